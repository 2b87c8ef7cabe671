#!/usr/bin/env bash
# Stats and reports on a GPU (issue 4), for the device tool. Build here first
# (cargo build --release), carry target/release/libcudapool.so, then on the device:
#   bash tests/gpu/gpu-stats-check.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-stats}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
W=$(mktemp -d)
exec > >(tee "$OUT/gpu-stats-check.log") 2>&1
echo "=== PyTorch, caching off, under cudapool: the Python module and nvidia-smi"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" python3 tests/gpu/torch_stats.py
echo; echo "=== a C program linked with -lcudapool (not preloaded) prints its status"
CUDA_LIB=$(dirname "$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')")
cc -O1 -Iinclude -o "$W/print_status" cbindings/c/print_status.c -ldl -L"$(dirname "$LIB")" -lcudapool \
  -Wl,-rpath,"$(dirname "$LIB")" && "$W/print_status"
echo; echo "=== CUDAPOOL_TRACK: a leak report, and what each level costs per pair (split, cuMemAlloc)"
cc -O1 -Itests/c -o "$W/client" tests/c/client.c tests/c/reuse.c tests/c/lifetimes.c tests/c/capture.c tests/c/sleep.c -ldl -lpthread
CUDAPOOL_TRACK=2 LD_PRELOAD="$LIB" "$W/client" dlsym leak "$OUT/snapshot.json" 2>&1 | grep -v "^gpa_" | head -20
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); d=s['devices'][0]; print('snapshot:', len(d['segments']), 'segments,', len(d['allocations']), 'live allocations, first backtrace frame:', d['allocations'][0]['backtrace'][0])" "$OUT/snapshot.json"
nvcc -O2 -o "$W/bench" benches/gpu/bench_alloc.cu -lcuda
for t in 0 1 2; do
  echo "CUDAPOOL_TRACK=$t: $(CUDAPOOL_TRACK=$t LD_PRELOAD="$LIB" "$W/bench" driver sizes | tr '\n' ' ')"
done
