#!/usr/bin/env bash
# Installs what the tests and the fuzz smoke run need that is not a crate, when it is missing.
set -euo pipefail
if ! command -v cargo-fuzz >/dev/null 2>&1 && cargo +nightly --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked
fi
