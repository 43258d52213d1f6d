#!/usr/bin/env bash
# Soak: an 8-node netns instance under overload for DURATION seconds (default 600): both cores saturated (one busy
# loop per core plus one extra, normal priority), every link impaired (IMPAIR="DELAY_MS JITTER_MS LOSS_PCT",
# default "50 50 2", through `vigil-bench netswitch`; IMPAIR=none for the plain bridge), a 4-node job every few
# seconds, and each minute a 10 s SIGSTOP/SIGCONT of node 3's broker and a silent kill of node 6 (link cut, every
# process killed), which is then restarted. Counts false "lost" verdicts (offline events for any rank but the
# killed one; must be 0), torpid/lively events, failed jobs that did not run on node 6, and the time from each kill
# to rank 0's offline event. Needs root. The brokers' logs and rank 0's resource eventlog are kept in SOAK_LOG_DIR
# (default /tmp/vigil-soak-logs-NAME).
#   bench/soak.sh [DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-600}
name=soak$$
name=${name:0:6}
export VIGIL=${VIGIL:-$PWD/target/release/vigil}
impair=${IMPAIR:-50 50 2}
dir=${VIGIL_NETNS_DIR:-/tmp}/vigil-netns-$name
logs=${SOAK_LOG_DIR:-/tmp/vigil-soak-logs-$name}
cleanup() {
    kill "${hogs[@]}" 2>/dev/null || true
    [ -n "${jobs_pid:-}" ] && kill "$jobs_pid" 2>/dev/null || true
    ci/netns-cluster.sh cont "$name" 3 2>/dev/null || true
    mkdir -p "$logs"
    for f in "$dir"/node*/broker.log; do [ -f "$f" ] && cp "$f" "$logs/$(basename "$(dirname "$f")").log"; done
    ci/netns-cluster.sh down "$name" 2>/dev/null || true
}
hogs=()
trap cleanup EXIT
# Links impaired from the start (before any broker starts).
if [ "$impair" != none ]; then export VIGIL_NETNS_IMPAIR="$impair 7"; fi
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
[ "$impair" != none ] && echo "soak: links impaired: delay, jitter (ms), loss (%): $impair"
mkdir -p "$logs"
# Jobs flowing: a 4-node job every 2 s; each outcome logged (a job that had node 6 may fail when it is killed).
(
    while :; do
        if out=$("$VIGIL" run -N4 sh -c 'echo $VIGIL_JOB_NODELIST' 2>&1); then
            echo "ok $out"
        else
            echo "failed $(echo "$out" | tr '\n' ' ')"
        fi
        sleep 2
    done
) > "$logs/jobs.log" 2>&1 &
jobs_pid=$!
start=$(date +%s)
stalls=0 kills=0
gone=""
lat=()
while [ $(( $(date +%s) - start )) -lt "$dur" ]; do
    sleep 20
    if ! ci/netns-cluster.sh stall "$name" 3; then
        gone="node 3's broker is gone after $(( $(date +%s) - start )) s"
        echo "soak: $gone"
        break
    fi
    sleep 10; ci/netns-cluster.sh cont "$name" 3
    stalls=$((stalls + 1))
    sleep 10
    t=$(date +%s.%N)
    ci/netns-cluster.sh kill "$name" 6
    kills=$((kills + 1))
    sleep 5
    l=$("$VIGIL" resource eventlog --json | T="$t" python3 -c '
import json, os, sys
t = float(os.environ["T"])
for line in sys.stdin:
    e = json.loads(line)
    if e.get("name") == "offline" and e.get("timestamp", 0) >= t and e.get("context", {}).get("idset") == "6":
        print(int((e["timestamp"] - t) * 1000)); break
')
    lat+=("${l:-none}")
    echo "soak: kill $kills of node 6: offline event after ${l:-(none within 5 s)} ms"
    ci/netns-cluster.sh restart "$name" 6
    sleep 5
done
kill "$jobs_pid" 2>/dev/null || true
ev=$("$VIGIL" resource eventlog --json)
echo "$ev" > "$logs/resource-eventlog.jsonl"
read -r lost torpid lively <<< "$(echo "$ev" | python3 -c '
import json, sys
lost = torpid = lively = 0
for line in sys.stdin:
    e = json.loads(line)
    n, ids = e.get("name"), e.get("context", {}).get("idset", "")
    lost += n == "offline" and ids != "6"
    torpid += n == "torpid"
    lively += n == "lively"
print(lost, torpid, lively)
')"
ok=$(grep -c '^ok' "$logs/jobs.log" || true)
failed=$(grep -c '^failed' "$logs/jobs.log" || true)
sorted=$(printf '%s\n' "${lat[@]}" | grep -v none | sort -n)
n=$(echo "$sorted" | grep -c . || true)
p50=$( [ "$n" -gt 0 ] && echo "$sorted" | sed -n "$(( (n + 1) / 2 ))p" || echo -)
max=$( [ "$n" -gt 0 ] && echo "$sorted" | tail -1 || echo -)
"$VIGIL" overlay status
echo "$ev" | grep '"name":"offline"' | sed 's/^/soak: offline event: /' || true
grep '^failed' "$logs/jobs.log" | head -5 | sed 's/^/soak: job /' || true
echo "soak: ${dur}s with $((ncpu + 1)) busy loops on $ncpu cores, links ${impair}, $stalls stalls of 10 s, $kills silent kills:" \
    "false lost verdicts $lost, torpid events $torpid, lively events $lively, jobs $ok ok / $failed failed," \
    "kill -> offline event median $p50 ms, max $max ms ($n of $kills seen)${gone:+ ($gone)}; logs in $logs"
[ "$lost" -eq 0 ] && [ -z "$gone" ] && [ "$n" -eq "$kills" ]
