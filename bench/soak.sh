#!/usr/bin/env bash
# Soak: an 8-node netns instance with both cores saturated (one busy loop per core plus one extra, normal
# priority) for DURATION seconds (default 600), with a SIGSTOP/SIGCONT of 10 s on one broker every minute.
# Counts false "lost"/"offline" verdicts (must be 0) and torpid/lively events. Needs root. The brokers' logs
# and rank 0's resource eventlog are kept in SOAK_LOG_DIR (default /tmp/vigil-soak-logs-NAME).
#   bench/soak.sh [DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-600}
name=soak$$
name=${name:0:6}
export VIGIL=${VIGIL:-$PWD/target/release/vigil}
dir=${VIGIL_NETNS_DIR:-/tmp}/vigil-netns-$name
logs=${SOAK_LOG_DIR:-/tmp/vigil-soak-logs-$name}
cleanup() {
    kill "${hogs[@]}" 2>/dev/null || true
    ci/netns-cluster.sh cont "$name" 3 2>/dev/null || true
    mkdir -p "$logs"
    for f in "$dir"/node*/broker.log; do [ -f "$f" ] && cp "$f" "$logs/$(basename "$(dirname "$f")").log"; done
    ci/netns-cluster.sh down "$name" 2>/dev/null || true
}
hogs=()
trap cleanup EXIT
ci/netns-cluster.sh up "$name" 8
export VIGIL_URI=$(ci/netns-cluster.sh uri "$name")
# Detectors load in the background after start-up: wait for them, and say what rank 0 runs on.
for _ in $(seq 1 300); do
    st=$("$VIGIL" overlay status)
    case $st in *loading*) sleep 0.1 ;; *) break ;; esac
done
echo "$st" | grep '^detectors' | sed 's/^/soak: rank 0 /'
ncpu=$(nproc)
for ((i = 0; i <= ncpu; i++)); do sh -c 'while :; do :; done' & hogs+=($!); done
start=$(date +%s)
stalls=0
gone=""
while [ $(( $(date +%s) - start )) -lt "$dur" ]; do
    sleep 50
    if ! ci/netns-cluster.sh stall "$name" 3; then
        gone="node 3's broker is gone after $(( $(date +%s) - start )) s"
        echo "soak: $gone"
        break
    fi
    sleep 10; ci/netns-cluster.sh cont "$name" 3
    stalls=$((stalls + 1))
done
ev=$("$VIGIL" resource eventlog --json)
mkdir -p "$logs"
echo "$ev" > "$logs/resource-eventlog.jsonl"
lost=$(echo "$ev" | grep -c '"name":"offline"' || true)
torpid=$(echo "$ev" | grep -c '"name":"torpid"' || true)
lively=$(echo "$ev" | grep -c '"name":"lively"' || true)
"$VIGIL" overlay status
echo "$ev" | grep '"name":"offline"' | sed 's/^/soak: offline event: /' || true
echo "soak: ${dur}s with $((ncpu + 1)) busy loops on $ncpu cores, $stalls stalls of 10 s: false lost verdicts $lost, torpid events $torpid, lively events $lively${gone:+ ($gone)}; logs in $logs"
[ "$lost" -eq 0 ] && [ -z "$gone" ]
