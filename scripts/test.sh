#!/usr/bin/env bash
# The whole test suite: unit tests of every crate and the black-box integration tests, built
# once, with feature `fingerprints` (BoringSSL; `scripts/ci-deps.sh` installs cmake and
# libclang). The build without the feature is what `cargo clippy` checks.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets --features fingerprints --no-fail-fast
cargo test --workspace --doc --features fingerprints
