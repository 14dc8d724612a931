#!/usr/bin/env bash
# Runs every fuzz target for a few seconds from its seed corpus, without writing new inputs into
# the committed corpus. Usage: scripts/fuzz-smoke.sh [SECONDS_PER_TARGET]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-15}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo +nightly fuzz build -O
for t in $(cargo +nightly fuzz list); do
  mkdir -p "$work/$t"
  if cargo +nightly fuzz run -O "$t" "$work/$t" "corpus/$t" -- \
      -max_total_time="$secs" -max_len=65536 -print_final_stats=1 >"$work/$t.log" 2>&1; then
    runs=$(grep -m1 'stat::number_of_executed_units' "$work/$t.log" | awk '{print $2}')
    echo "fuzz $t: ${runs:-?} runs in ${secs}s, no crash"
  else
    echo "fuzz $t: FAILED"
    tail -n 60 "$work/$t.log"
    exit 1
  fi
done
