#!/usr/bin/env bash
# Soft-RoCE (rdma_rxe) test driver.
#
#   ci/rdma-tests.sh build   # on the build host: build the RDMA test binaries, record their paths
#   ci/rdma-tests.sh run     # where rdma_rxe exists: create the devices if needed, run the RDMA tests
#
# `run` works in two places:
#  - inside ../shared/tools/rxe-vm (the harness has created rxe0 on veth0 = 10.200.0.1 and rxe1 on veth1 =
#    10.200.0.2 and exported RXE_A0/RXE_A1); the VM sees the host's file system read-only, so nothing is
#    built here: `build` must have run on the host first;
#  - on a machine whose own kernel has rdma_rxe (as root): it creates the same pair of devices itself, on a veth
#    pair of its own, and removes them afterwards.
# Tests: the verbs layer (vigil-rdma: connect, send/receive, flow control, large messages, peer QP destroyed),
# a 2-broker instance on the two rxe addresses running jobs over RDMA, the libfabric overlay on
# `verbs;ofi_rxm` over the same devices (ci/ofi-verbs-test.sh), memory limits (ci/memory-cgroup-test.sh) and the
# eBPF detectors (ci/ebpf-vm-test.sh: vigil-ebpf's tests, an instance of optimised brokers, failure_netns's kill -9
# and silent node loss) on the guest's own kernel, then the link-down test (it cuts veth1, so it
# comes last). Results go to $RDMA_OUT (default /mnt/out inside the VM, else target/rdma-tests).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=$ROOT/target/rdma-tests
MODE=${1:-run}

if [ "$MODE" = build ]; then
    set -e
    mkdir -p "$STATE"
    # A test binary of package $1, test target $2, built with cargo's extra arguments $3.. (a profile).
    test_exe() {
        cargo test -p "$1" --test "$2" "${@:3}" --no-run --locked --message-format=json 2>/dev/null |
            python3 -c 'import json,sys
for l in sys.stdin:
    try: m = json.loads(l)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$2" | tail -1
    }
    exe=$(test_exe vigil-rdma verbs)
    [ -x "$exe" ] || { echo "rdma-tests: could not find the verbs test binary" >&2; exit 1; }
    ofi=$(test_exe vigil-ofi endpoints)
    [ -x "$ofi" ] || { echo "rdma-tests: could not find vigil-ofi's endpoints test binary" >&2; exit 1; }
    # The eBPF detectors' tests, run in the guest on its own kernel (ci/ebpf-vm-test.sh).
    ebpf=()
    for t in exit tcp oom xdp exit_detach; do
        e=$(test_exe vigil-ebpf "$t")
        [ -x "$e" ] || { echo "rdma-tests: could not find vigil-ebpf's $t test binary" >&2; exit 1; }
        ebpf+=("$e")
    done
    # The broker-level detector tests (kill -9 of a broker, a silent node loss, on network-namespace nodes) and
    # the brokers of the eBPF step, optimised: under emulation on a loaded host, debug brokers miss their timers by
    # seconds (namespace nodes do not come up; seen: a 3-broker instance refusing its children's hellos after 5 s).
    netns=$(test_exe vigil failure_netns --profile ci)
    [ -x "$netns" ] || { echo "rdma-tests: could not find vigil's failure_netns test binary (profile ci)" >&2; exit 1; }
    cargo build --profile ci --locked -p vigil -p vigil-shell --quiet
    cargo build --locked -p vigil -p vigil-shell --quiet
    printf 'VERBS_TEST=%q\nOFI_TEST=%q\nVIGIL_BIN=%q\nEBPF_TESTS=%q\nNETNS_TEST=%q\nVIGIL_CI_BIN=%q\n' "$exe" "$ofi" \
        "$ROOT/target/debug" "${ebpf[*]}" "$netns" "$ROOT/target/ci" > "$STATE/bins.env"
    echo "rdma-tests: built $exe $ofi ${ebpf[*]} $netns"
    exit 0
fi
[ "$MODE" = run ] || { echo "usage: $0 build|run" >&2; exit 2; }
[ -f "$STATE/bins.env" ] || { echo "rdma-tests: run '$0 build' first" >&2; exit 1; }
# shellcheck source=/dev/null
. "$STATE/bins.env"

OUT=${RDMA_OUT:-}
if [ -z "$OUT" ]; then
    if [ -d /mnt/out ] && [ -w /mnt/out ]; then OUT=/mnt/out; else OUT=$STATE; fi
fi
mkdir -p "$OUT"

A0=10.200.0.1 A1=10.200.0.2
CREATED=0
# Route traffic between the two local addresses over the veth wire instead of 'lo' (rxe ignores packets on
# lo): locally generated packets to the peer address use table 100, which points out of our own veth end; the
# local table is moved behind that rule. Static neighbours, no rp_filter, accept_local.
wire_routing() {
    local k
    for k in all default veth0 veth1; do
        sysctl -qw net.ipv4.conf.$k.rp_filter=0 net.ipv4.conf.$k.accept_local=1
    done
    ip addr replace $A0/32 dev veth0
    ip addr replace $A1/32 dev veth1
    ip link set veth0 up
    ip link set veth1 up
    ip route replace $A1/32 dev veth0 src $A0 table 100
    ip route replace $A0/32 dev veth1 src $A1 table 100
    # The same routes in the main table, for rdma_cm's check of an incoming request's net device (a lookup
    # out of that device; see ci/ofi-verbs-test.sh): without them it rejects every connection.
    ip route replace $A1/32 dev veth0 src $A0
    ip route replace $A0/32 dev veth1 src $A1
    ip neigh replace $A1 lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent
    ip neigh replace $A0 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
    ip rule show | grep -q 'lookup 100' || ip rule add pref 100 iif lo to 10.200.0.0/24 table 100
    if ! ip rule show | grep -q '^200:'; then
        ip rule add pref 200 table local
        ip rule del pref 0 table local
    fi
}
v4_gid_ready() { grep -qs '^0000:0000:0000:0000:0000:ffff:' /sys/class/infiniband/"$1"/ports/1/gids/*; }
wait_ready() {
    local i
    for i in $(seq 1 200); do
        if grep -qs ACTIVE /sys/class/infiniband/rxe0/ports/1/state && grep -qs ACTIVE /sys/class/infiniband/rxe1/ports/1/state &&
            v4_gid_ready rxe0 && v4_gid_ready rxe1; then return 0; fi
        sleep 0.05
    done
    return 1
}
cleanup() {
    if [ $CREATED = 1 ]; then
        rdma link delete rxe1 2>/dev/null
        rdma link delete rxe0 2>/dev/null
        ip link del veth0 2>/dev/null
        ip rule del pref 100 2>/dev/null
        if ip rule show | grep -q '^200:'; then ip rule add pref 0 table local && ip rule del pref 200; fi
    fi
}
trap cleanup EXIT

if [ -z "${RXE_A0:-}" ]; then
    # Not inside the harness: make the devices on this kernel.
    [ "$(id -u)" = 0 ] || { echo "rdma-tests: needs root to create rxe devices" >&2; exit 1; }
    modprobe rdma_rxe || { echo "rdma-tests: this kernel has no rdma_rxe" >&2; exit 1; }
    if [ -e /sys/class/infiniband/rxe0 ] || ip link show veth0 >/dev/null 2>&1; then
        echo "rdma-tests: rxe0 or veth0 already exists; not touching them" >&2
        exit 1
    fi
    CREATED=1
    ip link add veth0 type veth peer name veth1
    wire_routing
    rdma link add rxe0 type rxe netdev veth0
    rdma link add rxe1 type rxe netdev veth1
    ulimit -l unlimited 2>/dev/null || true
else
    A0=$RXE_A0 A1=$RXE_A1
    # The guest's own kernel: a crashing broker leaves a core in the results, and the step that saw it prints
    # its backtrace (ci/ofi-verbs-test.sh).
    echo "$OUT/core.%e.%p" > /proc/sys/kernel/core_pattern
    ulimit -c unlimited
fi
wait_ready || { echo "rdma-tests: rxe devices not ready" >&2; rdma link show; exit 1; }
export RXE_A0=$A0 RXE_A1=$A1 VIGIL_RDMA_TESTS=1

FAIL=0
step() {
    local name=$1
    shift
    local t0=$EPOCHREALTIME
    echo "== rdma-tests: $name"
    "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== rdma-tests: $name rc=$rc ($(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')s)"
    [ "$rc" = 0 ] || FAIL=1
}

step verbs "$VERBS_TEST" --test-threads=1 --nocapture
if [ -x "$ROOT/ci/rdma-broker-test.sh" ]; then
    step broker "$ROOT/ci/rdma-broker-test.sh" "$VIGIL_BIN" "$A0" "$A1" "$OUT"
fi
# The libfabric overlay on the verbs;ofi_rxm provider over the same devices (reports SKIPPED, not a failure,
# when the installed libfabric cannot offer that provider here).
if [ -x "$ROOT/ci/ofi-verbs-test.sh" ]; then
    step ofi-verbs "$ROOT/ci/ofi-verbs-test.sh" "$VIGIL_BIN" "$A0" "$A1" "$OUT" "${OFI_TEST:-}"
fi
# Not RDMA, but needs this guest's own kernel too: memory limits and OOM reports with a full cgroup v2.
if [ -x "$ROOT/ci/memory-cgroup-test.sh" ]; then
    step memory "$ROOT/ci/memory-cgroup-test.sh" "$VIGIL_BIN" "$OUT"
fi
# Not RDMA either: every eBPF detector must load and work on this guest's kernel (Debian 12's 6.1 in the harness),
# not only on the build machine's; a detector falling back to userspace fails the step.
if [ -x "$ROOT/ci/ebpf-vm-test.sh" ] && [ -n "${EBPF_TESTS:-}" ]; then
    step ebpf "$ROOT/ci/ebpf-vm-test.sh" "${VIGIL_CI_BIN:-$VIGIL_BIN}" "$OUT" "$EBPF_TESTS" "${NETNS_TEST:-}"
fi
# Last: cuts veth1, then restores the wire.
step linkdown env VIGIL_RDMA_LINKDOWN=1 RXE_NETDEV1=veth1 "$VERBS_TEST" --exact peer_link_down --nocapture
ip link set veth1 up
wire_routing
wait_ready || echo "rdma-tests: devices not ready again after the link-down test"

echo "rdma-tests: $([ $FAIL = 0 ] && echo "all passed" || echo "FAILED") (logs in $OUT)"
exit $FAIL
