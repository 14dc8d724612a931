#!/usr/bin/env bash
# End-to-end load test: the same nginx upstream measured directly and through the gateway in one
# run, so the ratio between them does not depend on the machine. Then latency of both at a fixed
# rate (half the gateway's maximum) to show the latency the gateway adds. See perf/README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION=${DURATION:-5s}
# Alternating direct/gateway rounds of DURATION each; the median round is reported.
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-1}
WARMUP=${WARMUP:-2s}
SKIP_GATEWAY=${SKIP_GATEWAY:-0}
# Fixed-rate phase: RATE overrides "half the measured maximum"; RATE_CAP bounds what the
# generator (perf/fixedrate) is asked to hold. It holds well over 30,000 req/s on two cores, so
# the cap only guards against a runaway measurement.
RATE=${RATE:-}
RATE_CAP=${RATE_CAP:-50000}
RATE_SECONDS=${RATE_SECONDS:-10}
# As many connections as the throughput phase: with fewer, a stall of the system under test
# leaves every connection busy and the schedule falls behind.
RATE_CONNECTIONS=${RATE_CONNECTIONS:-64}
# ISOLATE=1 (the default when the gateway has fewer cores than the machine) pins nginx and the
# generator to the CPUs the gateway's pinned threads do not use during the fixed-rate phase, in
# both its direct and gateway runs, so that the latency measured is the gateway's and not that
# of processes sharing its core. The throughput phase never pins: there wrk and nginx use every
# CPU, as they would without the gateway.
ISOLATE=${ISOLATE:-}
PIN_PREFIX=""
# Cores the gateway runs on. By default half the machine's CPUs (at least one), leaving the
# other half to the load generator and nginx, as a benchmark of a system under test should;
# 0 means every CPU.
GATEWAY_CORES=${GATEWAY_CORES:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}
# The fixed-rate generator's binary, built once at the start of the run.
FIXEDRATE_BIN=""

TARGET_RATIO=0.45
TARGET_ADDED_P99_MS=1
# Scheduler lag p99 (us) above which the generator counts as behind its schedule. Its sleeps end
# within tens of microseconds of their instants, so a millisecond of lag means every connection
# was busy or the generator waited for a CPU: as much as the added latency being measured.
MAX_HEALTHY_LAG_US=1000
# Longest wrk run accepted, so that a typo in DURATION cannot start an hour of load.
MAX_WRK_SECONDS=120

# Seconds in a wrk duration such as 10, 10s, 2m.
duration_seconds() {
  case "$1" in
    *[!0-9smh]* | "") die "bad duration '$1' (use e.g. 10s)" ;;
    *h) echo $((${1%h} * 3600)) ;;
    *m) echo $((${1%m} * 60)) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
  esac
}

# Says so when the fixed-rate generator could not hold its schedule (result line $1, rate $2):
# its latencies are then those of a lower rate and should not be compared with the target.
check_held_rate() {
  local achieved lag
  achieved=$(field achieved_rps "$1")
  lag=$(field lag_p99_us "$1")
  if awk -v a="$achieved" -v r="$2" -v l="$lag" -v max="$MAX_HEALTHY_LAG_US" \
    'BEGIN { exit !(a < 0.95 * r || l > max) }'; then
    say "WARNING: the generator fell behind ($(field label "$1"): $achieved of $2 req/s," \
      "scheduler lag p99 $(us_to_ms "$lag") ms); lower RATE or quiet the machine"
  fi
}

# Runs wrk for $2 against URL $3 with Lua script $4 and prints its WRK_RESULT line; the full wrk
# output goes to the results file (and to the terminal) labelled $1.
run_wrk() {
  local label=$1 duration=$2 url=$3 script=$4 out="$WORK_DIR/wrk-$1.txt" secs
  secs=$(duration_seconds "$duration")
  timeout $((secs + 30)) wrk -t"$THREADS" -c"$CONNECTIONS" -d"$duration" --latency -s "$script" \
    "$url" >"$out" 2>&1 || { cat "$out" >&2; die "wrk ($label) failed"; }
  case "$label" in
    warmup-*) ;;
    *) { printf -- '--- wrk %s\n' "$label"; cat "$out"; } | tee -a "$RESULTS_FILE" >&2 ;;
  esac
  grep '^WRK_RESULT ' "$out" || die "wrk ($label) printed no result line"
}

# Runs the fixed-rate generator against one target and prints its FIXEDRATE_RESULT line.
run_fixedrate() {
  local label=$1 rate=$2 out="$WORK_DIR/fixedrate-$1.txt"
  shift 2
  # shellcheck disable=SC2086 # PIN_PREFIX is empty or "taskset -c CPUS", split on purpose.
  timeout $((RATE_SECONDS + 30)) $PIN_PREFIX "$FIXEDRATE_BIN" --label "$label" --rate "$rate" \
    --seconds "$RATE_SECONDS" --connections "$RATE_CONNECTIONS" "$@" >"$out" 2>&1 || true
  { printf -- '--- fixedrate %s\n' "$label"; cat "$out"; } | tee -a "$RESULTS_FILE" >&2
  grep '^FIXEDRATE_RESULT ' "$out" || die "fixedrate ($label) printed no result line"
}

# Fails unless the gateway answers the envelope with a 200 whose upstream status is 200.
probe_gateway() {
  local body code
  code=$(curl -s -o "$WORK_DIR/probe.json" -w '%{http_code}' --max-time 10 \
    -H "Authorization: Bearer $DEPLOYMENT_TOKEN" -H 'Content-Type: application/json' \
    --data "$(envelope_json)" "http://127.0.0.1:$API_PORT/api/v1/requests" || true)
  body=$(head -c 600 "$WORK_DIR/probe.json" 2>/dev/null || true)
  if [ "$code" != 200 ] || [[ $body != *'"status":200'* ]]; then
    die "the gateway did not relay a 200 from nginx (HTTP $code): $body"
  fi
  log "probe ok: gateway relayed nginx's 200"
}

main() {
  local wrk_secs
  wrk_secs=$(duration_seconds "$DURATION")
  [ "$wrk_secs" -le "$MAX_WRK_SECONDS" ] || die "DURATION is capped at ${MAX_WRK_SECONDS}s"
  case "$ROUNDS" in
    [1-9]) ;;
    *) die "ROUNDS must be 1 to 9 (got '$ROUNDS')" ;;
  esac
  [ "$RATE_SECONDS" -le 15 ] || die "RATE_SECONDS is capped at 15"

  init_run
  RESULTS_FILE="$RESULTS_DIR/$(date +%F)-load.txt"
  apt_install nginx wrk curl
  FIXEDRATE_BIN=$(fixedrate_binary)
  local bin=""
  if [ "$SKIP_GATEWAY" != 1 ]; then
    bin=$(gateway_binary)
  fi

  start_nginx
  if [ "$SKIP_GATEWAY" != 1 ]; then
    start_gateway "$bin" "$GATEWAY_CORES"
    probe_gateway
  fi

  say ""
  say "=== sortie load run $(date -u +%FT%TZ)"
  say "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
    git -C "$REPO_DIR" diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
  say "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  quiet_check
  say "tools: $(wrk -v 2>&1 | head -n 1 | cut -d' ' -f1-2), $(nginx -v 2>&1 | cut -d' ' -f3)"
  say "knobs: DURATION=$DURATION ROUNDS=$ROUNDS CONNECTIONS=$CONNECTIONS THREADS=$THREADS WARMUP=$WARMUP" \
    "RATE_SECONDS=$RATE_SECONDS RATE_CONNECTIONS=$RATE_CONNECTIONS SKIP_GATEWAY=$SKIP_GATEWAY" \
    "GATEWAY_CORES=$GATEWAY_CORES ISOLATE=${ISOLATE:-auto}"

  local direct_url="http://127.0.0.1:$UPSTREAM_PORT/small"
  local gateway_url="http://127.0.0.1:$API_PORT/api/v1/requests"
  export SORTIE_PERF_URL="$direct_url" SORTIE_PERF_TOKEN="$DEPLOYMENT_TOKEN" SORTIE_PERF_DIR="$PERF_DIR"

  # Direct and gateway runs alternate for ROUNDS rounds, and the round with the median ratio is
  # reported: on a shared machine the background load drifts, and one disturbed run (or a
  # drift between the two runs of a round) must not decide the result.
  local direct="" gateway="" round d g ratios=() directs=() gateways=()
  run_wrk warmup-direct "$WARMUP" "$direct_url" "$PERF_DIR/report.lua" >/dev/null
  if [ "$SKIP_GATEWAY" != 1 ]; then
    run_wrk warmup-gateway "$WARMUP" "$gateway_url" "$PERF_DIR/envelope.lua" >/dev/null
  fi
  for ((round = 1; round <= ROUNDS; round++)); do
    d=$(run_wrk "direct-$round" "$DURATION" "$direct_url" "$PERF_DIR/report.lua")
    directs+=("$d")
    if [ "$SKIP_GATEWAY" != 1 ]; then
      g=$(run_wrk "gateway-$round" "$DURATION" "$gateway_url" "$PERF_DIR/envelope.lua")
      gateways+=("$g")
      ratios+=("$(awk -v g="$(field rps "$g")" -v d="$(field rps "$d")" 'BEGIN { printf "%.4f", g / d }')")
    fi
  done
  local pick=0 median
  if [ "$SKIP_GATEWAY" != 1 ]; then
    median=$(printf '%s\n' "${ratios[@]}" | sort -n | sed -n "$(((ROUNDS + 1) / 2))p")
    for ((round = 0; round < ROUNDS; round++)); do
      [ "${ratios[$round]}" != "$median" ] || { pick=$round; break; }
    done
    gateway=${gateways[$pick]}
  fi
  direct=${directs[$pick]}

  local direct_rps gateway_rps="" bad
  direct_rps=$(field rps "$direct")
  say ""
  say "--- maximum throughput (wrk -t$THREADS -c$CONNECTIONS -d$DURATION, $ROUNDS rounds)"
  if [ "$SKIP_GATEWAY" != 1 ]; then
    for ((round = 0; round < ROUNDS; round++)); do
      say "round $((round + 1)): direct $(field rps "${directs[$round]}")" \
        " gateway $(field rps "${gateways[$round]}")  ratio ${ratios[$round]}"
    done
    say "reported: round $((pick + 1)), the median ratio"
  fi
  say "direct  req/s: $direct_rps  p50 $(us_to_ms "$(field p50_us "$direct")") ms" \
    " p99 $(us_to_ms "$(field p99_us "$direct")") ms"
  if [ -n "$gateway" ]; then
    gateway_rps=$(field rps "$gateway")
    say "gateway req/s: $gateway_rps  p50 $(us_to_ms "$(field p50_us "$gateway")") ms" \
      " p99 $(us_to_ms "$(field p99_us "$gateway")") ms"
    bad=$(($(field non_2xx "$gateway") + $(field timeouts "$gateway") + $(field read_errors "$gateway")))
    [ "$bad" = 0 ] || say "WARNING: $bad gateway responses were errors; the gateway numbers are not valid"
    say "$(awk -v g="$gateway_rps" -v d="$direct_rps" -v t="$TARGET_RATIO" 'BEGIN {
      r = g / d; printf "ratio gateway/direct: %.3f (target >= %s: %s)", r, t, (r >= t ? "met" : "MISSED") }')"
  else
    say "gateway: skipped (SKIP_GATEWAY=1)"
  fi

  local rate
  if [ -n "$RATE" ]; then
    rate=$RATE
  else
    rate=$(awk -v r="${gateway_rps:-$direct_rps}" -v cap="$RATE_CAP" 'BEGIN {
      h = int(r / 2); if (h > cap) h = cap; if (h < 1) h = 1; print h }')
    say "fixed rate: half of the measured $([ -n "$gateway" ] && echo gateway || echo direct)" \
      "maximum, capped at RATE_CAP=$RATE_CAP: $rate req/s"
  fi

  # The gateway pins core thread i to CPU i (runtime.rs), so CPUs from GATEWAY_CORES up are free.
  local cores=$GATEWAY_CORES cpus
  cpus=$(nproc)
  PIN_PREFIX=""
  if [ -z "$ISOLATE" ]; then
    if [ "$cores" -gt 0 ] && [ "$cores" -lt "$cpus" ]; then ISOLATE=1; else ISOLATE=0; fi
  fi
  if [ "$ISOLATE" = 1 ]; then
    if [ "$cores" -lt 1 ] || [ "$cores" -ge "$cpus" ]; then
      die "ISOLATE=1 needs GATEWAY_CORES between 1 and $((cpus - 1))"
    fi
    local others="$cores-$((cpus - 1))" worker
    worker=$(nginx_worker_pid) || die "no nginx worker process"
    taskset -pc "$others" "$worker" >/dev/null || die "cannot pin nginx to CPUs $others"
    PIN_PREFIX="taskset -c $others"
    say "fixed-rate phase: nginx and the generator pinned to CPUs $others; the gateway's" \
      "threads run on CPUs 0-$((cores - 1)) (ISOLATE=0 to share)"
  fi

  local fdirect fgateway
  fdirect=$(run_fixedrate direct "$rate" --url "$direct_url")
  say ""
  say "--- latency at $rate req/s for ${RATE_SECONDS}s over $RATE_CONNECTIONS keep-alive connections"
  say "direct  p50 $(us_to_ms "$(field p50_us "$fdirect")") ms  p99 $(us_to_ms "$(field p99_us "$fdirect")") ms" \
    " (achieved $(field achieved_rps "$fdirect") req/s, errors $(field errors "$fdirect"))"
  check_held_rate "$fdirect" "$rate"
  if [ "$SKIP_GATEWAY" != 1 ]; then
    fgateway=$(run_fixedrate gateway "$rate" --url "$gateway_url" --method POST \
      --header "Authorization: Bearer $DEPLOYMENT_TOKEN" --header 'Content-Type: application/json' \
      --body "$(envelope_json)" --expect '"status":200')
    say "gateway p50 $(us_to_ms "$(field p50_us "$fgateway")") ms  p99 $(us_to_ms "$(field p99_us "$fgateway")") ms" \
      " (achieved $(field achieved_rps "$fgateway") req/s, errors $(field errors "$fgateway"))"
    check_held_rate "$fgateway" "$rate"
    say "$(awk -v g="$(field p99_us "$fgateway")" -v d="$(field p99_us "$fdirect")" -v t="$TARGET_ADDED_P99_MS" 'BEGIN {
      a = (g - d) / 1000; printf "p99 added latency: %.3f ms (target <= %s ms: %s)", a, t, (a <= t ? "met" : "MISSED") }')"
  fi
  say "results appended to perf/results/$(basename "$RESULTS_FILE")"
}

main "$@"
