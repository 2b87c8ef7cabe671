#!/usr/bin/env bash
# Is a GPU host's pair cost its CPU or the real driver? (issue 26; docs/gpu/host-modes-h100.txt)
# The host's CPU, the cost of an atomic exchange, a compare-and-swap, an indirect call and a
# thread-local add there (scripts/gpu/probe_micro.c); cudapool's own test client on its fake
# driver (no GPU involved) with the one-slot stub and with cudapool, pinned to core 5; then the
# same pairs on the GPU (bench_alloc). Carry target/release/libcudapool.so and target/tmp/preload
# (cargo test builds it). Output under $OUT.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/probe}; mkdir -p $OUT
LIB=$PWD/target/release/libcudapool.so
{
  lscpu | head -25
  cat /sys/devices/system/cpu/cpu5/cpufreq/scaling_governor
  uname -a
  grep . /sys/devices/system/cpu/vulnerabilities/* 2>/dev/null
} >$OUT/host.txt 2>&1
gcc -O2 -o /tmp/micro scripts/gpu/probe_micro.c
gcc -shared -fPIC -O2 -o /tmp/callcount.so scripts/gpu/callcount.c -ldl
nvcc -O2 -o /tmp/bench scripts/gpu/bench_alloc.cu -lcuda
{
  taskset -c 5 /tmp/micro
  cd target/tmp/preload
  for r in 1 2 3 4 5; do
    echo "stub  $(LD_LIBRARY_PATH=. STUB_POOL=1 LD_PRELOAD=/tmp/callcount.so taskset -c 5 ./client_linked link pairs 4096 2000000)"
    echo "pool  $(LD_LIBRARY_PATH=. LD_PRELOAD=$LIB taskset -c 5 ./client_linked link pairs 4096 2000000)"
  done
  cd ../../..
  for r in 1 2 3; do
    echo "gpu stub $(STUB_POOL=1 LD_PRELOAD=/tmp/callcount.so taskset -c 5 /tmp/bench driver sizes | tr '\n' ' ')"
    echo "gpu pool $(LD_PRELOAD=$LIB taskset -c 5 /tmp/bench driver sizes | tr '\n' ' ')"
    echo "gpu pool threads1 $(LD_PRELOAD=$LIB taskset -c 5 /tmp/bench driver threads 1)"
    echo "gpu stub threads1 $(STUB_POOL=1 LD_PRELOAD=/tmp/callcount.so taskset -c 5 /tmp/bench driver threads 1)"
  done
  CALLCOUNT_OUT=$OUT/calls.txt LD_PRELOAD=/tmp/callcount.so /tmp/bench driver sizes >/dev/null
} >$OUT/probe.txt 2>&1
cat $OUT/host.txt $OUT/probe.txt
