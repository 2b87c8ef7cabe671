#!/usr/bin/env bash
# Sleep and wake of two builds side by side on one GPU: `tests/gpu/programs/sleep_wake.cu`
# holding GIB GiB in 256 MiB blocks, each build's process in turn for ROUNDS rounds (the order
# swapped every other round), then each step's median with its 25th and 75th percentiles in GB/s
# (first sleep, wake by a launch, second sleep, wake by the API), and the cycles' time.
#   bash scripts/sleep-ab.sh LIB_A LIB_B [ROUNDS] [GIB] [CYCLES]
# Needs nvcc and a GPU. Prints one line per process run and the table; exits 1 if a run lost
# a byte.
set -u
A=$1 B=$2 ROUNDS=${3:-10} GIB=${4:-8} CYCLES=${5:-5}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
nvcc -O2 -o "$W/sleep_wake" tests/gpu/programs/sleep_wake.cu || exit 1
bad=0
one() { # LABEL LIB ROUND
  local out="$W/$1.$3"
  LD_PRELOAD=$2 timeout 300 "$W/sleep_wake" "$GIB" 256 0 "$CYCLES" > "$out" 2>&1
  grep -q '^sleep_wake ok' "$out" || { bad=1; echo "$1 round $3 FAILED: $(tail -2 "$out" | tr '\n' ' ')"; }
  local s w c
  s=$(sed -n 's/^asleep round=[0-9]* .*sleep_gbs=\([0-9.]*\).*/\1/p' "$out" | paste -sd' ')
  w=$(sed -n 's/^woken round=[0-9]* .*wake_gbs=\([0-9.]*\).*/\1/p' "$out" | paste -sd' ')
  c=$(sed -n 's/^cycles .*each_ms=\([0-9.]*\).*/\1/p' "$out")
  echo "$1 round $3: sleeps $s wakes $w cycles_ms $c"
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then one A "$A" "$r"; one B "$B" "$r"; else one B "$B" "$r"; one A "$A" "$r"; fi
done | tee "$W/rows"
python3 - "$W/rows" <<'PY'
import sys, statistics as st
rows = {"A": [], "B": []}
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 4 or p[0] not in rows or "FAILED" in line:
        continue
    i, j, k = p.index("sleeps"), p.index("wakes"), p.index("cycles_ms")
    s, w = [float(x) for x in p[i + 1:j]], [float(x) for x in p[j + 1:k]]
    if len(s) >= 2 and len(w) >= 2:
        rows[p[0]].append((s[0], w[0], s[1], w[1], float(p[k + 1]) if len(p) > k + 1 else float("nan")))
def q(v):
    v = sorted(v)
    if len(v) < 2:
        return f"{v[0]:.2f}" if v else "-"
    qs = st.quantiles(v, n=4)
    return f"{st.median(v):.2f} ({qs[0]:.2f}-{qs[2]:.2f})"
names = ["first sleep GB/s", "wake by a launch GB/s", "second sleep GB/s", "wake by the API GB/s", "cycle ms"]
print(f"| | A ({len(rows['A'])} runs) | B ({len(rows['B'])} runs) |\n| --- | --- | --- |")
for n, name in enumerate(names):
    print(f"| {name} | {q([r[n] for r in rows['A']])} | {q([r[n] for r in rows['B']])} |")
PY
exit $bad
