#!/bin/sh
# A node health check for Vigil (-S health.program=/etc/vigil/health-check.sh, or [health] program in the TOML
# bootstrap; docs/system-instance.md, "Health checks"). Each broker runs it at start and every health.interval.
# Exit 0: healthy. Otherwise it prints one line, the reason the node is drained with ("health check: LINE").
# Edit the settings below, or set them in the environment of the broker (the unit's Environment=).
#
# VIGIL_BROKER_RANK and VIGIL_URI (this node's broker) are set by the broker, for checks that ask it things.

# Where jobs write their temporary files, and the least free space it must have (KiB).
tmpdir=${HC_TMPDIR:-${TMPDIR:-/tmp}}
min_free_kb=${HC_MIN_FREE_KB:-1048576}
# Mount points that must be mounted, separated by spaces (e.g. "/home /scratch").
mounts=${HC_MOUNTS:-}
# Cores this node must have (empty: not checked), and GPUs (empty: not checked; skipped without a tool to count).
cores=${HC_CORES:-}
gpus=${HC_GPUS:-}

fail() {
    echo "$*"
    exit 1
}

# Free space of the job temporary directory (POSIX df -P: the 4th field of the 2nd line, in KiB).
[ -d "$tmpdir" ] || fail "$tmpdir is missing"
free=$(df -Pk "$tmpdir" 2>/dev/null | awk 'NR == 2 { print $4 }')
[ -n "$free" ] || fail "cannot read the free space of $tmpdir"
# The reason names the threshold, not the free space: a reason that changes from run to run is a new drain reason
# (and a new log line) each time.
[ "$free" -ge "$min_free_kb" ] || fail "$tmpdir has less than ${min_free_kb} KiB free"

# Required mounts: listed in /proc/mounts (its second field), not merely a directory.
for m in $mounts; do
    awk -v m="$m" '$2 == m { found = 1 } END { exit !found }' /proc/mounts 2>/dev/null || fail "$m is not mounted"
done

# Core count: hwloc's view (what the broker schedules on), else the online CPUs.
if [ -n "$cores" ]; then
    if command -v hwloc-calc >/dev/null 2>&1; then
        have=$(hwloc-calc --number-of core machine:0 2>/dev/null)
    else
        have=$(nproc 2>/dev/null)
    fi
    [ -n "$have" ] || fail "cannot count cores (neither hwloc-calc nor nproc answered)"
    [ "$have" -eq "$cores" ] || fail "$have cores, expected $cores"
fi

# GPU count, with the vendor's tool when there is one (a GPU that fell off the bus is not listed).
if [ -n "$gpus" ]; then
    have=
    if command -v nvidia-smi >/dev/null 2>&1; then
        have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    elif command -v rocm-smi >/dev/null 2>&1; then
        have=$(rocm-smi --showid 2>/dev/null | grep -c '^GPU\[')
    fi
    if [ -n "$have" ] && [ "$have" -ne "$gpus" ]; then
        fail "$have GPUs, expected $gpus"
    fi
fi

exit 0
