#!/usr/bin/env bash
# Where a job's memory goes (issue 25): for each job of benches/gpu/train_mem.py (GPT and
# ResNet-50 training, GPT-2 generation), the peaks PyTorch's own allocator (default, and
# expandable segments) and cudapool (split with classic and with expandable segments, PyTorch's
# cache off) report: reserved, allocated (blocks handed out) and requested (what the program
# asked for). allocated / requested is the rounding; reserved / requested is what the
# allocator holds for what was asked. On the device, with target/release/libcudapool.so carried:
#   bash benches/gpu/rounding.sh                  (table on stdout; raw lines in $OUT/rounding-raw.txt)
# Each row is one process; the rows of a job run back to back in one session.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-rounding}
mkdir -p "$OUT"
LIB=$PWD/target/release/libcudapool.so
STEPS=${STEPS:-20}
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }
field() { echo "$2" | sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p"; }
row() { # job, allocator, env...
  local job=$1 name=$2 line
  shift 2
  line=$(timeout 300 env "$@" python3 benches/gpu/train_mem.py $job --steps "$STEPS" 2>>"$OUT/rounding.err" |
    tee -a "$OUT/rounding-raw.txt" | grep '^workload=' | head -n 1)
  if [ -z "$line" ]; then echo "| $job | $name | failed (see rounding.err) | | | | | |"; return; fi
  local res all req sps
  res=$(field peak_reserved "$line") all=$(field peak_allocated "$line")
  req=$(field peak_requested "$line") sps=$(field steps_per_s "$line")
  echo "| $job | $name | $(mib "$res") | $(mib "$all") | $(mib "$req") | $(ratio "$all" "$req") | $(ratio "$res" "$req") | $sps |"
}
echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F), bash benches/gpu/rounding.sh (STEPS=$STEPS)"
echo "| job | allocator | peak reserved MiB | peak allocated MiB | peak requested MiB | allocated / requested | reserved / requested | steps/s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for job in ${JOBS:-gpt cnn gen}; do
  row $job "PyTorch default" PYTORCH_CUDA_ALLOC_CONF=
  row $job "PyTorch expandable_segments" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  row $job "cudapool split (PyTorch cache off)" PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB"
  row $job "cudapool split, expandable segments" PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDAPOOL_SEGMENTS=expandable LD_PRELOAD="$LIB"
done
