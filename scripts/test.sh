#!/usr/bin/env bash
# Every test that needs no GPU: the pool and config unit tests, then the whole library under
# LD_PRELOAD against the fake libcuda.so.1 with C clients (tests/preload/), plus fmt, clippy
# and the layering check; then the pip wheel, installed into a fresh venv
# (scripts/test-wheel.sh), and the replay gate (scripts/replay-gate.py). Needs cargo, a C compiler (cc) and python3 with venv and pip.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
command -v cc >/dev/null || { echo "test.sh: a C compiler is needed (apt-get install gcc)" >&2; exit 1; }

if cargo fmt --version >/dev/null 2>&1; then cargo fmt --all -- --check; fi
# The layers import only downward, and no two files import each other in a circle.
command -v python3 >/dev/null || { echo "test.sh: python3 is needed (apt-get install python3)" >&2; exit 1; }
python3 scripts/check-layers.py --self-test
python3 scripts/check-layers.py
# The Markdown pages link only to files and headings that exist.
python3 scripts/check-links.py
# The docs name every function and public name, and only paths and variables that exist.
python3 scripts/check-docs.py
if cargo clippy --version >/dev/null 2>&1; then cargo clippy --all-targets -- -D warnings; fi

# The preload tests load target/debug/libcudapool.so, which `cargo test` alone does not build.
cargo build
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The whole library again with classic segments (expandable is the default): every client
# runs under CUDAPOOL_SEGMENTS=classic unless its test names the mode.
CPTEST_SEGMENTS=classic cargo test --no-fail-fast --test preload --test lifetimes 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
# The replay gate: every allocation trace of benches/traces/ through split with expandable
# segments, at most 1.03x its peak allocated and never above PyTorch's recorded reserved.
python3 scripts/replay-gate.py target/debug/cudapool 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
# The pip wheel, built and installed into a fresh virtual environment (fetches the Python
# build tools from PyPI into a private venv the first time).
bash scripts/test-wheel.sh 2>&1 | tee -a "$log"
wheel_status=${PIPESTATUS[0]}
set -e
passed=$(awk '/^test result:/ {s += $4} /^wheel: [0-9]/ {s += $2} END {print s + 0}' "$log")
failed=$(awk '/^test result:/ {s += $6} /^wheel: [0-9]/ {s += $4} END {print s + 0}' "$log")
# A wheel that did not build or install is a failure too, though it ran no check.
[ "$wheel_status" = 0 ] || grep -q '^wheel: [0-9]' "$log" || failed=$((failed + 1))
# The failing tests by name, last, where the eye lands (their output is further up).
if [ "$failed" -gt 0 ]; then
  echo "failed:"
  grep -E '^test .* \.\.\. FAILED$' "$log" | sed 's/^test \(.*\) \.\.\. FAILED$/  \1/' | sort -u
  grep -E '^(wheel|replay-gate)[^ ]*: .*([1-9][0-9]* failed|FAIL)' "$log" | sed 's/^/  /' || true
fi
echo "$passed passed, $failed failed ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
[ "$status" = 0 ] && [ "$wheel_status" = 0 ]
