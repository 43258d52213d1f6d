#!/bin/sh
# A checkpointing application in the manner of SCR's PARTNER scheme, one task per node, run by batch.sh.
# Each step, rank r advances its state and checkpoints it: first to its own node's local storage
# ($VIGIL_ALLOC_TMPDIR/ckpt.r, kept until the batch job ends), then a copy to its partner's (the node of rank r+1 mod
# N, as partner.r), and only then records the step as its last complete checkpoint in $CKPT_ROOT/complete.r (as SCR's
# index in its prefix directory on the shared file system). A relaunched rank resumes from the checkpoint on its node,
# and fails (exit 3) if that is older than its last complete checkpoint: its data was not put where it runs.
# Usage: app.sh STEPS   (environment: CKPT_ROOT; CKPT_HOSTS, the node of each rank in rank order; STEP_S, seconds)
set -eu
rank=$VIGIL_TASK_RANK
dir=${VIGIL_ALLOC_TMPDIR:?not set: run this as a Vigil job}
node=$(vigil getattr hostname)
# The partner's storage, as batch.sh makes it reachable.
partner=$CKPT_ROOT/node.$(echo $CKPT_HOSTS | cut -d' ' -f$(( (rank + 1) % VIGIL_JOB_SIZE + 1 )))
step=0; [ -f "$dir/ckpt.$rank" ] && step=$(cat "$dir/ckpt.$rank")
last=0; [ -f "$CKPT_ROOT/complete.$rank" ] && last=$(cat "$CKPT_ROOT/complete.$rank")
echo "$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ) rank $rank on $node: resuming from step $step (last complete checkpoint: step $last)"
if [ "$step" -lt "$last" ]; then
    echo "rank $rank on $node: ERROR: resuming from step $step, older than its last complete checkpoint (step $last)" >&2
    exit 3
fi
put() { echo "$1" > "$2.tmp" && mv "$2.tmp" "$2"; }
while [ "$step" -lt "$1" ]; do
    sleep "${STEP_S:-0.25}"
    step=$((step + 1))
    put $step "$dir/ckpt.$rank"
    put $step "$partner/partner.$rank"
    put $step "$CKPT_ROOT/complete.$rank"
done
echo "$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ) rank $rank on $node: completed $1 steps"
