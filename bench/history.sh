#!/bin/sh
# vigil history over a large history table (issue 39: "vigil history over 100,000 records answers in under 1 s").
#
# A 1-broker test instance with a state directory runs two jobs (one COMPLETED, one FAILED) and stops; the store's
# history table then gets N copies of the COMPLETED record (ids, end times 10 ms apart ending now, 100 names,
# a tenth FAILED), written with sqlite3 beside the two real ones, and the instance starts again on it (rank 0 reads
# them back as it does after any restart). Inside it each query runs RUNS times; the table gives the median, min
# and max wall time of the command and the median CPU time (user + system) of the vigil process itself (the rest
# of the wall time is rank 0 and the socket). Queries:
#   newest 10        vigil history -A -c 10              (targeted: stops after 10)
#   last 10 s        vigil history -A --since=@EPOCH     (targeted by end time: the newest 1,000, 10 s of ends)
#   one name         vigil history -A --name job7        (a scan of all N, 1 % kept)
#   no such user     vigil history -u 4242               (a scan of all N, nothing kept)
#   all, table       vigil history -A -c 0               (every record, formatted)
#   all, JSON        vigil history -A -c 0 --json        (every record, as rank 0 wrote it)
#
# Usage: bench/history.sh   (env: VIGIL=path/to/vigil [target/release/vigil], N=100000, RUNS=5,
#                            OUT=bench/results/history.md). Needs sqlite3 and /usr/bin/time.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
VIGIL=${VIGIL:-$here/../target/release/vigil}
VIGIL=$(cd "$(dirname "$VIGIL")" && pwd)/$(basename "$VIGIL")
N=${N:-100000}
RUNS=${RUNS:-5}
OUT=${OUT:-$here/results/history.md}
command -v sqlite3 >/dev/null || { echo "bench/history.sh: needs sqlite3" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench/history.sh: needs /usr/bin/time" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PATH="$(dirname "$VIGIL"):$PATH"
state=$work/state

# 1. Two real records.
"$VIGIL" start --test-size=1 -S statedir="$state" sh -c 'vigil run true; vigil run false; true' >/dev/null 2>&1
real=$(sqlite3 "$state/vigil.sqlite" "SELECT count(*) FROM history")
[ "$real" = 2 ] || { echo "bench/history.sh: expected 2 real records, found $real" >&2; exit 1; }

# 2. N copies of the COMPLETED one: ids above any real one, end times 10 ms apart up to now.
now=$(date +%s)
sqlite3 "$state/vigil.sqlite" "
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $N),
  r AS (SELECT record FROM history WHERE json_extract(record, '\$.result') = 'COMPLETED' LIMIT 1)
INSERT INTO history(id, t_inactive, record)
SELECT (1 << 40) + i, $now - ($N - i) * 0.01,
  json_set(r.record, '\$.id', (1 << 40) + i, '\$.t_inactive', $now - ($N - i) * 0.01,
    '\$.t_finish', $now - ($N - i) * 0.01, '\$.name', 'job' || (i % 100),
    '\$.result', CASE WHEN i % 10 = 0 THEN 'FAILED' ELSE 'COMPLETED' END,
    '\$.exit_code', CASE WHEN i % 10 = 0 THEN 1 ELSE 0 END)
FROM n, r;"
kept=$(sqlite3 "$state/vigil.sqlite" "SELECT count(*) FROM history")

# 3. The queries, inside the instance started again on the store.
cat >"$work/q.sh" <<'EOF'
#!/bin/sh
# One line per run: label, wall s, cpu s, lines of output, bytes of output.
run() {
  label=$1; shift
  i=0
  while [ "$i" -lt "$RUNS" ]; do
    s=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$WORK/t" vigil history "$@" >"$WORK/o" 2>"$WORK/e" || { cat "$WORK/e" >&2; exit 1; }
    e=$(date +%s.%N)
    echo "$label|$(echo "$e - $s" | bc)|$(awk '{print $1 + $2}' "$WORK/t")|$(wc -l <"$WORK/o")|$(wc -c <"$WORK/o")"
    i=$((i + 1))
  done
}
run "newest 10 (-c 10)" -A -c 10
run "last 10 s (--since=@EPOCH)" -A --since="@$SINCE"
run "one name (--name job7)" -A --name job7
run "no such user (-u 4242)" -u 4242
run "all, table (-c 0)" -A -c 0
run "all, JSON (-c 0 --json)" -A -c 0 --json
EOF
chmod +x "$work/q.sh"
WORK=$work RUNS=$RUNS SINCE=$((now - 10)) "$VIGIL" start --test-size=1 -S statedir="$state" "$work/q.sh" >"$work/samples" 2>"$work/err" ||
  { cat "$work/err" >&2; exit 1; }

# 4. Medians (the middle sample of RUNS, sorted), min and max.
{
  echo "# vigil history over $kept records"
  echo
  echo "\`bench/history.sh\` (N=$N, RUNS=$RUNS), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load average at the start:" \
    "$(cut -d' ' -f1-3 /proc/loadavg). Wall: the \`vigil history\` command, start to exit; CPU: that process's user +" \
    "system time (the rest is rank 0 and the socket)."
  echo
  echo "| query | median wall (s) | min | max | median CPU of vigil (s) | lines | bytes |"
  echo "|---|---|---|---|---|---|---|"
  cut -d'|' -f1 "$work/samples" | uniq | while read -r label; do
    grep -F "$label|" "$work/samples" | awk -F'|' -v label="$label" '
      { w[NR] = $2; c[NR] = $3; lines = $4; bytes = $5 }
      END {
        n = NR; for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) {
          if (w[j] < w[i]) { t = w[i]; w[i] = w[j]; w[j] = t }
          if (c[j] < c[i]) { t = c[i]; c[i] = c[j]; c[j] = t } }
        m = int((n + 1) / 2)
        printf "| %s | %.3f | %.3f | %.3f | %.3f | %d | %d |\n", label, w[m], w[1], w[n], c[m], lines, bytes }'
  done
} >"$OUT"
cat "$OUT"
