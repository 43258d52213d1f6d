#!/bin/sh
# A checkpointing application in the manner of SCR's PARTNER scheme, one task per node, run by batch.sh.
# Each step, rank r advances its state and checkpoints it: first to its own node's local storage
# ($VIGIL_ALLOC_TMPDIR/ckpt.r.STEP), then a copy to its partner's (the node of rank r+1 mod N, as partner.r.STEP), and
# only then records the step as its last complete checkpoint in $CKPT_ROOT/complete.r (as SCR's index in its prefix
# directory on the shared file system). Each node keeps a rank's two newest checkpoints (SCR's cache of 2).
# The ranks are coupled, as an MPI code exchanging halos every step is: no rank starts a step before every rank has
# completed the one before it (a barrier through $CKPT_ROOT), so no rank is ever more than one step ahead.
# A launch resumes every rank from the same step: the newest checkpoint complete on every rank (the smallest of the
# ranks' complete.r; 0 when one has none), which every rank holds by the two rules above. A rank whose node does not
# hold that checkpoint fails (exit 3): its data was not put where it runs.
# Usage: app.sh STEPS   (environment: CKPT_ROOT; CKPT_HOSTS, the node of each rank in rank order; STEP_S, seconds)
set -eu
steps=$1 rank=$VIGIL_TASK_RANK size=$VIGIL_JOB_SIZE
dir=${VIGIL_ALLOC_TMPDIR:?not set: run this as a Vigil job}
node=$(vigil getattr hostname)
stamp() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; }
# Shell built-ins only from here to the end of a restart and in the barrier, which polls: on a busy node every
# fork waits for a CPU, and a restart is on every rank's critical path.
# The partner's storage, as batch.sh makes it reachable: the node of rank (rank+1) mod size in CKPT_HOSTS.
set -- $CKPT_HOSTS
i=0; while [ $i -lt $(( (rank + 1) % size )) ]; do shift; i=$((i + 1)); done
partner=$CKPT_ROOT/node.$1
# Rank $1's last complete checkpoint (0: none), into $c.
last_of() { c=0; [ -f "$CKPT_ROOT/complete.$1" ] && read -r c < "$CKPT_ROOT/complete.$1"; c=${c:-0}; }
# The newest checkpoint complete on every rank, into $m.
common() {
    m=""; i=0
    while [ $i -lt "$size" ]; do
        last_of $i
        [ -z "$m" ] || [ "$c" -lt "$m" ] && m=$c
        i=$((i + 1))
    done
    m=${m:-0}
}
last_of $rank; last=$c
common; step=$m
echo "$(stamp) rank $rank on $node: resuming from step $step (last complete checkpoint: step $last)"
if [ "$step" -gt 0 ] && ! [ -f "$dir/ckpt.$rank.$step" ]; then
    echo "rank $rank on $node: ERROR: no checkpoint of step $step on this node, the newest checkpoint complete on every rank" >&2
    exit 3
fi
put() { echo "$1" > "$2.tmp" && mv "$2.tmp" "$2"; }
# A newer checkpoint of this rank belongs to a future the restart abandoned: dropped, as SCR drops it.
if [ "$last" -gt "$step" ]; then
    rm -f "$dir/ckpt.$rank.$last"
    put $step "$CKPT_ROOT/complete.$rank"
fi
while [ "$step" -lt "$steps" ]; do
    # The halo exchange: every rank has completed this step.
    while common; [ "$m" -lt "$step" ]; do sleep 0.02; done
    sleep "${STEP_S:-0.25}"
    step=$((step + 1))
    put $step "$dir/ckpt.$rank.$step"
    put $step "$partner/partner.$rank.$step"
    put $step "$CKPT_ROOT/complete.$rank"
    rm -f "$dir/ckpt.$rank.$((step - 2))" "$partner/partner.$rank.$((step - 2))"
done
echo "$(stamp) rank $rank on $node: completed $steps steps"
