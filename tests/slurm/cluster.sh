#!/usr/bin/env bash
# A real Slurm on this machine for the tests (tests/slurm.rs): Debian's slurm-wlm (munged,
# slurmctld and slurmd as root on localhost), GPU memory as the count-only GRES `gpumem`
# (1024M on the node), cudapool's TaskProlog and TaskEpilog from deploy/slurm/.
#
#   bash tests/slurm/cluster.sh start DIR    installs what is missing (apt, as root), writes the
#                                           configuration into DIR, starts the daemons and waits
#                                           for the node; prints "slurm ready"
#   bash tests/slurm/cluster.sh stop DIR     stops them
#   PROCTRACK=cgroup ... start DIR           tasks in Slurm's cgroups (cgroup v1 here), each
#                                           job's in .../job_<id>/: for the mandatory mode
#   PREEMPT=1 ... start DIR                  three more partitions: jobs of \`urgent\` preempt
#                                           jobs of \`low\` by suspending them; jobs of
#                                           \`slices\` share the CPUs in 5 s time slices
#   GPUMEM=2048M ... start DIR               the node's gpumem count (1024M by default)
#
# Jobs then need SLURM_CONF=DIR/slurm.conf. Nothing outside DIR is configured; the daemons'
# state lives in DIR. DIR, DEPLOY_DIR (the TaskProlog's folder, deploy/slurm by default) and
# what the jobs run must be where the job's user can read them (tests/slurm.rs stages them).
set -euo pipefail
cmd=$1 dir=$(realpath -m "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
case $cmd in
stop)
  for p in slurmd slurmctld slurmdbd; do
    [ -f "$dir/$p.pid" ] && kill "$(cat "$dir/$p.pid")" 2>/dev/null || true
  done
  [ -f "$dir/munged.pid" ] && kill "$(cat "$dir/munged.pid")" 2>/dev/null || true
  [ -f "$dir/db/mariadb.pid" ] && kill "$(cat "$dir/db/mariadb.pid")" 2>/dev/null || true
  exit 0
  ;;
start) ;;
*) echo "usage: cluster.sh start|stop DIR" >&2; exit 2 ;;
esac
# The daemons (munged, slurmctld, slurmd) and dpkg's tools live in the system's sbin folders,
# which a minimal PATH (CI's) leaves out.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
[ "$(id -u)" = 0 ] || { echo "slurm: not root: no cluster (daemons run as root)"; exit 3; }
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v srun >/dev/null; then
  echo "slurm: installing Debian's slurm-wlm and munge" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi
# Slurm's accounting (sacct): slurmdbd and a MariaDB of our own, on loopback ports, in DIR.
if [ "${ACCOUNTING:-}" = 1 ] && { ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; }; then
  echo "slurm: installing Debian's slurmdbd and mariadb-server" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurmdbd mariadb-server >/dev/null
fi
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
# Two ordinary users for the hostile cases (Slurm runs jobs only of users it can look up):
# uid 1001 submits, uid 1002 is its neighbour. Made only where those uids are free.
for u in 1001 1002; do
  getent passwd "$u" >/dev/null || useradd --uid "$u" --no-create-home --no-user-group \
    --gid nogroup --home-dir /nonexistent --shell /bin/sh "cudapool-test-$u"
done
# Slurm's cgroups need a writable cgroup v1 freezer hierarchy; elsewhere the tasks are tracked
# by pid (the mandatory mode's case is then not run).
if [ "${PROCTRACK:-}" = cgroup ] && [ ! -w /sys/fs/cgroup/freezer ]; then
  echo "slurm: no writable cgroup v1 freezer: tasks tracked by pid" >&2
  PROCTRACK=linuxproc
fi
echo "${PROCTRACK:-linuxproc}" > "$dir/proctrack"
node=$(hostname -s)
cpus=$(nproc)
ACCOUNTING_LINES=""
if [ "${ACCOUNTING:-}" = 1 ]; then
  # The lines a site adds for accounting (docs/deploying.md): GPUs and the gpumem GRES as TRES.
  ACCOUNTING_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=16819
AccountingStoragePass=$dir/munge/munge.socket
AccountingStorageTRES=gres/gpu,gres/gpumem
JobAcctGatherType=jobacct_gather/none"
fi
cat > "$dir/slurm.conf" <<CONF
ClusterName=cudapool-test
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/${PROCTRACK:-linuxproc}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=600
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
MpiDefault=none
${ACCOUNTING_LINES:-}
# What a site adds for cudapool (docs/deploying.md):
GresTypes=gpumem
TaskProlog=${DEPLOY_DIR:-$root/deploy/slurm}/task_prolog.sh
TaskEpilog=${DEPLOY_DIR:-$root/deploy/slurm}/task_epilog.sh
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus Gres=gpumem:${GPUMEM:-1024M} State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4${PREEMPT:+ PreemptMode=OFF}
CONF
if [ "${PREEMPT:-}" = 1 ]; then
  # Preemption by suspend, as a site with a GPU partition configures it (docs/deploying.md):
  # a job of \`urgent\` suspends jobs of \`low\` whose resources it needs; \`test\` is left out.
  # Slurm keeps a suspended job's GRES counted: the preemptor's gpumem must fit beside it.
  cat >> "$dir/slurm.conf" <<CONF
PreemptType=preempt/partition_prio
PreemptMode=SUSPEND,GANG
SchedulerTimeSlice=5
PartitionName=low Nodes=$node MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=SUSPEND OverSubscribe=FORCE:1
PartitionName=urgent Nodes=$node MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF OverSubscribe=FORCE:1
PartitionName=slices Nodes=$node MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=GANG OverSubscribe=FORCE:2
CONF
fi
echo "NodeName=$node Name=gpumem Count=${GPUMEM:-1024M}" > "$dir/gres.conf"
printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n' > "$dir/cgroup.conf"
if [ -n "${SLURM_PROLOG:-}" ]; then
  # As a site installs them: the files of deploy/slurm/ with the path of its `cudapool` written
  # in (Slurm gives its prologs no PATH).
  for p in prolog epilog; do
    src=$SLURM_PROLOG; [ $p = epilog ] && src=$SLURM_EPILOG
    sed "s|/usr/local/bin/cudapool|${CUDAPOOL_BIN_DIR:?}/cudapool|" "$src" > "$dir/$p.sh"
    chmod 755 "$dir/$p.sh"
  done
  printf 'Prolog=%s\nEpilog=%s\n' "$dir/prolog.sh" "$dir/epilog.sh" >> "$dir/slurm.conf"
fi
# munged of our own, on a socket in DIR (the machine's, if any, is left alone).
if [ ! -f /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key >/dev/null 2>&1 ||
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
  chmod 600 /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key 2>/dev/null || true
fi
munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munged.pid" \
  --seed-file="$dir/munge/seed" --log-file="$dir/munged.log" 2>/dev/null
export SLURM_CONF=$dir/slurm.conf
if [ "${ACCOUNTING:-}" = 1 ]; then
  rm -rf "$dir/db" && mkdir -p "$dir/db"
  mariadb-install-db --no-defaults --datadir="$dir/db/data" --user=root --auth-root-authentication-method=socket >/dev/null 2>&1
  mariadbd --no-defaults --datadir="$dir/db/data" --user=root --socket="$dir/db/sock" \
    --port=13306 --bind-address=127.0.0.1 --pid-file="$dir/db/mariadb.pid" \
    --log-error="$dir/db/error.log" --skip-log-bin >/dev/null 2>&1 &
  for _ in $(seq 100); do [ -S "$dir/db/sock" ] && break; sleep 0.1; done
  mariadb --no-defaults --socket="$dir/db/sock" -u root -e \
    "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'cudapool-test'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  cat > "$dir/slurmdbd.conf" <<DBD
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort=16819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=13306
StorageUser=slurm
StoragePass=cudapool-test
StorageLoc=slurm_acct_db
PidFile=$dir/slurmdbd.pid
LogFile=$dir/slurmdbd.log
DBD
  chmod 600 "$dir/slurmdbd.conf"
  # slurmdbd reads the slurmdbd.conf beside SLURM_CONF.
  SLURM_CONF=$dir/slurm.conf slurmdbd
  for _ in $(seq 100); do sacctmgr -i add cluster cudapool-test >/dev/null 2>&1 && break; sleep 0.2; done
  sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx cudapool-test || { echo "slurm: slurmdbd did not come up" >&2; tail -5 "$dir/slurmdbd.log" >&2; exit 1; }
fi
slurmctld -f "$dir/slurm.conf"
slurmd -f "$dir/slurm.conf" -N "$node"
for _ in $(seq 100); do
  if sinfo -h -o '%T' 2>/dev/null | grep -q 'idle'; then
    echo "slurm ready"
    exit 0
  fi
  sleep 0.2
done
echo "slurm: the node did not come up" >&2
tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2
exit 1
