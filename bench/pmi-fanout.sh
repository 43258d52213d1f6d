#!/bin/sh
# Bytes rank 0 sends on its overlay links for one PMI-1 exchange of about 1 MiB of puts per task, 8 tasks on 8
# brokers of a kary:2 tree (`vigil start --test-size=8 -S tbon.topo=kary:2`), against a `true` job on the same 8
# nodes: the sum of `bytes_sent` (ss -ti) over rank 0's TCP sockets before and after each job. Usage:
#   bench/pmi-fanout.sh [VIGIL] [RUNS]     (VIGIL: the vigil binary, default target/release/vigil; RUNS: 3)
# Prints one line per job: `true|pmi tcp_sent=BYTES ok=TASKS-THAT-READ-A-REMOTE-KEY`.
set -eu
VIGIL=${1:-target/release/vigil}
RUNS=${2:-3}
if [ "${PMI_FANOUT_INSIDE:-}" != 1 ]; then
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    # One exchange: 1104 puts of 950 bytes per task (1 MiB), one barrier, then a remote get checks it.
    cat > "$dir/pmi_mib.py" <<'PY'
import os, socket
rank = int(os.environ["PMI_RANK"]); size = int(os.environ["PMI_SIZE"])
sock = socket.socket(fileno=int(os.environ["PMI_FD"])); rd = sock.makefile("rb")
def call(line):
    sock.sendall(line.encode()); return rd.readline().decode()
call("cmd=init pmi_version=1 pmi_subversion=1\n")
kvs = call("cmd=get_my_kvsname\n").split("kvsname=")[1].split()[0]
val = chr(ord("a") + rank) * 950
for i in range(1104):
    assert "rc=0" in call(f"cmd=put kvsname={kvs} key=r{rank}k{i} value={val}\n")
assert "rc=0" in call("cmd=barrier_in\n")
peer = (rank + 1) % size
got = call(f"cmd=get kvsname={kvs} key=r{peer}k1103\n").strip()
call("cmd=finalize\n")
print(rank, "OK" if got.endswith(chr(ord("a") + peer) * 950) else "BAD", flush=True)
PY
    PMI_FANOUT_INSIDE=1 PMI_FANOUT_DIR=$dir RUNS=$RUNS exec "$VIGIL" start --test-size=8 -S tbon.topo=kary:2 -- "$0"
fi
# Inside the instance: the initial program's parent is rank 0's broker.
R0=$PPID
sent() {
    ss -tinpH | awk -v p="pid=$R0," 'index($0, p) { getline; if (match($0, /bytes_sent:[0-9]+/)) s += substr($0, RSTART + 11, RLENGTH - 11) } END { print s + 0 }'
}
job() {
    name=$1; shift
    s0=$(sent); out=$("$@" 2>&1) || true; s1=$(sent)
    echo "$name tcp_sent=$((s1 - s0)) ok=$(echo "$out" | grep -c ' OK$' || true)"
}
sleep 1
i=0
while [ $i -lt "$RUNS" ]; do
    job true vigil run -N8 -n8 true
    job pmi vigil run -N8 -n8 python3 "$PMI_FANOUT_DIR/pmi_mib.py"
    i=$((i + 1))
done
