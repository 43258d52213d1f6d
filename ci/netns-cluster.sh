#!/usr/bin/env bash
# Make N "nodes" on this machine as network namespaces on a private bridge, run one Vigil broker per node with the
# config-file bootstrap, and kill, stall or heal nodes. Needs root (ip netns).
#
#   ci/netns-cluster.sh up     NAME N [-S ATTR=VAL]...  create nodes NAME-n0..n(N-1) and start brokers; node K has
#                                                      address 10.200.(K/200).(K%200+1) (10.200.0.1.. for K < 200)
#   ci/netns-cluster.sh nodes  NAME N                  only create the nodes (no brokers), for another system to run on
#                                                      them (e.g. ci/slurm-cluster.sh netns); kill, cut, run and down work
#   ci/netns-cluster.sh uri    NAME                    print rank 0's VIGIL_URI
#   ci/netns-cluster.sh run    NAME K CMD...           run CMD inside node K's namespace
#   ci/netns-cluster.sh kill   NAME K                  silent node death: cut K's link (no RST/FIN reaches peers), then SIGKILL every process of K
#   ci/netns-cluster.sh stall  NAME K | cont NAME K    SIGSTOP / SIGCONT node K's broker
#   ci/netns-cluster.sh cut    NAME K | heal NAME K    take node K's link down / up (processes untouched; a cut
#                                                      longer than tbon.lost_timeout gets K declared lost, and a
#                                                      lost broker exits: heal does not bring it back)
#   ci/netns-cluster.sh restart NAME K                 after kill (or a broker that exited): bring K's link up and
#                                                      start a new broker there, with the arguments of `up`
#   ci/netns-cluster.sh pids   NAME K                  processes of node K
#   ci/netns-cluster.sh impair NAME DELAY_MS JITTER_MS LOSS_PCT [SEED]
#                                                      every frame between nodes gets a delay drawn from
#                                                      DELAY +- JITTER ms and is lost with LOSS_PCT % (the kernel has no
#                                                      netem: the bridge is replaced by `vigil-bench netswitch`, found
#                                                      as $VIGIL_BENCH or next to $VIGIL); unimpair NAME puts the bridge back;
#                                                      VIGIL_NETNS_IMPAIR="DELAY JITTER LOSS [SEED]" makes `up` impair first
#   ci/netns-cluster.sh down   NAME                    kill everything and remove namespaces, links and files
#   ci/netns-cluster.sh fcut NAME K | fheal NAME K     with a fabric (below): take node K's fabric link down / up
#                                                      (its management link and processes untouched); fcut
#                                                      prints the time the link went down (seconds, epoch)
#
# VIGIL_NETNS_FABRIC=1 given to `up` or `nodes`: each node also gets a second network, a "fabric" (a high-speed
# network for jobs): interface fab0 with address 10.201.(K/200).(K%200+1) on a second bridge of the hub; `up` names
# it as each host's job_network in the config (`tbon.job_network`), so the parents probe it too.
#
# NAME is a short tag (<= 6 characters) so several clusters can coexist; each has its own hub namespace holding
# the bridge, so addresses never leak into the root namespace. State lives in ${VIGIL_NETNS_DIR:-/tmp}/vigil-netns-NAME.
# VIGIL_NETNS_RANK0_ARGS: extra broker arguments for node 0 only (e.g. "-S broker.xdp_mode=native"); given to `up`,
# they are kept for `restart` of node 0 as the arguments of `up` are (set it again to restart with others).
set -euo pipefail

# The vigil binary: $VIGIL, else vigil on PATH, else this tree's release build (ci/main-job.sh), else its debug build.
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${VIGIL:-}" ]; then
    VIGIL=$(command -v vigil || true)
    [ -n "$VIGIL" ] || { [ -x "$root/target/release/vigil" ] && VIGIL=$root/target/release/vigil; } || VIGIL=$root/target/debug/vigil
fi
cmd=${1:-}; name=${2:-}
[ -n "$cmd" ] && [ -n "$name" ] || { sed -n '2,36p' "$0"; exit 2; }
[ ${#name} -le 6 ] || { echo "netns-cluster: NAME must be at most 6 characters" >&2; exit 2; }
dir=${VIGIL_NETNS_DIR:-/tmp}/vigil-netns-$name
hub=vn-$name-hub
ns() { echo "vn-$name-n$1"; }
hostveth() { echo "vn${name}h$1"; }
fabveth() { echo "vn${name}f$1"; }
addr() { echo "10.200.$(($1 / 200)).$(($1 % 200 + 1))"; }
fabaddr() { echo "10.201.$(($1 / 200)).$(($1 % 200 + 1))"; }

node_pids() { ip netns pids "$(ns "$1")" 2>/dev/null || true; }

# Start node $1's broker in the background with the arguments `up` was given (saved in $dir/args), appending to
# its log, and record its pid.
start_broker() {
    local k=$1 extra=() args=()
    [ -s "$dir/args" ] && mapfile -t args < "$dir/args"
    local r0=${VIGIL_NETNS_RANK0_ARGS-}
    [ -z "${VIGIL_NETNS_RANK0_ARGS+set}" ] && [ -s "$dir/rank0-args" ] && r0=$(cat "$dir/rank0-args")
    read -r -a rank0_args <<< "$r0"
    [ "$k" = 0 ] && extra=("${rank0_args[@]}")
    mkdir -p "$dir/node$k"
    ip netns exec "$(ns "$k")" setsid "$VIGIL" broker --config="$dir/config.toml" --hostname="node$k" \
        --rundir="$dir/node$k" "${args[@]}" "${extra[@]}" >> "$dir/node$k/broker.log" 2>&1 < /dev/null &
    echo $! > "$dir/node$k/broker.pid"
}

# Create the hub namespace with its bridge, and nodes 0..$1-1, each a namespace with eth0 on the bridge.
make_nodes() {
    local n=$1 k nsk
    ip netns add "$hub"
    ip -n "$hub" link add br0 type bridge
    ip -n "$hub" link set br0 up
    ip -n "$hub" link set lo up
    for ((k = 0; k < n; k++)); do
        nsk=$(ns $k)
        ip netns add "$nsk"
        ip link add "$(hostveth $k)" type veth peer name eth0 netns "$nsk"
        ip link set "$(hostveth $k)" netns "$hub"
        ip -n "$hub" link set "$(hostveth $k)" master br0 up
        ip -n "$nsk" addr add "$(addr $k)/16" dev eth0
        ip -n "$nsk" link set eth0 up
        ip -n "$nsk" link set lo up
    done
    if [ -n "${VIGIL_NETNS_FABRIC:-}" ]; then
        ip -n "$hub" link add br1 type bridge
        ip -n "$hub" link set br1 up
        for ((k = 0; k < n; k++)); do
            nsk=$(ns $k)
            ip link add "$(fabveth $k)" type veth peer name fab0 netns "$nsk"
            ip link set "$(fabveth $k)" netns "$hub"
            ip -n "$hub" link set "$(fabveth $k)" master br1 up
            ip -n "$nsk" addr add "$(fabaddr $k)/16" dev fab0
            ip -n "$nsk" link set fab0 up
        done
        : > "$dir/fabric"
    fi
    echo "$n" > "$dir/size"
}

# impair NAME DELAY JITTER LOSS [SEED]: see the usage text (arguments as the command's, $1 being the command).
impair() {
    usage="usage: $0 impair NAME DELAY_MS JITTER_MS LOSS_PCT [SEED]"
    [ $# -ge 5 ] || { echo "$usage" >&2; exit 2; }
    delay=$3; jitter=$4; loss=$5; seed=${6:-1}
    # Checked before anything is touched: a refused value leaves the cluster as it was.
    num='^[0-9]+([.][0-9]+)?$'
    [[ $delay =~ $num ]] || { echo "netns-cluster: DELAY_MS '$delay' is not a number of milliseconds >= 0" >&2; exit 2; }
    [[ $jitter =~ $num ]] || { echo "netns-cluster: JITTER_MS '$jitter' is not a number of milliseconds >= 0" >&2; exit 2; }
    [[ $loss =~ $num ]] && awk -v l="$loss" 'BEGIN { exit !(l <= 100) }' \
        || { echo "netns-cluster: LOSS_PCT '$loss' is not a percentage 0-100" >&2; exit 2; }
    [[ $seed =~ ^[0-9]+$ ]] || { echo "netns-cluster: SEED '$seed' is not a whole number" >&2; exit 2; }
    bench=${VIGIL_BENCH:-$(dirname "$VIGIL")/vigil-bench}
    [ -x "$bench" ] || { echo "netns-cluster: no vigil-bench at $bench (set VIGIL_BENCH)" >&2; exit 2; }
    n=$(cat "$dir/size")
    [ -s "$dir/netswitch.pid" ] && kill "$(cat "$dir/netswitch.pid")" 2>/dev/null || true
    ports=()
    for ((k = 0; k < n; k++)); do ports+=("$(hostveth $k)"); done
    # Off the bridge in one batch, then the switch at once: the gap is a few milliseconds of lost frames.
    for p in "${ports[@]}"; do echo "link set $p nomaster"; done | ip -n "$hub" -batch - 2>/dev/null || true
    ip netns exec "$hub" "$bench" netswitch --delay-ms "$delay" --jitter-ms "$jitter" --loss-pct "$loss" \
        --seed "$seed" "${ports[@]}" > "$dir/netswitch.log" 2>&1 < /dev/null &
    echo $! > "$dir/netswitch.pid"
    sleep 0.2
    if ! kill -0 "$(cat "$dir/netswitch.pid")" 2>/dev/null; then
        # No switch: the bridge again, so that the nodes are not cut off.
        for p in "${ports[@]}"; do echo "link set $p master br0"; done | ip -n "$hub" -batch -
        rm -f "$dir/netswitch.pid"
        echo "netns-cluster: the switch did not start (the links are on the bridge again, unimpaired):" >&2
        cat "$dir/netswitch.log" >&2
        exit 1
    fi
}

# Every command but those that make a cluster (and `down`, which cleans up whatever is left) needs one.
case "$cmd" in
nodes | up | down) ;;
*) [ -s "$dir/size" ] || { echo "netns-cluster: no cluster '$name' (no $dir/size): make one with: $0 up $name N" >&2; exit 2; } ;;
esac

case "$cmd" in
nodes)
    n=${3:?N}
    mkdir -p "$dir"
    make_nodes "$n"
    ;;
up)
    n=${3:?N}; shift 3
    mkdir -p "$dir"
    # Every node of the cluster holds the same overlay key, as a system instance's nodes would.
    rm -f "$dir/overlay.key"
    "$VIGIL" keygen "$dir/overlay.key" 2>/dev/null
    {
        echo "[bootstrap]"
        echo "instance = \"$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')\""
        echo "overlay_key = \"$dir/overlay.key\""
        echo "hosts = ["
        for ((k = 0; k < n; k++)); do
            jn=""
            [ -n "${VIGIL_NETNS_FABRIC:-}" ] && jn=", job_network = \"fab0\""
            echo "  { host = \"node$k\", bind = \"tcp://$(addr $k):8050\", connect = \"tcp://$(addr $k):8050\"$jn },"
        done
        echo "]"
    } > "$dir/config.toml"
    chmod 600 "$dir/config.toml"
    make_nodes "$n"
    # VIGIL_NETNS_IMPAIR="DELAY JITTER LOSS [SEED]": the links are impaired before any broker starts.
    if [ -n "${VIGIL_NETNS_IMPAIR:-}" ]; then
        # shellcheck disable=SC2086
        impair impair "$name" $VIGIL_NETNS_IMPAIR
    fi
    # One argument per line, for `restart`.
    if [ $# -gt 0 ]; then printf '%s\n' "$@" > "$dir/args"; else : > "$dir/args"; fi
    printf '%s' "${VIGIL_NETNS_RANK0_ARGS:-}" > "$dir/rank0-args"
    for ((k = 0; k < n; k++)); do
        start_broker "$k"
        # Rank 0 (the parent every test and benchmark looks at) first, with its eBPF detectors attached before
        # the others start: the kernel takes at most 64 BPF programs per tracepoint, so in instances of more than
        # 64 nodes on one kernel the later brokers fall back to userspace watchers, and rank 0 must not be one.
        if [ "$k" = 0 ] && [ "$n" -gt 64 ]; then
            for _ in $(seq 1 100); do
                s=$(VIGIL_URI="local://$dir/node0/local-0" "$VIGIL" overlay status 2> /dev/null || true)
                case $s in *loading* | "") sleep 0.1 ;; *) break ;; esac
            done
        fi
    done
    # Wait until rank 0 answers and every rank is online (30 s, plus 0.4 s per node for big clusters).
    for _ in $(seq 1 $((300 + 4 * n))); do
        if [ -S "$dir/node0/local-0" ] && VIGIL_URI="local://$dir/node0/local-0" "$VIGIL" overlay status --json 2>/dev/null \
            | grep -o '"state":"online"' | wc -l | grep -qx "$n"; then
            exit 0
        fi
        # Every broker already gone (e.g. a refused attribute): say why now instead of waiting out the timeout.
        alive=0
        for ((k = 0; k < n; k++)); do kill -0 "$(cat "$dir/node$k/broker.pid")" 2> /dev/null && { alive=1; break; }; done
        if [ $alive = 0 ]; then
            echo "netns-cluster: every broker exited; node 0 said:" >&2
            tail -n 3 "$dir/node0/broker.log" >&2
            echo "netns-cluster: remove its namespaces with: $0 down $name" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "netns-cluster: instance did not come up; logs in $dir/node*/broker.log; remove it with: $0 down $name" >&2
    exit 1
    ;;
uri) echo "local://$dir/node0/local-0" ;;
run) k=${3:?K}; shift 3; exec ip netns exec "$(ns "$k")" "$@" ;;
pids) node_pids "${3:?K}" ;;
restart)
    k=${3:?K}
    [ -d "$dir/node$k" ] || { echo "netns-cluster: no node $k in cluster $name" >&2; exit 2; }
    # A killed broker may take a moment to be gone (its eBPF links are released after RCU grace periods), and on
    # a starved machine much longer: one was seen in uninterruptible sleep for 58 s. Wait up to 120 s, saying so.
    for i in $(seq 1 1200); do
        [ -z "$(node_pids "$k")" ] && break
        [ "$i" = 100 ] && echo "netns-cluster: node $k: killed processes not yet reaped after 10 s; waiting" >&2
        sleep 0.1
    done
    if [ -n "$(node_pids "$k")" ]; then
        echo "netns-cluster: node $k still runs processes: kill it first" >&2
        ps -o pid,stat,wchan:24,etime,args -p "$(node_pids "$k" | paste -sd,)" >&2 || true
        exit 1
    fi
    ip -n "$hub" link set "$(hostveth "$k")" up
    ip -n "$(ns "$k")" link set eth0 up
    start_broker "$k"
    ;;
kill)
    k=${3:?K}
    ip -n "$hub" link set "$(hostveth "$k")" down
    ip -n "$(ns "$k")" link set eth0 down 2>/dev/null || true
    # Up to 2 s: on a starved machine a SIGKILLed process may take that long to be reaped.
    for _ in $(seq 40); do
        p=$(node_pids "$k"); [ -z "$p" ] && break
        kill -9 $p 2>/dev/null || true
        sleep 0.05
    done
    ;;
stall) kill -STOP "$(cat "$dir/node${3:?K}/broker.pid")" ;;
cont) kill -CONT "$(cat "$dir/node${3:?K}/broker.pid")" ;;
cut) ip -n "$hub" link set "$(hostveth "${3:?K}")" down ;;
heal) ip -n "$hub" link set "$(hostveth "${3:?K}")" up; ip -n "$(ns "${3:?K}")" link set eth0 up 2>/dev/null || true ;;
fcut | fheal)
    [ -e "$dir/fabric" ] || { echo "netns-cluster: cluster $name has no fabric (make it with VIGIL_NETNS_FABRIC=1)" >&2; exit 2; }
    if [ "$cmd" = fcut ]; then
        ip -n "$hub" link set "$(fabveth "${3:?K}")" down
        date +%s.%N # when the link went down (for latency figures)
    else
        ip -n "$hub" link set "$(fabveth "${3:?K}")" up; ip -n "$(ns "${3:?K}")" link set fab0 up 2>/dev/null || true
    fi
    ;;
impair) impair "$@" ;;
unimpair)
    n=$(cat "$dir/size")
    [ -s "$dir/netswitch.pid" ] && kill "$(cat "$dir/netswitch.pid")" 2>/dev/null || true
    rm -f "$dir/netswitch.pid"
    for ((k = 0; k < n; k++)); do echo "link set $(hostveth $k) master br0"; done | ip -n "$hub" -batch -
    ;;
down)
    n=$(cat "$dir/size" 2>/dev/null || echo 64)
    [ -s "$dir/netswitch.pid" ] && kill -9 "$(cat "$dir/netswitch.pid")" 2>/dev/null || true
    for ((k = 0; k < n; k++)); do
        p=$(node_pids $k); [ -n "$p" ] && kill -CONT $p 2>/dev/null; [ -n "$p" ] && kill -9 $p 2>/dev/null
        ip netns del "$(ns $k)" 2>/dev/null || true
    done
    ip netns del "$hub" 2>/dev/null || true
    # Whatever is left of this instance's namespaces (an instance killed half way up has no size file).
    for k in $(ip netns list | awk -v p="vn-$name-n" 'index($1, p) == 1 { print $1 }'); do ip netns del "$k" 2>/dev/null || true; done
    rm -rf "$dir"
    ;;
*) sed -n '2,36p' "$0"; exit 2 ;;
esac
