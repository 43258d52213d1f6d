#!/usr/bin/env bash
# Install the Debian packages Vigil needs to build and test (Debian 12). Idempotent and quiet when all is present.
set -euo pipefail
PKGS=(pkg-config libhwloc-dev libudev-dev hwloc iproute2 procps mpich libmpich-dev clang libbpf-dev python3 slurm-wlm munge libmunge-dev
    libibverbs-dev librdmacm-dev ibverbs-providers libclang-dev libfabric-dev libfabric-bin libsqlite3-dev
    libc6-dev binutils openmpi-bin libopenmpi-dev libpmix-dev python3-mpi4py tmux gdb
    python3-venv python3-setuptools python3-wheel python3-pytest)
# Installed without their recommends: Prometheus (its instance_metrics test scrapes a broker) would pull in node
# exporters and smartmontools.
BARE=(prometheus)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
bare=()
for p in "${BARE[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || bare+=("$p")
done
if ((${#missing[@]} + ${#bare[@]})); then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    echo "ci/setup.sh: installing ${missing[*]} ${bare[*]}"
    $SUDO apt-get update -qq
    if ((${#missing[@]})); then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    if ((${#bare[@]})); then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${bare[@]}" >/dev/null
    fi
fi
# Open MPI installs beside MPICH and takes over the `mpicc`/`mpirun` alternatives when it is installed after it:
# the plain names stay MPICH's (the MPICH tests and the benchmark call `mpicc`); Open MPI is `mpicc.openmpi`.
for alt in mpi:/usr/bin/mpicc.mpich mpirun:/usr/bin/mpirun.mpich; do
    name=${alt%%:*} path=${alt#*:}
    if [ -e "$path" ] && [ "$(update-alternatives --query "$name" 2>/dev/null | sed -n 's/^Value: //p')" != "$path" ]; then
        ${SUDO:-$( [ "$(id -u)" -ne 0 ] && echo sudo )} update-alternatives --quiet --set "$name" "$path"
    fi
done
command -v cargo >/dev/null || { echo "ci/setup.sh: cargo not found: install a Rust toolchain (rustup)" >&2; exit 1; }
