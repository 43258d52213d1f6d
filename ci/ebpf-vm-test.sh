#!/usr/bin/env bash
# The eBPF failure detectors on another kernel than the build machine's: run inside the rxe-vm harness by
# ci/rdma-tests.sh (the guest boots Debian 12's own 6.1 kernel), or as root on any machine.
#   ci/ebpf-vm-test.sh BIN_DIR OUT_DIR EBPF_TESTS [NETNS_TEST]
# EBPF_TESTS: space-separated test binaries of vigil-ebpf (exit, tcp, oom, xdp, exit_detach), each run whole: every
# eBPF case there requires the eBPF backend (a program the verifier refuses fails it). Then an instance whose
# brokers must run every detector on eBPF. NETNS_TEST (optional): a failure_netns test binary, of which the
# broker-level detector tests run; give an optimised one (`--profile ci`): under emulation, debug brokers on
# namespace nodes miss their timers by seconds and the cluster does not come up. Fails when any detector of the
# instance reads `userspace`, when a test fails, or when the OOM test skips for want of a memory cgroup.
set -uo pipefail
BIN=$1 OUT=$2 EBPF_TESTS=$3 NETNS_TEST=${4:-}
export PATH=$BIN:$PATH
cd "$(dirname "$0")/.."
FAILED=()
fail_step() { echo "ebpf-vm-test: FAIL: $*"; FAILED+=("$1"); }
echo "ebpf-vm-test: kernel $(uname -r)"

mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || fail_step tracefs "cannot mount tracefs"
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf || fail_step bpffs "cannot mount bpffs"
# The OOM test needs a cgroup2 whose root gives the memory controller to its children (the guest mounts none).
mnt=$(awk '$0 ~ / - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
if [ -z "$mnt" ]; then
    mount -t cgroup2 none /sys/fs/cgroup && mnt=/sys/fs/cgroup
fi
if [ "$mnt" = /sys/fs/cgroup ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
fi

# 1. vigil-ebpf's own tests: process exit (kill -9, exit codes, segfaults, threads), TCP (close, reset,
#    retransmit), OOM victim (mark_victim), the XDP responder and hub, the owner-exit tracepoint. With --nocapture:
#    a test that skips says so on stderr.
for t in $EBPF_TESTS; do
    name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
    "$t" --test-threads=1 --nocapture 2>&1 | tee "$OUT/ebpf-$name.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail_step "ebpf-$name" "vigil-ebpf test $name"
    if [ "$name" = oom ] && grep -q SKIP "$OUT/ebpf-$name.log"; then fail_step ebpf-oom "the OOM test was skipped"; fi
done

# 2. An instance whose brokers must run every detector on eBPF (broker.detectors=ebpf exits otherwise): its
#    detector lines, once loaded, read no `userspace`; a task killed with SIGKILL fails its job with an exception;
#    a broker killed with SIGKILL is lost.
T=$(mktemp -d /tmp/vigil-ebpf-vm.XXXXXX)
trap 'rm -rf "$T"' EXIT
cat > "$T/initial.sh" <<'EOF'
#!/bin/bash
for i in $(seq 600); do
    vigil overlay status | grep '^detectors' > "$T/detectors"
    grep -q loading "$T/detectors" || break
    sleep 0.1
done
cat "$T/detectors"
vigil run -N1 -n2 -o exit-on-error sh -c 'if [ $VIGIL_TASK_RANK = 0 ]; then kill -9 $$; fi; sleep 30' 2> "$T/kill.err"
echo "kill-rc=$?"
cat "$T/kill.err"
kill -9 "$(vigil getattr -r 2 broker.pid)"
for i in $(seq 300); do
    vigil overlay status | grep -q '2 .*: lost' && break
    sleep 0.1
done
vigil overlay status | grep ': lost'
EOF
sed -i "s|\$T|$T|g" "$T/initial.sh"
chmod +x "$T/initial.sh"
timeout 300 vigil start --test-size=3 -S broker.detectors=ebpf "$T/initial.sh" > "$T/out" 2>&1 </dev/null
rc=$?
cp "$T/out" "$OUT/ebpf-instance.log"
cat "$T/out"
if [ $rc != 0 ]; then
    fail_step instance "the instance with broker.detectors=ebpf exited $rc"
else
    grep -q '^detectors (rank 0): process-exit ebpf (' "$T/out" || fail_step detectors "process-exit is not ebpf"
    grep -q '^detectors (rank 0): tcp ebpf (' "$T/out" || fail_step detectors "tcp is not ebpf"
    grep -q '^detectors (rank 0): responder xdp' "$T/out" || fail_step detectors "the responder is not xdp"
    if grep '^detectors' "$T/out" | grep -q userspace; then fail_step detectors "a detector reads userspace"; fi
    grep -q '^kill-rc=137$' "$T/out" || fail_step task-kill "the job whose task was SIGKILLed did not exit 137"
    grep -q 'exception.*task 0.*signal 9\|exception.*task 0.*SIGKILL' "$T/out" ||
        fail_step task-kill "no exception naming the SIGKILLed task"
    grep -q '^└─ 2 .*: lost' "$T/out" || fail_step broker-kill "the broker killed with SIGKILL is not lost"
fi

# 3. Broker-level detector tests on network-namespace nodes, when given: kill -9 of a broker -> lost, a node gone
#    silently -> lost (XDP probes unanswered; the test asserts every detector is eBPF as root).
if [ -n "$NETNS_TEST" ]; then
    "$NETNS_TEST" --test-threads=1 --exact broker_kill_is_lost silent_node_loss_is_lost 2>&1 | tee "$OUT/ebpf-netns.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail_step netns "failure_netns detector tests"
fi

if [ ${#FAILED[@]} = 0 ]; then
    echo "ebpf-vm-test: all passed on $(uname -r)"
else
    echo "ebpf-vm-test: FAILED on $(uname -r): ${FAILED[*]}"
    exit 1
fi
