#!/usr/bin/env bash
# Fabric cut -> job exception (issue 40, item 1): TRIALS trials (default 20) of the test
# `fabric_down_fails_the_job_and_drains_the_node_not_lost` (runtime/cli/tests/failure_netns.rs) on one 4-node netns
# cluster whose nodes also have a fabric (`VIGIL_NETNS_FABRIC=1`: fab0 on a second bridge, each host's
# job_network). Each trial: `vigil submit -N4 -n4` of an MPICH allreduce loop whose UCX TCP transport runs on the
# fabric (`examples/mpi/allreduce_loop.c`; a sleep job without mpicc), node3's fabric link cut once it runs (its
# management link untouched), the exception and the drain timed from the cut (one clock: all nodes are
# namespaces of this machine), then heal and undrain.
# Writes bench/results/fabric-down.json (every trial's figures, seconds after the cut) and
# bench/results/fabric-down.md (p50/p99/max). p99 is by nearest rank: with 20 trials it is the largest sample.
# Target (issue 40): p99 <= 100 ms. Slurm's side (22.05 with --no-kill, ci/slurm-cluster.sh netns) is not measured
# here yet. Needs root, MPICH (mpicc), and the binaries of the ci profile (built here first).
#   bench/fabric-down.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-20}
case $trials in '' | *[!0-9]* | 0) echo "usage: bench/fabric-down.sh [TRIALS] (a positive integer; default 20)" >&2; exit 2 ;; esac
out=bench/results
json=$out/fabric-down.json
# The package set of the usual build (another set unifies features differently and rebuilds the core).
cargo build --profile ci --locked -p vigil -p vigil-shell -p vigil-bench -p vigil-pmix 2>&1 | tail -1 # measure this tree
t0=$(date +%s)
status=0
rm -f "$json"
VIGIL_FABRIC_TRIALS=$trials VIGIL_FABRIC_JSON=$PWD/$json \
    cargo test --profile ci --locked -p vigil --test failure_netns -- --exact \
    fabric_down_fails_the_job_and_drains_the_node_not_lost --nocapture 2>&1 | tee /tmp/vigil-fabric-down.log \
    | grep -E '^\[|trial' || status=$?
took=$(($(date +%s) - t0))
[ -s "$json" ] || { echo "fabric-down: no result (log: /tmp/vigil-fabric-down.log)" >&2; exit 1; }
python3 - "$json" "$out/fabric-down.md" "$trials" "$took" "$(nproc)" "$(uname -r)" << 'PY'
import json, math, sys
path, md, asked, took, ncpu, kernel = sys.argv[1:7]
doc = json.load(open(path))
trials = doc["trials"]
def q(v, p):
    v = sorted(v)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)]
def ms(s):
    return f"{s * 1e3:.1f}"
rows = [
    ("fabric cut -> job exception", [t["exception"] for t in trials]),
    ("fabric cut -> node drained", [t["drain"] for t in trials if t["drain"] is not None]),
]
lines = [
    "# Fabric cut -> job exception",
    "",
    f"`bench/fabric-down.sh {asked}`: {len(trials)} trials in {took} s; {ncpu}-core machine, kernel {kernel},",
    "ci-profile binaries, shared with other builds while it ran. One 4-node netns cluster with a second (fabric)",
    f"bridge; each trial a 4-node job ({doc['job']}, MPICH's UCX TCP transport on fab0), node3's fabric link cut",
    "(its management link untouched), then healed and undrained. Defaults: tbon.probe_period 10 ms,",
    "tbon.probe_misses 3. p99 by nearest rank. Target (issue 40): p99 <= 100 ms.",
    "Slurm 22.05 with --no-kill under the same cut is not measured here yet.",
    "",
    "| ms | n | p50 | p99 | max |",
    "|---|---:|---:|---:|---:|",
]
for name, v in rows:
    if v:
        lines.append(f"| {name} | {len(v)} | {ms(q(v, 50))} | {ms(q(v, 99))} | {ms(max(v))} |")
lines += ["", "Per trial (ms after the cut): exception; drain.", ""]
for i, t in enumerate(trials):
    d = ms(t["drain"]) if t["drain"] is not None else "-"
    lines.append(f"{i + 1}. {ms(t['exception'])}; {d}")
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit $status
