#!/bin/bash
# Slurm TaskEpilog for cudapool (slurm.conf: TaskEpilog=/etc/slurm/cudapool/task_epilog.sh).
# Runs as the job's user after each task. A group's last member removes its ledger
# (group-slurm-<jobid> in the user's runtime directory) as it exits; one whose last member was
# killed holds nothing and no live member: `cudapool stat` reads it, and a reader removes a
# ledger of its user in which no member lives (behind the ledger's door: never while a member
# joins or lives). An earlier task's epilog leaves it, since later tasks still live in it.
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
cli=$(command -v cudapool 2>/dev/null) || exit 0
"$cli" stat > /dev/null 2>&1 || true
exit 0
