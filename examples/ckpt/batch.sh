#!/bin/sh
# N+1 checkpoint/restart: run the application on N nodes of an N+1-node allocation; if a node is lost, rebuild
# the lost ranks' checkpoints on the spare from their partner copies and relaunch on the N survivors.
# Usage (inside a Vigil instance): vigil batch -N5 batch.sh APP STEPS   (environment: CKPT_ROOT, STEP_S)
set -u
app=$1
steps=$2
n=$(( $(vigil getattr size) - 1 ))
ts() { date +%s.%N; }
echo "$(ts) launch 1: $n ranks on $n nodes, 1 spare"
vigil run -N"$n" -n"$n" "$app" "$steps"
rc=$?
echo "$(ts) launch 1 ended with exit code $rc"
if [ $rc -ne 0 ]; then
    vigil resource status
    # Nodes still up (their names are the hostnames of the avail ranks).
    avail=$(vigil resource status --json | python3 -c 'import json,sys; print(" ".join(r["hostname"] for r in json.load(sys.stdin)["ranks"] if r["state"]=="avail"))')
    echo "$(ts) surviving nodes: $avail"
    for r in $(seq 0 $((n - 1))); do
        found=""
        for h in $avail; do [ -f "$CKPT_ROOT/$h/ckpt.$r" ] && found=$h; done
        if [ -z "$found" ]; then
            # Lost with its node: take the partner copy (kept on the node of rank r+1) and put it on the spare.
            for h in $avail; do [ -f "$CKPT_ROOT/$h/partner.$r" ] && src=$h; done
            used=$(cat "$CKPT_ROOT"/map.* | sort -u)
            for h in $avail; do echo "$used" | grep -qx "$h" || spare=$h; done
            mkdir -p "$CKPT_ROOT/$spare"
            cp "$CKPT_ROOT/$src/partner.$r" "$CKPT_ROOT/$spare/ckpt.$r"
            echo "$(ts) rebuilt checkpoint of rank $r (step $(cat "$CKPT_ROOT/$spare/ckpt.$r")) on spare $spare from the partner copy on $src"
        fi
    done
    echo "$(ts) launch 2: $n ranks on the $n surviving nodes"
    vigil run -N"$n" -n"$n" "$app" "$steps"
    rc=$?
    echo "$(ts) launch 2 ended with exit code $rc"
fi
exit $rc
