#!/usr/bin/env bash
# The whole test suite: unit tests of every crate and the black-box integration tests, built
# once, with feature `fingerprints` (BoringSSL; `scripts/ci-deps.sh` installs cmake and
# libclang). `.ci/run` lints both builds, with and without the feature.
set -euo pipefail
cd "$(dirname "$0")/.."
# What the tests run that is not a crate (squid, dante, nginx, s3s-fs, Chromium, cmake, ...),
# installed when missing; quiet and quick when everything is there.
bash scripts/ci-deps.sh
cargo test --workspace --all-targets --features fingerprints --no-fail-fast
cargo test --workspace --doc --features fingerprints
