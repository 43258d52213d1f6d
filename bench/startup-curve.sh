#!/usr/bin/env bash
# Start-up curve: `vigil start --test-size=N` for each N and topology, RUNS times each, all brokers on this
# machine. Per run: seconds from launching `vigil start` to every rank online (`vigil overlay status --wait=full`),
# seconds of `vigil run -N N true`, and rank 0's broker CPU seconds (user + system, /proc) at that point. Prints a
# markdown table of medians (min-max) and the ratio of each median to the smallest N's, so growth can be read
# against N's own growth (linear = the N ratio). Packed instances stretch their periods (README: 32 brokers per
# CPU), which `vigil start` says on stderr; this script keeps the default attributes otherwise.
#   bench/startup-curve.sh [SIZES] [TOPOS] [RUNS]     defaults: "64 128 256 512 1024" "kary:0 kary:32" 3
# VIGIL: the vigil binary (default: target/release/vigil, else target/ci/vigil).
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-64 128 256 512 1024}
topos=${2:-kary:0 kary:32}
runs=${3:-3}
if [ -z "${VIGIL:-}" ]; then
    VIGIL=$PWD/target/release/vigil
    [ -x "$VIGIL" ] || VIGIL=$PWD/target/ci/vigil
fi
export PATH="$(dirname "$VIGIL"):$PATH"
tck=$(getconf CLK_TCK)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The instance's initial program: wait for N online, time the job, read rank 0's CPU time ($PPID is rank 0).
inner='n=$1; t0=$2; tck=$3
vigil overlay status --wait=full --timeout=300s > /dev/null
t1=$(date +%s.%N)
vigil run -N"$n" true
t2=$(date +%s.%N)
cpu=$(awk -v t="$tck" "{print (\$14 + \$15) / t}" /proc/$PPID/stat)
echo "RESULT $(awk "BEGIN {print $t1 - $t0, $t2 - $t1}") $cpu"'
for topo in $topos; do
    for n in $sizes; do
        for ((r = 1; r <= runs; r++)); do
            t0=$(date +%s.%N)
            if line=$(timeout 600 "$VIGIL" start --test-size="$n" -S tbon.topo="$topo" sh -c "$inner" sh "$n" "$t0" "$tck" 2>/dev/null | grep '^RESULT'); then
                read -r _ online job cpu <<< "$line"
                echo "$topo $n $online $job $cpu" | tee -a "$out" >&2
            else
                echo "$topo $n FAILED" | tee -a "$out" >&2
            fi
        done
    done
done
python3 - "$out" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5:
        rows.setdefault((f[0], int(f[1])), []).append(tuple(map(float, f[2:])))
print("| topology | N | runs | all online (s) | `run -N N true` (s) | rank 0 CPU (s) | online / smallest N | N / smallest N |")
print("|---|---:|---:|---|---|---|---:|---:|")
base = {}
for (topo, n) in sorted(rows, key=lambda k: (k[0], k[1])):
    v = rows[(topo, n)]
    cols = []
    for i in range(3):
        xs = [x[i] for x in v]
        cols.append(f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})")
    med = statistics.median(x[0] for x in v)
    b = base.setdefault(topo, (n, med))
    print(f"| {topo} | {n} | {len(v)} | {cols[0]} | {cols[1]} | {cols[2]} | {med / b[1]:.1f} | {n / b[0]:.0f} |")
EOF
