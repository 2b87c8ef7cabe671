#!/usr/bin/env bash
# Reuse safety of the caching pools on a real GPU (issue 3), for the device tool. Build here
# first (cargo build --release), carry target/release/libcudapool.so, then on the device:
#   bash tests/gpu/gpu-pool-check.sh       (log and a recorded PyTorch trace under $OUT)
# A kernel still reads a buffer when the program frees it; the program allocates the same size
# and overwrites it (tests/gpu/programs/race.cu). The checksum must survive on the legacy stream, a
# blocking stream, a non-blocking stream and across two host threads, for every caching kind.
# CUDAPOOL_REUSE=immediate is run too: there the race may corrupt, which shows the test bites.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-pool-check}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
W=$(mktemp -d)
exec > >(tee "$OUT/gpu-pool-check.log") 2>&1
nvcc -O2 -std=c++17 -o "$W/race" tests/gpu/programs/race.cu || exit 1
nvcc -O2 -std=c++17 --default-stream per-thread -o "$W/race_ptds" tests/gpu/programs/race.cu || exit 1
pass=0 fail=0
check() { # expect(ok|any) label command...
  local expect=$1 label=$2; shift 2
  local out; out=$("$@" 2>&1); local rc=$?
  echo "$label: $out" | tail -1
  if [ "$expect" = ok ] && [ $rc -ne 0 ]; then fail=$((fail + 1)); echo "  FAIL"; else pass=$((pass + 1)); fi
}
for mode in legacy blocking nonblocking threads late handoff switch return; do
  bin="$W/race"; case $mode in threads|handoff) bin="$W/race_ptds";; esac
  check ok "no shim, $mode" "$bin" $mode
  for k in split binned simple; do
    check ok "cudapool $k auto, $mode" env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$bin" $mode
  done
  check any "cudapool split IMMEDIATE (unsafe on purpose), $mode" env LD_PRELOAD="$LIB" CUDAPOOL_POOL=split CUDAPOOL_REUSE=immediate "$bin" $mode
done
echo "$pass passed, $fail failed"

echo; echo "=== recording a PyTorch allocation trace (caching off, pool none)"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_LOG=debug CUDAPOOL_POOL=none LD_PRELOAD="$LIB" \
  python3 tests/gpu/train_small.py 2> "$W/debug.log" | tail -2
python3 benches/gpu/record_trace.py "$W/debug.log" "PyTorch $(python3 -c 'import torch; print(torch.__version__)'), 4-layer transformer, 8 AdamW steps, PYTORCH_NO_CUDA_MEMORY_CACHING=1" > "$OUT/pytorch_transformer.trace"
wc -l "$OUT/pytorch_transformer.trace"
echo; echo "=== the same training under each caching kind: losses must match the run without the shim"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 tests/gpu/train_small.py > "$W/plain.txt"
for k in split binned simple; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_POOL=$k CUDAPOOL_REPORT=stderr LD_PRELOAD="$LIB" \
    python3 tests/gpu/train_small.py > "$W/$k.txt" 2> "$W/$k.err"
  if cmp -s "$W/plain.txt" "$W/$k.txt"; then echo "$k: losses identical"; else echo "$k: LOSSES DIFFER"; diff "$W/plain.txt" "$W/$k.txt" | head; fi
  grep "calls:" "$W/$k.err"
done
