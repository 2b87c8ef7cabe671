#!/usr/bin/env bash
# DDP over NCCL on two GPUs, rows interleaved (issue 26): GPT training
# (benches/gpu/train_mem.py gpt --ddp, one process per GPU through torchrun), every row once per
# round, the rows in turn. On one GPU (or with SIDE=1), DDP's two queues on one GPU instead:
# train_mem.py gpt --side (each gradient "reduced" on a second stream). The rows: PyTorch's own caching allocator, PyTorch with caching off under
# cudapool split (this build), under BASE_LIB's build when given, and CUDA's stream-ordered pool
# (backend:cudaMallocAsync). Per row: the median steps/s of the rounds (both ranks averaged in
# each round) with the lowest and highest, the ratio of medians to PyTorch's own allocator, and
# the peak reserved per rank (the pool's: less what cudapool counts outside it, NCCL's own
# buffers, which PyTorch's figure leaves out), median of the rounds. On a 2-GPU device with
# target/release/libcudapool.so carried (and BASE_LIB's file):
#   bash benches/gpu/ddp_interleaved.sh          (ROUNDS=3, STEPS=60, SIDE=0)
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/cbindings/python${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/cudapool-ddp}
mkdir -p "$OUT"
LIB=${CUDAPOOL_LIB:-$PWD/target/release/libcudapool.so}
BASE_LIB=${BASE_LIB:-}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-60}
RAW=$OUT/ddp-raw.txt
: >"$RAW"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && [ "${SIDE:-0}" != 1 ]; then
  R="torchrun --standalone --nproc_per_node=2 benches/gpu/train_mem.py gpt --ddp --steps $STEPS"
  RANKS=2 WHAT="GPT in DDP over NCCL, 2 GPUs, per rank"
else
  R="python3 benches/gpu/train_mem.py gpt --side --steps $STEPS"
  RANKS=1 WHAT="GPT with DDP's two queues on one GPU (--side)"
fi
declare -a NAMES ENVS
add() { NAMES+=("$1"); ENVS+=("$2"); }
add "PyTorch's own allocator" ""
add "caching off, cudapool split" "PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$LIB"
[ -n "$BASE_LIB" ] && add "caching off, cudapool split (base build)" "PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$BASE_LIB"
add "backend:cudaMallocAsync" "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"
echo "# $WHAT: $(nvidia-smi -L | wc -l) x $(nvidia-smi -i 0 --query-gpu=name,driver_version --format=csv,noheader), $(date -u +%F), bash benches/gpu/ddp_interleaved.sh: $ROUNDS rounds of $STEPS steps, rows interleaved"
for ((r = 1; r <= ROUNDS; r++)); do
  for i in "${!NAMES[@]}"; do
    # shellcheck disable=SC2086 # ENVS holds VAR=value words
    env NCCL_NVLS_ENABLE=0 ${ENVS[$i]} $R 2>>"$OUT/ddp.err" | grep '^workload=' | sed "s/^/round=$r row=$i /" >>"$RAW"
  done
done
printf '%s\n' "${NAMES[@]}" >"$OUT/ddp-names.txt"
python3 - "$RAW" "$OUT/ddp-names.txt" "$RANKS" "$WHAT" <<'PY'
import statistics, sys
raw, names, ranks, what = sys.argv[1], open(sys.argv[2]).read().splitlines(), int(sys.argv[3]), sys.argv[4]
runs = {}
for line in open(raw):
    kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
    runs.setdefault(int(kv["row"]), {}).setdefault(int(kv["round"]), []).append(kv)
med = {}
print(f"| {what} | steps/s, median [lowest, highest] | vs own | pool peak reserved per rank (GB), median | pool vs own | rounds |")
print("| --- | --- | --- | --- | --- | --- |")
for i, name in enumerate(names):
    rounds = runs.get(i, {})
    speeds = [statistics.mean(float(k["steps_per_s"]) for k in ks) for ks in rounds.values() if len(ks) == ranks]
    pools = [max(int(k["peak_reserved"]) - int(k.get("outside", 0)) for k in ks) for ks in rounds.values() if len(ks) == ranks]
    if not speeds:
        print(f"| {name} | failed | | | | 0 |")
        continue
    med[i] = (statistics.median(speeds), statistics.median(pools))
    vs = f"{med[i][0] / med[0][0]:.3f}x" if i and 0 in med else ""
    pv = f"{med[i][1] / med[0][1]:.3f}x" if i and 0 in med else ""
    print(f"| {name} | {med[i][0]:.3f} [{min(speeds):.3f}, {max(speeds):.3f}] | {vs} | {med[i][1] / 1e9:.2f} | {pv} | {len(speeds)} |")
PY
