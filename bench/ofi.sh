#!/usr/bin/env bash
# libfabric overlay benchmark (issue 20), one run on this machine's loopback with a libfabric provider
# (PROVIDER, default tcp;ofi_rxm; on a Slingshot node inside a job: PROVIDER=cxi ADDR=<the node's HSN address>).
#   cargo build --release -p vigil -p vigil-shell && bench/ofi.sh [OUT_DIR]
# It measures, in the same run, on the same provider and address:
#  - libfabric's own fi_pingpong (package libfabric-bin) over an RDM endpoint: latency at 64 bytes (about an
#    overlay ping's size) and throughput at 64 KiB, N iterations each;
#  - the overlay RPC round trip between two brokers, timed by broker 0 itself (`vigil ping --overlay-only`), and
#    as a client sees it (`vigil ping`), and streaming throughput (64 KiB pings, 16 in flight), with the overlay on
#    ofi and on Vigil's own TCP links.
# Writes OUT_DIR/ofi.md (default bench/results). Medians; every ratio is of two figures of this run.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REL=$ROOT/target/release
OUT=${1:-$ROOT/bench/results}
P=${PROVIDER:-tcp;ofi_rxm}
ADDR=${ADDR:-127.0.0.1}
N=${N:-1000}
export PATH=$REL:$PATH
command -v fi_pingpong >/dev/null || { echo "ofi.sh: fi_pingpong not found (apt-get install libfabric-bin)" >&2; exit 1; }
T=$(mktemp -d /tmp/vigil-ofi-bench.XXXXXX)
trap 'rm -rf "$T"' EXIT
med() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "nan"}'; }

# fi_pingpong: server, then client; the client's last line has usec/xfer (one way: total time / 2N transfers) and
# MB/sec. An untimed warm-up first.
pingpong() { # size iterations -> "usec_per_xfer MB_per_s"
    local port=$((20000 + RANDOM % 20000))
    timeout 120 fi_pingpong -p "$P" -e rdm -B "$port" -I "$2" -S "$1" >"$T/pp.s" 2>&1 &
    sleep 0.5
    timeout 120 fi_pingpong -p "$P" -e rdm -P "$port" -I "$2" -S "$1" "$ADDR" >"$T/pp.c" 2>&1
    wait
    # The bytes column says 64 or 64k: take the last line whose usec/xfer and MB/sec are numbers.
    awk 'NF == 8 && $6 ~ /^[0-9.]+$/ && $7 ~ /^[0-9.]+$/ {l = $7 " " $6} END {print l}' "$T/pp.c"
}
pingpong 64 100 >/dev/null
read -r PP_LAT _ <<<"$(pingpong 64 "$N")"
read -r _ PP_BW <<<"$(pingpong 65536 "$N")"
[ -n "${PP_LAT:-}" ] || { echo "ofi.sh: fi_pingpong gave no figure:" >&2; cat "$T/pp.c" >&2; exit 1; }
PP_RTT=$(awk -v l="$PP_LAT" 'BEGIN { printf "%.1f", 2 * l }')

cat >"$T/pings.sh" <<EOF
#!/bin/bash
for i in \$(seq 100); do vigil uptime | grep -q loading || break; sleep 0.1; done
vigil uptime | head -1
vigil ping -c 50 1 >/dev/null
vigil ping -c $N 1
vigil ping --overlay-only -c 200 1 >/dev/null
vigil ping --overlay-only -c $N 1
vigil ping --overlay-only -c 300 --window 16 --size 65536 1
EOF
chmod +x "$T/pings.sh"
declare -A PING OVL STREAM
for tr in ofi tcp; do
    timeout 300 vigil start --test-size=2 -S tbon.transport=$tr -S "tbon.ofi_provider=$P" "$T/pings.sh" >"$T/$tr.ping" 2>"$T/$tr.log"
    head -1 "$T/$tr.ping"
    if ! head -1 "$T/$tr.ping" | grep -q "transport $tr[ ,]"; then
        echo "ofi.sh: the $tr run did not run on $tr:" >&2; head -1 "$T/$tr.ping" >&2; tail -5 "$T/$tr.log" >&2; exit 1
    fi
    PING[$tr]=$(sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' "$T/$tr.ping" | med)
    OVL[$tr]=$(grep "overlay round trips" "$T/$tr.ping" | sed -n '1s/.*median \([0-9.]*\) us.*/\1/p')
    STREAM[$tr]=$(grep "overlay round trips" "$T/$tr.ping" | sed -n '2s/.*, \([0-9.]*\) MB\/s sent.*/\1/p')
    grep "overlay round trips" "$T/$tr.ping"
done

us() { awk -v v="$1" 'BEGIN { printf "%.1f", v * 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
PO=$(us "${PING[ofi]}") PT=$(us "${PING[tcp]}")
mkdir -p "$OUT"
cat >"$OUT/ofi.md" <<EOF
# libfabric overlay benchmark (provider $P on $ADDR, one run)

$(uname -r), $(nproc) CPUs, libfabric $(fi_info --version 2>/dev/null | sed -n 's/^libfabric: *//p' | head -1). Run by
\`bench/ofi.sh\`; medians over $N round trips. Every ratio is of two figures of this run. The target (issue 20): the
overlay RPC round trip within 1.5x of fi_pingpong's on the same provider.

| measurement | median | ratio |
|---|---|---|
| fi_pingpong (RDM, 64 B), as a round trip (2 x usec/xfer) | $PP_RTT µs | 1.00 |
| overlay RPC round trip between the brokers, timed by broker 0 (\`vigil ping --overlay-only\`), ofi | ${OVL[ofi]} µs | $(ratio "${OVL[ofi]}" "$PP_RTT") x fi_pingpong RTT |
| same, Vigil's TCP links | ${OVL[tcp]} µs | ofi/TCP = $(ratio "${OVL[ofi]}" "${OVL[tcp]}") |
| client RPC round trip \`vigil ping 1\` (client → Unix socket → broker 0 → overlay → broker 1 and back), ofi | $PO µs | $(ratio "$PO" "$PP_RTT") x fi_pingpong RTT |
| same, TCP | $PT µs | ofi/TCP = $(ratio "$PO" "$PT") |
| overlay streaming, 64 KiB pings, 16 in flight, ofi | ${STREAM[ofi]} MB/s | $(ratio "${STREAM[ofi]}" "$PP_BW") x fi_pingpong |
| same, TCP | ${STREAM[tcp]} MB/s | ofi/TCP = $(ratio "${STREAM[ofi]}" "${STREAM[tcp]}") |
| fi_pingpong (RDM, 64 KiB, one in flight) | $PP_BW MB/s | |
EOF
cat "$OUT/ofi.md"
