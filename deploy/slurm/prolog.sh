#!/bin/sh
# Slurm's root Prolog for cudapool's mandatory mode (slurm.conf: Prolog=/etc/slurm/cudapool/
# prolog.sh; see docs/deploying.md). Everything happens in `cudapool slurm prolog`, which reads
# only what Slurm owns (the job's id, uid, GPUs and TRES per node, never a text the user wrote)
# and writes the job's share into /run/cudapool/jobs/<jobid>. Slurm gives it no PATH: if
# `cudapool` is installed elsewhere, write its full path below. The site's settings: /etc/cudapool/slurm.conf.
exec /usr/local/bin/cudapool slurm prolog
