# Sourced by the prologs of deploy/slurm/. gpumem_share JOBID prints the job's share of GPU
# memory per GPU on this node, in bytes, as Slurm recorded it (scontrol: the node's GRES, else
# the job's TresPerNode or JOB_GRES; never a variable the user sets), split evenly over the GPUs
# the job sees (CUDA_VISIBLE_DEVICES, or in a root prolog SLURM_JOB_GPUS; one if neither is
# set). Prints nothing when the job asked for no gpumem.
gpumem_share() {
  local job=$1 node record share bytes gpus visible
  node=$(hostname -s)
  record=$(scontrol show job -d "$job" 2>/dev/null) || return 0
  share=$(awk -v node="$node" '
    /^ *Nodes=/ {
      split($1, a, "="); nodes = a[2]; gres = ""
      for (i = 2; i <= NF; i++) if ($i ~ /^GRES=/) gres = substr($i, 6)
      cmd = "scontrol show hostnames " nodes
      while ((cmd | getline h) > 0) if (h == node) mine = gres
      close(cmd)
    }
    { for (i = 1; i <= NF; i++) {
        if ($i ~ /^JOB_GRES=/) job = substr($i, 10)
        if ($i ~ /^TresPerNode=/) per = substr($i, 13)
    } }
    END { print (mine != "" ? mine : per != "" ? per : job) }' <<< "$record" | tr ',' '\n' |
    sed -n -e 's/^gpumem[^(]*(CNT:\([0-9]*\)).*$/\1/p' \
      -e 's/^\(gres[:/]\)\{0,1\}gpumem\(:[^:]*\)*[:=]\([0-9][0-9.]*[KMGTP]\{0,1\}\)$/\3/p' | head -1)
  [ -n "$share" ] || return 0
  # Slurm's K/M/G/T/P are powers of 1024.
  bytes=$(awk -v s="$share" 'BEGIN {
    u = substr(s, length(s)); n = s; m = 1
    if (u ~ /[KMGTP]/) { n = substr(s, 1, length(s) - 1); m = 1024 ^ index("KMGTP", u) }
    printf "%.0f", n * m }')
  visible=${CUDA_VISIBLE_DEVICES:-${SLURM_JOB_GPUS:-}}
  gpus=1
  [ -n "$visible" ] && gpus=$(tr ',' '\n' <<< "$visible" | grep -c .)
  echo $((bytes / gpus))
}
