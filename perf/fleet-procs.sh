#!/usr/bin/env bash
# A fleet of real processes: a private PostgreSQL cluster, an S3-compatible server (s3s-fs),
# three `sortie control` processes sharing them, and N `sortie worker` processes (N in
# $FLEET_SIZES), each with its own loopback source address, tags and country, dialling all
# three. perf/fleetprocs.py runs the measurements (cold start, a rollout's acknowledgements,
# idle CPU and RSS, fixed load through both ingresses, kill -9 of one control under load, its
# restart) and this script prints the table. See perf/README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FLEET_SIZES=${FLEET_SIZES:-"10 50 100"}
PG_PORT=${PG_PORT:-18432}
S3_PORT=${S3_PORT:-18433}
BASE_PORT=${BASE_PORT:-19100}
HEARTBEAT_MS=${HEARTBEAT_MS:-1000}
IDLE_SECONDS=${IDLE_SECONDS:-10}
# Fixed client load: RATE requests/s per control and ingress (request API, forward proxy).
RATE=${RATE:-50}
LOAD_SECONDS=${LOAD_SECONDS:-10}
KILL_SECONDS=${KILL_SECONDS:-15}
PG_DIR=""

# PostgreSQL refuses to run as root: its data lives in a directory of its own user's.
start_postgres() {
  local bin
  bin=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
  [ -n "$bin" ] || bin=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
  [ -x "$bin/initdb" ] || die "initdb not found: apt-get install postgresql"
  require_free_port "$PG_PORT" PG_PORT
  PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/sortie-perf-pg.XXXXXX")
  local as=()
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$PG_DIR"
    as=(runuser -u postgres --)
  fi
  "${as[@]}" "$bin/initdb" -D "$PG_DIR/data" -U sortie -A trust -E UTF8 --no-locale --no-sync \
    >"$PG_DIR/initdb.log" 2>&1 || { cat "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
  "${as[@]}" "$bin/postgres" -D "$PG_DIR/data" -p "$PG_PORT" -c listen_addresses=127.0.0.1 \
    -c unix_socket_directories= -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
    -c max_connections=400 >"$PG_DIR/server.log" 2>&1 &
  EXTRA_PIDS+=($!)
  wait_port "$PG_PORT" 30 "$!" || { cat "$PG_DIR/server.log" >&2; die "postgres did not start"; }
  local deadline=$((SECONDS + 30))
  until psql -q -d "postgres://sortie@127.0.0.1:$PG_PORT/postgres" -c 'SELECT 1' >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "postgres does not answer queries"
    sleep 0.2
  done
  log "postgres on 127.0.0.1:$PG_PORT"
}

stop_all() {
  # The workers and controls are perf/fleetprocs.py's: it stops them itself on every way out
  # but a kill, and an interrupt (Ctrl-C) reaches them too, in the same process group.
  cleanup
  if [ -n "$PG_DIR" ] && [ -d "$PG_DIR" ]; then
    local deadline=$((SECONDS + 20))
    while pgrep -f "postgres -D $PG_DIR/data" >/dev/null; do
      [ "$SECONDS" -lt "$deadline" ] || { pkill -9 -f "postgres -D $PG_DIR/data" || true; break; }
      sleep 0.2
    done
    rm -rf "$PG_DIR"
  fi
}

main() {
  init_run
  trap stop_all EXIT
  RESULTS_FILE="$RESULTS_DIR/$(date +%F)-fleet-procs.txt"
  apt_install nginx curl python3 postgresql
  ulimit -n "$(ulimit -Hn)"
  local bin
  bin=$(gateway_binary)
  NGINX_ACCESS_LOG="$WORK_DIR/access.log" start_nginx
  start_postgres
  start_s3s "$S3_PORT" receipts
  say ""
  say "=== sortie fleet of real processes $(date -u +%FT%TZ)"
  say "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  say "knobs: FLEET_SIZES='$FLEET_SIZES' HEARTBEAT_MS=$HEARTBEAT_MS IDLE_SECONDS=$IDLE_SECONDS" \
    "RATE=$RATE LOAD_SECONDS=$LOAD_SECONDS KILL_SECONDS=$KILL_SECONDS (3 controls, 1 core each)"
  say ""
  local out="$WORK_DIR/fleetprocs.txt"
  python3 "$PERF_DIR/fleetprocs.py" --bin "$bin" --work "$WORK_DIR/fleet" \
    --pg-admin-url "postgres://sortie@127.0.0.1:$PG_PORT/postgres" --s3-port "$S3_PORT" \
    --upstream-port "$UPSTREAM_PORT" --access-log "$WORK_DIR/access.log" --sizes "$FLEET_SIZES" \
    --base-port "$BASE_PORT" --heartbeat-ms "$HEARTBEAT_MS" --idle-seconds "$IDLE_SECONDS" \
    --rate "$RATE" --load-seconds "$LOAD_SECONDS" --kill-seconds "$KILL_SECONDS" >"$out" ||
    die "fleetprocs.py failed (its progress is above)"
  local line keys k
  keys="workers cold_s ack_p50_ms ack_p99_ms ack_max_ms acked idle_cpu_pct rss_mib worker_rss_mib
    load_rps load_failed per_control control_us_per_req workers_used worker_min_med_max
    kill_survivor_ok kill_survivor_failed receipt_back_s restart_s"
  while IFS= read -r line; do
    [[ $line == FLEETPROCS\ * ]] || continue
    for k in $keys; do
      say "$(printf '  %-22s %s' "$k" "$(field "$k" "$line")")"
    done
    say ""
  done <"$out"
  say "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

main "$@"
