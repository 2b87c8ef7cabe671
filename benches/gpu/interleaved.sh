#!/usr/bin/env bash
# Pair benchmarks that tell kinds apart (issue 26, part 3): every row runs once per round, the
# rows in turn (A, B, C, A, B, C, ...), the process pinned to one core; per row and size the
# median of the rounds and their spread (25th to 75th percentile), and the machine's state that
# moves the figures (the core, its governor and frequency). Two rows whose medians differ by
# less than either spread are reported as no difference.
# Rows: cuMemAlloc/cuMemFree pairs (benches/gpu/bench_alloc.cu driver) raw and under each
# cudapool kind (split also with expandable segments, and a second build when BASE_LIB names
# one), then torch.empty+del from Python (benches/gpu/torch_pairs.py): PyTorch's own caching
# allocator, and caching off under each cudapool kind. On the device, with
# target/release/libcudapool.so carried (and BASE_LIB's file, say target/base/libcudapool.so):
#   bash benches/gpu/interleaved.sh               (ROUNDS=7, CORE=5; PYTHON=0 skips the Python rows)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-interleaved}
mkdir -p "$OUT"
LIB=${CUDAPOOL_LIB:-$PWD/target/release/libcudapool.so}
BASE_LIB=${BASE_LIB:-}
ROUNDS=${ROUNDS:-7}
CORE=${CORE:-5}
W=$(mktemp -d)
nvcc -O2 -o "$W/bench" benches/gpu/bench_alloc.cu -lcuda || exit 1
RAW=$OUT/interleaved-raw.txt
: >"$RAW"
pin() { taskset -c "$CORE" "$@"; }
declare -a NAMES CMDS
add() { NAMES+=("$1"); shift; CMDS+=("$*"); }
add "cuMemAlloc, raw driver" "$W/bench" driver sizes
for k in split binned simple; do
  add "cuMemAlloc, cudapool $k" env LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k "$W/bench" driver sizes
done
add "cuMemAlloc, cudapool split expandable" env LD_PRELOAD="$LIB" CUDAPOOL_SEGMENTS=expandable "$W/bench" driver sizes
[ -n "$BASE_LIB" ] && add "cuMemAlloc, cudapool split (base build)" env LD_PRELOAD="$BASE_LIB" CUDAPOOL_POOL=split "$W/bench" driver sizes
if [ "${PYTHON:-1}" = 1 ]; then
  add "torch.empty+del, PyTorch's caching allocator" python3 benches/gpu/torch_pairs.py
  for k in split binned simple; do
    add "torch.empty+del, caching off, cudapool $k" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" CUDAPOOL_POOL=$k python3 benches/gpu/torch_pairs.py
  done
  add "torch.empty+del, caching off, cudapool split expandable" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" CUDAPOOL_SEGMENTS=expandable python3 benches/gpu/torch_pairs.py
  [ -n "$BASE_LIB" ] && add "torch.empty+del, caching off, cudapool split (base build)" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$BASE_LIB" CUDAPOOL_POOL=split python3 benches/gpu/torch_pairs.py
fi
gov=$(cat /sys/devices/system/cpu/cpu$CORE/cpufreq/scaling_governor 2>/dev/null || echo unknown)
mhz=$(awk -v c="$CORE" '$1 == "processor" { p = $3 } $1 == "cpu" && $2 == "MHz" && p == c { print $4 }' /proc/cpuinfo)
echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F), bash benches/gpu/interleaved.sh: $ROUNDS rounds, rows interleaved, pinned to core $CORE (governor $gov, ${mhz:-?} MHz at start, $(nproc) cores)"
for ((r = 1; r <= ROUNDS; r++)); do
  for i in "${!NAMES[@]}"; do
    pin ${CMDS[$i]} 2>>"$OUT/interleaved.err" | sed -n "s/^size=\([0-9]*\) ns=\([0-9.]*\).*/$r|$i|\1|\2/p" >>"$RAW"
  done
done
mhz_end=$(awk -v c="$CORE" '$1 == "processor" { p = $3 } $1 == "cpu" && $2 == "MHz" && p == c { print $4 }' /proc/cpuinfo)
printf '%s\n' "${NAMES[@]}" >"$W/names"
python3 - "$RAW" "$W/names" "${mhz_end:-?}" <<'PY'
import statistics, sys
raw, names, mhz = sys.argv[1], open(sys.argv[2]).read().splitlines(), sys.argv[3]
fig = {}
for line in open(raw):
    r, i, size, ns = line.strip().split("|")
    fig.setdefault((int(i), int(size)), []).append(float(ns))
sizes = sorted({s for _, s in fig})
def q(v, p):
    v = sorted(v); k = (len(v) - 1) * p; lo = int(k); hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)
def label(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"
print(f"(core at {mhz} MHz at the end) ns per pair: median of the rounds [25th-75th percentile]")
print("| row | " + " | ".join(label(s) for s in sizes) + " |")
print("| --- |" + " --- |" * len(sizes))
for i, n in enumerate(names):
    cells = []
    for s in sizes:
        v = fig.get((i, s))
        cells.append(f"{statistics.median(v):.0f} [{q(v, .25):.0f}-{q(v, .75):.0f}]" if v else "-")
    print(f"| {n} | " + " | ".join(cells) + " |")
def verdict(a, b):
    out = []
    for s in sizes:
        va, vb = fig.get((a, s)), fig.get((b, s))
        if not va or not vb:
            continue
        ma, mb = statistics.median(va), statistics.median(vb)
        spread = max(q(va, .75) - q(va, .25), q(vb, .75) - q(vb, .25))
        out.append(f"{label(s)} " + (f"no difference ({ma:.0f} vs {mb:.0f})" if abs(ma - mb) <= spread else f"{ma / mb:.2f}x ({ma:.0f} vs {mb:.0f})"))
    return "; ".join(out)
idx = {n: i for i, n in enumerate(names)}
pairs = [("cuMemAlloc, cudapool split", "cuMemAlloc, cudapool split (base build)"),
         ("cuMemAlloc, cudapool split expandable", "cuMemAlloc, cudapool split"),
         ("torch.empty+del, caching off, cudapool split", "torch.empty+del, PyTorch's caching allocator"),
         ("torch.empty+del, caching off, cudapool split expandable", "torch.empty+del, PyTorch's caching allocator"),
         ("torch.empty+del, caching off, cudapool split", "torch.empty+del, caching off, cudapool split (base build)")]
print()
for a, b in pairs:
    if a in idx and b in idx:
        print(f"- {a} against {b}: {verdict(idx[a], idx[b])}")
PY
