#!/usr/bin/env bash
# What makes one process's pairs slow? (issue 26; docs/gpu/host-modes-h100.txt) 12 rounds, a new
# process each time: the 4 KiB pair pinned, with address randomisation off, not pinned, on the
# fake driver (no GPU), under the one-slot stub, and with the thread's context known. Carry
# target/release/libcudapool.so and target/tmp/preload. Output under $OUT.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/probe}; mkdir -p $OUT
LIB=$PWD/target/release/libcudapool.so
gcc -shared -fPIC -O2 -o /tmp/callcount.so scripts/gpu/callcount.c -ldl
nvcc -O2 -o /tmp/bench scripts/gpu/bench_alloc.cu -lcuda
f4() { sed -n 's/^size=4096 ns=\([0-9.]*\)/\1/p'; }
for r in $(seq 1 12); do
  a=$(LD_PRELOAD=$LIB taskset -c 5 /tmp/bench driver sizes | f4)
  b=$(LD_PRELOAD=$LIB taskset -c 5 setarch x86_64 -R /tmp/bench driver sizes | f4)
  c=$(LD_PRELOAD=$LIB /tmp/bench driver sizes | f4)
  d=$(cd target/tmp/preload && LD_LIBRARY_PATH=. LD_PRELOAD=$LIB taskset -c 5 ./client_linked link pairs 4096 1000000 | sed 's/.*ns_per_pair=\([0-9.]*\).*/\1/')
  e=$(STUB_POOL=1 LD_PRELOAD=/tmp/callcount.so taskset -c 5 /tmp/bench driver sizes | f4)
  g=$(LD_PRELOAD=$LIB taskset -c 5 /tmp/bench driver threads 1 | sed 's/.*mpairs=//' | awk '{printf "%.1f", 1000/$1}')
  echo "round $r pinned=$a noaslr=$b unpinned=$c fake=$d stub=$e threads1=$g"
done | tee $OUT/modes.txt
