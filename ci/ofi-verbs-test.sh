#!/usr/bin/env bash
# Overlay links over libfabric's `verbs;ofi_rxm` provider on the two soft-RoCE devices: the same ofi code a
# Slingshot machine runs with `cxi`, here on an RDMA provider. Called by ci/rdma-tests.sh (inside the rxe-vm
# harness, or on a kernel with rdma_rxe):
#   ci/ofi-verbs-test.sh BIN_DIR ADDR0 ADDR1 OUT_DIR [ENDPOINTS_TEST]
# Checks, in order:
#  1. `fi_info -p 'verbs;ofi_rxm' -t FI_EP_RDM` lists an rxe domain. If it does not, or the library has no
#     verbs provider at all, the test prints "ofi-verbs-test: SKIPPED: <libfabric's reason>" and exits 0: that
#     is a fact about the libfabric installed, not a bug of Vigil's, and it is said where the log shows it.
#  2. libfabric's own `fi_pingpong` between the two addresses (a reference, and a sign the provider works).
#  3. vigil-ofi's exchange tests (ENDPOINTS_TEST, two endpoints in one process on ADDR0 and ADDR1).
#  4. A 3-broker system instance (rank 0 on ADDR0, ranks 1 and 2 on ADDR1) with tbon.transport=ofi and
#     tbon.ofi_provider=verbs;ofi_rxm (a fallback to TCP would fail the start): `vigil overlay status` shows
#     every link on ofi with that provider on an rxe domain, `vigil uptime` says transport ofi, jobs run across
#     all ranks, output larger than one libfabric fragment streams back, `vigil ping` answers.
set -uo pipefail
BIN=$1 A0=$2 A1=$3 OUT=$4 ENDPOINTS=${5:-}
PROV='verbs;ofi_rxm'
export PATH=$BIN:$PATH
T=$(mktemp -d /tmp/vigil-ofi-verbs.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
fail() { echo "ofi-verbs-test: FAIL: $*"; exit 1; }
skip() { echo "ofi-verbs-test: SKIPPED: $*"; exit 0; }

# What verbs;ofi_rxm needs here that the raw verbs path does not:
#  - rdma_cm (rxm connects its verbs endpoints with it). On the passive side the kernel checks the request's
#    net device with a route lookup from our address to the peer's *out of that device*
#    (validate_ipv4_net_dev: oif = our netdev). With only the harness's policy routing (table 100, used by
#    locally generated packets) that lookup fails, and every connection request is rejected
#    (REJ_CONSUMER_DEFINED, "Connection refused, prov_err -28"; `ib_send_lat -R` fails the same way). The
#    same /32 routes in the main table make it succeed and change nothing else: sent packets still take
#    table 100, received ones the local table.
#  - a smaller FI_UNIVERSE_SIZE: rxm sizes its verbs completion queue as (rx_size + tx_size) x universe size,
#    256 by default, about 196,000 entries, and rxe allows 32,767 (max_cqe): `fi_enable` fails with EINVAL
#    ("Unable to create verbs CQ"). 32 peers per endpoint is plenty for this test (a broker's endpoint talks
#    to its parent and children only).
ip route replace "$A1/32" dev veth0 src "$A0"
ip route replace "$A0/32" dev veth1 src "$A1"
export FI_UNIVERSE_SIZE=${FI_UNIVERSE_SIZE:-32}
ulimit -l unlimited 2>/dev/null || true

# 1. Does this libfabric offer verbs;ofi_rxm on the rxe devices?
command -v fi_info >/dev/null || skip "fi_info not installed (package libfabric-bin)"
fi_info --version | head -2
if ! fi_info -p "$PROV" -t FI_EP_RDM >"$T/fi_info.txt" 2>&1; then
    cat "$T/fi_info.txt"
    FI_LOG_LEVEL=warn fi_info -p verbs 2>&1 | tail -20
    skip "libfabric lists no $PROV endpoint: $(tail -1 "$T/fi_info.txt")"
fi
grep -E 'provider|domain' "$T/fi_info.txt" | sort | uniq -c
grep -q 'domain: rxe' "$T/fi_info.txt" || skip "$PROV lists no rxe domain"

# 2. libfabric's own ping-pong between the two addresses (also shows the provider can connect at all).
fi_pingpong -p "$PROV" -e rdm -d rxe0 -I 200 -S 64 >"$T/pp-server.txt" 2>&1 &
PIDS+=($!)
sleep 1
if timeout 60 fi_pingpong -p "$PROV" -e rdm -d rxe1 -I 200 -S 64 "$A0" >"$T/pp-client.txt" 2>&1; then
    echo "fi_pingpong $PROV 64 B:"
    cat "$T/pp-client.txt"
else
    cat "$T/pp-client.txt" "$T/pp-server.txt"
    fail "fi_pingpong -p '$PROV' between $A1 and $A0 failed"
fi
wait "${PIDS[0]}" 2>/dev/null

# 3. vigil-ofi's own exchange tests on this provider, one endpoint on each address.
if [ -n "$ENDPOINTS" ]; then
    VIGIL_OFI_TEST_PROVIDER="$PROV" VIGIL_OFI_TEST_SOURCE="$A0" VIGIL_OFI_TEST_SOURCE2="$A1" \
        timeout 300 "$ENDPOINTS" --exact site_provider --nocapture ||
        fail "vigil-ofi's exchange tests on $PROV"
fi

# 4. An instance whose links run on verbs;ofi_rxm.
vigil keygen --force "$T/overlay.key" 2>/dev/null || fail "vigil keygen"
cat >"$T/vigil.toml" <<EOF
[bootstrap]
instance = "ofi-verbs-test"
overlay_key = "$T/overlay.key"
hosts = [
  { host = "n0", bind = "tcp://$A0:8060", connect = "tcp://$A0:8060" },
  { host = "n1", bind = "tcp://$A1:8061", connect = "tcp://$A1:8061" },
  { host = "n2", bind = "tcp://$A1:8062", connect = "tcp://$A1:8062" },
]
EOF
cat >"$T/initial.sh" <<'EOF'
#!/bin/bash
set -e
vigil overlay status
vigil uptime
vigil run -N3 -n3 -l hostname
vigil run -N3 -n6 -l echo task-ran
# 200 KiB from the last rank: several libfabric fragments per message up the tree.
vigil run -N3 -n3 sh -c '[ $VIGIL_TASK_RANK = 2 ] && head -c 204800 /dev/zero | tr "\0" x; true' | wc -c | sed 's/^/big-output-bytes /'
id=$(vigil submit -N3 -n3 true)
vigil job wait "$id"
vigil ping 1
vigil ping 2
EOF
chmod +x "$T/initial.sh"
ATTRS=(-S tbon.transport=ofi -S "tbon.ofi_provider=$PROV" -S log-level=info)
for r in 1 2; do
    mkdir -p "$T/r$r"
    vigil broker --config "$T/vigil.toml" --rank $r --rundir "$T/r$r" "${ATTRS[@]}" >"$T/r$r.log" 2>&1 &
    PIDS+=($!)
done
mkdir -p "$T/r0"
timeout 180 vigil broker --config "$T/vigil.toml" --rank 0 --rundir "$T/r0" "${ATTRS[@]}" "$T/initial.sh" \
    >"$T/out.txt" 2>"$T/r0.log" </dev/null
rc=$?
rcs=()
for p in "${PIDS[@]:1}"; do
    wait "$p"
    rcs+=($?)
done
cat "$T/out.txt"
for r in 0 1 2; do
    echo "--- rank $r log"
    cat "$T/r$r.log"
done
cp "$T/out.txt" "$OUT/ofi-verbs.out" 2>/dev/null
# A broker that crashed (139: SIGSEGV, 134: SIGABRT) left a core where ci/rdma-tests.sh pointed the guest's
# kernel: its backtrace, every thread.
if [[ " $rc ${rcs[*]} " =~ \ 1(39|34)\  ]]; then
    for c in "$OUT"/core.*; do
        [ -f "$c" ] || continue
        echo "--- backtrace of $c"
        if command -v gdb >/dev/null; then
            timeout 300 gdb -batch -nx -ex 'info threads' -ex 'thread apply all bt 30' "$BIN/vigil" "$c" 2>&1 | tail -200
        else
            echo "(gdb not installed)"
        fi
    done
fi
[ $rc = 0 ] || fail "rank 0 exited with $rc"
[ "${rcs[*]}" = "0 0" ] || fail "ranks 1 and 2 exited with ${rcs[*]}"
for r in 1 2; do
    grep -q "^link $r -> 0: ofi (provider $PROV, fabric .* domain rxe" "$T/out.txt" ||
        fail "overlay status does not show rank $r's link on ofi with $PROV on an rxe domain"
done
grep -q 'transport ofi' "$T/out.txt" || fail "uptime does not say transport ofi"
grep -q "libfabric endpoint open: provider $PROV" "$T/r1.log" || fail "rank 1 did not log its endpoint"
grep -q "overlay link to parent: ofi (provider $PROV" "$T/r1.log" || fail "rank 1 did not log its ofi link"
[ "$(grep -c 'task-ran' "$T/out.txt")" = 6 ] || fail "the 6-task job did not run"
grep -q '^big-output-bytes 204800$' "$T/out.txt" || fail "200 KiB of output did not arrive whole"
echo "ofi-verbs-test: passed"
