#!/usr/bin/env bash
# The whole test suite: unit tests of every crate and the black-box integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc
