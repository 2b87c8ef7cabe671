#!/usr/bin/env bash
# Watching a running program on a GPU (issue 7), for the device tool. Build here first
# (cargo build --release), carry target/release/libcudapool.so and target/release/cudapool:
#   bash tests/gpu/gpu-watch-check.sh      (trace and picture under $OUT)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-watch}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
CLI=$PWD/target/release/cudapool
exec > >(tee "$OUT/gpu-watch-check.log") 2>&1
PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_MEMORY_LIMIT=6GiB CUDAPOOL_TRACE="$OUT/pytorch.trace.json" \
  CUDAPOOL_LOG=error LD_PRELOAD="$LIB" python3 tests/gpu/train_traced.py &
pid=$!
for _ in $(seq 1 120); do
  grep -q "pausing" "$OUT/gpu-watch-check.log" 2>/dev/null && break
  sleep 0.5
done
echo "=== cudapool stat, from outside, while it runs"
"$CLI" stat
echo "=== nvidia-smi sees"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
wait $pid
echo "=== after it exited: $(ls /dev/shm/cudapool-$(id -u) 2>/dev/null | grep -c page-) cudapool pages left"
"$CLI" stat
"$CLI" plot "$OUT/pytorch.trace.json" -o "$OUT/pytorch-memory.svg"
python3 -c "import json,sys; t=json.load(open(sys.argv[1])); ev=t['traceEvents']; print('trace:', sum(e['ph']=='C' for e in ev), 'samples,', [e['name'] for e in ev if e['ph']=='i'], 'dropped', t['otherData']['dropped_events'])" "$OUT/pytorch.trace.json"
