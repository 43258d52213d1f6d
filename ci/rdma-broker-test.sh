#!/usr/bin/env bash
# A 2-broker system instance on the two soft-RoCE addresses with the overlay on RDMA, running jobs.
# Called by ci/rdma-tests.sh (inside the rxe-vm harness or on a kernel with rdma_rxe):
#   ci/rdma-broker-test.sh BIN_DIR ADDR0 ADDR1 OUT_DIR
# Checks: both links choose rdma (tbon.transport=rdma, so a fallback would fail the start), `vigil overlay
# status` and `vigil uptime` say rdma, jobs run across both ranks, `vigil ping 1` answers; then, with
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

mkdir -p "$T/r0" "$T/r1"
vigil broker --config "$T/vigil.toml" --rank 1 --rundir "$T/r1" -S tbon.transport=rdma -S log-level=info \
    >"$T/r1.log" 2>&1 &
P1=$!
timeout 120 vigil broker --config "$T/vigil.toml" --rank 0 --rundir "$T/r0" -S tbon.transport=rdma \
    -S log-level=info "$T/initial.sh" >"$T/out.txt" 2>"$T/r0.log" </dev/null
rc=$?
wait $P1
rc1=$?
cat "$T/out.txt"
echo "--- rank 0 log"; cat "$T/r0.log"
echo "--- rank 1 log"; cat "$T/r1.log"
cp "$T/out.txt" "$OUT/broker-rdma.out" 2>/dev/null
[ $rc = 0 ] || fail "rank 0 exited with $rc"
[ $rc1 = 0 ] || fail "rank 1 exited with $rc1"
grep -q '^link 1 -> 0: rdma (rxe' "$T/out.txt" || fail "overlay status does not show rank 1's link on rdma"
grep -q 'transport rdma' "$T/out.txt" || fail "uptime does not say transport rdma"
grep -q 'overlay link to parent: rdma on' "$T/r1.log" || fail "rank 1 did not log its rdma choice"
[ "$(grep -c 'task-ran' "$T/out.txt")" = 4 ] || fail "the 4-task job did not run"

# Auto fallback on loopback: a device exists, but none serves 127.0.0.1.
out=$(timeout 60 vigil start --test-size=2 sh -c 'vigil overlay status; vigil uptime' 2>&1 </dev/null)
echo "$out"
grep -q 'link 1 -> 0: tcp (this side: libibverbs found no device serving 127.0.0.1' <<<"$out" ||
    fail "auto did not fall back to tcp with the reason"
echo "rdma-broker-test: passed"
