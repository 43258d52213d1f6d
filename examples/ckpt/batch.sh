#!/bin/sh
# N+1 checkpoint/restart in the manner of SCR: run app.sh's N ranks on N nodes and keep a spare; when a node dies,
# rebuild its rank's checkpoint on the spare from the partner copy and relaunch on N good nodes, each rank where its
# checkpoint is (a host file task map), all inside this batch job, without going back to the queue.
# This script runs on the allocation's first node, rank 0 of the batch job's instance, whose loss ends the job (as
# the batch host's does under any batch system): the ranks run on the N+1 other nodes, the last one being the spare.
# Usage: vigil batch -N$((N+2)) batch.sh APP STEPS   (environment: CKPT_ROOT, a directory every node sees; STEP_S)
# Every relaunch resumes every rank from the same step, the newest checkpoint complete on every rank (app.sh says why
# that is every rank's last or the one before), as an SCR restart of a coupled code does.
# Exit code: the last launch's (0: every rank completed; 3: app.sh found a rank's node without the checkpoint it
# resumes from); 75 (EX_TEMPFAIL) if a rank's node was lost with no spare left, or with its partner's node,
# also while the storage was set up; 64 (EX_USAGE) for a CKPT_SCHED it does not know; 71 (EX_OSERR) if setting up the
# nodes' storage failed with no node lost (the reason is on standard error). Every line it prints starts with the
# time in UTC, ISO 8601 with microseconds (2026-12-06T21:55:43.123456Z), as app.sh's do.
#
# The few commands that differ between batch systems are the functions below, chosen by CKPT_SCHED: `vigil` (the
# default), or `slurm` (the default inside a Slurm job: `sbatch --no-kill -N$((N+2)) batch.sh APP STEPS`, which
# vigil-bench ckpt runs beside Vigil; app.sh then needs a `vigil` on PATH that answers `getattr hostname`).
set -u
app=$1 steps=$2
say() { echo "$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ) $*"; }
has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }
# The K-th of the words after K, into $word (built-ins only: no fork).
word() { k=$1; shift; while [ "$k" -gt 1 ]; do shift; k=$((k - 1)); done; word=${1:-}; }
sched=${CKPT_SCHED:-$([ -n "${SLURM_JOB_NODELIST:-}" ] && echo slurm || echo vigil)}
case $sched in
vigil)
    # The allocation's nodes but this one, one a word.
    other_nodes() { vigil hostlist -e -x "$(vigil getattr hostname)" "$VIGIL_JOB_NODELIST"; }
    # Hosts as one compressed host list, for the log.
    compress() { vigil hostlist "$@"; }
    # Each node's storage, reached from the others as $CKPT_ROOT/node.HOST. On a cluster the partner copies and the
    # rebuild go over the network (SCR's go over MPI); the nodes of ci/netns-cluster.sh share a file system, where a
    # link to each node's VIGIL_ALLOC_TMPDIR stands in for that.
    storage() {
        vigil run -N$# -n$# -w "$(vigil hostlist "$@")" \
            sh -c 'ln -sfn "$VIGIL_ALLOC_TMPDIR" "$CKPT_ROOT/node.$(vigil getattr hostname)"'
    }
    hostfile=$VIGIL_ALLOC_TMPDIR/hosts
    # The application on $hosts, rank r on line r+1 of $hostfile.
    launch_app() { CKPT_HOSTS="$hosts" vigil run -N$n -n$n --taskmap=hostfile:"$hostfile" "$app" "$steps"; }
    # The nodes this instance lost (it never gets them back), one a word.
    lost_nodes() { vigil resource status -s lost,down -no '{nodelist}' | vigil hostlist -e -; }
    ;;
slurm)
    other_nodes() { scontrol show hostnames "$SLURM_JOB_NODELIST" | grep -vx "$(hostname)" | tr '\n' ' '; }
    compress() { echo "$*"; }
    # No per-allocation node-local directory there: a directory of CKPT_ROOT for each node.
    storage() { for h in "$@"; do mkdir -p "$CKPT_ROOT/node.$h"; done; }
    hostfile=$CKPT_ROOT/hosts
    # app.sh's Vigil variables from Slurm's; the lost nodes excluded, or srun waits for them.
    launch_app() {
        SLURM_HOSTFILE=$hostfile CKPT_HOSTS="$hosts" srun --overlap -n$n --distribution=arbitrary \
            ${lost:+--exclude=$(echo $lost | tr ' ' ,)} sh -c 'VIGIL_TASK_RANK=$SLURM_PROCID \
            VIGIL_JOB_SIZE=$SLURM_NTASKS VIGIL_ALLOC_TMPDIR=$CKPT_ROOT/node.$(hostname) exec "$0" "$1"' "$app" "$steps"
    }
    lost_nodes() { sinfo -h -N -t down,drain,fail -n "$SLURM_JOB_NODELIST" -o %N | sort -u | tr '\n' ' '; }
    ;;
*) echo "batch.sh: CKPT_SCHED=$sched: vigil or slurm expected" >&2; exit 64 ;;
esac

others=$(other_nodes)
n=$(( $(echo $others | wc -w) - 1 ))
rm -rf "$CKPT_ROOT"/node.* "$CKPT_ROOT"/complete.*
# Each node's storage, made reachable from the others. A node lost meanwhile is left out (its storage with it) and
# the step is tried again on the rest (it is idempotent); the ranks go on the first n nodes left, the spares after.
setup=1
while :; do
    say "setting up storage on $(compress $others)"
    storage $others && break
    rc=$?
    lost=$(lost_nodes)
    [ -n "$lost" ] || { sleep 1; lost=$(lost_nodes); }    # a verdict may come just after the launch ended
    left=""
    for h in $others; do has "$lost" $h && { rm -rf "$CKPT_ROOT/node.$h"; continue; }; left="$left $h"; done
    [ "$left" != "$(printf ' %s' $others)" ] || { say "setting up storage failed (exit code $rc), no node lost: giving up" >&2; exit 71; }
    say "lost while setting up storage: $(compress $lost)"
    others=${left# }
    [ $(echo $others | wc -w) -ge $n ] || { say "fewer than $n nodes left for $n ranks: giving up"; exit 75; }
    setup=$((setup + 1))
    [ $setup -le 4 ] || { say "setting up storage failed $((setup - 1)) times: giving up"; exit 75; }
done
hosts=$(echo $others | cut -d' ' -f1-$n)    # rank r runs on the (r+1)-th of them
spares=$(echo $others | cut -d' ' -f$((n + 1))-)
launch=1 lost=""
while :; do
    printf '%s\n' $hosts > "$hostfile"    # line r+1: the node of rank r
    say "launch $launch: ranks 0-$((n - 1)) on $(compress $hosts), spare: ${spares:-none}"
    launch_app
    rc=$?
    say "launch $launch ended with exit code $rc"
    # Which nodes died, if any.
    lost=$(lost_nodes)
    say "lost nodes: ${lost:-none}"
    for h in $lost; do rm -rf "$CKPT_ROOT/node.$h"; done
    left=""; for h in $spares; do has "$lost" $h || left="$left $h"; done; spares=$left
    # Where every rank resumes: the newest checkpoint complete on every rank (app.sh's rule, SCR's index).
    # Shell built-ins only (no $(cat ...)): every fork on this path waits for a CPU on a busy node.
    restart=""
    r=0; while [ $r -lt $n ]; do
        c=0; [ -f "$CKPT_ROOT/complete.$r" ] && read -r c < "$CKPT_ROOT/complete.$r"; c=${c:-0}
        [ -z "$restart" ] || [ "$c" -lt "$restart" ] && restart=$c
        r=$((r + 1))
    done
    r=0 relaunch="" moved=""
    for h in $hosts; do
        if has "$lost" $h; then
            set -- $spares
            [ $# -gt 0 ] || { say "rank $r lost its node $h and no spare is left: giving up"; exit 75; }
            word $(( (r + 1) % n + 1 )) $hosts; p=$word    # rank r+1's node holds rank r's partner copy
            has "$lost" $p && { say "rank $r lost its node $h and its partner copy on $p: giving up"; exit 75; }
            if [ "$restart" -eq 0 ]; then
                say "no checkpoint is complete on every rank: rank $r starts over on $1"
            elif cp "$CKPT_ROOT/node.$p/partner.$r.$restart" "$CKPT_ROOT/node.$1/ckpt.$r.$restart" 2>/dev/null; then
                say "rebuilt rank $r's checkpoint (step $restart) on $1 from its partner copy on $p"
            else
                # Without it no step is complete on every rank any more: every rank starts over.
                say "no partner copy of rank $r's step $restart on $p: every rank starts over"
                rm -f "$CKPT_ROOT"/complete.*; restart=0
            fi
            h=$1 moved=1; shift; spares=$*
        fi
        relaunch="$relaunch $h" r=$((r + 1))
    done
    [ -n "$moved" ] || exit $rc    # no rank lost its node: done, or the application failed by itself
    say "every rank resumes from step $restart, the newest checkpoint complete on every rank"
    hosts=$relaunch launch=$((launch + 1))
done
