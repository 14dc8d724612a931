#!/usr/bin/env bash
# The gateway's overhead on top of a proxied path: nginx's /small fetched through the same
# squid (HTTP CONNECT with Basic authentication), once by the request API with a pool behind
# squid (wrk posting envelopes, the gateway holding pooled tunnels to squid) and once by curl
# itself (one curl process, --proxytunnel, CONNECTIONS transfers in parallel over reused tunnels),
# in one run. Prints req/s and requests per CPU-second of the measured client (the gateway; curl)
# and of squid, from /proc. See perf/README.md.
#
#   bash perf/upstream-proxy.sh
#   DURATION=10s CONNECTIONS=32 CURL_REQUESTS=20000 SORTIE_BIN=target/release/sortie bash perf/upstream-proxy.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-32}
CURL_REQUESTS=${CURL_REQUESTS:-20000}
GATEWAY_CORES=${GATEWAY_CORES:-1}
SQUID_PORT=${SQUID_PORT:-18128}
TICKS=$(getconf CLK_TCK)
[ "$CURL_REQUESTS" -le 200000 ] || die "CURL_REQUESTS is capped at 200000"
RESULTS_FILE="$RESULTS_DIR/upstream-proxy.txt"

init_run
apt_install nginx wrk curl squid openssl
BIN=$(gateway_binary)
start_nginx

# squid: memory only, no cache, Basic authentication by basic_ncsa_auth, one user.
SQ="$WORK_DIR/squid"
mkdir -p "$SQ/logs"
chmod 755 "$WORK_DIR" "$SQ"
chmod 777 "$SQ/logs"
printf 'perf-user:%s\n' "$(openssl passwd -apr1 perf-password)" >"$SQ/passwd"
chmod 644 "$SQ/passwd"
require_free_port "$SQUID_PORT" SQUID_PORT
cat >"$SQ/squid.conf" <<CONF
http_port 127.0.0.1:$SQUID_PORT
pid_filename $SQ/logs/squid.pid
access_log none
cache_log $SQ/logs/cache.log
cache_store_log none
cache deny all
cache_mem 8 MB
coredump_dir $SQ/logs
max_filedescriptors 16384
auth_param basic program /usr/lib/squid/basic_ncsa_auth $SQ/passwd
auth_param basic realm sortie-perf
auth_param basic casesensitive on
acl authed proxy_auth REQUIRED
http_access allow authed
http_access deny all
shutdown_lifetime 0 seconds
visible_hostname sortie-perf
CONF
chmod 644 "$SQ/squid.conf"
squid -N -f "$SQ/squid.conf" >"$SQ/out.txt" 2>&1 &
SQUID_PID=$!
EXTRA_PIDS+=("$SQUID_PID")
wait_port "$SQUID_PORT" 20 "$SQUID_PID" || { cat "$SQ/logs/cache.log" >&2; die "squid did not start"; }
log "squid (pid $SQUID_PID) on 127.0.0.1:$SQUID_PORT"

TARGET="http://127.0.0.1:$UPSTREAM_PORT/small"

# --- curl through squid: one process, CONNECTIONS transfers at a time over CONNECT tunnels.
curl_run() {
  local t0 t1 c0 c1 s0 s1 ok
  s0=$(cpu_ticks "$SQUID_PID")
  t0=$(date +%s.%N)
  curl -sS --no-progress-meter --parallel --parallel-max "$CONNECTIONS" --proxytunnel \
    -x "http://127.0.0.1:$SQUID_PORT" --proxy-user perf-user:perf-password \
    -o /dev/null -w '%{http_code}\n' "$TARGET?[1-$CURL_REQUESTS]" >"$WORK_DIR/curl.codes" &
  local pid=$! peak=0 now
  # curl's CPU: sampled from /proc until it exits (the last sample misses at most 20 ms).
  while is_alive "$pid"; do
    now=$(cpu_ticks "$pid" 2>/dev/null || echo "$peak")
    [ "$now" -lt "$peak" ] || peak=$now
    sleep 0.02
  done
  wait "$pid" || die "curl through squid failed"
  t1=$(date +%s.%N)
  s1=$(cpu_ticks "$SQUID_PID")
  ok=$(grep -c '^200$' "$WORK_DIR/curl.codes" || true)
  [ "$ok" = "$CURL_REQUESTS" ] || die "curl: $ok of $CURL_REQUESTS transfers answered 200"
  awk -v n="$ok" -v t0="$t0" -v t1="$t1" -v c="$peak" -v s0="$s0" -v s1="$s1" -v hz="$TICKS" 'BEGIN {
    s = t1 - t0; cc = c / hz; sq = (s1 - s0) / hz
    printf "CURL requests=%d seconds=%.2f rps=%.1f client_cpu_s=%.2f client_req_per_cpu_s=%.0f squid_cpu_s=%.2f squid_req_per_cpu_s=%.0f\n",
      n, s, n / s, cc, (cc > 0 ? n / cc : 0), sq, (sq > 0 ? n / sq : 0)
  }'
}

# --- the request API with its pool behind the same squid.
export PERF_SNAPSHOT_JSON='{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct","upstream_proxy":{"id":"squid","url":"http://127.0.0.1:'"$SQUID_PORT"'","username_template":"perf-user","password":"perf-password"}}],"destinations":{"allow":["127.0.0.0/8"],"deny":[]}}'
start_gateway "$BIN" "$GATEWAY_CORES"
probe=$(curl -sS -H "Authorization: Bearer $DEPLOYMENT_TOKEN" -H 'Content-Type: application/json' \
  -d "{\"method\":\"GET\",\"url\":\"$TARGET\",\"timeout_ms\":5000}" "http://127.0.0.1:$API_PORT/api/v1/requests")
case $probe in
  *'"status":200'*) ;;
  *) die "the request API through squid did not answer 200: $probe" ;;
esac

gateway_run() {
  local g0 g1 s0 s1 out
  export SORTIE_PERF_URL="$TARGET" SORTIE_PERF_TOKEN="$DEPLOYMENT_TOKEN" SORTIE_PERF_DIR="$PERF_DIR"
  g0=$(cpu_ticks "$GATEWAY_PID")
  s0=$(cpu_ticks "$SQUID_PID")
  out=$(timeout 120 wrk -t1 -c"$CONNECTIONS" -d"$DURATION" -s "$PERF_DIR/envelope.lua" \
    "http://127.0.0.1:$API_PORT/api/v1/requests" | grep '^WRK_RESULT ') || die "wrk failed"
  g1=$(cpu_ticks "$GATEWAY_PID")
  s1=$(cpu_ticks "$SQUID_PID")
  awk -v line="$out" -v g0="$g0" -v g1="$g1" -v s0="$s0" -v s1="$s1" -v hz="$TICKS" 'BEGIN {
    n = split(line, f, " "); for (i = 2; i <= n; i++) { split(f[i], kv, "="); v[kv[1]] = kv[2] }
    gc = (g1 - g0) / hz; sq = (s1 - s0) / hz; r = v["requests"]
    printf "GATEWAY requests=%d seconds=%.2f rps=%.1f p50_us=%d p99_us=%d non_2xx=%d gateway_cpu_s=%.2f gateway_req_per_cpu_s=%.0f squid_cpu_s=%.2f squid_req_per_cpu_s=%.0f\n",
      r, v["seconds"], v["rps"], v["p50_us"], v["p99_us"], v["non_2xx"] + v["connect_errors"] + v["read_errors"] + v["timeouts"],
      gc, (gc > 0 ? r / gc : 0), sq, (sq > 0 ? r / sq : 0)
  }'
}

# Warm both paths, then measure them back to back.
curl -sS -o /dev/null --proxytunnel -x "http://127.0.0.1:$SQUID_PORT" \
  --proxy-user perf-user:perf-password "$TARGET" || die "curl through squid failed"
timeout 60 wrk -t1 -c"$CONNECTIONS" -d2s -s "$PERF_DIR/envelope.lua" \
  "http://127.0.0.1:$API_PORT/api/v1/requests" >/dev/null 2>&1 || true
c=$(curl_run)
g=$(gateway_run)
field() { printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
{
  echo "--- upstream-proxy $(date -u +%Y-%m-%dT%H:%M:%SZ) cores=$GATEWAY_CORES connections=$CONNECTIONS nproc=$(nproc) $(squid -v | head -n 1)"
  echo "$c"
  echo "$g"
  awk -v gr="$(field rps "$g")" -v cr="$(field rps "$c")" \
    -v gq="$(field gateway_req_per_cpu_s "$g")" -v cq="$(field client_req_per_cpu_s "$c")" 'BEGIN {
      printf "RATIO gateway_rps/curl_rps=%.2f gateway_req_per_cpu_s/curl_req_per_cpu_s=%.2f\n", gr / cr, gq / cq
    }'
} | tee -a "$RESULTS_FILE"
