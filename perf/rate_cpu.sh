#!/usr/bin/env bash
# CPU per request at fixed request rates, below saturation: the forward proxy (absolute-form)
# beside an nginx reverse hop to the same upstream, in one run, rounds alternating. The fixed-
# rate generator (perf/fixedrate) holds each rate for RATE_SECONDS over 64 keep-alive
# connections; `perf stat -e task-clock` reads the measured process's CPU over MEASURE_SECONDS
# from its third second. See perf/README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RATES=${RATES:-"8000 4000"}
ROUNDS=${ROUNDS:-3}
RATE_SECONDS=10
MEASURE_SECONDS=5
RATE_CONNECTIONS=${RATE_CONNECTIONS:-64}
GATEWAY_PROXY_PORT=${GATEWAY_PROXY_PORT:-19134}
FIXEDRATE_BIN=""
HOP_PID=""

# The nginx reverse hop proxy.sh measures (write_nginx_hop), started here on its own.
start_hop() {
  local dir master
  dir=$(write_nginx_hop)
  require_free_port "$NGINX_HOP_PORT" NGINX_HOP_PORT
  nginx -e "$dir/logs/error.log" -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' &
  master=$!
  EXTRA_PIDS+=("$master")
  wait_port "$NGINX_HOP_PORT" 10 "$master" || die "the nginx hop did not start"
  HOP_PID=$(pgrep -P "$master" | head -n 1)
  [ -n "$HOP_PID" ] || die "the nginx hop has no worker process"
}

# Holds `rate` for RATE_SECONDS against the target in the remaining arguments and prints the
# measured process's CPU per request (µs), then the generator's result fields.
measure() {
  local pid=$1 rate=$2 out="$WORK_DIR/fixedrate.txt" gen ms
  shift 2
  "$FIXEDRATE_BIN" --label rate-cpu --rate "$rate" --seconds "$RATE_SECONDS" \
    --connections "$RATE_CONNECTIONS" "$@" >"$out" 2>&1 &
  gen=$!
  sleep 3
  ms=$(perf stat -x, -e task-clock -p "$pid" -- sleep "$MEASURE_SECONDS" 2>&1 |
    awk -F, '/task-clock/ { print $1 }')
  wait "$gen" || die "the fixed-rate generator failed: $(tail -n 3 "$out")"
  local line
  line=$(grep '^FIXEDRATE_RESULT ' "$out") || die "the generator printed no result line"
  [ "$(field errors "$line")" = 0 ] || die "requests failed at $rate req/s: $line"
  awk -v ms="$ms" -v r="$rate" -v s="$MEASURE_SECONDS" 'BEGIN { printf "%.1f", ms * 1000 / (r * s) }'
}

main() {
  init_run
  apt_install nginx linux-perf
  command -v perf >/dev/null || die "perf not found (install linux-perf)"
  RESULTS_FILE="$RESULTS_DIR/$(date +%F)-rate-cpu.txt"
  FIXEDRATE_BIN=$(fixedrate_binary)
  local bin
  bin=$(gateway_binary)
  start_nginx
  start_hop
  start_gateway "$bin" 1
  local auth
  auth="Proxy-Authorization: Basic $(printf 'perf:%s' "$DEPLOYMENT_TOKEN" | base64 -w0)"
  say ""
  say "=== CPU per request at fixed rates $(date -u +%FT%TZ), commit $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); sortie cores=1, nginx worker_processes 1, $RATE_CONNECTIONS connections"
  quiet_check
  local round rate n s
  for round in $(seq 1 "$ROUNDS"); do
    for rate in $RATES; do
      n=$(measure "$HOP_PID" "$rate" --url "http://127.0.0.1:$NGINX_HOP_PORT/small")
      s=$(measure "$GATEWAY_PID" "$rate" --url "http://127.0.0.1:$UPSTREAM_PORT/small" \
        --proxy "http://127.0.0.1:$GATEWAY_PROXY_PORT" --header "$auth")
      say "round $round rate $rate: nginx hop $n µs, sortie $s µs CPU per request; sortie/nginx $(awk -v a="$s" -v b="$n" 'BEGIN { printf "%.2f", a / b }')"
    done
  done
  say "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
}

main "$@"
