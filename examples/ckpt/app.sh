#!/bin/sh
# A checkpointing application (one task per node), SCR-style partner scheme.
# Every STEP_S seconds each rank advances its state, writes a checkpoint to its node's local storage
# ($VIGIL_ALLOC_TMPDIR/ckpt.<rank>: the allocation's, kept across relaunches until the batch job ends), and a copy
# to its partner's node (rank+1 mod size) as partner.<rank>, there reached as $CKPT_ROOT/<node> (see batch.sh).
# On start a rank resumes from the newest checkpoint of its rank it can find on its node; after a relaunch it
# refuses (exit 3) to resume from older than the newest complete one batch.sh found ($CKPT_ROOT/expect.<rank>).
# Usage: app.sh STEPS   (environment: CKPT_ROOT, STEP_S)
set -eu
steps=$1
rank=$VIGIL_TASK_RANK
size=$VIGIL_JOB_SIZE
node=$(vigil getattr hostname)
dir=${VIGIL_ALLOC_TMPDIR:?not set: run this as a Vigil job}
state=0
if [ -f "$dir/ckpt.$rank" ]; then
    state=$(cat "$dir/ckpt.$rank")
    echo "rank $rank on $node: resuming from checkpoint at step $state"
else
    echo "rank $rank on $node: starting from step 0"
fi
if [ -f "$CKPT_ROOT/expect.$rank" ] && [ "$state" -lt "$(cat "$CKPT_ROOT/expect.$rank")" ]; then
    echo "rank $rank on $node: ERROR: would resume at step $state, but its newest checkpoint is at step $(cat "$CKPT_ROOT/expect.$rank")" >&2
    exit 3
fi
partner=$(( (rank + 1) % size ))
# The partner's node: published by each rank in the shared map written at start.
echo "$node" > "$CKPT_ROOT/map.$rank"
while [ "$state" -lt "$steps" ]; do
    sleep "${STEP_S:-0.25}"
    state=$((state + 1))
    echo "$state" > "$dir/ckpt.$rank.tmp" && mv "$dir/ckpt.$rank.tmp" "$dir/ckpt.$rank"
    if [ -f "$CKPT_ROOT/map.$partner" ]; then
        pdir=$CKPT_ROOT/$(cat "$CKPT_ROOT/map.$partner")
        mkdir -p "$pdir" && echo "$state" > "$pdir/partner.$rank.tmp" && mv "$pdir/partner.$rank.tmp" "$pdir/partner.$rank"
    fi
done
echo "rank $rank on $node: completed $steps steps"
