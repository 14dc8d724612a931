#!/usr/bin/env bash
# HTTP/1.1 vs HTTP/2 to the destination, in one run: the request API fetching a 1 KiB file from
# nginx over TLS, once from a server that offers only HTTP/1.1 and once from one that offers
# HTTP/2 (same nginx, same certificate, same file). Reports req/s, requests per CPU-second of
# the gateway (from /proc) and how many upstream connections each protocol used (nginx's
# access log names each request's connection). See perf/README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-1}
GATEWAY_CORES=${GATEWAY_CORES:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}
H1_PORT=${H1_PORT:-18093}
H2_PORT=${H2_PORT:-18094}
CLK_TCK=$(getconf CLK_TCK)

say() { printf '%s\n' "$*" | tee -a "$RESULTS_FILE"; }

# Value of key $1 in a "KEY=value KEY=value" result line $2.
field() {
  local pair
  for pair in $2; do
    [ "${pair%%=*}" != "$1" ] || { echo "${pair#*=}"; return 0; }
  done
  die "no $1 in result line: $2"
}

# A throwaway CA and a leaf for 127.0.0.1 and localhost, for nginx; the gateway trusts the CA
# through `[egress] ca_file`.
make_certs() {
  local d="$WORK_DIR/tls"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=sortie perf CA" \
    -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$d/leaf.key" \
    -out "$d/leaf.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$d/ext.cnf"
  openssl x509 -req -in "$d/leaf.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 2 -extfile "$d/ext.cnf" -out "$d/leaf.pem" 2>/dev/null
}

start_tls_nginx() {
  local dir="$WORK_DIR/nginx" d="$WORK_DIR/tls"
  mkdir -p "$dir/logs" "$dir/tmp" "$dir/www"
  require_free_port "$H1_PORT" H1_PORT
  require_free_port "$H2_PORT" H2_PORT
  head -c 1024 /dev/urandom >"$dir/www/1k.bin"
  # nginx's worker runs as an unprivileged user: it must reach the file in the private run dir.
  chmod o+x "$WORK_DIR" "$dir"
  chmod o+rx "$dir/www"
  chmod o+r "$dir/www/1k.bin"
  cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
worker_rlimit_nofile 20000;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 16384; }
http {
    log_format conn '\$server_port \$connection';
    access_log $dir/logs/access.log conn;
    keepalive_timeout 120s;
    keepalive_requests 10000000;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    ssl_certificate $d/leaf.pem;
    ssl_certificate_key $d/leaf.key;
    root $dir/www;
    server { listen 127.0.0.1:$H1_PORT ssl backlog=4096; }
    server { listen 127.0.0.1:$H2_PORT ssl http2 backlog=4096; }
}
CONF
  nginx -t -q -e "$dir/logs/error.log" -p "$dir" -c "$dir/nginx.conf" ||
    die "nginx rejected its config"
  nginx -e "$dir/logs/error.log" -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' &
  NGINX_PID=$!
  wait_port "$H1_PORT" 10 "$NGINX_PID" && wait_port "$H2_PORT" 10 "$NGINX_PID" ||
    { cat "$dir/logs/error.log" >&2 || true; die "nginx did not start"; }
  log "nginx (pid $NGINX_PID): HTTP/1.1 on $H1_PORT, HTTP/2 on $H2_PORT"
}

# Distinct upstream connections nginx saw on port $1 so far (the log is written unbuffered).
upstream_connections() {
  awk -v p="$1" '$1 == p { seen[$2] = 1 } END { n = 0; for (c in seen) n++; print n }' \
    "$WORK_DIR/nginx/logs/access.log"
}

# Runs wrk for DURATION seconds through the gateway against upstream URL $2; prints
# "label rps= cpu_s= per_cpu_s= errors=".
run_round() {
  local label=$1 url=$2 out="$WORK_DIR/wrk-$1.txt" before after line requests cpu
  export SORTIE_PERF_URL="$url"
  before=$(cpu_ticks "$GATEWAY_PID")
  timeout $((DURATION + 30)) wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" \
    -s "$PERF_DIR/envelope.lua" "http://127.0.0.1:$API_PORT/api/v1/requests" >"$out" 2>&1 ||
    { cat "$out" >&2; die "wrk ($label) failed"; }
  after=$(cpu_ticks "$GATEWAY_PID")
  line=$(grep '^WRK_RESULT ' "$out") || die "wrk ($label) printed no result line"
  requests=$(field requests "$line")
  cpu=$(awk -v t=$((after - before)) -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }')
  printf '%s rps=%s cpu_s=%s per_cpu_s=%s errors=%s\n' "$label" "$(field rps "$line")" "$cpu" \
    "$(awk -v r="$requests" -v c="$cpu" 'BEGIN { printf "%.0f", (c > 0 ? r / c : 0) }')" \
    "$(($(field non_2xx "$line") + $(field timeouts "$line") + $(field read_errors "$line")))"
}

probe() {
  local out="$WORK_DIR/probe.json" code
  export SORTIE_PERF_URL="$1"
  code=$(curl -s -o "$out" -w '%{http_code}' --max-time 10 \
    -H "Authorization: Bearer $DEPLOYMENT_TOKEN" -H 'Content-Type: application/json' \
    --data "{\"method\":\"GET\",\"url\":\"$1\",\"timeout_ms\":5000}" \
    "http://127.0.0.1:$API_PORT/api/v1/requests" || true)
  [ "$code" = 200 ] && grep -q '"status":200' "$out" ||
    die "the gateway did not relay a 200 from $1 (HTTP $code): $(head -c 400 "$out")"
}

main() {
  case "$ROUNDS" in [1-9]) ;; *) die "ROUNDS must be 1 to 9" ;; esac
  [ "$DURATION" -le 60 ] || die "DURATION (seconds) is capped at 60"
  init_run
  RESULTS_FILE="$RESULTS_DIR/$(date +%F)-h2.txt"
  apt_install nginx wrk curl openssl
  local bin
  bin=$(gateway_binary)
  make_certs
  start_tls_nginx
  start_gateway "$bin" "$GATEWAY_CORES" "[egress]
ca_file = \"$WORK_DIR/tls/ca.pem\""
  local h1_url="https://127.0.0.1:$H1_PORT/1k.bin" h2_url="https://127.0.0.1:$H2_PORT/1k.bin"
  probe "$h1_url"
  probe "$h2_url"
  export SORTIE_PERF_TOKEN="$DEPLOYMENT_TOKEN" SORTIE_PERF_DIR="$PERF_DIR"

  say ""
  say "=== sortie h2 run $(date -u +%FT%TZ)"
  say "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  say "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  say "knobs: DURATION=${DURATION}s ROUNDS=$ROUNDS CONNECTIONS=$CONNECTIONS GATEWAY_CORES=$GATEWAY_CORES" \
    "body=1 KiB over TLS ($(nginx -v 2>&1 | cut -d' ' -f3))"
  run_round warmup-h1 "$h1_url" >/dev/null
  run_round warmup-h2 "$h2_url" >/dev/null
  local round h1 h2 ratios=() lines=()
  for ((round = 1; round <= ROUNDS; round++)); do
    h1=$(run_round "h1-$round" "$h1_url")
    h2=$(run_round "h2-$round" "$h2_url")
    lines+=("$h1" "$h2")
    ratios+=("$(awk -v a="$(field rps "$h2")" -v b="$(field rps "$h1")" 'BEGIN { printf "%.3f", a / b }')")
    say "round $round: $h1"
    say "round $round: $h2  (h2/h1 req/s ${ratios[-1]})"
  done
  local median
  median=$(printf '%s\n' "${ratios[@]}" | sort -n | sed -n "$(((ROUNDS + 1) / 2))p")
  local c1 c2
  c1=$(upstream_connections "$H1_PORT")
  c2=$(upstream_connections "$H2_PORT")
  say "upstream connections over the whole run: HTTP/1.1 $c1, HTTP/2 $c2" \
    "(gateway cores $GATEWAY_CORES, $CONNECTIONS client connections)"
  say "median h2/h1 req/s ratio: $median (target >= 1.0 with fewer connections:" \
    "$(awk -v m="$median" -v a="$c2" -v b="$c1" 'BEGIN { print (m >= 1.0 && a < b ? "met" : "MISSED") }'))"
  say "results appended to perf/results/$(basename "$RESULTS_FILE")"
}

main "$@"
