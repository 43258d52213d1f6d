#!/usr/bin/env bash
# Prober CPU cost on a parent node: a flat netns instance of N+1 nodes (rank 0 the parent of N children, default
# N = 256), each node its own network namespace with its own broker and eBPF detectors, measured idle.
#
# Isolation: the parent node's broker is pinned on CPU 0 and its interface's receive processing is steered there
# (RPS or its NAPI thread, below); every child broker, the bridge ports (the "network") and this script run on CPU 1.
# The parent node's cost is rank 0's run time (all threads, exact, from schedstat: its prober, its sends), plus the
# NAPI thread's run time (PARENT_RX=napi), plus CPU 0's irq + softirq time (tick-sampled, from /proc/stat: the
# kernel's receive path under RPS); CPU 0's total busy time is shown too (it also counts anything else the
# machine runs there). Variants, each in a
# fresh instance, alternating RUNS times: probes effectively off (tbon.probe_period=3600s, the baseline), unicast
# probes (tbon.probe_group=off: one datagram per child per period), group probes (the default: one multicast
# datagram per period, replies collected by XDP). Cost = variant - baseline, in % of one core, medians over runs.
# Every variant runs with tbon.heartbeat_period=200ms and tbon.torpid_max=2s: 256 child brokers sharing one core
# with their 50 ms default heartbeats keep it busy, and replies delayed by a starved core would be counted against
# the parent (late replies bring extra unicast probes).
# Then, in the same instance, the busy-core view: the fixed-work-quanta OS-noise measurement (`vigil-bench fwq`,
# a compute-bound process pinned on CPU 0 next to rank 0's broker, like an application rank) for as long again;
# its noise (share of the core lost to interruptions) with probing minus without is what probing costs a job
# running on the parent's core. On an idle core, part of the kernel's cost is waking the halted virtual CPU for
# each burst of replies (inter-processor interrupts that trap to the hypervisor); on a busy core it is not.
# PARENT_RX=rps (default) or napi: how the parent's interface hands received packets to CPU 0. rps: the veth's
# packets are queued to CPU 0's backlog by receive packet steering (one inter-processor interrupt per batch, the
# generic per-CPU queue). napi: the veth runs its own NAPI receive ring (GRO on), polled by a NAPI thread pinned on
# CPU 0 at real-time priority (threaded NAPI standing for a NIC's receive softirq), the way a NIC driver polls its
# ring: woken once, it drains every packet that arrived. (The hub's end of the veth gets TSO off, without which a
# veth bypasses its ring for forwarded packets; the script stops if the NAPI thread never ran.) xdp: the napi set-up,
# plus what a NIC with native XDP gives: the parent's responder attached in native mode (broker.xdp_mode=native) and
# the hub's end of every child's veth running a switch-port program (`vigil-bench xdp-hub`) that hands each probe
# reply to the parent's ring as an XDP frame, so the parent's XDP program consumes the replies before any socket
# buffer is built (on veth, frames from the bridge are socket buffers). Writes bench/results/probe-cost.{md,json},
# or probe-cost-napi / probe-cost-xdp.{md,json}.
# Also reports the ranks online at the end (a child declared lost shows there), the XDP program's own time per
# packet (kernel BPF statistics, in a separate 5 s window), and, with probes off, the floor: what a process that only
# wakes every 10 ms and sends one datagram on the parent's interface costs (`vigil-bench tick`). Warns when the
# baseline itself is noisy (something else is using CPU 0: the figures then say little). Needs root, bpftool
# (optional) and 2+ CPUs.
#   bench/probe-cost.sh [N] [IDLE_S] [RUNS]       (defaults 256 20 3)
set -euo pipefail
cd "$(dirname "$0")/.."
ncpu=$(nproc)
n=${1:-256}
idle=${2:-20}
runs=${3:-3}
for v in "$n" "$idle" "$runs"; do
    case $v in '' | *[!0-9]* | 0) echo "usage: bench/probe-cost.sh [N IDLE_S RUNS] (positive integers; defaults 256 20 3)" >&2; exit 2 ;; esac
done
rx=${PARENT_RX:-rps}
case $rx in rps) suffix= ;; napi) suffix=-napi ;; xdp) suffix=-xdp ;; *) echo "probe-cost: PARENT_RX must be rps, napi or xdp" >&2; exit 2 ;; esac
name=pc$(printf '%04d' $(($$ % 10000)))
[ "$ncpu" -ge 2 ] || { echo "probe-cost: needs 2 CPUs" >&2; exit 2; }
cargo build --release -p vigil -p vigil-bench 2>&1 | tail -1 # measure this tree, not a stale build
fwq_bin=$PWD/target/release/vigil-bench
export VIGIL=${VIGIL:-$PWD/target/release/vigil}
dir=${VIGIL_NETNS_DIR:-/tmp}/vigil-netns-$name
out=bench/results
logs=${PROBE_COST_LOGS:-/tmp/vigil-probe-cost-logs}
hub_pid=
cleanup() {
    [ -n "$hub_pid" ] && kill "$hub_pid" 2> /dev/null || true
    # Keep the brokers' logs of an instance left behind (why it failed to come up, what rank 0 saw).
    if [ -d "$dir" ]; then
        mkdir -p "$logs/last"
        for f in "$dir"/node*/broker.log; do [ -s "$f" ] && cp "$f" "$logs/last/$(basename "$(dirname "$f")").log"; done
    fi
    ci/netns-cluster.sh down "$name" > /dev/null 2>&1 || true
    sysctl -qw kernel.bpf_stats_enabled="$stats_was" 2> /dev/null || true
}
trap cleanup EXIT
rm -rf "$logs"/run* "$logs/last" # logs of an earlier run would pass for this one's
taskset -p 2 $$ >/dev/null # this script (and what it starts) on CPU 1

# Accounting. Task CPU time is read from /proc/PID/task/*/schedstat (the scheduler's own run time, in ns): the
# utime/stime of /proc/PID/stat are sampled by the tick (4 ms at HZ=250), and a broker that runs some 30 µs every
# 10 ms is caught by a tick only now and then, so those figures are noisy. CPU 0's irq + softirq time is still the
# tick-sampled /proc/stat figure unless the kernel has CONFIG_IRQ_TIME_ACCOUNTING; with PARENT_RX=napi the
# receive work runs in the NAPI thread, whose run time is exact.
cpu0_busy() { awk '$1 == "cpu0" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
cpu0_irq() { awk '$1 == "cpu0" { print $7 + $8 }' /proc/stat; }
# Run time in ns of every thread of the given processes.
task_ns() {
    local t=0 p f a
    for p in "$@"; do
        for f in /proc/"$p"/task/*/schedstat; do read -r a _ < "$f" 2> /dev/null && t=$((t + a)); done
    done
    echo $t
}
napi_pids() { [ "$rx" != rps ] && pgrep 'napi/eth0-[0-9]' || true; }
# xdp: only the parent's responder in native mode (children keep generic XDP, which needs nothing of the hub).
[ "$rx" = xdp ] && export VIGIL_NETNS_RANK0_ARGS="-S broker.xdp_mode=native"
hz=$(getconf CLK_TCK)
# The kernel's per-program statistics (run time of each BPF program) cost two clock reads per run: off while
# measuring, on for a separate window that times the parent's XDP program alone (needs bpftool).
stats_was=$(sysctl -n kernel.bpf_stats_enabled 2> /dev/null || echo 0)
sysctl -qw kernel.bpf_stats_enabled=0 2> /dev/null || true
have_bpftool=$(command -v bpftool > /dev/null && echo 1 || echo 0)
[ "$have_bpftool" = 1 ] || echo "probe-cost: no bpftool: the XDP program's own run time is not measured" >&2
# XDP program on the parent's eth0: "run_cnt run_time_ns" (cumulative, counted while statistics are on).
xdp_stats() {
    local id
    id=$(ip -n "vn-$name-n0" -d link show eth0 | grep -o 'prog/xdp id [0-9]*' | awk '{ print $3 }' | head -1)
    [ -n "$id" ] || { echo "0 0"; return; }
    bpftool prog show id "$id" -j | python3 -c 'import json,sys; p=json.load(sys.stdin); print(p.get("run_cnt", 0), p.get("run_time_ns", 0))'
}

variants=("baseline|probes off (tbon.probe_period=3600s)|-S tbon.probe_period=3600s"
    "unicast|unicast probes (tbon.probe_group=off)|-S tbon.probe_group=off"
    "group|group probes (default)|")
results=()
for ((r = 1; r <= runs; r++)); do
    for v in "${variants[@]}"; do
        IFS='|' read -r key label attrs <<< "$v"
        # Start-up (257 brokers loading their eBPF programs) on every CPU; pinned once up.
        # shellcheck disable=SC2086
        taskset -c "0-$((ncpu - 1))" ci/netns-cluster.sh up "$name" $((n + 1)) -S tbon.topo=kary:0 -S tbon.heartbeat_period=200ms -S tbon.torpid_max=2s $attrs
        export VIGIL_URI=$(ci/netns-cluster.sh uri "$name")
        # Pin: node 0's processes on CPU 0, every other node's on CPU 1; receive processing likewise.
        for p in $(ci/netns-cluster.sh pids "$name" 0); do taskset -a -p 1 "$p" >/dev/null; done
        for ((k = 1; k <= n; k++)); do
            for p in $(ci/netns-cluster.sh pids "$name" $k); do taskset -a -p 2 "$p" >/dev/null; done
        done
        if [ "$rx" != rps ]; then
            ip netns exec "vn-$name-n0" ethtool -K eth0 gro on
            # A veth hands a packet to its peer's NAPI ring only if the sending end has no TSO (or the packet comes
            # from a local socket): the replies come through the bridge, so the hub's end of the parent's veth
            # gets TSO and GSO off. Without this the replies bypass the ring and are processed on the bridge's CPU.
            ip netns exec "vn-$name-hub" ethtool -K "vn${name}h0" tso off gso off
            ip netns exec "vn-$name-n0" sh -c 'echo 1 > /sys/class/net/eth0/threaded'
            # Only the parent's eth0 runs threaded NAPI: its thread is the one napi/eth0-* kernel thread. It stands
            # for a NIC's receive softirq, which preempts tasks: real-time priority. At normal priority it waits
            # behind the broker and FWQ, the veth's 256-entry ring overflows in the bursts of replies and drops
            # some, and the children at the end of each burst are (rightly, from what arrives) declared lost.
            for p in $(pgrep 'napi/eth0-[0-9]' || true); do taskset -p 1 "$p" > /dev/null; chrt -f -p 50 "$p"; done
        else
            ip netns exec "vn-$name-n0" sh -c 'echo 1 > /sys/class/net/eth0/queues/rx-0/rps_cpus'
        fi
        for ((k = 1; k <= n; k++)); do
            ip netns exec "vn-$name-n$k" sh -c 'echo 2 > /sys/class/net/eth0/queues/rx-0/rps_cpus'
        done
        ip netns exec "vn-$name-hub" sh -c 'for f in /sys/class/net/*/queues/rx-0/rps_cpus; do echo 2 > $f; done'
        # Every broker's detectors loaded (each node's own broker answers on its local socket), then settle.
        for ((k = 0; k <= n; k++)); do
            for _ in $(seq 1 600); do
                kill -0 "$(cat "$dir/node$k/broker.pid")" 2> /dev/null || break # gone (lost): counted below
                s=$(VIGIL_URI="local://$dir/node$k/local-$k" "$VIGIL" overlay status 2> /dev/null || true)
                case $s in *loading* | "") sleep 0.2 ;; *) break ;; esac
            done
        done
        st=$("$VIGIL" overlay status)
        if [ "$rx" = xdp ]; then
            echo "$st" | grep -q '^detectors.*xdp (native on eth0)' || {
                echo "probe-cost: rank 0's responder is not in native XDP mode:" >&2
                echo "$st" | grep '^detectors' >&2
                exit 1
            }
            ports=()
            for ((k = 1; k <= n; k++)); do ports+=("vn${name}h$k"); done
            ip netns exec "vn-$name-hub" taskset -c 1 "$fwq_bin" xdp-hub --to "vn${name}h0" --parent 10.200.0.1 "${ports[@]}" &
            hub_pid=$!
            sleep 2
            kill -0 "$hub_pid" 2> /dev/null || { echo "probe-cost: vigil-bench xdp-hub failed" >&2; exit 1; }
        fi
        sleep 5
        pid0=$(cat "$dir/node0/broker.pid")
        napi=$(napi_pids)
        # shellcheck disable=SC2086
        b0=$(cpu0_busy); i0=$(cpu0_irq); u0=$(task_ns "$pid0"); q0=$(task_ns $napi); t0=$(date +%s%N)
        sleep "$idle"
        # shellcheck disable=SC2086
        b1=$(cpu0_busy); i1=$(cpu0_irq); u1=$(task_ns "$pid0"); q1=$(task_ns $napi); t1=$(date +%s%N)
        fwq=$(taskset -c 0 "$fwq_bin" fwq --seconds "$idle")
        read -r noise rate < <(echo "$fwq" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["noise_pct"], r["work_rate"])')
        # The XDP program's own time per packet, in a short window of its own (statistics on).
        xdp_ns=0 xdp_pps=0
        if [ "$have_bpftool" = 1 ] && sysctl -qw kernel.bpf_stats_enabled=1 2> /dev/null; then
            read -r c0 r0 < <(xdp_stats); x0=$(date +%s%N)
            sleep 5
            read -r c1 r1 < <(xdp_stats); x1=$(date +%s%N)
            sysctl -qw kernel.bpf_stats_enabled=0
            read -r xdp_ns xdp_pps < <(awk -v c="$((c1 - c0))" -v r="$((r1 - r0))" -v ns="$((x1 - x0))" \
                'BEGIN { printf "%.0f %.0f\n", c ? r / c : 0, c / (ns / 1e9) }')
        fi
        # The floor (with probes off, on the parent's node and core): what waking every 10 ms and sending one
        # datagram on the parent's interface costs by itself, before any prober logic (`vigil-bench tick`).
        floor=0
        if [ "$key" = baseline ]; then
            ip0=$(ip -n "vn-$name-n0" -4 -o addr show eth0 | awk '{ split($4, a, "/"); print a[1] }')
            floor=$(ip netns exec "vn-$name-n0" taskset -c 0 "$fwq_bin" tick --to 239.255.254.254:22087 --from "$ip0" \
                --period-ms 10 --seconds "$idle" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cpu_pct"])')
            echo "probe-cost: run $r floor (wake every 10 ms, send one datagram): $floor % of a core"
        fi
        states=$("$VIGIL" overlay status --json | grep -o '"state":"[a-z]*"' | cut -d'"' -f4 | sort | uniq -c | awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }')
        online=$(echo "$states" | grep -o '[0-9]* online' | awk '{ print $1 }')
        online=${online:-0}
        if [ "$online" -lt $((n + 1)) ]; then
            # Keep this instance's logs: which ranks, and why (torpid: starved; lost: the verdict's reason).
            mkdir -p "$logs/run$r-$key"
            for f in "$dir"/node*/broker.log; do [ -s "$f" ] && cp "$f" "$logs/run$r-$key/$(basename "$(dirname "$f")").log"; done
            echo "probe-cost: run $r $key: ranks by state: $states; logs in $logs/run$r-$key"
        fi
        read -r cpu broker irq nq < <(awk -v b="$((b1 - b0))" -v u="$((u1 - u0))" -v i="$((i1 - i0))" -v q="$((q1 - q0))" \
            -v hz="$hz" -v ns="$((t1 - t0))" \
            'BEGIN { w = ns / 1e9; printf "%.3f %.3f %.3f %.3f\n", 100 * b / hz / w, 100 * u / ns, 100 * i / hz / w, 100 * q / ns }')
        if [ "$rx" != rps ] && [ "$key" != baseline ] && [ "$((q1 - q0))" -eq 0 ]; then
            echo "probe-cost: the parent's NAPI thread did not run: replies bypassed its ring; the figures would omit the kernel's receive work" >&2
            exit 1
        fi
        printf 'probe-cost: run %d %-8s rank 0 broker %6.2f %%  NAPI thread %5.2f %%  CPU 0 irq+softirq %6.2f %%  CPU 0 busy %6.2f %%  FWQ noise %5.2f %%  XDP %s ns x %s/s  online %d/%d\n' \
            "$r" "$key" "$broker" "$nq" "$irq" "$cpu" "$noise" "$xdp_ns" "$xdp_pps" "$online" $((n + 1))
        results+=("$key $cpu $broker $irq $online $noise $rate $nq $xdp_ns $xdp_pps $floor")
        [ "$r" = 1 ] && echo "$st" | grep '^detectors' | sed "s/^/probe-cost: $key: rank 0 /"
        [ -n "$hub_pid" ] && { kill "$hub_pid"; wait "$hub_pid" 2> /dev/null || true; hub_pid=; }
        ci/netns-cluster.sh down "$name"
    done
done

python3 - "$n" "$idle" "$runs" "$ncpu" "$(uname -r)" "$rx" "${results[@]}" <<'PYEOF'
import json, statistics, sys, time
n, idle, runs, ncpu, kernel, rx = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
suffix = "" if rx == "rps" else "-" + rx
rows = []
for a in sys.argv[7:]:
    key, cpu, broker, irq, online, noise, rate, napi, xdp_ns, xdp_pps, floor = a.split()
    rows.append({"variant": key, "cpu0_busy_pct": float(cpu), "rank0_broker_pct": float(broker),
                 "cpu0_irq_softirq_pct": float(irq), "napi_thread_pct": float(napi),
                 "parent_pct": float(broker) + float(irq) + float(napi), "online": int(online),
                 "fwq_noise_pct": float(noise), "fwq_work_rate": float(rate),
                 "xdp_ns_per_packet": float(xdp_ns), "xdp_packets_per_s": float(xdp_pps), "floor_pct": float(floor)})
by = {}
for r in rows:
    by.setdefault(r["variant"], []).append(r)
fields = ["parent_pct", "rank0_broker_pct", "cpu0_irq_softirq_pct", "napi_thread_pct", "cpu0_busy_pct", "fwq_noise_pct",
          "fwq_work_rate", "xdp_ns_per_packet", "xdp_packets_per_s", "floor_pct"]
med = {k: {f: statistics.median(r[f] for r in v) for f in fields} | {"min_online": min(r["online"] for r in v)} for k, v in by.items()}
base = med["baseline"]["parent_pct"]
cost = {k: med[k]["parent_pct"] - base for k in med if k != "baseline"}
nbase = med["baseline"]["fwq_noise_pct"]
noise_cost = {k: med[k]["fwq_noise_pct"] - nbase for k in med if k != "baseline"}
rate_ratio = {k: med[k]["fwq_work_rate"] / med["baseline"]["fwq_work_rate"] for k in med}
labels = {"baseline": "probes off (`tbon.probe_period=3600s`)", "unicast": "unicast probes (`tbon.probe_group=off`)",
          "group": "group probes (default)"}
doc = {"children": n, "idle_s": idle, "runs": runs, "cpus": ncpu, "kernel": kernel, "unix_time": int(time.time()),
       "parent_rx": rx, "runs_raw": rows, "median": med, "cost_pct": cost, "busy_core_cost_pct": noise_cost, "fwq_rate_vs_baseline": rate_ratio}
json.dump(doc, open(f"bench/results/probe-cost{suffix}.json", "w"), indent=1)
md = [f"# Prober CPU cost on the parent node ({n} children, netns test bed)\n",
      f"`{'PARENT_RX=' + rx + ' ' if rx != 'rps' else ''}bench/probe-cost.sh {n} {idle:g} {runs}` (kernel {kernel}, {ncpu} CPUs, unix time {doc['unix_time']}). A flat instance of "
      f"{n + 1} nodes, one network namespace and one broker (with its eBPF detectors) per node, on one bridge, idle. "
      "Rank 0's broker is pinned on CPU 0 and its interface's receive processing done there ("
      + {"rps": "receive packet steering to CPU 0's backlog",
         "napi": "the veth's NAPI ring, GRO on, polled by its NAPI thread pinned on CPU 0",
         "xdp": "the veth's NAPI ring, polled by its NAPI thread pinned on CPU 0, with rank 0's responder in native "
                "XDP mode and a switch-port program on the hub handing it each probe reply as an XDP frame, the way a "
                "NIC with native XDP would: no socket buffer for a reply"}[rx]
      + "); the children, "
      "the bridge and the harness run on CPU 1. The parent node's CPU = rank 0's run time (all its threads, from "
      "`/proc/PID/task/*/schedstat`, exact)" + (" + the NAPI thread's run time (exact)" if rx != "rps" else "")
      + " + CPU 0's irq + softirq time (`/proc/stat`, sampled by the 4 ms tick), "
      f"over {idle:g} s; medians of {runs} runs per variant, each run a fresh instance, variants "
      f"alternating. Every variant runs with `tbon.heartbeat_period=200ms` and `tbon.torpid_max=2s` ({n} child brokers share "
      "one core; with 50 ms heartbeats they keep it saturated and delay the replies). CPU 0's total busy time also counts "
      "whatever else the machine ran there.\n",
      "| variant | parent node, % of a core | rank 0 broker | NAPI thread | CPU 0 irq + softirq | cost of probing | CPU 0 busy | "
      "XDP program per packet | packets/s through it | ranks online at the end |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for k in ["baseline", "unicast", "group"]:
    if k not in med:
        continue
    m = med[k]
    c = "" if k == "baseline" else f"**{cost[k]:+.2f} %**"
    napi = f"{m['napi_thread_pct']:.2f} %" if rx != "rps" else "-"
    xdp = f"{m['xdp_ns_per_packet']:.0f} ns" if m["xdp_packets_per_s"] > 0 else "-"
    md.append(f"| {labels[k]} | {m['parent_pct']:.2f} % | {m['rank0_broker_pct']:.2f} % | {napi} | {m['cpu0_irq_softirq_pct']:.2f} % | {c} | "
              f"{m['cpu0_busy_pct']:.2f} % | {xdp} | {m['xdp_packets_per_s']:.0f} | {m['min_online']}/{n + 1} |")
g, u = cost.get("group"), cost.get("unicast")
md.append("")
if g is not None and u is not None:
    verdict = "met" if g < 1.0 else "**missed**"
    ratio = f" Unicast / group: {u / g:.1f}x." if g > 0.05 else ""
    md.append(f"Cost of probing {n} children every 10 ms with group probes: {g:.2f} % of a core (target below 1 %: {verdict}); "
              f"with unicast probes: {u:.2f} %.{ratio}")
if g is not None:
    d = {f: med["group"][f] - med["baseline"][f] for f in ["rank0_broker_pct", "napi_thread_pct", "cpu0_irq_softirq_pct"]}
    xg = med["group"]
    line = (f"Where the group cost goes: rank 0's broker {d['rank0_broker_pct']:+.2f} %, "
            + (f"NAPI thread {d['napi_thread_pct']:+.2f} %, " if rx != "rps" else "")
            + f"CPU 0 irq + softirq {d['cpu0_irq_softirq_pct']:+.2f} %.")
    if xg["xdp_packets_per_s"] > 0:
        line += (f" The XDP program itself (kernel BPF statistics, a separate 5 s window): {xg['xdp_ns_per_packet']:.0f} ns "
                 f"per packet x {xg['xdp_packets_per_s']:.0f} packets/s = "
                 f"{xg['xdp_ns_per_packet'] * xg['xdp_packets_per_s'] / 1e7:.2f} % of a core.")
    md.append(line)
    fl = med["baseline"]["floor_pct"]
    if fl > 0:
        md.append("")
        md.append(f"Floor on this machine: a process that only wakes every 10 ms and sends one datagram on the parent's "
                  f"interface (`vigil-bench tick`, on CPU 0 in the parent's namespace, probes off) uses {fl:.2f} % of a core "
                  f"(its own run time). Rank 0's part of the cost of group probing is {d['rank0_broker_pct']:+.2f} %: "
                  f"{d['rank0_broker_pct'] - fl:+.2f} % above that floor.")
md += ["", "Busy core: `vigil-bench fwq` (fixed work quanta of 100 µs, a compute-bound process pinned on CPU 0 beside rank 0's "
       f"broker, {idle:g} s in the same instance right after the idle window). Noise = share of CPU 0 lost to "
       "interruptions; cost of probing = noise with probing minus noise with probes off; work rate relative to probes off.\n",
       "| variant | FWQ noise | cost of probing to a job on the parent's core | work rate vs probes off |", "|---|---:|---:|---:|"]
for k in ["baseline", "unicast", "group"]:
    if k not in med:
        continue
    c = "" if k == "baseline" else f"**{noise_cost[k]:+.2f} %**"
    md.append(f"| {labels[k]} | {med[k]['fwq_noise_pct']:.2f} % | {c} | {rate_ratio[k]:.4f} |")
g2 = noise_cost.get("group")
if g2 is not None:
    md.append("")
    md.append(f"Cost of probing {n} children every 10 ms with group probes to a job on the parent's core: {g2:.2f} % "
              f"(target below 1 %: {'met' if g2 < 1.0 else '**missed**'}).")
bb, bn = med["baseline"]["cpu0_busy_pct"], med["baseline"]["fwq_noise_pct"]
if bb > 20 or bn > 15:
    md.append(f"\n**Warning: noisy baseline** (probes off: CPU 0 {bb:.1f} % busy idle, FWQ noise {bn:.1f} %): something else "
              "ran on CPU 0; these figures say little about probing. Rerun on an otherwise idle machine.")
    print("probe-cost: WARNING: noisy baseline; rerun on an idle machine", file=sys.stderr)
md.append("\nRuns (parent node %, FWQ noise %): " + "; ".join(f"{r['variant']} {r['parent_pct']:.2f} {r['fwq_noise_pct']:.2f}" for r in rows))
open(f"bench/results/probe-cost{suffix}.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PYEOF
