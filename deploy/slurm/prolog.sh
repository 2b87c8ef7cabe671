#!/bin/bash
# Slurm's root Prolog for cudapool's mandatory mode (slurm.conf: Prolog=/etc/slurm/cudapool/
# prolog.sh, with ProctrackType=proctrack/cgroup and the library in /etc/ld.so.preload: see
# docs/deploying.md). Runs as root on each node before the job: writes the job's share of GPU
# memory per GPU into /run/cudapool/jobs/<jobid>, a file only root can write. Every process of
# the job (Slurm puts it in a cgroup .../job_<jobid>/, which it cannot leave) is then held to it
# in the group slurm-<jobid>, whatever its environment says. A job that asked for no gpumem
# gets no file (no limit), or the site's site_no_gpumem below (a SIZE per GPU).
site_no_gpumem=none
jobs=/run/cudapool/jobs
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
. "$(dirname "$0")/gpumem_share.sh"
share=$(gpumem_share "$SLURM_JOB_ID")
if [ -z "$share" ]; then
  [ "$site_no_gpumem" = none ] && exit 0
  share=$site_no_gpumem
fi
umask 022
mkdir -p "$jobs"
chown root:root /run/cudapool "$jobs"
chmod 755 /run/cudapool "$jobs"
tmp=$(mktemp "$jobs/.$SLURM_JOB_ID.XXXXXX")
printf 'group=slurm-%s\nlimit=%s\n' "$SLURM_JOB_ID" "$share" > "$tmp"
chmod 644 "$tmp"
mv -f "$tmp" "$jobs/$SLURM_JOB_ID"
exit 0
