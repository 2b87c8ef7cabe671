#!/usr/bin/env bash
# Builds side by side on a GPU host (issue 26; docs/gpu/host-modes-h100.txt): the fake-driver pair
# of each build in target/<name>/libcudapool.so (LIBS, default "f9d release tlsd"), 6 rounds
# alternating, pinned to core 5; then scripts/gpu/cpp_lockstep.py with split and the other builds
# (edit BASE_LIB below). Carry the builds and target/tmp/preload. Output under $OUT.
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/probe}; mkdir -p $OUT
{
cd target/tmp/preload
for r in 1 2 3 4 5 6; do
  for l in ${LIBS:-f9d release tlsd}; do
    echo "$r $l $(LD_LIBRARY_PATH=. LD_PRELOAD=$PWD/../../$l/libcudapool.so taskset -c 5 ./client_linked link pairs 4096 1000000 2>&1 | sed 's/.*ns_per_pair=\([0-9.]*\).*/\1/')"
  done
done
} > $OUT/fake.txt 2>&1
cd "$ROOT"
python3 - $OUT/fake.txt <<'PY'
import sys, statistics
d = {}
for line in open(sys.argv[1]):
    r, l, v = line.split()
    d.setdefault(l, []).append(float(v))
for l, v in d.items():
    print(f"fake driver on this host, {l}: median {statistics.median(v):.1f} ns, all {sorted(v)}")
PY
KINDS=split BASE_LIB=f9d=target/f9d/libcudapool.so,tlsdesc=target/tlsd/libcudapool.so python3 scripts/gpu/cpp_lockstep.py ${ROUNDS:-30} > $OUT/cpp.txt 2>$OUT/cpp.err
cat $OUT/cpp.txt; tail -5 $OUT/cpp.err
