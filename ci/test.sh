#!/usr/bin/env bash
# The test suite: set up packages, build every binary (the broker starts vigil-shell from its own directory),
# then run all unit, property and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
# Network-namespace "nodes" left over from an interrupted run (ci/netns-cluster.sh names them vn-*).
if [ "$(id -u)" -eq 0 ]; then
    # Only clusters with no live process in any of their namespaces: another user's running cluster (a benchmark,
    # a demo) on a shared machine is left alone.
    for c in $(ip netns list 2>/dev/null | awk '{print $1}' | sed -n 's/^vn-\(.*\)-\(hub\|n[0-9]*\)$/\1/p' | sort -u); do
        live=0
        for ns in $(ip netns list | awk -v p="vn-$c-" 'index($1, p) == 1 {print $1}'); do
            [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && { live=1; break; }
        done
        [ $live = 1 ] && continue
        for ns in $(ip netns list | awk -v p="vn-$c-" 'index($1, p) == 1 {print $1}'); do ip netns del "$ns" 2>/dev/null || true; done
    done
    # The eBPF detectors attach to tracepoints: mount tracefs when missing.
    mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
# Formatting (rustfmt.toml); skipped with a note where the toolchain has no rustfmt component.
if cargo fmt --version >/dev/null 2>&1; then cargo fmt --all --check; else echo "ci/test.sh: rustfmt not installed, formatting not checked"; fi
cargo build --workspace --locked
# The lint wall: every clippy warning fails the build; skipped with a note where the toolchain has no clippy.
if cargo clippy --version >/dev/null 2>&1; then
    cargo clippy --workspace --all-targets --locked -- -D warnings
else
    echo "ci/test.sh: clippy not installed, lints not checked"
fi
# The pure crates link no I/O: no tokio, libc, nix, hwloc or -sys crate in their normal dependency trees. The core
# holds the broker's rules, the simulator drives thousands of them in one process; see docs/architecture.md, "Crates".
for c in vigil-proto vigil-core vigil-sim; do
    bad=$(cargo tree --locked -p "$c" -e normal --prefix none | awk '{print $1}' \
        | grep -E '^(tokio|libc|nix|mio|socket2|hwlocality)$|-sys$' | sort -u | tr '\n' ' ' || true)
    if [ -n "$bad" ]; then
        echo "ci/test.sh: $c must stay free of I/O crates (tokio, libc, nix, hwloc, -sys), but it now depends on: $bad" >&2
        echo "ci/test.sh: see why with: cargo tree -p $c -e normal -i CRATE; move the I/O into vigil (the driver)" >&2
        exit 1
    fi
done
# The driver links no command-line parser: commands are the CLI's (`vigil`), the driver does I/O.
if cargo tree --locked -p vigil-driver -e normal --prefix none | awk '{print $1}' | grep -qx clap; then
    echo "ci/test.sh: vigil-driver must not depend on clap (the CLI is the vigil crate's)" >&2
    exit 1
fi
cargo test --workspace --locked -- --test-threads=4 "$@"
# The Python API (python/, docs/python.md), installed as a user installs it: into a fresh virtual environment of
# Debian's Python 3.11, from the tree alone (pure Python: no index, no build isolation, so no network), then its
# pytest suite against real instances of the debug binaries, bounded at 10 minutes (about 30 s here).
# From another directory, so that the tests import the installed module, not the tree's.
root=$PWD pyenv=$(mktemp -d)
/usr/bin/python3 -m venv --system-site-packages "$pyenv/venv"
"$pyenv/venv/bin/pip" install --quiet --no-index --no-build-isolation ./python
(cd "$pyenv" && VIGIL_BIN="$root/target/debug/vigil" timeout 600 venv/bin/python -m pytest -q -p no:cacheprovider \
    "$root/python/tests")
rm -rf "$pyenv" python/build python/vigil.egg-info
# Verdicts under overload (two CPU hogs per core, every netns link 50 ms +- 50 ms with 2 % loss through
# `vigil-bench netswitch`): alone, since it loads the whole machine (about 15 s).
cargo test --workspace --locked --test failure_netns -- --ignored --test-threads=1 under_overload
# vigil-ofi without libfabric (its stub answers "libfabric not available", which the broker turns into TCP):
# the same tests, built as on a machine without libfabric-dev.
VIGIL_OFI=off cargo test --locked -p vigil-ofi --quiet
# The job shell as it is meant to run (`cargo build-shell`, .cargo/config.toml: release, static-pie): it links (a
# dependency on a library without a static archive, such as hwloc, fails here), has no program interpreter, and runs
# a 2-node job under the debug brokers.
cargo build-shell
if readelf -lW target/release/vigil-shell | grep -q 'Requesting program interpreter'; then
    echo "ci/test.sh: cargo build-shell made a dynamically linked vigil-shell" >&2
    exit 1
fi
out=$(VIGIL_SHELL="$PWD/target/release/vigil-shell" target/debug/vigil start --test-size=2 \
    vigil run -N2 -n2 -l sh -c 'echo "task $VIGIL_TASK_RANK"')
if [ "$(printf '%s\n' "$out" | sort)" != "$(printf '0: task 0\n1: task 1')" ]; then
    echo "ci/test.sh: a job under the static shell printed: $out" >&2
    exit 1
fi
# The simulator of the real sans-IO broker (release code, ten times faster than debug; `[profile.ci]` leaves out the
# release profile's whole-program link, minutes on 2 cores): every scenario at 1,024 brokers for kary:32, and churn
# on a flat tree, seeded; each run exits non-zero when an invariant fails and prints which. A 16,384-broker churn
# takes about a minute and a half here, so it runs with `vigil-bench sim --table` (bench/results/sim.md), not in CI.
cargo build --profile ci --locked -p vigil-bench
for s in boot jobs churn partition; do
    target/ci/vigil-bench sim --brokers 1024 --topo kary:32 --scenario "$s" --seed 1
done
target/ci/vigil-bench sim --brokers 1024 --topo flat --scenario churn --seed 2
# Rank 0 killed and restarted on its state directory 3 times during churn: no acknowledged job lost, duplicated or
# hung (docs/statedir.md, "Tried in the simulator").
target/ci/vigil-bench sim --brokers 1024 --topo kary:32 --scenario restart --seed 1
# Other shapes (about 12 s each). Seeds 1-8 of kary:8/16/32 and flat hold; a sample of them runs here.
for s in 2 4; do
    target/ci/vigil-bench sim --brokers 1024 --topo kary:32 --scenario restart --seed "$s"
done
for s in 1 2 4 5 6; do
    target/ci/vigil-bench sim --brokers 1024 --topo kary:16 --scenario restart --seed "$s"
done
for s in 1 2 3 4 7; do
    target/ci/vigil-bench sim --brokers 1024 --topo kary:8 --scenario restart --seed "$s"
done
# Found at 256 brokers: an orphan whose live candidates were all full (16 children each) and the rest dead is
# adopted by rank 0 as a last resort, not cut off (docs/failure-detection.md, "Last resort"; about 4 s).
target/ci/vigil-bench sim --brokers 256 --topo kary:8 --scenario restart --seed 6
target/ci/vigil-bench sim --brokers 1024 --topo flat --scenario restart --seed 1
# Under load (`overload`: links queueing up to 200 ms and losing 5 % of probes, a fifth of the nodes starved up to
# 300 ms at a time, half of them without a kernel responder): no live broker is ever declared lost, every dead one is
# (docs/failure-detection.md, "Confirmation"; about 10 s each).
target/ci/vigil-bench sim --brokers 1024 --topo kary:32 --scenario overload --seed 1
target/ci/vigil-bench sim --brokers 1024 --topo kary:8 --scenario overload --seed 2
# Router loss and re-parenting at 1,024 brokers with 1 ms links (each 1-12 s here; the 16,384-broker figures are
# in bench/results/sim.md): every router lost in turn (kary:32 and kary:8), 1 % and 5 % of them, a router with its
# orphans' adopter, adopters lost while orphans join them, a flapping router.
for t in kary:32 kary:8; do
    target/ci/vigil-bench sim --brokers 1024 --topo "$t" --scenario router-each --seed 1 --latency-us 1000
done
for s in routers-1pct routers-5pct router-adopter reparent-loss router-flap; do
    target/ci/vigil-bench sim --brokers 1024 --topo kary:32 --scenario "$s" --seed 1 --latency-us 1000
done
# 257 optimised brokers started at once on this machine, then a job on every one of them, ten times in a row: no
# live broker may be declared lost for the CPU storm (docs/failure-detection.md, "Confirmation").
cargo build --profile ci --locked -p vigil -p vigil-shell
cargo test --profile ci --locked -p vigil --test instance_scale -- --ignored --nocapture
# Public items are documented and intra-doc links resolve.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
# RDMA verbs tests on soft-RoCE: directly where this kernel has rdma_rxe, else inside the rxe-vm harness
# (../shared/tools/rxe-vm next to the repository, or $RXE_VM), else skipped with a note.
if [ "$(id -u)" -eq 0 ] && modprobe rdma_rxe 2>/dev/null; then
    ci/rdma-tests.sh build && ci/rdma-tests.sh run
else
    harness=${RXE_VM:-$(cd .. && pwd)/shared/tools/rxe-vm/run-rxe-vm.sh}
    if [ "$(id -u)" -eq 0 ] && [ -f "$harness" ]; then
        ci/rdma-tests.sh build
        WORK=${RXE_VM_WORK:-/tmp/rxe-vm-ci} VM_TIMEOUT=${RXE_VM_TIMEOUT:-1200} bash "$harness" run "$PWD/ci/rdma-tests.sh" run
    else
        echo "RDMA tests skipped: this kernel has no rdma_rxe and no rxe-vm harness at $harness (or not root)"
    fi
fi
