#!/usr/bin/env bash
# The peers' own memory tests as a gate (fetched by scripts/fetch-peer-tests.sh into .peers/):
# PyTorch's test_cuda.py (its memory, caching-allocator, graph, MemPool and expandable-segment
# tests) with PyTorch's cache on and off, and CuPy's test_memory.py, each run without cudapool
# and under it (LIB). Every test that passes without cudapool must pass with it; a test that
# fails without it too is listed, not counted against cudapool. Prints PASS/FAIL lines:
#   bash tests/gpu/peers/peers.sh LIB [WORKDIR]
set -u
cd "$(dirname "$0")/../../.."
LIB=${1:?the library}
W=${2:-$(mktemp -d)}
mkdir -p "$W"
# A peer whose tests are not here is a SKIP row of its own (not a pass: the table counts it
# apart and names it); the others still run.
fetched() { # file, label
  [ -f "$1" ] && return 0
  echo "SKIP | peers: $2 | not fetched ($1): run scripts/fetch-peer-tests.sh and carry .peers"
  return 1
}
K='memory or caching or graph or MemPool or mempool or expandable or empty_cache'
# One side: pytest's verdict per test id, as "id outcome" lines.
side() { # name, directory, test file, -k expression (or ""), environment...
  local name=$1 dir=$2 file=$3 k=$4 began=$SECONDS; shift 4
  # (pytest's root is the repository's: test ids read .peers.cupy.test_memory.Class::test.)
  (cd "$dir" && env "$@" timeout 900 python3 -m pytest -q -p no:cacheprovider ${k:+-k "$k"} \
    -o junit_family=xunit1 --junitxml="$W/$name.xml" "$file" > "$W/$name.log" 2>&1)
  python3 - "$W/$name.xml" > "$W/$name.txt" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    sys.exit(0)
for case in root.iter("testcase"):
    tid = f"{case.get('classname')}::{case.get('name')}"
    tags = {c.tag for c in case}
    outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
    print(tid, outcome)
PY
  echo "# $name: $(wc -l < "$W/$name.txt") tests in $((SECONDS - began)) s" >&2
}
compare() { # label, without, with
  python3 - "$1" "$W/$2.txt" "$W/$3.txt" <<'PY'
import sys
label, a, b = sys.argv[1:]
read = lambda p: dict(l.rsplit(None, 1) for l in open(p) if l.strip())
alone, under = read(a), read(b)
passed = [t for t, o in alone.items() if o == "passed"]
lost = [t for t in passed if under.get(t) != "passed"]
failing_alone = [t for t, o in alone.items() if o == "failed"]
verdict = "PASS" if alone and not lost else "FAIL"
detail = f"{len(passed)} pass without cudapool, {len(passed) - len(lost)} of them with it"
if failing_alone:
    detail += f"; {len(failing_alone)} fail without it too: " + ", ".join(sorted(failing_alone)[:5])
if lost:
    detail += "; lost: " + ", ".join(sorted(lost)[:10])
if not alone:
    detail = "no result without cudapool (see the log)"
print(f"{verdict} | peers: {label} | {detail}")
PY
}
# Tests that assert a limit of the driver cudapool lifts, left out on both sides (and named in
# the row with why): each is a program that would fail without cudapool and works with it.
# TestMemoryAsyncPool::test_free_all_blocks_large_chunk frees 70 % of the device with
# cudaFreeAsync and wants cudaMalloc of 30 % to fail until a synchronization (the driver's pool
# keeps the memory until then); cudapool's one pool serves it from the freed block.
CUPY_LIFTED=test_free_all_blocks_large_chunk
T=$PWD/.peers/torch
C=$PWD/.peers/cupy
if fetched "$T/test_cuda.py" "PyTorch test_cuda.py"; then
  side torch-on "$T" test_cuda.py "$K"
  side torch-on-cp "$T" test_cuda.py "$K" LD_PRELOAD="$LIB"
  compare "PyTorch test_cuda.py, cache on" torch-on torch-on-cp
  side torch-off "$T" test_cuda.py "$K" PYTORCH_NO_CUDA_MEMORY_CACHING=1
  side torch-off-cp "$T" test_cuda.py "$K" PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB"
  compare "PyTorch test_cuda.py, cache off" torch-off torch-off-cp
fi
if fetched "$C/test_memory.py" "CuPy test_memory.py"; then
  side cupy "$C" test_memory.py "not $CUPY_LIFTED"
  side cupy-cp "$C" test_memory.py "not $CUPY_LIFTED" LD_PRELOAD="$LIB"
  compare "CuPy test_memory.py (left out, a driver limit cudapool lifts: $CUPY_LIFTED)" cupy cupy-cp
fi
