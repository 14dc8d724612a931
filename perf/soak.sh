#!/usr/bin/env bash
# Soak test: the gateway (release build, one core) under a fixed-rate mix of successes and
# failure modes for SOAK_SECONDS (default 30 minutes). SOAK_MODE=api (the default) drives the
# request API: successes, destination errors, upstream resets, refused connections, timeouts
# and client disconnects. SOAK_MODE=proxy drives the forward-proxy listener instead:
# absolute-form GETs (1 KiB, and 256 KiB / 1 MiB bodies that are spliced), echoed POSTs,
# CONNECT tunnels (small exchanges, bulk data that switches them to splice, idle ones closed
# by the tunnel idle timeout), clients leaving mid-body, upstream resets and stalls mid-body,
# a slow head and refused destinations (perf/soak.py lists the mix). RSS and open descriptors
# of the gateway (sockets and pipes counted apart) are sampled every 10 s; the script prints
# their slope after the warm-up (whole, last two thirds, each third) and exits non-zero when
# either grows over the last two thirds. Results are appended to perf/results/DATE-soak.txt.
#
# Knobs: SOAK_MODE (api), SOAK_SECONDS (1800), SOAK_RATE operations/s (400), SOAK_WARMUP
#        seconds (60), GATEWAY_CORES (1), SORTIE_BIN (a prebuilt binary instead of cargo build
#        --release); for SOAK_MODE=proxy: PROXY_PORT (18082), TUNNEL_IDLE_MS (3000, the
#        gateway's control.proxy.tunnel_idle_timeout_ms), PROXY_IDLE_MS (1000, its
#        control.proxy.idle_timeout_ms: the mid-body stall and the slow head outlast it).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

SOAK_MODE=${SOAK_MODE:-api}
SOAK_SECONDS=${SOAK_SECONDS:-1800}
SOAK_RATE=${SOAK_RATE:-400}
SOAK_WARMUP=${SOAK_WARMUP:-60}
GATEWAY_CORES=${GATEWAY_CORES:-1}
PROXY_PORT=${PROXY_PORT:-18082}
TUNNEL_IDLE_MS=${TUNNEL_IDLE_MS:-3000}
PROXY_IDLE_MS=${PROXY_IDLE_MS:-1000}

main() {
  init_run
  command -v python3 >/dev/null || die "python3 is required"
  local bin out target
  case "$SOAK_MODE" in
    api) target=(--api-port "$API_PORT") ;;
    proxy) target=(--proxy-port "$PROXY_PORT" --tunnel-idle-ms "$TUNNEL_IDLE_MS") ;;
    *) die "SOAK_MODE must be api or proxy, not $SOAK_MODE" ;;
  esac
  bin=$(gateway_binary)
  if [ "$SOAK_MODE" = proxy ]; then
    require_free_port "$PROXY_PORT" PROXY_PORT
    # The snapshot's default timeout bounds a proxied request's head: 2 s, so that the slow
    # head (3 s) ends in a 504.
    PERF_SNAPSHOT_JSON='{"default_timeout_ms":2000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"}],"destinations":{"allow":["127.0.0.0/8"],"deny":[]}}' \
      GATEWAY_PROXY_PORT=$PROXY_PORT start_gateway "$bin" "$GATEWAY_CORES" "[control.proxy]
idle_timeout_ms = $PROXY_IDLE_MS
tunnel_idle_timeout_ms = $TUNNEL_IDLE_MS"
    wait_port "$PROXY_PORT" 30 "$GATEWAY_PID" || die "the proxy listener did not open on $PROXY_PORT"
  else
    start_gateway "$bin" "$GATEWAY_CORES"
  fi
  out="$RESULTS_DIR/$(date -u +%F)-soak.txt"
  {
    echo ""
    echo "=== sortie soak run $(date -u +%FT%TZ), mode $SOAK_MODE"
    echo "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "knobs: SOAK_MODE=$SOAK_MODE SOAK_SECONDS=$SOAK_SECONDS SOAK_RATE=$SOAK_RATE SOAK_WARMUP=$SOAK_WARMUP GATEWAY_CORES=$GATEWAY_CORES$([ "$SOAK_MODE" != proxy ] || echo " TUNNEL_IDLE_MS=$TUNNEL_IDLE_MS PROXY_IDLE_MS=$PROXY_IDLE_MS")"
  } | tee -a "$out"
  local status=0 cpu_before cpu_after
  cpu_before=$(cpu_ticks "$GATEWAY_PID")
  python3 "$PERF_DIR/soak.py" --mode "$SOAK_MODE" "${target[@]}" --token "$DEPLOYMENT_TOKEN" \
    --admin-port "$ADMIN_PORT" --admin-token "$ADMIN_TOKEN" --pid "$GATEWAY_PID" --seconds "$SOAK_SECONDS" --rate "$SOAK_RATE" \
    --warmup "$SOAK_WARMUP" | tee -a "$out" || status=$?
  is_alive "$GATEWAY_PID" || die "the gateway died during the soak (log: $WORK_DIR/gateway.log)"
  cpu_after=$(cpu_ticks "$GATEWAY_PID")
  {
    echo "gateway CPU: $(awk -v t=$((cpu_after - cpu_before)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", t / hz }') s over the run; load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
  } | tee -a "$out"
  log "results appended to $out"
  return "$status"
}

main "$@"
