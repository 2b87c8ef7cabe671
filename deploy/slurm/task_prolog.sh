#!/bin/sh
# Slurm TaskProlog for cudapool (slurm.conf: TaskProlog=/etc/slurm/cudapool/task_prolog.sh).
# Runs as the job's user before each task; `cudapool slurm task-prolog` prints the exports that
# put the task in the group slurm-<jobid>, held to the job's gpumem share per GPU on this node
# (Slurm's record of the job, split over the task's GPUs, rounded up):
#
#   sbatch --gres=gpumem:20G ...   ->   CUDAPOOL_GROUP=slurm-<jobid>, CUDAPOOL_GROUP_LIMIT=<share>
#
# The site's settings (the share of a job that asked for no gpumem, the library's path) are in
# /etc/cudapool/slurm.conf, read by the root Prolog too: one place. These exports are a
# convenience: the mandatory mode (prolog.sh) does not depend on them.
command -v cudapool >/dev/null 2>&1 || { echo "print cudapool task prolog: no cudapool command on PATH: the job runs without cudapool"; exit 0; }
exec cudapool slurm task-prolog
