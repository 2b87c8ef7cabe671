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
#   bash scripts/bench-gpu.sh pairs      (only the pair, launch and thread tables: issue 14)
#   bash scripts/bench-gpu.sh e2e        (only the end-to-end tables: speed, then memory)
#   bash scripts/bench-gpu.sh mem        (only the memory table, issue 11; DDP rows with 2 GPUs)
#   bash scripts/bench-gpu.sh ddp        (only the DDP rows of the memory table: 2 GPUs)
# CUDAPOOL_LIB=path picks the library (default target/release/libcudapool.so); BASE_LIB=path adds
# rows for a second build (say, the last release) to the memory table, side by side.
set -u
cd "$(dirname "$0")/.."
# The memory rows read cudapool's figures through its Python package (cbindings/python/cudapool).
export PYTHONPATH="$PWD/cbindings/python${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/cudapool-bench}
mkdir -p "$OUT"
LIB=${CUDAPOOL_LIB:-$PWD/target/release/libcudapool.so}
MODE=${1:-all}
W=$(mktemp -d)
KINDS="none split binned simple"
echo "device: $(nvidia-smi -L | wc -l) x $(nvidia-smi -i 0 --query-gpu=name,driver_version --format=csv,noheader), $(date -u +%F)"
if [ "$MODE" = all ] || [ "$MODE" = pairs ]; then
nvcc -O2 -o "$W/bench" benches/gpu/bench_alloc.cu -lcuda || exit 1
# The floor (issue 14): a one-slot cache in front of the driver, nothing else. Its cudaMalloc
# row minus its cuMemAlloc row is what the CUDA runtime itself adds to a pair.
gcc -shared -fPIC -O2 -o "$W/stub.so" benches/gpu/callcount.c -ldl -lpthread || exit 1
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
row "floor: one-slot stub, cuMemAlloc" env STUB_POOL=1 LD_PRELOAD="$W/stub.so" "$W/bench" driver sizes
row "floor: one-slot stub, cudaMalloc" env STUB_POOL=1 LD_PRELOAD="$W/stub.so" "$W/bench" runtime sizes
for k in $KINDS; do
  row "cudapool $k, cuMemAlloc" env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/bench" driver sizes
  row "cudapool $k, cudaMalloc" env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/bench" runtime sizes
done
row "cudapool split, cuMemAlloc, in a group (CUDAPOOL_GROUP)" env LD_PRELOAD="$LIB" CUDAPOOL_GROUP="bench-$$" CUDAPOOL_GROUP_LIMIT=60GiB "$W/bench" driver sizes
rm -f "/dev/shm/cudapool-$(id -u)/group-bench-$$"
row "cudapool split, cuMemAlloc, CUDAPOOL_TRACK=1" env LD_PRELOAD="$LIB" CUDAPOOL_TRACK=1 "$W/bench" driver sizes
row "cudapool split, cuMemAlloc, CUDAPOOL_TRACK=2" env LD_PRELOAD="$LIB" CUDAPOOL_TRACK=2 "$W/bench" driver sizes
row "PyTorch caching allocator (torch.empty+del)" python3 benches/gpu/torch_pairs.py
row "PyTorch caching off, raw" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 benches/gpu/torch_pairs.py
for k in split binned simple; do
  row "PyTorch caching off, cudapool $k" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k python3 benches/gpu/torch_pairs.py
done
echo
echo "| host ns per empty kernel launch (median of 7 x 1000) | legacy stream | two streams alternating |"
echo "| --- | --- | --- |"
lrow() { echo "| $1 | $("${@:2}" launch one | sed -n 's/.*ns=//p') | $("${@:2}" launch two | sed -n 's/.*ns=//p') |"; }
lrow "no cudapool" "$W/bench"
lrow "cudapool split" env LD_PRELOAD="$LIB" "$W/bench"
lrow "cudapool split, CUDAPOOL_REUSE=immediate (no work watching)" env LD_PRELOAD="$LIB" CUDAPOOL_REUSE=immediate "$W/bench"
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
trow "floor: one-slot stub" env STUB_POOL=1 LD_PRELOAD="$W/stub.so" "$W/bench" driver threads
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
if [ "$MODE" = all ] || [ "$MODE" = e2e ]; then
echo
echo "| training steps/s (median of 3) | steps/s | vs reference | runs |"
echo "| --- | --- | --- | --- |"
e2e - "PyTorch, its own caching allocator" python3 benches/gpu/train_bench.py
REF=$E2E
e2e "$REF" "PyTorch, caching off (PYTORCH_NO_CUDA_MEMORY_CACHING=1)" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 benches/gpu/train_bench.py
for k in split binned simple none; do
  e2e "$REF" "PyTorch, caching off, cudapool $k" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k python3 benches/gpu/train_bench.py
done
e2e - "JAX, its default allocator" python3 benches/gpu/jax_bench.py
REF=$E2E
e2e "$REF" "JAX, XLA_PYTHON_CLIENT_ALLOCATOR=platform" env XLA_PYTHON_CLIENT_ALLOCATOR=platform python3 benches/gpu/jax_bench.py
for k in split none; do
  e2e "$REF" "JAX, platform, cudapool $k" env XLA_PYTHON_CLIENT_ALLOCATOR=platform LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k python3 benches/gpu/jax_bench.py
done
fi

[ "$MODE" = pairs ] && exit 0

# ---- memory (issue 11): peak reserved beside steps/s, against PyTorch's own allocator -------
# One run each. "own" is PyTorch's caching allocator in the same run; the limit rows run under
# CUDAPOOL_MEMORY_LIMIT = 1.25 x its peak reserved.
GB() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1e9 }'; }
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" | head -n 1; }
mem_row() { # name, reference line ("-" for none), command...
  local name=$1 ref=$2 line
  shift 2
  line=$("$@" 2>>"$OUT/mem.err" | tee -a "$OUT/raw.txt" | grep '^workload=' | head -n 1)
  MEMLINE=$line
  if [ -z "$line" ]; then echo "| $name | failed (see mem.err) | | | | | | |"; return; fi
  local sps res out nvml allocs drv
  sps=$(echo " $line" | field steps_per_s); res=$(echo " $line" | field peak_reserved)
  out=$(echo " $line" | field outside); nvml=$(echo " $line" | field nvml_used)
  allocs=$(echo " $line" | field allocs); drv=$(echo " $line" | field driver_allocs)
  local rs="" rr="" rn="" churn="-"
  if [ "$ref" != - ]; then
    rs=$(awk -v a="$sps" -v b="$(echo " $ref" | field steps_per_s)" 'BEGIN { printf "%.3fx", a / b }')
    rr=$(awk -v a="$res" -v o="${out:-0}" -v b="$(echo " $ref" | field peak_reserved)" 'BEGIN { printf "%.2fx", (a - o) / b }')
    rn=$(awk -v a="$nvml" -v b="$(echo " $ref" | field nvml_used)" 'BEGIN { printf " (%.2fx)", a / b }')
  fi
  [ "${allocs:-0}" != 0 ] && churn="$drv / $allocs"
  echo "| $name | $sps | $rs | $(GB "$res") | $(GB "${out:-0}") | $rr | $(GB "$nvml")$rn | $churn |"
}
T="python3 benches/gpu/train_mem.py"
OFF="env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$LIB"
ASYNC="env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"
echo
# "outside the pool": what cudapool counts beyond its pool (NCCL's own buffers, VMM memory),
# which PyTorch's figure does not include; "pool vs own" compares peak reserved less that.
echo "| workload, allocator | steps/s | vs own | peak reserved (GB) | outside the pool (GB) | pool vs own | process, NVML (GB) | driver allocs / allocs after warm-up |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
# (The CNN runs 120 steps: at ~50 steps/s, 40 were too few for a steady figure.)
[ "$MODE" = ddp ] || for w in gpt "gpt --sync" "cnn --steps 120"; do
  n=${w%% --steps*}
  mem_row "$n: PyTorch's own allocator" - $T $w; OWN=$MEMLINE
  LIMIT=$(awk -v b="$(echo " $OWN" | field peak_reserved)" 'BEGIN { printf "%d", b * 1.25 }')
  mem_row "$n: caching off, cudapool split" "$OWN" $OFF $T $w
  if [ "$w" = gpt ]; then
    for k in binned simple; do mem_row "$n: caching off, cudapool $k" "$OWN" $OFF CUDAPOOL_POOL=$k $T $w; done
    mem_row "$n: caching off, cudapool split, REUSE=immediate (unsafe)" "$OWN" $OFF CUDAPOOL_REUSE=immediate $T $w
    mem_row "$n: backend:cudaMallocAsync (driver pool)" "$OWN" $ASYNC $T $w
    mem_row "$n: backend:cudaMallocAsync, cudapool split" "$OWN" $ASYNC LD_PRELOAD="$LIB" $T $w
  fi
  [ "$w" = "gpt --sync" ] || mem_row "$n: caching off, cudapool split, limit 1.25x own ($(GB "$LIMIT") GB)" "$OWN" $OFF CUDAPOOL_MEMORY_LIMIT="$LIMIT" $T $w
  if [ -n "${BASE_LIB:-}" ]; then
    mem_row "$n: caching off, BASE_LIB split" "$OWN" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$BASE_LIB" $T $w
    [ "$w" = "gpt --sync" ] || mem_row "$n: caching off, BASE_LIB split, limit 1.25x own" "$OWN" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$BASE_LIB" CUDAPOOL_MEMORY_LIMIT="$LIMIT" $T $w
  fi
done
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  # DDP over NCCL on two GPUs: a row per rank.
  R="torchrun --standalone --nproc_per_node=2 benches/gpu/train_mem.py gpt --ddp"
  ddp_rows() { # name, reference lines, env...
    local name=$1 ref=$2 out r
    shift 2
    out=$(env "$@" $R 2>>"$OUT/mem.err" | tee -a "$OUT/raw.txt" | grep '^workload=')
    DDP=$out
    for r in 0 1; do
      local l rl
      l=$(echo "$out" | grep " rank=$r ")
      rl=-; [ "$ref" != - ] && rl=$(echo "$ref" | grep " rank=$r ")
      mem_row "gpt DDP rank $r: $name" "$rl" echo "$l"
    done
  }
  ddp_rows "PyTorch's own allocator" - NCCL_NVLS_ENABLE=0; OWN=$DDP
  ddp_rows "caching off, cudapool split" "$OWN" NCCL_NVLS_ENABLE=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB"
  ddp_rows "backend:cudaMallocAsync (driver pool)" "$OWN" NCCL_NVLS_ENABLE=0 PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  ddp_rows "backend:cudaMallocAsync, cudapool split" "$OWN" NCCL_NVLS_ENABLE=0 PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD="$LIB"
  [ -n "${BASE_LIB:-}" ] && ddp_rows "caching off, BASE_LIB split" "$OWN" NCCL_NVLS_ENABLE=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$BASE_LIB"
fi
