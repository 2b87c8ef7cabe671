#!/usr/bin/env bash
# Which driver entry points and streams carry real programs' device work (issue 11), traced
# with scripts/gpu/worktrace.so and no cudapool: a runtime program (static and shared cudart),
# then one PyTorch training step of each workload of train_mem.py, whose kernel launches the
# tracer saw are compared with the kernels PyTorch's profiler saw.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-survey}
mkdir -p "$OUT"
W=$(mktemp -d)
gcc -shared -fPIC -O2 -o "$W/worktrace.so" scripts/gpu/worktrace.c -ldl -lpthread || exit 1
nvcc -O2 -o "$W/rt_static" scripts/gpu/rt_streams.cu && nvcc -O2 -cudart shared -o "$W/rt_shared" scripts/gpu/rt_streams.cu || exit 1
for p in rt_static rt_shared; do
  echo "== $p"
  WORKTRACE_LOG=$W/$p.log LD_PRELOAD=$W/worktrace.so "$W/$p"
  cat "$W/$p.log"
done
for w in gpt cnn; do
  echo "== PyTorch $w, caching off"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 WORKTRACE_LOG=$W/$w.log LD_PRELOAD=$W/worktrace.so python3 scripts/gpu/launch_count.py $w 2>&1 | grep -v '^workload=' | tail -n 3
  cat "$W/$w.log"
done
