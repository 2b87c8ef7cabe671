#!/bin/sh
# Slurm's root Epilog for cudapool's mandatory mode (slurm.conf: Epilog=/etc/slurm/cudapool/
# epilog.sh): `cudapool slurm epilog` removes the job's share file and its group's folder once
# the job ended on the node. Slurm gives it no PATH: if `cudapool` is
# installed elsewhere, write its full path below.
exec /usr/local/bin/cudapool slurm epilog
