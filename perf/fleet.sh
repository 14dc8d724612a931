#!/usr/bin/env bash
# One control and a simulated fleet of N remote workers (perf/fleetsim.py, one process that
# speaks the bus protocol for every worker), for N in $FLEET_SIZES: how long registration
# takes and what it costs the control (CPU per registration, from /proc), what one more worker
# costs at rest (RSS, idle CPU), how long a rollout takes until every worker acknowledged it,
# and request API throughput with N eligible workers beside N = 10. PROFILE=1 records the
# control at rest with `perf record` and prints its top costs. See perf/README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FLEET_SIZES=${FLEET_SIZES:-"10 500 2000 4000 8000"}
BUS_PORT=${BUS_PORT:-18182}
CONTROL_CORES=${CONTROL_CORES:-2}
HEARTBEAT_MS=${HEARTBEAT_MS:-1000}
# The bus protocol version the simulated workers offer: 4 heartbeats on lane 0 only, 3 on
# every lane (decision 118). PROTOCOLS="3 4" measures both in one run.
PROTOCOLS=${PROTOCOLS:-4}
# Workers started per second by the simulator; 0 starts them all at once (a storm).
CONNECT_RATE=${CONNECT_RATE:-0}
IDLE_SECONDS=${IDLE_SECONDS:-10}
# Request API throughput at each size: wrk for THROUGHPUT_SECONDS against nginx through the
# control and the simulated workers (which answer without an upstream).
THROUGHPUT_SECONDS=${THROUGHPUT_SECONDS:-5}
CONNECTIONS=${CONNECTIONS:-32}
BUS_TOKEN=perf-bus-token-0123456789abcdef
CLK_TCK=$(getconf CLK_TCK)
CONTROL_PID=""
SIM_PID=""

stop_run() {
  local pid
  for pid in "$SIM_PID" "$CONTROL_PID"; do
    [ -n "$pid" ] || continue
    kill "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  SIM_PID=""
  CONTROL_PID=""
}

# Starts `sortie control` with the simulated workers' pool open to loopback.
start_control() {
  local bin=$1 dir="$WORK_DIR/control"
  rm -rf "$dir"
  mkdir -p "$dir/data"
  cat >"$dir/snapshot.json" <<'JSON'
{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"}],"destinations":{"allow":["127.0.0.0/8"],"deny":[]}}
JSON
  cat >"$dir/control.toml" <<TOML
[control]
api_listen = "127.0.0.1:$API_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"
bus_listen = "127.0.0.1:$BUS_PORT"
data_dir = "$dir/data"
cores = $CONTROL_CORES
bootstrap_snapshot = "$dir/snapshot.json"

[control.bus]
token = "$BUS_TOKEN"
plaintext = true
heartbeat_ms = $HEARTBEAT_MS

[[deployments]]
id = "perf"
token = "$DEPLOYMENT_TOKEN"

[admin]
token = "$ADMIN_TOKEN"
TOML
  # The previous size's control may still be closing its sockets.
  local free_by=$((SECONDS + 20)) port
  for port in "$API_PORT" "$ADMIN_PORT" "$BUS_PORT"; do
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
      [ "$SECONDS" -lt "$free_by" ] || require_free_port "$port" "the port variables"
      sleep 0.2
    done
  done
  "$bin" control --config "$dir/control.toml" >"$WORK_DIR/control.log" 2>&1 &
  CONTROL_PID=$!
  wait_port "$BUS_PORT" 30 "$CONTROL_PID" || { tail -n 20 "$WORK_DIR/control.log" >&2; die "the control did not start"; }
  sleep 0.5
}

# Commits the bootstrap snapshot again with another default timeout: a new revision to roll out.
rollout() {
  local body etag
  body=$(sed "s/\"default_timeout_ms\":60000/\"default_timeout_ms\":$1/" "$WORK_DIR/control/snapshot.json")
  etag=$(curl -fsS -D - -o /dev/null -H "Authorization: Bearer $ADMIN_TOKEN" \
    "http://127.0.0.1:$ADMIN_PORT/api/v1/admin/config" | awk -F': ' 'tolower($1) == "etag" { print $2 }' | tr -d '\r')
  [ -n "$etag" ] || die "no ETag on the configuration"
  curl -fsS -o /dev/null -X PUT -H "Authorization: Bearer $ADMIN_TOKEN" -H "If-Match: $etag" \
    -H 'Content-Type: application/json' --data "$body" \
    "http://127.0.0.1:$ADMIN_PORT/api/v1/admin/config" || die "the rollout's commit failed"
}

# Seconds, three decimals, of CPU ticks $1.
ticks_s() { awk -v t="$1" -v hz="$CLK_TCK" 'BEGIN { printf "%.3f", t / hz }'; }

one_size() {
  local bin=$1 n=$2 protocol=$3 sim_out="$WORK_DIR/fleetsim-$n-v$protocol.txt" base_rss base_ticks t0 t1 reg_line
  start_control "$bin"
  base_rss=$(rss_kib "$CONTROL_PID")
  base_ticks=$(cpu_ticks "$CONTROL_PID")
  local stay=$((IDLE_SECONDS + THROUGHPUT_SECONDS + 60))
  python3 "$PERF_DIR/fleetsim.py" --control "127.0.0.1:$BUS_PORT" --token "$BUS_TOKEN" \
    --workers "$n" --seconds "$stay" --timeout 120 --protocol "$protocol" --connect-rate "$CONNECT_RATE" >"$sim_out" 2>"$WORK_DIR/fleetsim-$n-v$protocol.err" &
  SIM_PID=$!
  local deadline=$((SECONDS + 150))
  until reg_line=$(grep '^FLEETSIM_REGISTERED ' "$sim_out" 2>/dev/null); do
    [ "$SECONDS" -lt "$deadline" ] || die "the fleet of $n did not register within 150 s"
    is_alive "$SIM_PID" || { cat "$WORK_DIR/fleetsim-$n-v$protocol.err" >&2; die "fleetsim exited"; }
    sleep 0.05
  done
  t0=$(cpu_ticks "$CONTROL_PID")
  local reg_cpu reg_s per_reg rss per_worker
  reg_cpu=$((t0 - base_ticks))
  reg_s=$(field seconds "$reg_line")
  per_reg=$(awk -v t="$reg_cpu" -v hz="$CLK_TCK" -v n="$n" 'BEGIN { printf "%.3f", t / hz * 1000 / n }')
  [ "$(field workers "$reg_line")" = "$n" ] || die "only $(field workers "$reg_line") of $n registered"
  # At rest: CPU over IDLE_SECONDS (heartbeats) and the resident memory each worker adds.
  sleep 2
  t0=$(cpu_ticks "$CONTROL_PID")
  if [ "${PROFILE:-0}" = 1 ]; then
    # The idle phase under `perf record`: where heartbeats spend the control's CPU.
    perf record -q -F 999 -g -p "$CONTROL_PID" -o "$WORK_DIR/idle-$n-v$protocol.perf" -- sleep "$IDLE_SECONDS" \
      >/dev/null 2>&1 || die "perf record failed (install linux-perf, or run without PROFILE=1)"
  else
    sleep "$IDLE_SECONDS"
  fi
  t1=$(cpu_ticks "$CONTROL_PID")
  local idle_pct
  idle_pct=$(awk -v t="$((t1 - t0))" -v hz="$CLK_TCK" -v s="$IDLE_SECONDS" 'BEGIN { printf "%.1f", t / hz / s * 100 }')
  rss=$(rss_kib "$CONTROL_PID")
  per_worker=$(awk -v a="$rss" -v b="$base_rss" -v n="$n" 'BEGIN { printf "%.1f", (a - b) / n }')
  # A rollout: until every simulated worker acknowledged the new revision.
  rollout 61000
  local applied="" wait_until_s=$((SECONDS + 30))
  until applied=$(grep '^FLEETSIM_APPLIED ' "$sim_out" 2>/dev/null); do
    [ "$SECONDS" -lt "$wait_until_s" ] || { applied="seconds=timeout"; break; }
    sleep 0.05
  done
  # Request API throughput through the simulated workers.
  export SORTIE_PERF_URL="http://127.0.0.1:$UPSTREAM_PORT/small" SORTIE_PERF_TOKEN="$DEPLOYMENT_TOKEN" SORTIE_PERF_DIR="$PERF_DIR"
  local wrk_out="$WORK_DIR/wrk-$n-v$protocol.txt" rps w0 w1
  w0=$(cpu_ticks "$CONTROL_PID")
  timeout $((THROUGHPUT_SECONDS + 30)) wrk -t1 -c"$CONNECTIONS" -d"${THROUGHPUT_SECONDS}s" \
    -s "$PERF_DIR/envelope.lua" "http://127.0.0.1:$API_PORT/api/v1/requests" >"$wrk_out" 2>&1 ||
    { cat "$wrk_out" >&2; die "wrk failed"; }
  w1=$(cpu_ticks "$CONTROL_PID")
  rps=$(field rps "$(grep '^WRK_RESULT ' "$wrk_out")")
  # The control's own CPU per request: the simulated workers (one Python process) bound the
  # raw rate, so req/s alone would measure them.
  local us_per_req
  us_per_req=$(awk -v t="$((w1 - w0))" -v hz="$CLK_TCK" -v r="$rps" -v s="$THROUGHPUT_SECONDS" \
    'BEGIN { printf "%.1f", (r > 0) ? t / hz * 1e6 / (r * s) : 0 }')
  # The same beyond the control's idle CPU (heartbeats), which the requests did not cause.
  local us_net
  us_net=$(awk -v t="$((w1 - w0))" -v idle="$((t1 - t0))" -v is="$IDLE_SECONDS" -v hz="$CLK_TCK" \
    -v r="$rps" -v s="$THROUGHPUT_SECONDS" \
    'BEGIN { x = t - idle / is * s; if (x < 0) x = 0; printf "%.1f", (r > 0) ? x / hz * 1e6 / (r * s) : 0 }')
  local non2xx
  non2xx=$(awk '/Non-2xx/ { print $NF }' "$wrk_out")
  say "$(printf 'v%s %6s  %8ss  %10s  %8s  %6s%%  %8s  %10ss  %9s  %8s  %10s  %s' "$protocol" "$n" "$reg_s" \
    "$(ticks_s "$reg_cpu")" "$per_reg" "$idle_pct" "$per_worker" "$(field seconds "$applied")" \
    "$rps" "$us_per_req" "$us_net" "${non2xx:-0}")"
  if [ "${PROFILE:-0}" = 1 ]; then
    say "top costs at rest with $n workers (perf report --no-children, self time):"
    perf report -i "$WORK_DIR/idle-$n-v$protocol.perf" --no-children --stdio --percent-limit 1.5 -g none \
      2>/dev/null | grep -E '^ +[0-9.]+%' | head -25 | while IFS= read -r l; do say "  $l"; done
    # PROFILE_KEEP=DIR keeps the recording for `perf report -i` after the run.
    [ -z "${PROFILE_KEEP:-}" ] || cp "$WORK_DIR/idle-$n-v$protocol.perf" "$PROFILE_KEEP/"
  fi
  stop_run
}

main() {
  init_run
  RESULTS_FILE="$RESULTS_DIR/$(date +%F)-fleet.txt"
  apt_install nginx wrk curl python3 python3-pip
  python3 -c 'import uvloop' 2>/dev/null ||
    pip3 install --quiet --break-system-packages uvloop >&2 ||
    log "uvloop could not be installed: the simulator runs on plain asyncio, slower"
  local bin
  bin=$(gateway_binary)
  start_nginx
  trap 'stop_run; cleanup' EXIT
  say ""
  say "=== sortie simulated fleet $(date -u +%FT%TZ)"
  say "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), open files $(ulimit -Hn)"
  say "knobs: FLEET_SIZES='$FLEET_SIZES' CONTROL_CORES=$CONTROL_CORES HEARTBEAT_MS=$HEARTBEAT_MS PROTOCOLS='$PROTOCOLS' CONNECT_RATE=$CONNECT_RATE" \
    "IDLE_SECONDS=$IDLE_SECONDS THROUGHPUT_SECONDS=$THROUGHPUT_SECONDS CONNECTIONS=$CONNECTIONS"
  say ""
  say "    workers  register  control CPU  ms/worker   idle CPU  KiB/worker     rollout      req/s  us/req  us/req-net  non-2xx"
  local n protocol
  for n in $FLEET_SIZES; do
    for protocol in $PROTOCOLS; do
      one_size "$bin" "$n" "$protocol"
    done
  done
  say "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

main "$@"
