#!/usr/bin/env bash
# Memory limits and OOM reports with a full cgroup v2 (the memory controller), where this machine has none: run
# inside the rxe-vm harness by ci/rdma-tests.sh (the guest boots its own kernel, where cgroup2 with every
# controller can be mounted), or on any machine whose cgroup2 offers the memory controller to the caller.
#   ci/memory-cgroup-test.sh BIN_DIR OUT_DIR
# Checks, with the eBPF exit detector (broker.detectors=ebpf: a detector the kernel refuses fails the start) and
# with the userspace one, and for a system-instance broker alone in a cgroup that has the memory controller
# without giving it to its children (as a systemd unit with Delegate=yes: the broker must move itself into a leaf
# first): `vigil uptime` says memory limits are available;
# a job over its `-o memory=` limit is killed by the OOM killer, exits 137, and the OOM kill is reported (an `oom`
# exception naming the task and node, on stderr and in the eventlog; `oom_kills` in its usage); a job under its
# limit exits 0 and its peak memory is recorded, below the limit.
set -uo pipefail
BIN=$1 OUT=$2
export PATH=$BIN:$PATH
fail() { echo "memory-cgroup-test: FAIL: $*"; exit 1; }
command -v python3 >/dev/null || fail "python3 is needed for the memory hog"

# A cgroup2 with the memory controller: the one mounted, else our own mount at /sys/fs/cgroup (in the guest).
mnt=$(awk '$0 ~ / - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
if [ -z "$mnt" ]; then
    mount -t cgroup2 none /sys/fs/cgroup || fail "cannot mount cgroup2"
    mnt=/sys/fs/cgroup
fi
own=$(sed -n 's/^0:://p' /proc/self/cgroup)
grep -qw memory "$mnt$own/cgroup.controllers" 2>/dev/null || fail "no memory controller in $mnt$own"
if [ "$own" = / ]; then
    # The root cgroup may hold processes and still give controllers to its children.
    echo +memory > "$mnt/cgroup.subtree_control" || fail "cannot enable memory in $mnt"
fi

T=$(mktemp -d /tmp/vigil-memory.XXXXXX)
trap 'rm -rf "$T"' EXIT
cat > "$T/initial.sh" <<'EOF'
#!/bin/bash
set -u
vigil uptime | grep 'contained by' | tee "$T/uptime"
# 256 MiB touched under a 64 MiB limit (no swap either): the OOM killer.
oom=$(vigil submit -o memory=64M python3 -c 'b = bytearray(256 << 20); print(len(b))')
vigil job attach "$oom" 2> "$T/oom.err"
echo "oom-rc=$?"
cat "$T/oom.err"
vigil job info --json "$oom" > "$T/oom.info"
vigil job eventlog "$oom" > "$T/oom.eventlog"
# 32 MiB under 128 MiB: runs, its peak recorded.
ok=$(vigil submit -o memory=128M python3 -c 'b = bytearray(32 << 20); print(len(b))')
vigil job attach "$ok"
echo "ok-rc=$?"
vigil job info --json "$ok" > "$T/ok.info"
EOF
sed -i "s|\$T|$T|g" "$T/initial.sh"
chmod +x "$T/initial.sh"

# The delegated case: a cgroup of its own holding only the broker, memory available there but not enabled below.
deleg=$mnt$own/vigil-delegated
vigil keygen --force "$T/overlay.key" >/dev/null 2>&1 || fail "vigil keygen"
cat > "$T/vigil.toml" <<EOF
[bootstrap]
instance = "memory-test"
overlay_key = "$T/overlay.key"
hosts = [ { host = "n0", bind = "tcp://127.0.0.1:8061", connect = "tcp://127.0.0.1:8061" } ]
EOF
mkdir -p "$T/rundir"

for det in ebpf userspace delegated; do
    echo "== memory-cgroup-test: $det"
    if [ $det = delegated ]; then
        mkdir -p "$deleg" || fail "cannot make $deleg"
        # Not enabled for its children: the broker must do that, from a leaf of its own.
        grep -qw memory "$deleg/cgroup.subtree_control" && fail "$deleg already gives memory to its children"
        timeout 120 sh -c 'echo 0 > "$1/cgroup.procs" && exec vigil broker --config "$2/vigil.toml" --rank 0 \
            -S broker.detectors=ebpf --rundir "$2/rundir" "$2/initial.sh"' sh "$deleg" "$T" > "$T/out" 2>&1 </dev/null
        rc=$?
        grep -qw memory "$deleg/cgroup.subtree_control" || fail "the broker did not enable memory in $deleg"
    else
        timeout 120 vigil start --test-size 1 -S broker.detectors=$det "$T/initial.sh" > "$T/out" 2>&1
        rc=$?
    fi
    cp "$T/out" "$OUT/memory-$det.log" 2>/dev/null || true
    cat "$T/out"
    [ $rc = 0 ] || fail "instance exited $rc ($det)"
    grep -q 'memory limits available' "$T/uptime" || fail "uptime does not offer memory limits ($det)"
    grep -q '^oom-rc=137$' "$T/out" || fail "the job over its limit did not exit 137 ($det)"
    grep -q 'killed by the OOM killer' "$T/oom.err" || fail "no OOM report on the job's stderr ($det)"
    grep -q 'exception.*type=oom' "$T/oom.eventlog" || fail "no oom exception in the eventlog ($det)"
    python3 - "$T/oom.info" "$T/ok.info" <<'PY' || fail "usage not as expected ($det)"
import json, sys
oom = json.load(open(sys.argv[1]))["info"]["usage"]
ok = json.load(open(sys.argv[2]))["info"]["usage"]
print("usage over the limit:", oom, "under it:", ok)
assert oom.get("oom_kills", 0) >= 1, oom
assert oom.get("memory_peak", 1 << 40) <= 64 << 20, oom
assert (32 << 20) <= ok.get("memory_peak", 0) <= 128 << 20, ok
assert ok.get("oom_kills", 0) == 0, ok
PY
    grep -q '^ok-rc=0$' "$T/out" || fail "the job under its limit failed ($det)"
done
# What the delegated broker left: its leaf, empty now, removed by the next broker that starts there.
rmdir "$deleg"/vigil-broker-*/broker "$deleg"/vigil-broker-* "$deleg" 2>/dev/null || true
echo "memory-cgroup-test: all passed"
