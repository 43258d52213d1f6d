#!/bin/bash
# What the privileged launcher adds to a job's start (issue 37: "latency at most +2 ms").
#
# In one run, on one machine, with one build: the wall time of `vigil run -N1 true`
#   (a) as root, on a 1-broker instance whose broker is root (jobs start as the broker's own: no credential,
#       no vigil-imp), and
#   (b) as a guest, on a 1-broker multi-user instance (`[access] allow-guest-users = true`) whose broker runs
#       as an unprivileged broker user, the job started through a setuid-root copy of vigil-imp with the
#       guest's munge credential,
# as runtime/cli/tests/instance_imp.rs sets such an instance up. Both instances run side by side from TOML
# (loopback), and the trials alternate a, b, a, b... after WARM untimed runs of each, so drift in the load hits
# both. Each trial is `setpriv --reuid=U --regid=G --init-groups vigil run -N1 true` for both (root's too), timed
# from spawn to exit. Reported: median and p90 (nearest rank) per side, their difference in ms and ratio.
#
# Makes (and removes on exit, also on failure): two users (useradd), a munged of its own (its own key and
# socket), cgroups under /sys/fs/cgroup/unified, /etc/vigil/imp.toml (refuses to run if it exists).
#
# Usage: bench/imp.sh   as root (env: BIN=target/ci, RUNS=60, WARM=5, OUT=bench/results/imp.md).
# Needs munged, munge, setpriv, useradd, python3 (free ports), cgroup2 at /sys/fs/cgroup/unified.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$here/../target/ci}
BIN=$(cd "$BIN" && pwd)
RUNS=${RUNS:-60}
WARM=${WARM:-5}
OUT=${OUT:-$here/results/imp.md}
IMP_CONFIG=/etc/vigil/imp.toml
CGBASE=/sys/fs/cgroup/unified
die() { echo "bench/imp.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"
for p in munged munge setpriv useradd userdel python3; do command -v $p >/dev/null || die "needs $p"; done
[ -e $CGBASE/cgroup.procs ] || die "no cgroup2 hierarchy at $CGBASE"
for p in vigil vigil-shell vigil-imp; do [ -x "$BIN/$p" ] || die "no $BIN/$p (cargo build --profile ci -p vigil -p vigil-shell -p vigil-imp)"; done
[ -e $IMP_CONFIG ] && die "$IMP_CONFIG exists (not this script's to overwrite)"

tag=$(printf '%05d' $(($$ % 100000)))
work=$(mktemp -d /tmp/impbench.XXXXXX)
chmod 755 "$work"
cg=$CGBASE/vigil-impbench-$tag
users=""
made_etc=0
pids=""
cleanup() {
  set +e
  for p in $pids; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in $pids; do kill -9 "$p" 2>/dev/null; done
  [ -f "$work/munge/munged.pid" ] && kill "$(cat "$work/munge/munged.pid")" 2>/dev/null
  if [ -d "$cg" ]; then
    # Depth first: kill what is left in each cgroup, then remove it.
    find "$cg" -depth -type d | while read -r d; do
      echo 1 >"$d/cgroup.kill" 2>/dev/null
      for _ in $(seq 50); do rmdir "$d" 2>/dev/null && break; sleep 0.1; done
    done
  fi
  for u in $users; do userdel "$u" 2>/dev/null; done
  rm -f $IMP_CONFIG
  [ "$made_etc" = 1 ] && rmdir /etc/vigil 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Users: the broker user of instance b and a guest.
for n in vibb$tag vibg$tag; do
  useradd -M -s /bin/sh -d /nonexistent "$n" || die "useradd $n"
  users="$users $n"
done
bu=$(id -u vibb$tag); bg=$(id -g vibb$tag)
gu=$(id -u vibg$tag); gg=$(id -g vibg$tag)

# munged, its own key and socket.
mkdir -m 755 "$work/munge"
head -c 1024 /dev/urandom >"$work/munge/munge.key"; chmod 600 "$work/munge/munge.key"
m=$work/munge
munged --force --socket="$m/munge.socket" --key-file="$m/munge.key" --pid-file="$m/munged.pid" \
  --log-file="$m/munged.log" --seed-file="$m/munged.seed" || die "munged"
for _ in $(seq 100); do [ -S "$m/munge.socket" ] && break; sleep 0.1; done
[ -S "$m/munge.socket" ] || die "munged's socket did not appear"

# The programs, root's, in a directory of root's; vigil-imp setuid root.
mkdir -m 755 "$work/bin"
for p in vigil vigil-shell vigil-imp; do cp "$BIN/$p" "$work/bin/$p"; done
chmod 4755 "$work/bin/vigil-imp"
[ -d /etc/vigil ] || { mkdir -p /etc/vigil; made_etc=1; }
cat >$IMP_CONFIG <<EOF
instance = 'impb'
broker-user = 'vibb$tag'
allowed-shells = ['$work/bin/vigil-shell']
cgroup-root = '$cg/b'
munge-socket = '$m/munge.socket'
EOF
chmod 644 $IMP_CONFIG

# Cgroups: a (root's) and b (delegated to the broker user).
mkdir "$cg" "$cg/a" "$cg/b"
for f in "" /cgroup.procs /cgroup.subtree_control /cgroup.threads; do chown "$bu:$bg" "$cg/b$f"; done

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# instance NAME DIR TABLES: a 1-broker TOML instance in DIR.
instance() {
  mkdir -m 755 "$2"
  "$work/bin/vigil" keygen "$2/overlay.key" >/dev/null 2>&1
  p=$(port)
  printf '[bootstrap]\ninstance = "%s"\noverlay_key = "%s"\nhosts = [ { host = "n0", bind = "tcp://127.0.0.1:%s", connect = "tcp://127.0.0.1:%s" } ]\n%b' \
    "$1" "$2/overlay.key" "$p" "$p" "$3" >"$2/vigil.toml"
  mkdir -m 755 "$2/r0"
}
instance impa "$work/a" ""
instance impb "$work/b" "[access]\nallow-guest-users = true\n[exec]\nimp = \"$work/bin/vigil-imp\"\n"
chown "$bu:$bg" "$work/b/overlay.key" "$work/b/r0"

# broker DIR CGROUP UID GID: start rank 0 in CGROUP as UID:GID.
broker() {
  (cd "$1" && TMPDIR=$1 PATH="$work/bin:$PATH" VIGIL_MUNGE_SOCKET=$m/munge.socket RUST_LOG= \
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$2" setpriv --reuid="$3" --regid="$4" --init-groups \
    "$work/bin/vigil" broker --rank=0 --config="$1/vigil.toml" --rundir="$1/r0" \
    -S "resource.synthetic=pack:1 core:2 pu:1" -S log-level=warn -S exec.shell="$work/bin/vigil-shell" \
    >"$1/broker.log" 2>&1) &
  pids="$pids $!"
}
broker "$work/a" "$cg/a" 0 0
broker "$work/b" "$cg/b" "$bu" "$bg"

# as DIR UID GID ARGS: vigil ARGS as UID:GID on DIR's instance.
as() {
  d=$1 u=$2 g=$3; shift 3
  (cd "$work" && env -i PATH="$work/bin:/usr/bin:/bin" HOME=/nonexistent TMPDIR="$work" VIGIL_URI="local://$d/r0/local-0" \
    VIGIL_MUNGE_SOCKET="$m/munge.socket" setpriv --reuid="$u" --regid="$g" --init-groups "$work/bin/vigil" "$@")
}
for side in "a 0 0" "b $gu $gg"; do
  set -- $side
  ok=0
  for _ in $(seq 120); do
    as "$work/$1" "$2" "$3" uptime 2>/dev/null | grep -q ' run ' && { ok=1; break; }
    sleep 0.5
  done
  [ $ok = 1 ] || { cat "$work/$1/broker.log" >&2; die "instance $1 did not come up"; }
done
# The guest's job really runs as the guest, through vigil-imp.
got=$(as "$work/b" "$gu" "$gg" run -N1 id -u 2>&1 | grep -v '^vigil-shell:' || true)
[ "$got" = "$gu" ] || { cat "$work/b/broker.log" >&2; die "the guest's job ran as '$got', not $gu"; }
got=$(as "$work/a" 0 0 run -N1 id -u 2>&1 | grep -v '^vigil-shell:' || true)
[ "$got" = 0 ] || die "root's job ran as '$got'"

load_start=$(uptime)
trial() { # trial SIDE -> ms
  case $1 in a) set -- "$work/a" 0 0 ;; b) set -- "$work/b" "$gu" "$gg" ;; esac
  s=$EPOCHREALTIME
  as "$1" "$2" "$3" run -N1 true >/dev/null 2>"$work/err" || { cat "$work/err" >&2; die "vigil run -N1 true failed"; }
  e=$EPOCHREALTIME
  echo "($e - $s) * 1000" | bc -l
}
for _ in $(seq "$WARM"); do trial a >/dev/null; trial b >/dev/null; done
: >"$work/a.ms"; : >"$work/b.ms"
for _ in $(seq "$RUNS"); do trial a >>"$work/a.ms"; trial b >>"$work/b.ms"; done
load_end=$(uptime)

# stat FILE -> "median p90 min max" (ms; median of an even count: the mean of the middle two).
stat() {
  sort -g "$1" | awk '{v[NR]=$1} END {
    med = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2
    p = int(0.9 * NR + 0.999999); printf "%.2f %.2f %.2f %.2f\n", med, v[p], v[1], v[NR] }'
}
read -r am ap amin amax <<<"$(stat "$work/a.ms")"
read -r bm bp bmin bmax <<<"$(stat "$work/b.ms")"
dm=$(echo "$bm - $am" | bc -l); dp=$(echo "$bp - $ap" | bc -l)
rm_=$(echo "$bm / $am" | bc -l); rp=$(echo "$bp / $ap" | bc -l)
verdict=$(echo "$dm <= 2" | bc -l)
{
  echo "# vigil-imp: added start cost of a guest's job"
  echo
  echo "\`bench/imp.sh\` (RUNS=$RUNS alternating trials per side after WARM=$WARM each), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, \`$(basename "$BIN")\` build."
  echo "Load (\`uptime\`) at the start: \`$load_start\`; at the end: \`$load_end\`."
  echo
  echo "Wall time of \`setpriv --reuid=U --regid=G --init-groups vigil run -N1 true\`, spawn to exit, on 1-broker TOML instances:"
  echo "(a) root on a root broker (no credential, no launcher); (b) a guest on a multi-user instance whose broker is an"
  echo "unprivileged user, the job shell started by setuid-root vigil-imp after checking the guest's munge credential."
  echo
  echo "| | median (ms) | p90 (ms) | min | max |"
  echo "|---|---:|---:|---:|---:|"
  echo "| (a) root, root broker | $am | $ap | $amin | $amax |"
  echo "| (b) guest, vigil-imp | $bm | $bp | $bmin | $bmax |"
  printf '| b - a | %+.2f | %+.2f | | |\n' "$dm" "$dp"
  printf '| b / a | %.3f | %.3f | | |\n' "$rm_" "$rp"
  echo
  if [ "$verdict" = 1 ]; then
    printf 'Issue 37 target (latency at most +2 ms): met (median +%.2f ms).\n' "$dm"
  else
    printf 'Issue 37 target (latency at most +2 ms): MISSED (median %+.2f ms).\n' "$dm"
  fi
} >"$OUT"
cat "$OUT"
