#!/bin/sh
# N+1 checkpoint/restart: run the application on N nodes of an N+1-node allocation; if a node is lost, put every
# rank's newest checkpoint on the node where the relaunch will run it (rebuilt from its partner copy when its own
# node died with it), and relaunch on the N surviving nodes. Works whichever application node, or the spare, dies.
# Checkpoints live in node-local storage, each node's VIGIL_ALLOC_TMPDIR, which the relaunch finds as the first launch
# left it and which goes when this batch job ends. The rebuild below and app.sh's partner copies reach another
# node's as $CKPT_ROOT/<node>, a symbolic link: the "nodes" of ci/netns-cluster.sh share one file system (on a
# cluster those copies go over the network, as SCR's do over MPI). At the end the last checkpoints are flushed to
# $CKPT_ROOT/<node>, real directories in place of the links, which outlive the allocation.
# Usage (inside a Vigil instance): vigil batch -N5 batch.sh APP STEPS   (environment: CKPT_ROOT, STEP_S)
# Exit code: the last launch's; 3 if a rank would resume from a checkpoint older than its newest complete one.
set -u
app=$1
steps=$2
n=$(( $(vigil getattr size) - 1 ))
ts() { date +%s.%N; }
# Every node's local storage as $CKPT_ROOT/<node>, the spare's too (replacing what a previous run flushed there).
# Where brokers share a host name (vigil start --test-size) one link wins: the partner scheme is not exercised there.
vigil run -N$((n + 1)) -n$((n + 1)) sh -c \
    'l=$CKPT_ROOT/$(vigil getattr hostname); rm -rf "$l"; ln -s "$VIGIL_ALLOC_TMPDIR" "$l" 2>/dev/null || [ -L "$l" ]' ||
    exit 1
flush() {
    for l in "$CKPT_ROOT"/*; do
        [ -L "$l" ] || continue
        if cp -R "$l/." "$l.flush" 2>/dev/null; then rm "$l" && mv "$l.flush" "$l"; else rm -rf "$l.flush"; fi
    done
}
trap flush EXIT
echo "$(ts) launch 1: $n ranks on $n nodes of ${VIGIL_JOB_NODELIST:-the allocation}, 1 spare"
vigil run -N"$n" -n"$n" "$app" "$steps"
rc=$?
echo "$(ts) launch 1 ended with exit code $rc"
if [ $rc -ne 0 ]; then
    vigil resource status
    # The nodes still up, in rank order: the relaunch puts rank r on the r-th of them (first fit in rank order).
    avail=$(vigil resource status --json | python3 -c 'import json,sys; print(" ".join(r["hostname"] for r in sorted(json.load(sys.stdin)["ranks"], key=lambda r: r["rank"]) if r["state"]=="avail"))')
    if [ "$(vigil hostlist -c $avail)" -lt "$n" ]; then
        echo "$(ts) only $(vigil hostlist -c $avail) nodes left ($(vigil hostlist $avail)), $n needed: giving up"
        exit $rc
    fi
    targets=$(vigil hostlist -e -L "$n" $avail)
    echo "$(ts) surviving nodes: $(vigil hostlist $avail); relaunch on $(vigil hostlist $targets)"
    r=0
    for target in $targets; do
        # The rank's newest complete checkpoint: its own copy where its node survives, else (or if newer) the
        # partner copy.
        best=""; step=-1; from=""
        for f in ckpt partner; do
            for h in $avail; do
                if [ -f "$CKPT_ROOT/$h/$f.$r" ] && [ "$(cat "$CKPT_ROOT/$h/$f.$r")" -gt "$step" ]; then
                    best=$CKPT_ROOT/$h/$f.$r; step=$(cat "$best"); from=$h
                fi
            done
        done
        if [ -z "$best" ]; then
            echo "$(ts) no checkpoint of rank $r survives: it restarts from step 0"
            step=0
        elif [ "$best" != "$CKPT_ROOT/$target/ckpt.$r" ]; then
            mkdir -p "$CKPT_ROOT/$target"
            cp "$best" "$CKPT_ROOT/$target/ckpt.$r.tmp" && mv "$CKPT_ROOT/$target/ckpt.$r.tmp" "$CKPT_ROOT/$target/ckpt.$r"
            case "$best" in
                */partner.*) what="rebuilt checkpoint of rank $r (step $step) on $target from the partner copy on $from" ;;
                *) what="moved checkpoint of rank $r (step $step) from $from to $target" ;;
            esac
            # The spare, by name: a node not in the first launch's placement.
            grep -qx "$target" "$CKPT_ROOT"/map.* || what="$what (the spare)"
            echo "$(ts) $what"
        fi
        # What the rank must resume from: app.sh refuses anything older (exit 3).
        echo "$step" > "$CKPT_ROOT/expect.$r"
        r=$((r + 1))
    done
    echo "$(ts) launch 2: $n ranks on the $n surviving nodes"
    vigil run -N"$n" -n"$n" -w "$(vigil hostlist $targets)" "$app" "$steps"
    rc=$?
    echo "$(ts) launch 2 ended with exit code $rc"
fi
exit $rc
