#!/usr/bin/env bash
# HTTP/1.1 vs HTTP/2 to the destination, a browser profile, and new-connection rates, in one
# run: the request API fetching a 1 KiB file from nginx over TLS, from a server that offers
# only HTTP/1.1, from one that offers HTTP/2, from one that offers HTTP/2 with every request
# naming fingerprint profile PROFILE (BoringSSL + the profile's HTTP/2 start), and from a
# server that closes every connection after one response with TLS resumption off, ordinary
# (rustls) and with the newest profile of each browser family in FAMILIES (BoringSSL; the
# family's moving alias, e.g. `chrome`): a full handshake per request. Same nginx, certificate
# and file throughout. Reports req/s, requests per CPU-second of the gateway (from /proc) and
# how many upstream connections each row used (nginx's access log names each request's
# connection). Needs a gateway built with `--features fingerprints`. See perf/README.md.
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
PROFILE_PORT=${PROFILE_PORT:-18095}
HANDSHAKE_PORT=${HANDSHAKE_PORT:-18096}
PROFILE=${PROFILE:-chrome_131}
# Browser families whose newest profile gets a full-handshake row (moving aliases).
FAMILIES=${FAMILIES:-chrome safari firefox}
CLK_TCK=$(getconf CLK_TCK)

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
  require_free_port "$PROFILE_PORT" PROFILE_PORT
  require_free_port "$HANDSHAKE_PORT" HANDSHAKE_PORT
  head -c 1024 /dev/urandom >"$dir/www/1k.bin"
  # nginx's worker runs as an unprivileged user: it must reach the file in the private run dir.
  chmod o+x "$WORK_DIR" "$dir"
  chmod o+rx "$dir/www"
  chmod o+r "$dir/www/1k.bin"
  cat >"$dir/nginx.conf" <<CONF
$(nginx_main_context "$dir")
http {
    log_format conn '\$server_port \$connection';
    access_log $dir/logs/access.log conn;
    keepalive_timeout 120s;
    keepalive_requests 10000000;
$(nginx_temp_paths "$dir")
    ssl_certificate $d/leaf.pem;
    ssl_certificate_key $d/leaf.key;
    root $dir/www;
    server { listen 127.0.0.1:$H1_PORT ssl backlog=4096; }
    server { listen 127.0.0.1:$H2_PORT ssl http2 backlog=4096; }
    server { listen 127.0.0.1:$PROFILE_PORT ssl http2 backlog=4096; }
    # One response per connection, no resumption: every request pays a full TLS handshake.
    server {
        listen 127.0.0.1:$HANDSHAKE_PORT ssl backlog=4096;
        keepalive_timeout 0;
        ssl_session_tickets off;
        ssl_session_cache off;
    }
}
CONF
  nginx -t -q -e "$dir/logs/error.log" -p "$dir" -c "$dir/nginx.conf" ||
    die "nginx rejected its config"
  nginx -e "$dir/logs/error.log" -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' &
  NGINX_PID=$!
  wait_port "$H1_PORT" 10 "$NGINX_PID" && wait_port "$H2_PORT" 10 "$NGINX_PID" &&
    wait_port "$PROFILE_PORT" 10 "$NGINX_PID" && wait_port "$HANDSHAKE_PORT" 10 "$NGINX_PID" ||
    { cat "$dir/logs/error.log" >&2 || true; die "nginx did not start"; }
  log "nginx (pid $NGINX_PID): HTTP/1.1 on $H1_PORT, HTTP/2 on $H2_PORT and $PROFILE_PORT," \
    "one request per connection on $HANDSHAKE_PORT"
}

# Distinct upstream connections nginx saw on port $1 so far (the log is written unbuffered).
upstream_connections() {
  awk -v p="$1" '$1 == p { seen[$2] = 1 } END { n = 0; for (c in seen) n++; print n }' \
    "$WORK_DIR/nginx/logs/access.log"
}

# Runs wrk for DURATION seconds through the gateway against upstream URL $2, every request
# naming fingerprint profile $3 when given; prints "label rps= cpu_s= per_cpu_s= errors=".
run_round() {
  local label=$1 url=$2 out="$WORK_DIR/wrk-$1.txt" before after line requests cpu
  export SORTIE_PERF_URL="$url" SORTIE_PERF_PROFILE="${3:-}"
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

# One request to URL $1 through the gateway (with fingerprint profile $2 when given).
probe() {
  local out="$WORK_DIR/probe.json" code extra=""
  [ -z "${2:-}" ] || extra=",\"fingerprint_profile\":\"$2\""
  code=$(curl -s -o "$out" -w '%{http_code}' --max-time 10 \
    -H "Authorization: Bearer $DEPLOYMENT_TOKEN" -H 'Content-Type: application/json' \
    --data "{\"method\":\"GET\",\"url\":\"$1\",\"timeout_ms\":5000$extra}" \
    "http://127.0.0.1:$API_PORT/api/v1/requests" || true)
  [ "$code" = 200 ] && grep -q '"status":200' "$out" ||
    die "the gateway did not relay a 200 from $1 ${2:+with profile $2 }(HTTP $code):" \
      "$(head -c 400 "$out") (a profile needs a binary built with --features fingerprints)"
}

# The gateway binary: SORTIE_BIN, or a release build with the fingerprinted connector.
fingerprint_binary() {
  if [ -n "${SORTIE_BIN:-}" ]; then
    gateway_binary
    return 0
  fi
  command -v cargo >/dev/null || die "cargo not found; install Rust or set SORTIE_BIN"
  log "cargo build --release --features fingerprints"
  (cd "$REPO_DIR" && cargo build --release -q --features fingerprints) >&2 ||
    die "cargo build --release --features fingerprints failed (needs cmake and libclang)"
  echo "${CARGO_TARGET_DIR:-$REPO_DIR/target}/release/sortie"
}

# Median of the numbers on stdin.
median() {
  sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }'
}

main() {
  case "$ROUNDS" in [1-9]) ;; *) die "ROUNDS must be 1 to 9" ;; esac
  [ "$DURATION" -le 60 ] || die "DURATION (seconds) is capped at 60"
  init_run
  RESULTS_FILE="$RESULTS_DIR/$(date +%F)-h2.txt"
  apt_install nginx wrk curl openssl
  local bin
  bin=$(fingerprint_binary)
  make_certs
  start_tls_nginx
  start_gateway "$bin" "$GATEWAY_CORES" "[egress]
ca_file = \"$WORK_DIR/tls/ca.pem\""
  # Named, so that the fingerprinted ClientHello carries SNI as to any named destination.
  local h1_url="https://localhost:$H1_PORT/1k.bin" h2_url="https://localhost:$H2_PORT/1k.bin"
  local p_url="https://localhost:$PROFILE_PORT/1k.bin" hs_url="https://localhost:$HANDSHAKE_PORT/1k.bin"
  probe "$h1_url"
  probe "$h2_url"
  probe "$p_url" "$PROFILE"
  probe "$hs_url"
  local fam
  for fam in $FAMILIES; do probe "$hs_url" "$fam"; done
  export SORTIE_PERF_TOKEN="$DEPLOYMENT_TOKEN" SORTIE_PERF_DIR="$PERF_DIR"

  say ""
  say "=== sortie h2 run $(date -u +%FT%TZ)"
  say "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  say "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  quiet_check
  say "knobs: DURATION=${DURATION}s ROUNDS=$ROUNDS CONNECTIONS=$CONNECTIONS GATEWAY_CORES=$GATEWAY_CORES" \
    "PROFILE=$PROFILE FAMILIES=\"$FAMILIES\" body=1 KiB over TLS ($(nginx -v 2>&1 | cut -d' ' -f3))"
  run_round warmup-h1 "$h1_url" >/dev/null
  run_round warmup-h2 "$h2_url" >/dev/null
  run_round warmup-profile "$p_url" "$PROFILE" >/dev/null
  local round h1 h2 pr hr hb
  local r_h2=() r_pr=() r_prc=()
  declare -A r_hs=() r_hsc=()
  for ((round = 1; round <= ROUNDS; round++)); do
    h1=$(run_round "h1-$round" "$h1_url")
    h2=$(run_round "h2-$round" "$h2_url")
    pr=$(run_round "h2-$PROFILE-$round" "$p_url" "$PROFILE")
    hr=$(run_round "handshake-rustls-$round" "$hs_url")
    r_h2+=("$(ratio "$(field rps "$h2")" "$(field rps "$h1")")")
    r_pr+=("$(ratio "$(field rps "$pr")" "$(field rps "$h2")")")
    r_prc+=("$(ratio "$(field per_cpu_s "$pr")" "$(field per_cpu_s "$h2")")")
    say "round $round: $h1"
    say "round $round: $h2  (h2/h1 req/s ${r_h2[-1]})"
    say "round $round: $pr  (profile/h2 req/s ${r_pr[-1]}, per CPU-s ${r_prc[-1]})"
    say "round $round: $hr"
    for fam in $FAMILIES; do
      hb=$(run_round "handshake-boringssl-$fam-$round" "$hs_url" "$fam")
      r_hs[$fam]+="$(ratio "$(field rps "$hb")" "$(field rps "$hr")") "
      r_hsc[$fam]+="$(ratio "$(field per_cpu_s "$hb")" "$(field per_cpu_s "$hr")") "
      say "round $round: $hb  (boringssl/rustls new connections/s" \
        "$(ratio "$(field rps "$hb")" "$(field rps "$hr")"), per CPU-s" \
        "$(ratio "$(field per_cpu_s "$hb")" "$(field per_cpu_s "$hr")"))"
    done
  done
  local c1 c2 cp ch
  c1=$(upstream_connections "$H1_PORT")
  c2=$(upstream_connections "$H2_PORT")
  cp=$(upstream_connections "$PROFILE_PORT")
  ch=$(upstream_connections "$HANDSHAKE_PORT")
  say "upstream connections over the whole run: HTTP/1.1 $c1, HTTP/2 $c2, HTTP/2 with $PROFILE $cp," \
    "one-request connections $ch (gateway cores $GATEWAY_CORES, $CONNECTIONS client connections)"
  local m_h2
  m_h2=$(printf '%s\n' "${r_h2[@]}" | median)
  say "median h2/h1 req/s ratio: $m_h2 (target >= 1.0 with fewer connections:" \
    "$(awk -v m="$m_h2" -v a="$c2" -v b="$c1" 'BEGIN { print (m >= 1.0 && a < b ? "met" : "MISSED") }'))"
  say "median $PROFILE/h2 ratio: req/s $(printf '%s\n' "${r_pr[@]}" | median)," \
    "per CPU-s $(printf '%s\n' "${r_prc[@]}" | median)"
  for fam in $FAMILIES; do
    say "median new-connection ratio boringssl($fam)/rustls: req/s" \
      "$(printf '%s\n' ${r_hs[$fam]} | median), per CPU-s $(printf '%s\n' ${r_hsc[$fam]} | median)"
  done
  say "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  say "results appended to perf/results/$(basename "$RESULTS_FILE")"
}

main "$@"
