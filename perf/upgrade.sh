#!/usr/bin/env bash
# A binary upgrade under load: fixed-rate keep-alive load through the request API and the
# forward proxy (perf/fixedrate), and long CONNECT tunnels carrying requests
# (perf/upgrade_tunnels.py), while SIGUSR2 makes the gateway hand its listeners to a new
# process and drain (decision 115). Prints what every client saw; the target is 0 failed
# requests and 0 refused connections. See perf/README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RATE=${RATE:-500}
RATE_SECONDS=${RATE_SECONDS:-12}
RATE_CONNECTIONS=${RATE_CONNECTIONS:-32}
TUNNELS=${TUNNELS:-8}
# Seconds into the load at which SIGUSR2 is sent.
UPGRADE_AT=${UPGRADE_AT:-4}
GATEWAY_CORES=${GATEWAY_CORES:-1}
export GATEWAY_PROXY_PORT=${GATEWAY_PROXY_PORT:-18082}

main() {
  [ "$RATE_SECONDS" -le 15 ] || die "RATE_SECONDS is capped at 15"
  [ "$UPGRADE_AT" -lt "$RATE_SECONDS" ] || die "UPGRADE_AT must be below RATE_SECONDS"
  init_run
  RESULTS_FILE="$RESULTS_DIR/$(date +%F)-upgrade.txt"
  apt_install nginx curl python3
  local fixedrate bin
  fixedrate=$(fixedrate_binary)
  bin=$(gateway_binary)
  start_nginx
  require_free_port "$GATEWAY_PROXY_PORT" GATEWAY_PROXY_PORT
  start_gateway "$bin" "$GATEWAY_CORES"
  local old=$GATEWAY_PID

  say ""
  say "=== sortie upgrade run $(date -u +%FT%TZ)"
  say "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  say "knobs: RATE=$RATE (each of API and proxy) RATE_SECONDS=$RATE_SECONDS" \
    "RATE_CONNECTIONS=$RATE_CONNECTIONS TUNNELS=$TUNNELS UPGRADE_AT=$UPGRADE_AT GATEWAY_CORES=$GATEWAY_CORES"

  local up="http://127.0.0.1:$UPSTREAM_PORT/small"
  timeout $((RATE_SECONDS + 30)) "$fixedrate" --label api --rate "$RATE" --seconds "$RATE_SECONDS" \
    --connections "$RATE_CONNECTIONS" --method POST \
    --header "Authorization: Bearer $DEPLOYMENT_TOKEN" --header 'Content-Type: application/json' \
    --body "$(envelope_json)" --expect '"status":200' \
    --url "http://127.0.0.1:$API_PORT/api/v1/requests" >"$WORK_DIR/api.txt" 2>&1 &
  local api_pid=$!
  local basic
  basic=$(printf 'perf:%s' "$DEPLOYMENT_TOKEN" | base64 -w0)
  timeout $((RATE_SECONDS + 30)) "$fixedrate" --label proxy --rate "$RATE" --seconds "$RATE_SECONDS" \
    --connections "$RATE_CONNECTIONS" --header "Proxy-Authorization: Basic $basic" \
    --proxy "http://127.0.0.1:$GATEWAY_PROXY_PORT" --url "$up" >"$WORK_DIR/proxy.txt" 2>&1 &
  local proxy_pid=$!
  PROXY="127.0.0.1:$GATEWAY_PROXY_PORT" TARGET="127.0.0.1:$UPSTREAM_PORT" \
    PROXY_AUTH="perf:$DEPLOYMENT_TOKEN" TUNNELS="$TUNNELS" SECONDS_=$((RATE_SECONDS - 2)) \
    timeout $((RATE_SECONDS + 30)) python3 "$PERF_DIR/upgrade_tunnels.py" >"$WORK_DIR/tunnels.txt" 2>&1 &
  local tunnels_pid=$!
  EXTRA_PIDS+=("$api_pid" "$proxy_pid" "$tunnels_pid")

  sleep "$UPGRADE_AT"
  local signalled=$SECONDS started_ns
  started_ns=$(date +%s%N)
  kill -USR2 "$old"
  local successor="" deadline=$((SECONDS + 30))
  while [ -z "$successor" ]; do
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 30 "$WORK_DIR/gateway.log" >&2; die "no hand-over within 30 s"; }
    successor=$(grep -o 'handed over to process [0-9]*' "$WORK_DIR/gateway.log" | grep -o '[0-9]*$' | head -n 1 || true)
    sleep 0.05
  done
  local handed_ms=$((($(date +%s%N) - started_ns) / 1000000))
  # From here the cleanup stops the successor; the old process drains on its own.
  GATEWAY_PID=$successor
  wait_gone "$old" 60 || die "the old process did not exit within 60 s of the hand-over"
  local old_status=0
  wait "$old" || old_status=$?
  local drained_s=$((SECONDS - signalled))
  wait "$api_pid" || true
  wait "$proxy_pid" || true
  wait "$tunnels_pid" || true
  EXTRA_PIDS=()

  local api proxy tunnels
  api=$(grep '^FIXEDRATE_RESULT ' "$WORK_DIR/api.txt") || { cat "$WORK_DIR/api.txt" >&2; die "no api result"; }
  proxy=$(grep '^FIXEDRATE_RESULT ' "$WORK_DIR/proxy.txt") || { cat "$WORK_DIR/proxy.txt" >&2; die "no proxy result"; }
  tunnels=$(grep '^TUNNELS_RESULT ' "$WORK_DIR/tunnels.txt") || { cat "$WORK_DIR/tunnels.txt" >&2; die "no tunnel result"; }
  say ""
  say "hand-over: SIGUSR2 to process $old, successor $successor serving after ${handed_ms} ms;" \
    "the old process exited with status $old_status about ${drained_s} s after the signal"
  local line label failures=0
  for line in "$api" "$proxy"; do
    label=$(field label "$line")
    say "$(printf '%-7s sent %6s  ok %6s  errors %s  reconnects %s  p99 %s ms' "$label" \
      "$(field sent "$line")" "$(field ok "$line")" "$(field errors "$line")" \
      "$(field reconnects "$line")" "$(us_to_ms "$(field p99_us "$line")")")"
    failures=$((failures + $(field errors "$line")))
  done
  say "$(printf 'tunnels %s tunnels, %s requests inside them, failures %s' \
    "$(field tunnels "$tunnels")" "$(field requests "$tunnels")" "$(field failures "$tunnels")")"
  failures=$((failures + $(field failures "$tunnels")))
  if [ "$failures" != 0 ]; then
    grep -hv '_RESULT ' "$WORK_DIR/api.txt" "$WORK_DIR/proxy.txt" "$WORK_DIR/tunnels.txt" |
      head -n 20 >&2 || true
  fi
  say "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ "$failures" = 0 ] && [ "$old_status" = 0 ]; then
    say "result: 0 failed requests, 0 refused connections across the upgrade"
  else
    say "result: $failures failures (target 0), old process status $old_status"
    exit 1
  fi
}

main "$@"
