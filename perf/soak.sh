#!/usr/bin/env bash
# Soak test: the gateway (release build, one core) under a fixed-rate mix of successes,
# destination errors, upstream resets, refused connections, timeouts and client disconnects
# for SOAK_SECONDS (default 30 minutes). RSS and open descriptors of the gateway are sampled
# every 10 s; the script prints their slope after the warm-up (whole, last two thirds, each
# third) and exits non-zero when either grows over the last two thirds. Results are appended to
# perf/results/DATE-soak.txt.
#
# Knobs: SOAK_SECONDS (1800), SOAK_RATE requests/s (400), SOAK_WARMUP seconds (60),
#        GATEWAY_CORES (1), SORTIE_BIN (a prebuilt binary instead of cargo build --release).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

SOAK_SECONDS=${SOAK_SECONDS:-1800}
SOAK_RATE=${SOAK_RATE:-400}
SOAK_WARMUP=${SOAK_WARMUP:-60}
GATEWAY_CORES=${GATEWAY_CORES:-1}

main() {
  init_run
  command -v python3 >/dev/null || die "python3 is required"
  local bin out
  bin=$(gateway_binary)
  start_gateway "$bin" "$GATEWAY_CORES"
  out="$RESULTS_DIR/$(date -u +%F)-soak.txt"
  {
    echo ""
    echo "=== sortie soak run $(date -u +%FT%TZ)"
    echo "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "knobs: SOAK_SECONDS=$SOAK_SECONDS SOAK_RATE=$SOAK_RATE SOAK_WARMUP=$SOAK_WARMUP GATEWAY_CORES=$GATEWAY_CORES"
  } | tee -a "$out"
  local status=0
  python3 "$PERF_DIR/soak.py" --api-port "$API_PORT" --token "$DEPLOYMENT_TOKEN" \
    --pid "$GATEWAY_PID" --seconds "$SOAK_SECONDS" --rate "$SOAK_RATE" \
    --warmup "$SOAK_WARMUP" | tee -a "$out" || status=$?
  is_alive "$GATEWAY_PID" || die "the gateway died during the soak (log: $WORK_DIR/gateway.log)"
  log "results appended to $out"
  return "$status"
}

main "$@"
