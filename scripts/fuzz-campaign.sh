#!/usr/bin/env bash
# A fuzz campaign: runs every target (or the ones named) to a fixed number of executions from
# its seed corpus, and prints a table of executions, time, rate and corpus growth. New inputs go
# to a scratch corpus, never into the committed one; crashes fail the campaign.
# Usage: scripts/fuzz-campaign.sh [-n RUNS] [TARGET...]   (RUNS defaults to 10,000,000)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
runs=10000000
if [ "${1:-}" = "-n" ]; then runs=$2; shift 2; fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo +nightly fuzz build -O >/dev/null
printf '| target | executions | seconds | exec/s | corpus (seeds → end) | result |\n'
printf '|---|---:|---:|---:|---|---|\n'
status=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  seeds=$(find "corpus/$t" -type f 2>/dev/null | wc -l)
  started=$(date +%s)
  if cargo +nightly fuzz run -O "$t" "$work/$t" "corpus/$t" -- \
      -runs="$runs" -max_len=65536 -print_final_stats=1 >"$work/$t.log" 2>&1; then
    result=ok
  else
    result=CRASH
    status=1
  fi
  secs=$(( $(date +%s) - started ))
  execs=$(grep -m1 'stat::number_of_executed_units' "$work/$t.log" | awk '{print $2}')
  rate=$(grep -m1 'stat::average_exec_per_sec' "$work/$t.log" | awk '{print $2}')
  end=$(find "$work/$t" -type f | wc -l)
  printf '| %s | %s | %s | %s | %s → %s | %s |\n' "$t" "${execs:-?}" "$secs" "${rate:-?}" \
    "$seeds" "$((seeds + end))" "$result"
  if [ "$result" != ok ]; then tail -n 40 "$work/$t.log" >&2; fi
done
exit $status
