#!/usr/bin/env bash
# compute-sanitizer sees pooled blocks (issue 12): cudapool registers each segment as an NVTX
# sub-allocator heap and each block the program holds as a region, so memcheck finds errors
# inside pooled segments as it does without cudapool. Build here first (cargo build --release),
# carry target/release/libcudapool.so; on the device:
#   bash tests/gpu/gpu-sanitizer-check.sh    (log under $OUT; PASS/FAIL lines; exit 1 on a FAIL)
# scripts/gpu-check.sh runs it as part of the suite (RESULTS=its table).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-gpu-check}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
W=$(mktemp -d)
RESULTS=${RESULTS:-$OUT/sanitizer-results.txt}
LOG=$OUT/sanitizer.log
CS=${COMPUTE_SANITIZER:-compute-sanitizer}
T="timeout 300"
FAILS=0
. tests/gpu/checks.sh
# Errors memcheck (or another tool) reports for a run: N of "ERROR SUMMARY: N errors".
errors() { sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$1" | head -1; }
# The planted errors themselves: bad accesses by kernels and the refused free. (After a kernel
# fault the context is broken and the driver refuses every later call, which memcheck also
# counts; cudapool does not pass a pooled block's free to the driver, so those counts differ.)
planted() { grep -cE 'Invalid __global__|Program hit cudaErrorInvalidValue' "$1"; }

echo "=== compute-sanitizer and pooled blocks ($($CS --version | tail -1))"
nvcc -O2 -lineinfo -o "$W/planted" tests/gpu/programs/planted.cu || exit 1
nvcc -O2 -std=c++17 -o "$W/race" tests/gpu/programs/race.cu || exit 1
run() { # output file, tool, then the program and its arguments (prefixed by env ... for cudapool)
  local out=$1 tool=$2; shift 2
  $T "$CS" --tool "$tool" --error-exitcode 0 --print-limit 100000 "$@" > "$out" 2>&1
  { echo "--- $tool $*"; cat "$out"; } >> "$LOG"
}
for mode in oob uaf double clean; do
  run "$W/plain" memcheck "$W/planted" $mode
  want=$(planted "$W/plain")
  line="without cudapool $want (of $(errors "$W/plain"))"
  ok=1
  for k in split binned simple; do
    run "$W/shim" memcheck env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/planted" $mode
    got=$(planted "$W/shim")
    line="$line, $k $got (of $(errors "$W/shim"))"
    [ "$got" = "$want" ] || ok=0
    [ $mode = oob ] && grep -m1 -A1 'is out of bounds' "$W/shim" > "$OUT/sanitizer-oob-$k.txt"
  done
  if [ $mode = clean ]; then
    check "[ $ok = 1 ] && [ '$want' = 0 ] && [ '$(errors "$W/shim")' = 0 ]" "memcheck, a correct program: 0 errors" "$line"
  else
    check "[ $ok = 1 ] && [ '${want:-0}' -gt 0 ]" "memcheck finds the planted $mode in every kind" "errors: $line"
  fi
done
for k in split binned simple; do
  run "$W/race.out" memcheck env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/race" legacy
  check "[ '$(errors "$W/race.out")' = 0 ] && grep -q 'checksum ok' '$W/race.out'" \
    "memcheck on the race test ($k): 0 errors" "$(grep -m1 checksum "$W/race.out"); $(grep 'ERROR SUMMARY' "$W/race.out")"
done
# initcheck --track-unused-memory: the unused rest of a segment is not the program's.
unused() { grep -c 'Unused memory' "$1"; }
run "$W/plain" initcheck --track-unused-memory "$W/planted" clean
for k in split binned; do
  run "$W/shim" initcheck --track-unused-memory env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/planted" clean
  check "grep -q 'ERROR SUMMARY' '$W/shim' && [ $(unused "$W/shim") -le $(unused "$W/plain") ] && [ '$(errors "$W/shim")' = '$(errors "$W/plain")' ]" \
    "initcheck --track-unused-memory ($k): no unused memory beyond the program's" \
    "unused-memory reports: $(unused "$W/shim") with cudapool, $(unused "$W/plain") without; $(grep 'ERROR SUMMARY' "$W/shim")"
done
run "$W/shim" racecheck env LD_PRELOAD="$LIB" "$W/planted" clean
check "grep -q 'done clean' '$W/shim' && grep -q 'RACECHECK SUMMARY: 0 hazards' '$W/shim'" "racecheck runs under cudapool" "$(grep 'RACECHECK SUMMARY' "$W/shim")"
# A PyTorch training step with caching off (every tensor a pooled block).
run "$W/torch" memcheck env LD_PRELOAD="$LIB" PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 tests/gpu/train_small.py
check "grep -q 'step' '$W/torch' && [ '$(errors "$W/torch")' = 0 ]" "memcheck on a PyTorch step, caching off: 0 errors" \
  "$(grep -m1 step "$W/torch" | tail -c 80); $(grep 'ERROR SUMMARY' "$W/torch")"
[ "$FAILS" = 0 ]
