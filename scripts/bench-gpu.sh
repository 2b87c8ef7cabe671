#!/usr/bin/env bash
# Side-by-side allocation benchmark on a GPU, one run (issue 3). Build here first
# (cargo build --release) and carry target/release/libcudapool.so; then on the device:
#   bash scripts/bench-gpu.sh            (tables on stdout, raw figures under $OUT)
# Rows: the raw driver, CUDA's stream-ordered pool, each cudapool kind through cuMemAlloc and
# through cudaMalloc, PyTorch's caching allocator and PyTorch with caching off (raw and under
# each cudapool kind). Columns: ns per alloc+free pair (median of 5 runs) by size. Then
# million 4 KiB pairs per second by thread count. Then end to end (issue 5): PyTorch training
# steps/s with its own allocator, caching off, and caching off under each cudapool kind; JAX with
# its default allocator, `platform`, and `platform` under cudapool.
#   bash scripts/bench-gpu.sh e2e        (only the end-to-end table)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudapool-bench}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
W=$(mktemp -d)
KINDS="none split binned simple"
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(date -u +%F)"
if [ "${1:-all}" != e2e ]; then
nvcc -O2 -o "$W/bench" scripts/gpu/bench_alloc.cu -lcuda || exit 1
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
fi

# ---- end to end (issue 5): training throughput, median of 3 runs, ratio to the reference ----
median3() { sort -n | sed -n 2p; }
e2e() { # reference steps/s or "-", name, command...
  local ref=$1 name=$2 v runs=""
  shift 2
  for _ in 1 2 3; do
    v=$("$@" 2>>"$OUT/e2e.err" | tee -a "$OUT/raw.txt" | sed -n 's/.*steps_per_s=\([0-9.]*\).*/\1/p')
    runs="$runs ${v:-0}"
  done
  E2E=$(echo "$runs" | tr ' ' '\n' | grep . | median3)
  local ratio="1.00x (reference)"
  [ "$ref" != - ] && ratio=$(awk -v a="$E2E" -v b="$ref" 'BEGIN { printf "%.3fx", a / b }')
  echo "| $name | $E2E | $ratio | $(echo $runs) |"
}
echo
echo "| training steps/s (median of 3) | steps/s | vs reference | runs |"
echo "| --- | --- | --- | --- |"
e2e - "PyTorch, its own caching allocator" python3 scripts/gpu/train_bench.py
REF=$E2E
e2e "$REF" "PyTorch, caching off (PYTORCH_NO_CUDA_MEMORY_CACHING=1)" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 scripts/gpu/train_bench.py
for k in split binned simple none; do
  e2e "$REF" "PyTorch, caching off, cudapool $k" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k python3 scripts/gpu/train_bench.py
done
e2e - "JAX, its default allocator" python3 scripts/gpu/jax_bench.py
REF=$E2E
e2e "$REF" "JAX, XLA_PYTHON_CLIENT_ALLOCATOR=platform" env XLA_PYTHON_CLIENT_ALLOCATOR=platform python3 scripts/gpu/jax_bench.py
for k in split none; do
  e2e "$REF" "JAX, platform, cudapool $k" env XLA_PYTHON_CLIENT_ALLOCATOR=platform LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k python3 scripts/gpu/jax_bench.py
done
