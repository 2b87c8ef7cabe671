#!/usr/bin/env bash
# The largest batch each training job of benches/gpu/train_mem.py (GPT, ResNet-50) trains at
# under a fixed memory limit (issue 25), found by bisection, for four allocators: PyTorch's own
# (default, and expandable segments) capped with set_per_process_memory_fraction, and cudapool
# (split with classic, and with expandable segments; PyTorch's cache off) capped with
# CUDAPOOL_MEMORY_LIMIT. A batch fits when a few steps (warm-up included) run without an
# out-of-memory error. cudapool's limit also counts what PyTorch's never sees (cuBLAS's own
# 128 MiB workspace, cudaMalloc'd by the library itself). On the device, with
# target/release/libcudapool.so carried:
#   bash benches/gpu/largest_batch.sh            (LIMITS="4 8" GiB, JOBS="gpt cnn")
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-largest}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
fits() { # job batch limit_gib allocator
  local job=$1 b=$2 gib=$3 how=$4 bytes=$(($3 << 30))
  local common=(python3 benches/gpu/train_mem.py "$job" --steps 2 --warmup 2 --batch "$b")
  case $how in
    torch) env PYTORCH_CUDA_ALLOC_CONF= "${common[@]}" --limit "$bytes" ;;
    torch-exp) env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "${common[@]}" --limit "$bytes" ;;
    split) env PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_MEMORY_LIMIT=${gib}GiB LD_PRELOAD="$LIB" "${common[@]}" ;;
    split-exp) env PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_MEMORY_LIMIT=${gib}GiB CUDAPOOL_SEGMENTS=expandable LD_PRELOAD="$LIB" "${common[@]}" ;;
  esac >>"$OUT/largest-raw.txt" 2>>"$OUT/largest.err"
}
largest() { # job limit allocator start: doubles up from start until a failure, then bisects
  local job=$1 gib=$2 how=$3 lo=0 hi=$4
  while fits "$job" "$hi" "$gib" "$how"; do lo=$hi; hi=$((hi * 2)); done
  while [ $((hi - lo)) -gt 1 ]; do
    local mid=$(((lo + hi) / 2))
    if fits "$job" "$mid" "$gib" "$how"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}
echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F), bash benches/gpu/largest_batch.sh"
echo "| job | limit | PyTorch default | PyTorch expandable | cudapool split | cudapool split, expandable |"
echo "| --- | --- | --- | --- | --- | --- |"
for gib in ${LIMITS:-4 8}; do
  for job in ${JOBS:-gpt cnn}; do
    case $job in gpt) start=$((gib * 2)) ;; *) start=$((gib * 16)) ;; esac
    row="| $job | $gib GiB |"
    for how in torch torch-exp split split-exp; do
      row="$row $(largest "$job" "$gib" "$how" "$start") |"
    done
    echo "$row"
  done
done
