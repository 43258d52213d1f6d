#!/usr/bin/env bash
# The test suite: set up packages, build every binary (the broker starts vigil-shell from its own directory),
# then run all unit, property and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/setup.sh
cargo build --workspace --locked
cargo test --workspace --locked -- --test-threads=4 "$@"
