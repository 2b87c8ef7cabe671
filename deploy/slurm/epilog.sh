#!/bin/bash
# Slurm's root Epilog for cudapool's mandatory mode (slurm.conf: Epilog=/etc/slurm/cudapool/
# epilog.sh): removes the job's share file once the job ended on the node. The group's ledger is
# the user's, removed by the TaskEpilog or the user's next reader.
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
case $SLURM_JOB_ID in *[!0-9]*) exit 0 ;; esac
rm -f "/run/cudapool/jobs/$SLURM_JOB_ID"
exit 0
