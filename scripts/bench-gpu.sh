#!/usr/bin/env bash
# Side-by-side allocation benchmark on a GPU, one run (issue 3). Build here first
# (cargo build --release) and carry target/release/libcudapool.so; then on the device:
#   bash scripts/bench-gpu.sh            (tables on stdout, raw figures under $OUT)
# Rows: the raw driver, CUDA's stream-ordered pool, each cudapool kind through cuMemAlloc and
# through cudaMalloc, PyTorch's caching allocator and PyTorch with caching off (raw and under
# each cudapool kind). Columns: ns per alloc+free pair (median of 5 runs) by size. Then
# million 4 KiB pairs per second by thread count.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudapool-bench}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
W=$(mktemp -d)
nvcc -O2 -o "$W/bench" scripts/gpu/bench_alloc.cu -lcuda || exit 1
KINDS="none split binned simple"
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(date -u +%F)"
row() { # name, command...
  local name=$1; shift
  local line="| $name |"
  while read -r kv; do line="$line ${kv#*ns=} |"; done < <("$@" | tee -a "$OUT/raw.txt" | grep '^size=')
  echo "$line"
}
echo
echo "| ns per alloc+free pair | 512 B | 4 KiB | 64 KiB | 1 MiB | 16 MiB | 256 MiB |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
row "raw driver (cuMemAlloc)" "$W/bench" driver sizes
row "CUDA stream-ordered pool (cuMemAllocAsync)" "$W/bench" async sizes
for k in $KINDS; do
  row "cudapool $k, cuMemAlloc" env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/bench" driver sizes
  row "cudapool $k, cudaMalloc" env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/bench" runtime sizes
done
row "cudapool split, cuMemAlloc, CUDAPOOL_TRACK=1" env LD_PRELOAD="$LIB" CUDAPOOL_TRACK=1 "$W/bench" driver sizes
row "cudapool split, cuMemAlloc, CUDAPOOL_TRACK=2" env LD_PRELOAD="$LIB" CUDAPOOL_TRACK=2 "$W/bench" driver sizes
row "PyTorch caching allocator (torch.empty+del)" python3 scripts/gpu/torch_pairs.py
row "PyTorch caching off, raw" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 scripts/gpu/torch_pairs.py
for k in split binned simple; do
  row "PyTorch caching off, cudapool $k" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k python3 scripts/gpu/torch_pairs.py
done
echo
echo "| million 4 KiB pairs/s | 1 | 2 | 4 | 8 | 16 | 16 vs 1 |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
trow() {
  local name=$1; shift
  local line="| $name |" first="" last=""
  for t in 1 2 4 8 16; do
    v=$("$@" "$t" | tee -a "$OUT/raw.txt" | sed -n 's/.*mpairs=//p')
    line="$line $v |"; [ -z "$first" ] && first=$v; last=$v
  done
  echo "$line $(awk -v a="$last" -v b="$first" 'BEGIN{printf "%.1fx", a/b}') |"
}
trow "CUDA stream-ordered pool" "$W/bench" async threads
for k in split binned simple; do
  trow "cudapool $k, cuMemAlloc" env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/bench" driver threads
done
