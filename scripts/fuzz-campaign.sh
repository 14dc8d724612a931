#!/usr/bin/env bash
# A fuzz campaign: runs every target (or the ones named) to a fixed number of executions from
# its seed corpus, and prints a table of executions, time, rate and corpus growth, one row as
# soon as each target finishes. New inputs go to a scratch corpus, never into the committed one;
# crashes fail the campaign.
#
# Usage: scripts/fuzz-campaign.sh [-n RUNS] [-t SECONDS] [-u TIME [-r SECONDS]] [-o DIR] [TARGET...]
#   -n RUNS     executions per target (default 10,000,000)
#   -t SECONDS  stop a target after this long (libFuzzer's -max_total_time); its row then
#               says how far it got instead of `ok`
#   -u TIME     stop the campaign at TIME (anything `date -d` reads): a target runs at most
#               until then, less -r SECONDS (default 0) kept back for each target after it;
#               targets not started by then get a `not run` row
#   -o DIR      keep each target's libFuzzer log (DIR/TARGET.log), the inputs it found
#               (DIR/corpus/TARGET) and the table (DIR/table.md); without it they live in a
#               temporary directory that is removed on exit
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
runs=10000000
max_time=0
until_s=0
reserve=0
out=""
while getopts "n:t:u:r:o:" opt; do
  case $opt in
    n) runs=$OPTARG ;;
    t) max_time=$OPTARG ;;
    u) until_s=$(date -d "$OPTARG" +%s) ;;
    r) reserve=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: $0 [-n RUNS] [-t SECONDS] [-u TIME [-r SECONDS]] [-o DIR] [TARGET...]" >&2
       exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
if [ -n "$out" ]; then
  mkdir -p "$out"
  work=$(cd "$out" && pwd)
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
table="$work/table.md"
# Built once: every target then runs the same build, and no run waits on cargo.
cargo +nightly fuzz build -O >/dev/null
bin="target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
row() { printf "$@" | tee -a "$table"; }
row '| target | executions | seconds | exec/s | corpus (seeds → end) | result |\n'
row '|---|---:|---:|---:|---|---|\n'
status=0
left=${#targets[@]}
for t in "${targets[@]}"; do
  left=$((left - 1))
  mkdir -p "$work/corpus/$t"
  log="$work/$t.log"
  seeds=$(find "corpus/$t" -type f 2>/dev/null | wc -l)
  started=$(date +%s)
  limit=$max_time
  if [ "$until_s" -gt 0 ]; then
    budget=$((until_s - started - reserve * left))
    if [ "$budget" -le 0 ]; then
      row '| %s | 0 | 0 | - | %s → %s | not run (campaign time limit) |\n' "$t" "$seeds" "$seeds"
      continue
    fi
    if [ "$limit" -eq 0 ] || [ "$budget" -lt "$limit" ]; then limit=$budget; fi
  fi
  mkdir -p "artifacts/$t"
  if "$bin/$t" -artifact_prefix="artifacts/$t/" -runs="$runs" -max_total_time="$limit" \
      -max_len=65536 -print_final_stats=1 "$work/corpus/$t" "corpus/$t" >"$log" 2>&1; then
    result=ok
  else
    result=CRASH
    status=1
  fi
  secs=$(( $(date +%s) - started ))
  execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  rate=$(grep -m1 'stat::average_exec_per_sec' "$log" | awk '{print $2}')
  if [ "$result" = ok ] && [ "${execs:-0}" -lt "$runs" ]; then
    result="stopped at the time limit"
  fi
  found=$(find "$work/corpus/$t" -type f | wc -l)
  row '| %s | %s | %s | %s | %s → %s | %s |\n' "$t" "${execs:-?}" "$secs" "${rate:-?}" \
    "$seeds" "$((seeds + found))" "$result"
  if [ "$result" = CRASH ]; then tail -n 40 "$log" >&2; fi
done
exit $status
