#!/usr/bin/env bash
# The pip wheel, as a user gets it (issue 15): build it (scripts/build-wheel.sh), install it into
# a fresh virtual environment, and run the `cudapool` command, `python -m cudapool` and the
# Python package from there against the fake driver (tests/fake/libcuda.c). Prints
# "wheel: N passed, M failed"; exits 1 on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
bash scripts/build-wheel.sh || { echo "wheel: the build failed"; exit 1; }
wheel=$(ls -t dist/cudapool-*manylinux*.whl | head -1)
python3 -m venv "$W/venv"
"$W/venv/bin/python" -m pip install -q "$wheel" || { echo "wheel: pip install failed"; exit 1; }
gcc -O2 -shared -fPIC -Wl,-Bsymbolic -o "$W/libcuda.so.1" tests/fake/libcuda.c -lpthread
gcc -O2 -o "$W/ranges" tests/c/ranges.c -ldl
export LD_LIBRARY_PATH="$W"
cd "$W"  # nothing of the source tree on any path from here
pass=0 fail=0
check() { # what, command producing output, grep pattern
  local out
  out=$(eval "$2" 2>&1)
  if grep -q -- "$3" <<< "$out"; then pass=$((pass + 1)); echo "PASS $1"; else fail=$((fail + 1)); echo "FAIL $1:"; echo "$out" | tail -5; fi
}
lib="$W/venv/lib/python3*/site-packages/cudapool/libcudapool.so"
check "the library is in the package" "ls $lib" "libcudapool.so"
# The licences travel with it: cudapool's two, and NVTX's, whose headers are compiled in.
for f in LICENSE-MIT LICENSE-APACHE third_party/nvtx3/LICENSE.txt; do
  check "the wheel carries $f" "python3 -m zipfile -l '$OLDPWD/$wheel'" "dist-info/licenses/$f"
done
# Installed without debug info, symbols kept (a backtrace names cudapool's functions).
for bin in $lib venv/bin/cudapool; do
  check "$(basename $bin) carries no debug info ($(du -k $bin | cut -f1) KiB)" \
    "readelf -S $bin | grep -c '\.debug_info'" "^0$"
  check "$(basename $bin) keeps its symbols" "readelf -s $bin | grep -c ' FUNC '" "^[1-9][0-9][0-9]"
done
check "cudapool.library_path() names it" "venv/bin/python -c 'import cudapool; print(cudapool.library_path())'" "site-packages/cudapool/libcudapool.so"
check "the cudapool command runs a program under the library" \
  "venv/bin/cudapool run --pool split --report -- ./ranges dlsym blocks" "cudapool: .*pool split"
check "... and its address queries are cudapool's" \
  "venv/bin/cudapool run --pool split -- ./ranges dlsym blocks" "memset a_rc=0 b_rc=0 a_ok=1 b_ok=1"
check "python -m cudapool run loads the library into Python" \
  "venv/bin/python -m cudapool run --limit 64MiB -- venv/bin/python -c 'import cudapool; print(\"loaded\", cudapool.is_loaded(), cudapool.memory_stats(0)[\"hard_limit\"])'" \
  "loaded True 67108864"
check "python -m cudapool answers --help" "venv/bin/python -m cudapool --help" "Usage: cudapool"
# The man pages and completions land in the prefix, where man and the shells look.
check "the man page is installed beside the command" "ls venv/share/man/man1/" "cudapool-run.1"
check "... and lists every variable" "cat venv/share/man/man1/cudapool.1" "CUDAPOOL_SLURM_CONFIG"
check "bash completion is installed" "ls venv/share/bash-completion/completions/" "cudapool"
if command -v man >/dev/null; then
  check "man finds it through PATH" "PATH=\$PWD/venv/bin:\$PATH man -w cudapool" "venv/share/man/man1/cudapool.1"
fi
check "the package reports when the library is absent" \
  "venv/bin/python -c 'import cudapool; print(cudapool.is_loaded())'" "False"
check "a bad option is refused before anything runs" "venv/bin/cudapool run --pool nope -- true; echo rc=\$?" "rc=2"
# C builds against the installed package (its header, library, pkg-config file, CMake package).
src=$OLDPWD
cp "$src/cbindings/c/print_status.c" "$src/cbindings/c/CMakeLists.txt" "$W/"
check "the package carries the header" "ls \$(venv/bin/cudapool config --includedir)/cudapool.h" "cudapool.h"
check "cc with cudapool config --cflags --libs, linked" \
  "gcc -o by_config print_status.c \$(venv/bin/cudapool config --cflags --libs) -ldl && ./by_config" "the phase peaked at 10485760 bytes"
if ! command -v pkg-config >/dev/null; then
  echo "wheel: no pkg-config on PATH: its check is not run (apt-get install pkg-config)"
else
  check "cc with pkg-config, linked" \
    "gcc -o by_pc print_status.c \$(PKG_CONFIG_PATH=\$(venv/bin/cudapool config --pkgconfigdir) pkg-config --cflags --libs cudapool) -ldl && ./by_pc" \
    "the phase peaked at 10485760 bytes"
fi
# CMake comes from PyPI (pinned in tests/python/requirements.txt) into this check's own venv,
# never from the machine: the check always runs.
cmake_version=$(sed -n 's/^cmake==//p' "$src/tests/python/requirements.txt")
venv/bin/python -m pip install -q --disable-pip-version-check "cmake==$cmake_version" >/dev/null
cmake="$PWD/venv/bin/cmake"
check "CMake's find_package(cudapool), linked" \
  "$cmake -S . -B cm -Dcudapool_DIR=\$(venv/bin/cudapool config --cmakedir) >/dev/null && $cmake --build cm >/dev/null && ./cm/print_status" \
  "the phase peaked at 10485760 bytes"
echo "wheel: $pass passed, $fail failed"
[ "$fail" = 0 ]
