#!/usr/bin/env bash
# Vigil's main job: build, start an instance of 4 brokers on this machine and run an 8-task parallel job
# across them; each task prints its rank, its node (broker rank) and the cpus it is bound to.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
cargo build --release --locked -p vigil
cargo build-shell   # the job shell, linked statically (.cargo/config.toml)
exec target/release/vigil start --test-size=4 \
    vigil run -N4 -n8 --label-io examples/whereami.sh
