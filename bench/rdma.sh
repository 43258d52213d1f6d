#!/usr/bin/env bash
# RDMA overlay benchmark, one run inside the soft-RoCE VM (rxe0 = 10.200.0.1 on veth0, rxe1 = 10.200.0.2 on
# veth1). On the host:
#   cargo build --release -p vigil -p vigil-shell && cargo build --release -p vigil-rdma --example rtt
#   WORK=/tmp/rxe-vm-rdma ../shared/tools/rxe-vm/run-rxe-vm.sh run $PWD/bench/rdma.sh
# It measures, in the same run on the same devices:
#  - perftest ib_send_lat (1000 iterations, 2 bytes; busy polling, and with completion events `-e`), the same
#    at the overlay ping's size (PING_BYTES, below: the transport floor at equal bytes), and ib_send_bw
#    (65536 bytes) between rxe0 and rxe1;
#  - vigil-rdma round trip of a 2-byte message (1000, median), completion-channel and busy-poll modes (tokio),
#    and, narrower, SyncConnection (no tokio: post_send + poll_cq in a loop) with both ends in one thread and
#    with the echoing end on its own thread (shaped like perftest's two processes);
#  - overlay RPC round trip between two brokers on the two addresses, timed by broker 0 itself
#    (`vigil ping --overlay-only`) and as a client sees it (`vigil ping`), and streaming throughput (64 KiB
#    pings, 16 in flight), with the overlay on RDMA (completion channel, and busy poll) and on TCP over the
#    same veth pair;
#  - peer loss detection over RDMA (the verbs peer-QP-destroyed test: time to IBV_WC_RETRY_EXC_ERR).
# Writes $OUT/rdma.md (OUT=/mnt/out) with the table; copy it to bench/results/rdma.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REL=$ROOT/target/release
OUT=${OUT:-/mnt/out}
# Devices, their addresses and GID indexes: the VM's by default; on a machine with real HCAs set RDMA_DEV0/1 and
# RXE_A0/1, RXE_G0/1 (perftest and vigil-rdma run between device 0 and device 1).
A0=${RXE_A0:-10.200.0.1} A1=${RXE_A1:-10.200.0.2} G0=${RXE_G0:-1} G1=${RXE_G1:-1}
D0=${RDMA_DEV0:-rxe0} D1=${RDMA_DEV1:-rxe1}
export PATH=$REL:$PATH
T=$(mktemp -d /tmp/vigil-rdma-bench.XXXXXX)
N=1000
# Bytes of an overlay ping as an RDMA link carries it (packed framing, runtime/proto/src/message.rs `packed`): 26 out
# and ~64 back (the answer names the rank, host and pid). perftest sends one size both ways, so its row at equal
# bytes per round trip uses the mean of the two (full frames, tbon.rdma_frame=full: 53 and ~95, mean 74).
PING_BYTES=${PING_BYTES:-45}
med() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "nan"}'; }

# An untimed warm-up first: in a freshly booted VM the first seconds of round trips run ~1.5-2.5x slower
# (seen in every session: 32-58 µs one way, then 19-21 µs), which would skew the ratios below.
timeout 60 ib_send_lat -d "$D1" -x "$G1" -F -D 10 >/dev/null 2>&1 &
sleep 1
timeout 60 ib_send_lat -d "$D0" -x "$G0" -F -D 10 "$A1" >/dev/null 2>&1
wait
# perftest (server on rxe1, client on rxe0). ib_send_lat reports the one-way latency (half the round trip).
timeout 120 ib_send_lat -d "$D1" -x "$G1" -F -n $N >"$T/lat.s" 2>&1 &
sleep 1
timeout 120 ib_send_lat -d "$D0" -x "$G0" -F -n $N "$A1" >"$T/lat.c" 2>&1
wait
cat "$T/lat.c"
LAT=$(awk '/t_typical/{h=1; next} h && $1 ~ /^[0-9]+$/ {print $5; exit}' "$T/lat.c")
# The same at the overlay ping's size: rxe's per-byte work (copy, ICRC) is not free under emulation.
timeout 120 ib_send_lat -d "$D1" -x "$G1" -F -n $N -s "$PING_BYTES" >"$T/lats.s" 2>&1 &
sleep 1
timeout 120 ib_send_lat -d "$D0" -x "$G0" -F -n $N -s "$PING_BYTES" "$A1" >"$T/lats.c" 2>&1
wait
cat "$T/lats.c"
LATS=$(awk '/t_typical/{h=1; next} h && $1 ~ /^[0-9]+$/ {print $5; exit}' "$T/lats.c")
# The same with completion events (-e): both ends sleep on their completion channel, as the event-driven overlay
# does; the floor for that mode.
timeout 120 ib_send_lat -e -d "$D1" -x "$G1" -F -n $N >"$T/late.s" 2>&1 &
sleep 1
timeout 120 ib_send_lat -e -d "$D0" -x "$G0" -F -n $N "$A1" >"$T/late.c" 2>&1
wait
cat "$T/late.c"
LATE=$(awk '/t_typical/{h=1; next} h && $1 ~ /^[0-9]+$/ {print $5; exit}' "$T/late.c")
timeout 120 ib_send_bw -d "$D1" -x "$G1" -F -n 2000 >"$T/bw.s" 2>&1 &
sleep 1
timeout 120 ib_send_bw -d "$D0" -x "$G0" -F -n 2000 "$A1" >"$T/bw.c" 2>&1
wait
cat "$T/bw.c"
BW=$(awk '/BW average/{h=1; next} h && $1 ~ /^[0-9]+$/ {print $4; exit}' "$T/bw.c")

# vigil-rdma alone (both QPs in one process, one tokio thread).
RTT_EV=$(timeout 120 "$REL/examples/rtt" event ct $N | sed -n 's/.*median_us=\([0-9.]*\).*/\1/p')
RTT_BUSY=$(timeout 120 "$REL/examples/rtt" busy ct $N | sed -n 's/.*median_us=\([0-9.]*\).*/\1/p')
RTT_SYNC1=$(timeout 120 "$REL/examples/rtt" sync ct $N | sed -n 's/.*median_us=\([0-9.]*\).*/\1/p')
RTT_SYNC2=$(timeout 120 "$REL/examples/rtt" sync mt $N | sed -n 's/.*median_us=\([0-9.]*\).*/\1/p')

# Two brokers, overlay on rdma then on tcp.
vigil keygen --force "$T/overlay.key" 2>/dev/null || { echo "rdma.sh: vigil keygen failed" >&2; exit 1; }
cat >"$T/vigil.toml" <<EOF
[bootstrap]
instance = "rdma-bench"
overlay_key = "$T/overlay.key"
hosts = [
  { host = "n0", bind = "tcp://$A0:8051", connect = "tcp://$A0:8051" },
  { host = "n1", bind = "tcp://$A1:8051", connect = "tcp://$A1:8051" },
]
EOF
# Measure the steady state: under emulation the eBPF detectors take a few seconds to load, on a thread that
# competes with the two busy-polling brokers for the VM's two CPUs (round trips measured meanwhile have a p99
# of 10-16 ms instead of ~0.5-0.7 ms).
cat >"$T/pings.sh" <<EOF
#!/bin/bash
for i in \$(seq 100); do vigil uptime | grep -q loading || break; sleep 0.1; done
vigil uptime
vigil ping -c 50 1 >/dev/null
vigil ping -c $N 1
vigil ping --overlay-only -c 200 1 >/dev/null
vigil ping --overlay-only -c $N 1
vigil ping --overlay-only -c 300 --window 16 --size 65536 1
EOF
chmod +x "$T/pings.sh"
declare -A PING OVL STREAM
# rdma-busy: the same links with tbon.rdma_poll=busy (completion queues polled in a loop: latency benchmark mode).
for run in rdma rdma-busy tcp; do
    tr=${run%-busy}
    extra=()
    [ "$run" = rdma-busy ] && extra=(-S tbon.rdma_poll=busy)
    mkdir -p "$T/$run/r0" "$T/$run/r1"
    vigil broker --config "$T/vigil.toml" --rank 1 --rundir "$T/$run/r1" -S tbon.transport=$tr "${extra[@]}" >"$T/$run.r1.log" 2>&1 &
    p1=$!
    timeout 300 vigil broker --config "$T/vigil.toml" --rank 0 --rundir "$T/$run/r0" -S tbon.transport=$tr "${extra[@]}" \
        "$T/pings.sh" >"$T/$run.ping" 2>"$T/$run.r0.log" </dev/null
    wait $p1
    head -1 "$T/$run.ping"
    PING[$run]=$(sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' "$T/$run.ping" | med)
    OVL[$run]=$(grep "overlay round trips" "$T/$run.ping" | sed -n '1s/.*median \([0-9.]*\) us.*/\1/p')
    STREAM[$run]=$(grep "overlay round trips" "$T/$run.ping" | sed -n '2s/.*, \([0-9.]*\) MB\/s sent.*/\1/p')
    grep "overlay round trips" "$T/$run.ping"
    echo "overlay over $run: client ping median ${PING[$run]} ms, broker-timed RTT ${OVL[$run]} us, stream ${STREAM[$run]} MB/s"
done

# Peer loss detection over RDMA (timeout 12, retry_cnt 1): 5 runs of the verbs test.
DET=()
if [ -f "$ROOT/target/rdma-tests/bins.env" ]; then
    . "$ROOT/target/rdma-tests/bins.env"
    for i in 1 2 3 4 5; do
        d=$(VIGIL_RDMA_TESTS=1 "$VERBS_TEST" --exact peer_qp_destroyed --nocapture 2>&1 |
            sed -n 's/.*error after \([0-9.]*\)\(ms\|µs\|s\).*/\1 \2/p' |
            awk '{v=$1; if ($2=="µs") v/=1000; if ($2=="s") v*=1000; printf "%.1f", v}')
        DET+=("$d")
    done
fi
if [ ${#DET[@]} -eq 0 ]; then
    echo "rdma.sh: peer loss detection not measured: no verbs test binary (run ci/rdma-tests.sh once to build it)" >&2
fi
DETMED=$(printf '%s\n' "${DET[@]}" | med)

us() { awk -v v="$1" 'BEGIN { printf "%.1f", v * 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
PR=$(us "${PING[rdma]}") PT=$(us "${PING[tcp]}") PB=$(us "${PING[rdma-busy]}")
LAT_RTT=$(awk -v l="$LAT" 'BEGIN { printf "%.1f", 2 * l }')
LATS_RTT=$(awk -v l="$LATS" 'BEGIN { printf "%.1f", 2 * l }')
LATE_RTT=$(awk -v l="$LATE" 'BEGIN { printf "%.1f", 2 * l }')
cat >"$OUT/rdma.md" <<EOF
# RDMA overlay benchmark (soft-RoCE in the rxe-vm, TCG emulation, one run)

Kernel $(uname -r), $D0 ($A0) and $D1 ($A1), the same link for RDMA and TCP.
Emulated: absolute numbers are noisy; compare ratios within this run. Medians over $N round trips.

| measurement | median | ratio |
|---|---|---|
| perftest ib_send_lat, one way (2 B) | $LAT µs | |
| perftest ib_send_lat, as a round trip (2 × one way) | $LAT_RTT µs | 1.00 |
| perftest \`ib_send_lat -s $PING_BYTES\` (the overlay ping's bytes per round trip), as a round trip | $LATS_RTT µs | $(ratio "$LATS_RTT" "$LAT_RTT") × ib_send_lat RTT |
| perftest \`ib_send_lat -e\` (completion events, both ends sleep), as a round trip | $LATE_RTT µs | $(ratio "$LATE_RTT" "$LAT_RTT") × ib_send_lat RTT |
| vigil-rdma message round trip, completion channel (2 B, one process) | $RTT_EV µs | $(ratio "$RTT_EV" "$LAT_RTT") × ib_send_lat RTT |
| vigil-rdma message round trip, busy poll (2 B, one process) | $RTT_BUSY µs | $(ratio "$RTT_BUSY" "$LAT_RTT") × ib_send_lat RTT |
| narrower: vigil-rdma \`SyncConnection\` round trip, no tokio, both ends in one thread (2 B) | $RTT_SYNC1 µs | $(ratio "$RTT_SYNC1" "$LAT_RTT") × ib_send_lat RTT |
| narrower: same, echoing end on its own thread (like perftest's two processes) | $RTT_SYNC2 µs | $(ratio "$RTT_SYNC2" "$LAT_RTT") × ib_send_lat RTT |
| overlay RPC round trip between the brokers, timed by broker 0 (\`vigil ping --overlay-only\`), RDMA | ${OVL[rdma]} µs | $(ratio "${OVL[rdma]}" "$LAT_RTT") × ib_send_lat RTT ($(ratio "${OVL[rdma]}" "$LATE_RTT") × ib_send_lat -e RTT) |
| same, RDMA with \`tbon.rdma_poll=busy\` | ${OVL[rdma-busy]} µs | $(ratio "${OVL[rdma-busy]}" "$LAT_RTT") × ib_send_lat RTT ($(ratio "${OVL[rdma-busy]}" "$LATS_RTT") × ib_send_lat -s $PING_BYTES RTT) |
| same, TCP | ${OVL[tcp]} µs | RDMA/TCP = $(ratio "${OVL[rdma]}" "${OVL[tcp]}"), busy RDMA/TCP = $(ratio "${OVL[rdma-busy]}" "${OVL[tcp]}") |
| client RPC round trip \`vigil ping 1\` (client → Unix socket → broker 0 → overlay → broker 1 and back), RDMA | $PR µs | $(ratio "$PR" "$LAT_RTT") × ib_send_lat RTT |
| same, RDMA busy poll | $PB µs | $(ratio "$PB" "$LAT_RTT") × ib_send_lat RTT |
| same, TCP | $PT µs | RDMA/TCP = $(ratio "$PR" "$PT") |
| overlay streaming, 64 KiB pings, 16 in flight, RDMA | ${STREAM[rdma]} MB/s | $(ratio "${STREAM[rdma]}" "$BW") × ib_send_bw |
| same, RDMA busy poll | ${STREAM[rdma-busy]} MB/s | $(ratio "${STREAM[rdma-busy]}" "$BW") × ib_send_bw |
| same, TCP | ${STREAM[tcp]} MB/s | RDMA/TCP = $(ratio "${STREAM[rdma]}" "${STREAM[tcp]}") |
| perftest ib_send_bw (64 KiB) | $BW MB/s | |
| peer loss detection over RDMA (peer QP destroyed → IBV_WC_RETRY_EXC_ERR, timeout 12, retry_cnt 1; 5 runs: ${DET[*]} ms) | $DETMED ms | |
EOF
cat "$OUT/rdma.md"
rm -rf "$T"
