#!/usr/bin/env bash
# Memory cost of idle keep-alive client connections on the gateway: RSS before and after 10,000
# connections that each made one request (401, wrong token) and then stay idle. See README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IDLE_CONNECTIONS=${IDLE_CONNECTIONS:-10000}
# Seconds the connections stay idle before the RSS is read: past the gateway's idle release
# (100 ms), so what is read is what an idle connection keeps.
IDLE_SETTLE=${IDLE_SETTLE:-3}
TARGET_KIB_PER_CONN=1
# The whole measurement gives up after this many seconds.
IDLE_TIMEOUT=${IDLE_TIMEOUT:-60}
# File descriptors wanted by the client and the gateway: the connections plus headroom.
WANT_FDS=65536

raise_fd_limit() {
  local need=$((IDLE_CONNECTIONS + 256)) hard
  if ! ulimit -n "$WANT_FDS" 2>/dev/null; then
    hard=$(ulimit -H -n)
    [ "$hard" = unlimited ] || ulimit -n "$hard"
  fi
  local now
  now=$(ulimit -n)
  if [ "$now" != unlimited ] && [ "$now" -lt "$need" ]; then
    die "the open-files limit is $now; $need are needed (raise the hard limit or lower IDLE_CONNECTIONS)"
  fi
  log "open-files limit: $now"
}

main() {
  init_run
  apt_install python3
  raise_fd_limit
  local bin pid_target results_file
  results_file="$RESULTS_DIR/$(date +%F)-idle.txt"
  case "${IDLE_TARGET:-gateway}" in
    nginx)
      # Measures nginx's worker instead: a check of the client itself, needing no gateway.
      start_nginx
      pid_target=$(nginx_worker_pid) || die "nginx has no worker process"
      set -- --port "$UPSTREAM_PORT" --request get --path /small --expect-status 200
      ;;
    gateway)
      bin=$(gateway_binary)
      start_gateway "$bin" 2
      pid_target=$GATEWAY_PID
      set -- --port "$API_PORT" --request bad-token --expect-status 401
      ;;
    *) die "IDLE_TARGET is gateway or nginx" ;;
  esac
  {
    echo ""
    echo "=== idle connections on ${IDLE_TARGET:-gateway} $(date -u +%FT%TZ)"
    echo "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  } | tee -a "$results_file"
  local out="$WORK_DIR/idle.txt" rc=0
  timeout $((IDLE_TIMEOUT + 10)) python3 "$PERF_DIR/idle_conns.py" "$@" --pid "$pid_target" \
    --settle "$IDLE_SETTLE" \
    --connections "$IDLE_CONNECTIONS" --timeout "$IDLE_TIMEOUT" >"$out" 2>&1 || rc=$?
  tee -a "$results_file" <"$out"
  [ "$rc" = 0 ] || die "the idle-connection client failed (exit $rc)"
  awk -v t="$TARGET_KIB_PER_CONN" '/^IDLE_RESULT / {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "kib_per_conn") v = kv[2] }
      printf "RSS per idle connection: %s KiB (target <= %s KiB: %s)\n", v, t, (v + 0 <= t ? "met" : "MISSED") }' \
    "$out" | tee -a "$results_file"
  echo "results appended to perf/results/$(basename "$results_file")"
}

main "$@"
