#!/bin/bash
# Slurm TaskProlog for cudapool (slurm.conf: TaskProlog=/etc/slurm/cudapool/task_prolog.sh).
# Runs as the job's user before each task; what it prints as `export NAME=value` enters the
# task's environment. It gives the job one cudapool group on this node, `slurm-<jobid>`, whose
# limit per GPU is the job's share of the count-only GRES `gpumem` on this node, read from
# Slurm's own record of the job (scontrol), never from a variable the user sets:
#
#   sbatch --gres=gpumem:20G ...   ->   CUDAPOOL_GROUP=slurm-<jobid>, CUDAPOOL_GROUP_LIMIT=<share>
#
# The share is split evenly over the GPUs the task sees (CUDA_VISIBLE_DEVICES, which Slurm sets
# when the job also asks for GPUs): 40G over two GPUs is 20 GiB on each. A job that asked for no
# gpumem gets site_no_gpumem below: "none" (the default: no group, no limit), or a SIZE
# per GPU every such job is held to.
#
# The site sets one thing, where the library is: site_library below, or else the library of
# the `cudapool` command on PATH (`cudapool config --libdir`, a pip install's).
site_library=""
site_no_gpumem=none

say() { echo "print cudapool task prolog: $*"; }
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
lib=$site_library
if [ -z "$lib" ] && command -v cudapool >/dev/null 2>&1; then
  lib="$(cudapool config --libdir 2>/dev/null)/libcudapool.so"
fi
if [ ! -f "$lib" ]; then
  say "no libcudapool.so (set site_library in $0): the job runs without cudapool"
  exit 0
fi
# This node's part of the job's gpumem per GPU, from Slurm's own record (gpumem_share.sh).
. "$(dirname "$0")/gpumem_share.sh"
share=$(gpumem_share "$SLURM_JOB_ID")
if [ -z "$share" ]; then
  [ "$site_no_gpumem" = none ] && exit 0
  limit=$site_no_gpumem
else
  limit=$share
fi
echo "export LD_PRELOAD=$lib${LD_PRELOAD:+:$LD_PRELOAD}"
echo "export CUDAPOOL_GROUP=slurm-$SLURM_JOB_ID"
echo "export CUDAPOOL_GROUP_LIMIT=$limit"
