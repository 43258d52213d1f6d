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
#   ci/slurm-cluster.sh netns DIR NAME N [CPUS]
#                                       a multi-node cluster on the nodes of `ci/netns-cluster.sh nodes NAME N`:
#                                       slurmctld in node 0's namespace (a login/controller node, no slurmd), one
#                                       slurmd per node 1..N-1, node K named nodeK at its namespace's address. Each
#                                       slurmd runs in its own UTS namespace whose host name is its node name, so
#                                       that it finds its NodeName by host name: no --enable-multiple-slurmd build
#                                       (`slurmd -N`) is needed, and each listens on its own address. Clients must
#                                       run in a node's namespace (`ci/netns-cluster.sh run NAME 0 sinfo`): the
#                                       root namespace has no route to the nodes. Killing a node (`netns-cluster.sh
#                                       kill`) kills its slurmd and its jobs' processes; `down DIR` stops the rest.
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
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 up|env|down DIR [CPUS] | netns DIR NAME N [CPUS]" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

stop() {
    local f d
    for f in "$dir"/slurmd*.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
        [ -f "$f" ] || continue
        d=$(basename "$f" .pid)
        pid=$(cat "$f" 2>/dev/null || true)
        [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$f"
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
up | netns) ;;
*)
    echo "usage: $0 up|env|down DIR [CPUS] | netns DIR NAME N [CPUS]" >&2
    exit 2
    ;;
esac

if [ "$(id -u)" -ne 0 ]; then echo "slurm-cluster: needs root" >&2; exit 3; fi
for b in slurmctld slurmd munged srun; do
    command -v "$b" >/dev/null || { echo "slurm-cluster: $b not found (apt-get install slurm-wlm munge)" >&2; exit 3; }
done
if [ "$cmd" = netns ]; then
    name=${3:?NAME}; nodes=${4:?N}; cpus=${5:-$(nproc)}
    [ "$nodes" -ge 2 ] || { echo "slurm-cluster: netns needs N >= 2 (node 0 is the controller)" >&2; exit 2; }
    netns() { echo "vn-$name-n$1"; }
    addr() { echo "10.200.$(($1 / 200)).$(($1 % 200 + 1))"; }
    ip netns list | grep -q "^$(netns 0) " || { echo "slurm-cluster: no netns cluster $name (ci/netns-cluster.sh nodes $name $nodes)" >&2; exit 2; }
    ctl_host="node0($(addr 0))"
    node_lines=""
    for ((k = 1; k < nodes; k++)); do node_lines+="NodeName=node$k NodeAddr=$(addr $k) CPUs=$cpus State=UNKNOWN"$'\n'; done
    compute="node[1-$((nodes - 1))]"
    # Every slurmd on its own address: Slurm's default ports for all of them.
    base=6817
    # %n: each slurmd's node name, so that they share no file.
    node_files="SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdLogFile=$dir/slurmd-%n.log"
    in_ctl() { ip netns exec "$(netns 0)" "$@"; }
else
    cpus=${3:-$(nproc)}
    host=$(hostname -s)
    ctl_host=$host
    node_lines="NodeName=$host CPUs=$cpus State=UNKNOWN"$'\n'
    compute=$host
    node_files="SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/slurmd.log"
    in_ctl() { "$@"; }
fi
# Ports of our own, away from Slurm's defaults (6817/6818), picked per directory so that two clusters can coexist
# (a netns cluster has addresses of its own).
# Below the kernel's ephemeral range (32768 and up by default), where an outgoing connection can take any port,
# and moved on past ports something already listens on: slurmctld exits at once on "Address already in use", and
# the cluster would only be found dead when its node never became idle.
if [ "$cmd" != netns ]; then
    base=$((20000 + $(printf '%s' "$dir" | cksum | cut -d' ' -f1) % 12000))
    while ss -Htln "( sport = :$base or sport = :$((base + 1)) )" 2>/dev/null | grep -q .; do
        base=$((base + 2))
    done
fi
stop
rm -rf "$dir/state" "$dir/spool"
mkdir -p "$dir/state" "$dir/spool"
if [ ! -s "$dir/munge.key" ]; then
    (umask 077 && head -c 1024 /dev/urandom > "$dir/munge.key")
fi
chmod 600 "$dir/munge.key"
cat > "$dir/slurm.conf" <<EOF
ClusterName=vigiltest
SlurmctldHost=$ctl_host
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
$node_files
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
${node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
if [ -n "${SLURM_EXTRA_CONF:-}" ]; then printf '%s\n' "$SLURM_EXTRA_CONF" >> "$dir/slurm.conf"; fi
cat > "$dir/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
EOF
export SLURM_CONF=$dir/slurm.conf
munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
if [ "$cmd" = netns ]; then
    # slurmctld finds itself in SlurmctldHost by host name, too.
    in_ctl unshare -u sh -c 'hostname node0 && exec slurmctld -i'
else
    slurmctld -i
fi
# slurmd in a private mount namespace: an empty /sys/fs/cgroup of its own.
start_slurmd='
    umount -l /sys/fs/cgroup 2>/dev/null || true
    mount -t tmpfs none /sys/fs/cgroup
    [ -n "${NODE:-}" ] && hostname "$NODE"
    exec slurmd
'
if [ "$cmd" = netns ]; then
    for ((k = 1; k < nodes; k++)); do
        mkdir -p "$dir/spool/node$k"
        NODE=node$k ip netns exec "$(netns $k)" unshare -m -u --propagation private sh -c "$start_slurmd"
    done
else
    unshare -m --propagation private sh -c "$start_slurmd"
fi
for _ in $(seq 150); do
    state=$(in_ctl timeout 5 sinfo -h -n "$compute" -o %T 2>/dev/null | sort -u | tr '\n' ' ' || true)
    case "$state" in "idle ") echo "slurm-cluster: $compute idle ($cpus CPUs each), SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
    sleep 0.2
done
echo "slurm-cluster: $compute did not become idle (state '${state:-?}'); logs in $dir" >&2
tail -n 5 "$dir"/slurm*.log >&2 || true
stop
exit 1
