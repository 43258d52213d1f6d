#!/usr/bin/env bash
# A one-node Slurm cluster (Debian 12's slurm-wlm 22.05) for tests and benchmarks, every file of it under DIR:
# its own munge key and socket, slurm.conf, state, spool and logs. Nothing system-wide is touched: slurmd runs in
# a private mount namespace whose /sys/fs/cgroup is an empty tmpfs (it must not touch this machine's cgroup v1
# hierarchies, and refuses its hybrid layout with cgroup/v2), with process tracking by /proc.
#
#   ci/slurm-cluster.sh up DIR [CPUS]   start munged, slurmctld, slurmd; wait until the node is idle (CPUS: at
#                                       most what this machine has, its count by default; srun -O runs more)
#   ci/slurm-cluster.sh env DIR         print the environment that points srun/sbatch/squeue at it
#   ci/slurm-cluster.sh down DIR        stop the daemons (the directory is left for its logs)
#
# Two optional environment variables tune the cluster for benchmarks (the defaults are what tests use):
#   SLURM_SCHED_PARAMS   the SchedulerParameters value (default: sched_min_interval=0)
#   SLURM_EXTRA_CONF     more slurm.conf lines, appended as given (e.g. "MaxJobCount=100000")
#
# Then: `SLURM_CONF=DIR/slurm.conf srun -n 4 --mpi=pmi2 CMD`. Needs root and the packages slurm-wlm and munge;
# exits 3 (after saying why) when either is missing, so that callers can skip.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 up|env|down DIR [CPUS]" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

stop() {
    for d in slurmd slurmctld munged; do
        [ -f "$dir/$d.pid" ] || continue
        pid=$(cat "$dir/$d.pid" 2>/dev/null || true)
        [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/$d.pid"
    done
}

case "$cmd" in
env)
    echo "SLURM_CONF=$dir/slurm.conf"
    exit 0
    ;;
down)
    stop
    exit 0
    ;;
up) ;;
*)
    echo "usage: $0 up|env|down DIR [CPUS]" >&2
    exit 2
    ;;
esac

if [ "$(id -u)" -ne 0 ]; then echo "slurm-cluster: needs root" >&2; exit 3; fi
for b in slurmctld slurmd munged srun; do
    command -v "$b" >/dev/null || { echo "slurm-cluster: $b not found (apt-get install slurm-wlm munge)" >&2; exit 3; }
done
cpus=${3:-$(nproc)}
host=$(hostname -s)
# Ports of our own, away from Slurm's defaults (6817/6818), picked per directory so that two clusters can coexist.
base=$((20000 + $(printf '%s' "$dir" | cksum | cut -d' ' -f1) % 20000))
stop
rm -rf "$dir/state" "$dir/spool"
mkdir -p "$dir/state" "$dir/spool"
if [ ! -s "$dir/munge.key" ]; then
    (umask 077 && head -c 1024 /dev/urandom > "$dir/munge.key")
fi
chmod 600 "$dir/munge.key"
cat > "$dir/slurm.conf" <<EOF
ClusterName=vigiltest
SlurmctldHost=$host
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=${SLURM_SCHED_PARAMS:-sched_min_interval=0}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
if [ -n "${SLURM_EXTRA_CONF:-}" ]; then printf '%s\n' "$SLURM_EXTRA_CONF" >> "$dir/slurm.conf"; fi
cat > "$dir/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
EOF
export SLURM_CONF=$dir/slurm.conf
munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
slurmctld -i
# slurmd in a private mount namespace: an empty /sys/fs/cgroup of its own.
unshare -m --propagation private sh -c '
    umount -l /sys/fs/cgroup 2>/dev/null || true
    mount -t tmpfs none /sys/fs/cgroup
    exec slurmd
'
for _ in $(seq 150); do
    state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
    case "$state" in idle*) echo "slurm-cluster: node $host idle ($cpus CPUs), SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
    sleep 0.2
done
echo "slurm-cluster: the node did not become idle (state '${state:-?}'); logs in $dir" >&2
tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1
