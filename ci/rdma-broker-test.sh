#!/usr/bin/env bash
# A 2-broker system instance on the two soft-RoCE addresses with the overlay on RDMA, running jobs.
# Called by ci/rdma-tests.sh (inside the rxe-vm harness or on a kernel with rdma_rxe):
#   ci/rdma-broker-test.sh BIN_DIR ADDR0 ADDR1 OUT_DIR
# Checks: both links choose rdma (tbon.transport=rdma, so a fallback would fail the start), `vigil overlay
# status` and `vigil uptime` say rdma, jobs run across both ranks, `vigil ping 1` answers, with completion events
# and again with busy polling (tbon.rdma_poll=busy); then, with
# tbon.transport=auto on loopback (no device serves 127.0.0.1), the instance falls back to tcp and says why.
set -uo pipefail
BIN=$1 A0=$2 A1=$3 OUT=$4
export PATH=$BIN:$PATH
T=$(mktemp -d /tmp/vigil-rdma-broker.XXXXXX)
trap 'kill $P1 2>/dev/null; rm -rf "$T"' EXIT
fail() { echo "rdma-broker-test: FAIL: $*"; exit 1; }

vigil keygen --force "$T/overlay.key" 2>/dev/null || fail "vigil keygen"
cat > "$T/vigil.toml" <<EOF
[bootstrap]
instance = "rdma-test"
overlay_key = "$T/overlay.key"
hosts = [
  { host = "n0", bind = "tcp://$A0:8050", connect = "tcp://$A0:8050" },
  { host = "n1", bind = "tcp://$A1:8050", connect = "tcp://$A1:8050" },
]
EOF
cat > "$T/initial.sh" <<'EOF'
#!/bin/bash
set -e
vigil overlay status
vigil uptime
vigil run -N2 -n2 -l hostname
vigil run -N2 -n4 -l echo task-ran
id=$(vigil submit -N2 -n2 true)
vigil job wait "$id"
vigil ping 1
EOF
chmod +x "$T/initial.sh"

# One run of the instance with these extra attributes (both ranks); output and logs under $T/$1.
run_instance() {
    local tag=$1
    shift
    local extra=()
    for a in "$@"; do extra+=(-S "$a"); done
    mkdir -p "$T/$tag/r0" "$T/$tag/r1"
    vigil broker --config "$T/vigil.toml" --rank 1 --rundir "$T/$tag/r1" -S tbon.transport=rdma -S log-level=info \
        "${extra[@]}" >"$T/$tag/r1.log" 2>&1 &
    P1=$!
    timeout 120 vigil broker --config "$T/vigil.toml" --rank 0 --rundir "$T/$tag/r0" -S tbon.transport=rdma \
        -S log-level=info "${extra[@]}" "$T/initial.sh" >"$T/$tag/out.txt" 2>"$T/$tag/r0.log" </dev/null
    rc=$?
    wait $P1
    rc1=$?
    cat "$T/$tag/out.txt"
    echo "--- rank 0 log ($tag)"; cat "$T/$tag/r0.log"
    echo "--- rank 1 log ($tag)"; cat "$T/$tag/r1.log"
    cp "$T/$tag/out.txt" "$OUT/broker-rdma-$tag.out" 2>/dev/null
    [ $rc = 0 ] || fail "$tag: rank 0 exited with $rc"
    [ $rc1 = 0 ] || fail "$tag: rank 1 exited with $rc1"
    grep -q '^link 1 -> 0: rdma (rxe' "$T/$tag/out.txt" || fail "$tag: overlay status does not show rank 1's link on rdma"
    grep -q 'transport rdma' "$T/$tag/out.txt" || fail "$tag: uptime does not say transport rdma"
    grep -q 'overlay link to parent: rdma on' "$T/$tag/r1.log" || fail "$tag: rank 1 did not log its rdma choice"
    [ "$(grep -c 'task-ran' "$T/$tag/out.txt")" = 4 ] || fail "$tag: the 4-task job did not run"
}
run_instance events
# Busy polling: the links' receiving halves poll their completion queues from the brokers' loops.
run_instance busy tbon.rdma_poll=busy

# Auto fallback on loopback: a device exists, but none serves 127.0.0.1.
out=$(timeout 60 vigil start --test-size=2 sh -c 'vigil overlay status; vigil uptime' 2>&1 </dev/null)
echo "$out"
grep -q 'link 1 -> 0: tcp (this side: libibverbs found no device serving 127.0.0.1' <<<"$out" ||
    fail "auto did not fall back to tcp with the reason"
echo "rdma-broker-test: passed"
