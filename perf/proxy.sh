#!/usr/bin/env bash
# Forward-proxy benchmark: nginx as the upstream, measured in one interleaved run directly and
# through each peer (squid and tinyproxy as forward proxies, nginx and haproxy as reverse hops)
# and through Sortie's proxy listener. Absolute-form at 1 KiB and 64 KiB (wrk with
# perf/proxy.lua), CONNECT with a new tunnel per request and requests inside long-lived tunnels
# (perf/tunnelbench), and the request API (POST /api/v1/requests, the body coming back base64 in
# the envelope) beside the nginx hop. Prints req/s, p50/p99, the ratio to direct and requests
# per CPU-second of the proxy process (utime + stime from /proc/PID/stat over the measured
# window) with the share of it spent in the kernel (stime), and Sortie's per-CPU figure against
# the nginx hop's (squid's for tunnels), of the median rounds and round by round. See
# perf/README.md.
set -euo pipefail
# Ports of this benchmark, away from load.sh's so both can run on one machine.
UPSTREAM_PORT=${UPSTREAM_PORT:-19190}
API_PORT=${API_PORT:-19180}
ADMIN_PORT=${ADMIN_PORT:-19181}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PROXY_PORT=${PROXY_PORT:-19128}
SQUID_PORT=${SQUID_PORT:-19131}
TINYPROXY_PORT=${TINYPROXY_PORT:-19132}
HAPROXY_PORT=${HAPROXY_PORT:-19134}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-64}
# Tunnel modes use one blocking thread per connection in the generator; fewer keep its own CPU
# use reasonable on a small machine.
TUNNEL_CONNECTIONS=${TUNNEL_CONNECTIONS:-32}
THREADS=${THREADS:-1}
GATEWAY_CORES=${GATEWAY_CORES:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}
# Which sizes and modes to run (space-separated); all by default.
SIZES=${SIZES:-"1k 64k"}
MODES=${MODES:-"absolute connect-new in-tunnel api"}
# PROFILE=1: after the measured rounds, one more (unrecorded) run of Sortie per mode and size
# under `perf record`, and its top symbols by self time.
PROFILE=${PROFILE:-0}
# How the profile walks stacks: fp (frame pointers: cheap, but the release build omits them, so
# callers are mostly lost) or dwarf (full callers, for `perf report -g caller` on the data kept
# with KEEP_WORK_DIR=1; larger files and more overhead). With dwarf, the run also prints where
# the user time goes by component and by stage of a request (perf/user_profile.py).
PROFILE_CALL_GRAPH=${PROFILE_CALL_GRAPH:-fp}
# COUNT_ALLOCS=1: after the measured rounds, one more (unrecorded) run of Sortie per mode and
# size with uprobes on the allocator, and the allocator calls per request it made. The probes
# slow every allocation; that run's req/s and CPU are not comparable, its count is.
COUNT_ALLOCS=${COUNT_ALLOCS:-0}
# COUNT_POLLS=1: after the measured rounds, one more (unrecorded) run of Sortie per request mode
# and size with uprobes on monoio's task poll, and the task polls per request it made (on
# io_uring about one per ring completion: each runs the request's futures from the top).
COUNT_POLLS=${COUNT_POLLS:-0}
# CALLGRIND=1: after the measured rounds (ROUNDS=0 runs none), Sortie and the nginx hop each run
# once more under valgrind's callgrind for the request modes (absolute, api) and sizes, and the
# instructions each executed per request are printed with Sortie's ratio to the hop's: a count
# that does not move with the machine's load, for comparing builds where CPU time is too noisy
# (see perf/README.md). Sortie runs on the epoll driver there (valgrind cannot run io_uring), the
# hop as one process (`master_process off`); both under wrk -c$CALLGRIND_CONNECTIONS for
# CALLGRIND_SECONDS after a warm-up, with the counters zeroed in between.
CALLGRIND=${CALLGRIND:-0}
CALLGRIND_SECONDS=${CALLGRIND_SECONDS:-10}
CALLGRIND_CONNECTIONS=${CALLGRIND_CONNECTIONS:-64}
# CACHE_SIM=1 (with CALLGRIND=1): callgrind also simulates the caches, and each count is followed
# by the process's simulated L1 instruction and data cache misses per request and its hot code
# footprint (the KiB of code a request runs through, `perf/footprint.py`): where instructions
# alone do not tell why user time per request differs.
CACHE_SIM=${CACHE_SIM:-0}
CALLGRIND_OPTS=()
[ "$CACHE_SIM" != 1 ] || CALLGRIND_OPTS=(--cache-sim=yes --dump-instr=yes --compress-pos=no)
# ALLOC_SITES=1 (with COUNT_ALLOCS=1): also record the allocations' call stacks and print the
# sites in Sortie's code that allocate, per request.
ALLOC_SITES=${ALLOC_SITES:-0}
# A CPU list for every thread of the gateway after it started (see start_sortie); empty keeps
# the gateway's own pinning (one CPU per core thread).
GATEWAY_AFFINITY=${GATEWAY_AFFINITY:-}
# URINGLAB="oneshot multishot oneshot-fixed multishot-fixed splice zc http monoio-http
# monoio-decisions monoio-api" (any of them): also measure the io_uring lab relay (perf/uringlab)
# in those variants in the absolute rows (monoio-api in the api rows), each on its own port from
# URINGLAB_PORT, on CPU 0 as the gateway's first core: what ring features the gateway's runtime
# does not expose (multishot receive into provided buffers, registered files, zero-copy sends)
# would save per request, and what splicing large bodies does, beside the least any io_uring
# hop costs, (http) the least an HTTP-parsing hop costs and (monoio-http) the same work on the
# gateway's runtime, (monoio-decisions) that with the gateway's per-request decisions as plain
# calls into its core; (monoio-api) the request API's decisions the same way; with
# CALLGRIND=1, the monoio variants' instructions per request too. See perf/README.md.
URINGLAB=${URINGLAB:-}
URINGLAB_PORT=${URINGLAB_PORT:-19135}
# SYSCALLS=1: after the measured rounds, one more (unrecorded) run of every measured process
# per request mode and size (Sortie, the nginx hop, haproxy, the lab relays) counting, with the
# kernel's tracepoints, its system calls and its io_uring submissions and completions per
# request: how often each hop enters the kernel and how many ring operations (each one a wake
# of the task waiting on it, in the gateway) a request costs.
SYSCALLS=${SYSCALLS:-0}

# SPLIT_CPUS=1: the measured hops on HOP_CPUS, everything that makes or serves the load (wrk,
# tunnelbench, the upstream nginx) on LOAD_CPUS. By default only the gateway's core threads are
# pinned (to CPU 0, by the gateway itself) and the scheduler places the rest; on a small
# virtual machine it then sometimes puts the load beside the hop and sometimes not, and the
# same binary's CPU per request moves by a third between runs (perf/README.md, "A small
# keep-alive response sent while the next head is read"). Split, every hop gets the same
# treatment and rounds agree more closely; the figures are not comparable with unsplit runs.
SPLIT_CPUS=${SPLIT_CPUS:-0}
HOP_CPUS=${HOP_CPUS:-0}
LOAD_CPUS=${LOAD_CPUS:-1-$(($(nproc) - 1))}
LOAD_TASKSET=()

# BASE_BIN=path: also measure a second gateway from that binary (the row `sortie-base`, on its own
# ports, same configuration) in every mode, interleaved with the others, and print Sortie's
# requests per CPU-second over its: a change against the build before it in the same run.
BASE_BIN=${BASE_BIN:-}
BASE_PROXY_PORT=${BASE_PROXY_PORT:-19228}
BASE_API_PORT=${BASE_API_PORT:-19280}
BASE_ADMIN_PORT=${BASE_ADMIN_PORT:-19281}
BASE_PID=""

# LABELS="direct nginx-hop sortie ...": measure only these of each mode's rows (all when empty);
# the sortie and nginx-hop (squid for tunnels) rows are needed for the ratio lines.
LABELS=${LABELS:-}

RESULTS_FILE=""
TUNNELBENCH=""
LAST_LINE=""
declare -A PID_OF=()
declare -A PORT_OF=()
# Rows "mode size label" -> list of result lines over rounds.
declare -A RESULTS=()

# Value of key $1 in a "KEY=value ..." line $2.
field() {
  local pair
  for pair in $2; do
    [ "${pair%%=*}" != "$1" ] || { echo "${pair#*=}"; return 0; }
  done
  echo 0
}

# CPU clock ticks used so far by the processes $@: "utime+stime stime" (all, then the kernel's).
cpu_ticks() {
  local total=0 kernel=0 pid stat rest
  for pid in "$@"; do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    # Fields after the command (which may hold spaces) start at field 3.
    rest=${stat##*) }
    read -r -a f <<<"$rest"
    total=$((total + f[11] + f[12]))
    kernel=$((kernel + f[12]))
  done
  echo "$total $kernel"
}

start_bg() {
  # $1 label, rest: command. Output goes to the run dir.
  local label=$1
  shift
  "$@" >"$WORK_DIR/$label.log" 2>&1 &
  PID_OF[$label]=$!
  EXTRA_PIDS+=("$!")
}

write_upstream() {
  local dir="$WORK_DIR/upstream"
  mkdir -p "$dir/logs" "$dir/tmp" "$dir/www"
  # nginx's worker runs as an unprivileged user: it must be able to read the files.
  chmod 755 "$WORK_DIR" "$dir" "$dir/www"
  head -c 1024 /dev/zero | tr '\0' x >"$dir/www/1k"
  head -c 65536 /dev/zero | tr '\0' y >"$dir/www/64k"
  cat >"$dir/nginx.conf" <<CONF
$(nginx_main_context "$dir")
http {
    access_log off;
    sendfile on;
    keepalive_timeout 120s;
    keepalive_requests 10000000;
$(nginx_temp_paths "$dir")
    server {
        listen 127.0.0.1:$UPSTREAM_PORT backlog=4096;
        root $dir/www;
        default_type application/octet-stream;
    }
}
CONF
  echo "$dir"
}

start_peers() {
  local up hop sq tp ha
  up=$(write_upstream)
  require_free_port "$UPSTREAM_PORT" UPSTREAM_PORT
  start_bg upstream nginx -e "$up/logs/error.log" -p "$up" -c "$up/nginx.conf" -g 'daemon off;'
  wait_port "$UPSTREAM_PORT" 10 "${PID_OF[upstream]}" || die "upstream nginx did not start"
  NGINX_PID=${PID_OF[upstream]}

  hop=$(write_nginx_hop)
  require_free_port "$NGINX_HOP_PORT" NGINX_HOP_PORT
  start_bg nginx-hop-master nginx -e "$hop/logs/error.log" -p "$hop" -c "$hop/nginx.conf" -g 'daemon off;'
  wait_port "$NGINX_HOP_PORT" 10 "${PID_OF[nginx-hop-master]}" || die "nginx hop did not start"
  PID_OF[nginx-hop]=$(pgrep -P "${PID_OF[nginx-hop-master]}" | head -n 1)

  sq="$WORK_DIR/squid"
  mkdir -p "$sq"
  chmod 777 "$sq"
  cat >"$sq/squid.conf" <<CONF
http_port 127.0.0.1:$SQUID_PORT
http_access allow all
cache deny all
cache_mem 8 MB
access_log none
cache_log $sq/cache.log
pid_filename $sq/squid.pid
coredump_dir $sq
max_filedescriptors 20000
via off
forwarded_for delete
shutdown_lifetime 0 seconds
CONF
  require_free_port "$SQUID_PORT" SQUID_PORT
  start_bg squid squid -N -f "$sq/squid.conf"
  wait_port "$SQUID_PORT" 20 "${PID_OF[squid]}" || { cat "$WORK_DIR/squid.log" >&2; die "squid did not start"; }

  tp="$WORK_DIR/tinyproxy"
  mkdir -p "$tp"
  chmod 777 "$tp"
  cat >"$tp/tinyproxy.conf" <<CONF
User nobody
Group nogroup
Port $TINYPROXY_PORT
Listen 127.0.0.1
Timeout 600
MaxClients 2048
LogLevel Critical
PidFile "$tp/tinyproxy.pid"
DisableViaHeader Yes
ConnectPort $UPSTREAM_PORT
CONF
  require_free_port "$TINYPROXY_PORT" TINYPROXY_PORT
  start_bg tinyproxy tinyproxy -d -c "$tp/tinyproxy.conf"
  wait_port "$TINYPROXY_PORT" 10 "${PID_OF[tinyproxy]}" || { cat "$WORK_DIR/tinyproxy.log" >&2; die "tinyproxy did not start"; }

  ha="$WORK_DIR/haproxy"
  mkdir -p "$ha"
  cat >"$ha/haproxy.cfg" <<CONF
global
    nbthread 1
    maxconn 8000
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
frontend hop
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend up
backend up
    http-reuse always
    server s1 127.0.0.1:$UPSTREAM_PORT
CONF
  require_free_port "$HAPROXY_PORT" HAPROXY_PORT
  start_bg haproxy haproxy -db -f "$ha/haproxy.cfg"
  wait_port "$HAPROXY_PORT" 10 "${PID_OF[haproxy]}" || { cat "$WORK_DIR/haproxy.log" >&2; die "haproxy did not start"; }
}

# SPLIT_CPUS=1: pins every thread of the process $2 and of its children to the CPU list $1.
pin_tree() {
  local cpus=$1 pid=$2 child
  taskset -a -p -c "$cpus" "$pid" >/dev/null || die "taskset -p $cpus $pid failed"
  for child in $(pgrep -P "$pid"); do
    taskset -a -p -c "$cpus" "$child" >/dev/null || die "taskset -p $cpus $child failed"
  done
}

# SPLIT_CPUS=1: the hops on HOP_CPUS, the upstream and the load generators on LOAD_CPUS. The
# gateways' core threads stay where they pinned themselves; their other threads go to the
# load's CPUs, out of the core's way.
split_cpus() {
  local label pid
  LOAD_TASKSET=(taskset -c "$LOAD_CPUS")
  pin_tree "$LOAD_CPUS" "${PID_OF[upstream]}"
  for label in nginx-hop-master squid tinyproxy haproxy; do
    pin_tree "$HOP_CPUS" "${PID_OF[$label]}"
  done
  for pid in $GATEWAY_PID $BASE_PID; do
    local task
    for task in /proc/"$pid"/task/*; do
      grep -q '^sortie-core-' "$task/comm" 2>/dev/null ||
        taskset -p -c "$LOAD_CPUS" "${task##*/}" >/dev/null || die "taskset of $task failed"
    done
  done
}

# Starts a gateway from binary $1 as process label $2 (sortie or sortie-base) on its proxy, API and
# admin ports $3 $4 $5; sets START_PID.
start_gateway() {
  local bin=$1 name=$2 proxy_port=$3 api_port=$4 admin_port=$5 dir="$WORK_DIR/gateway" vars=""
  [ "$name" = sortie ] || { dir="$WORK_DIR/$name" vars=BASE_; }
  mkdir -p "$dir/data"
  cat >"$dir/snapshot.json" <<'JSON'
{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"}],"destinations":{"allow":["127.0.0.0/8"],"deny":[]}}
JSON
  cat >"$dir/sortie.toml" <<TOML
[control]
api_listen = "127.0.0.1:$api_port"
admin_listen = "127.0.0.1:$admin_port"
proxy_listen = "127.0.0.1:$proxy_port"
data_dir = "$dir/data"
cores = $GATEWAY_CORES
bootstrap_snapshot = "$dir/snapshot.json"

[[deployments]]
id = "perf"
token = "$DEPLOYMENT_TOKEN"

[admin]
token = "$ADMIN_TOKEN"

[[workers]]
id = "local"
capacity = 100000
TOML
  require_free_port "$proxy_port" "${vars}PROXY_PORT"
  require_free_port "$api_port" "${vars}API_PORT"
  require_free_port "$admin_port" "${vars}ADMIN_PORT"
  start_bg "$name" "$bin" serve --config "$dir/sortie.toml"
  START_PID=${PID_OF[$name]}
  wait_port "$proxy_port" 30 "$START_PID" || { cat "$WORK_DIR/$name.log" >&2; die "$name did not start"; }
  if [ -n "$GATEWAY_AFFINITY" ]; then
    # The core threads pin themselves to one CPU each; on a machine shared with other work a
    # pinned thread waits for its CPU while the other is idle, where the peers (unpinned)
    # move. GATEWAY_AFFINITY (a CPU list, e.g. 0-1) widens every thread of the gateway.
    taskset -a -p -c "$GATEWAY_AFFINITY" "$START_PID" >/dev/null || die "taskset failed"
  fi
}

start_sortie() {
  start_gateway "$1" sortie "$PROXY_PORT" "$API_PORT" "$ADMIN_PORT"
  GATEWAY_PID=$START_PID
  if [ -n "$BASE_BIN" ]; then
    [ -x "$BASE_BIN" ] || die "BASE_BIN=$BASE_BIN is not an executable"
    start_gateway "$BASE_BIN" sortie-base "$BASE_PROXY_PORT" "$BASE_API_PORT" "$BASE_ADMIN_PORT"
    BASE_PID=$START_PID
  fi
}

# Builds perf/uringlab and starts one relay per variant in URINGLAB.
start_uringlab() {
  log "building perf/uringlab"
  cargo build --release --quiet --manifest-path "$PERF_DIR/uringlab/Cargo.toml" ||
    die "building perf/uringlab failed"
  local relay="${CARGO_TARGET_DIR:-$PERF_DIR/uringlab/target}/release/sortie-uringlab"
  local variant port=$URINGLAB_PORT
  for variant in $URINGLAB; do
    require_free_port "$port" URINGLAB_PORT
    PROXY_TOKEN=$DEPLOYMENT_TOKEN start_bg "uringlab-$variant" "$relay" "127.0.0.1:$port" "127.0.0.1:$UPSTREAM_PORT" "$variant"
    wait_port "$port" 10 "${PID_OF[uringlab-$variant]}" ||
      { cat "$WORK_DIR/uringlab-$variant.log" >&2; die "uringlab $variant did not start"; }
    PORT_OF[uringlab-$variant]=$port
    port=$((port + 1))
  done
}

# Runs one measurement: $1 mode, $2 size, $3 label. Appends its result line (with cpu_s) to
# RESULTS["mode size label"].
# The process behind row label $1: sets LABEL_PID (empty for direct), LABEL_PORT (its proxy or
# hop port) and LABEL_API_PORT (a gateway's request API port, else empty).
label_process() {
  LABEL_PID="" LABEL_PORT="" LABEL_API_PORT=""
  case $1 in
    direct) ;;
    squid) LABEL_PID=${PID_OF[squid]} LABEL_PORT=$SQUID_PORT ;;
    tinyproxy) LABEL_PID=${PID_OF[tinyproxy]} LABEL_PORT=$TINYPROXY_PORT ;;
    nginx-hop) LABEL_PID=${PID_OF[nginx-hop]} LABEL_PORT=$NGINX_HOP_PORT ;;
    haproxy) LABEL_PID=${PID_OF[haproxy]} LABEL_PORT=$HAPROXY_PORT ;;
    sortie) LABEL_PID=$GATEWAY_PID LABEL_PORT=$PROXY_PORT LABEL_API_PORT=$API_PORT ;;
    sortie-base) LABEL_PID=$BASE_PID LABEL_PORT=$BASE_PROXY_PORT LABEL_API_PORT=$BASE_API_PORT ;;
    uringlab-*) LABEL_PID=${PID_OF[$1]} LABEL_PORT=${PORT_OF[$1]} ;;
  esac
}

measure() {
  local mode=$1 size=$2 label=$3 pid port line before after tick
  tick=$(getconf CLK_TCK)
  label_process "$label"
  pid=$LABEL_PID port=$LABEL_PORT
  local target="127.0.0.1:$UPSTREAM_PORT" auth=""
  # The gateway and the lab relay that makes its decisions check the deployment's credentials.
  [[ "$label" != sortie* && "$label" != uringlab-monoio-decisions ]] ||
    auth=$(printf 'perf:%s' "$DEPLOYMENT_TOKEN" | base64 -w0)
  before=$( [ -z "$pid" ] || cpu_ticks "$pid")
  case $mode in
    absolute | api)
      local out="$WORK_DIR/wrk.txt" url
      case $mode/$label in
        */direct) url="http://$target/$size" script="$PERF_DIR/report.lua" ;;
        */nginx-hop | */haproxy) url="http://127.0.0.1:$port/$size" script="$PERF_DIR/report.lua" ;;
        # The request API: every request POSTs the envelope naming the target.
        api/sortie | api/sortie-base) url="http://127.0.0.1:$LABEL_API_PORT/api/v1/requests" script="$PERF_DIR/envelope.lua" ;;
        api/uringlab-monoio-api) url="http://127.0.0.1:$port/api/v1/requests" script="$PERF_DIR/envelope.lua" ;;
        *) url="http://127.0.0.1:$port" script="$PERF_DIR/proxy.lua" ;;
      esac
      SORTIE_PERF_TARGET="http://$target/$size" SORTIE_PERF_TARGET_HOST="$target" \
        SORTIE_PERF_URL="http://$target/$size" SORTIE_PERF_TOKEN="$DEPLOYMENT_TOKEN" \
        SORTIE_PERF_PROXY_AUTH="$auth" SORTIE_PERF_DIR="$PERF_DIR" \
        "${LOAD_TASKSET[@]}" timeout 120 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "$script" "$url" \
        >"$out" 2>&1 || { cat "$out" >&2; die "wrk $mode $size $label failed"; }
      line=$(grep '^WRK_RESULT ' "$out") || { cat "$out" >&2; die "wrk printed no result"; }
      ;;
    connect-new | in-tunnel)
      local secs=${DURATION%s} tmode
      if [ "$label" = direct ]; then
        [ "$mode" = connect-new ] && tmode=direct-new || tmode=direct-keepalive
        line=$(CONNECTIONS=$TUNNEL_CONNECTIONS SECONDS=$secs "${LOAD_TASKSET[@]}" "$TUNNELBENCH" "$tmode" "$target" "/$size")
      else
        [ "$mode" = connect-new ] && tmode=new-tunnel || tmode=in-tunnel
        line=$(CONNECTIONS=$TUNNEL_CONNECTIONS SECONDS=$secs PROXY_AUTH="${auth:+perf:$DEPLOYMENT_TOKEN}" \
          "${LOAD_TASKSET[@]}" "$TUNNELBENCH" "$tmode" "127.0.0.1:$port" "$target" "/$size")
      fi
      ;;
  esac
  after=$( [ -z "$pid" ] || cpu_ticks "$pid")
  local cpu_s=0 sys_s=0
  if [ -n "$pid" ]; then
    cpu_s=$(awk -v a="${after% *}" -v b="${before% *}" -v t="$tick" 'BEGIN { printf "%.3f", (a - b) / t }')
    sys_s=$(awk -v a="${after#* }" -v b="${before#* }" -v t="$tick" 'BEGIN { printf "%.3f", (a - b) / t }')
  fi
  RESULTS["$mode $size $label"]+="$line cpu_s=$cpu_s sys_s=$sys_s"$'\n'
  LAST_LINE=$line
  log "$mode $size $label: $(field rps "$line") req/s, cpu ${cpu_s}s, errors $(field read_errors "$line")/$(field non_2xx "$line")"
}

# The labels measured in mode $1 (those in LABELS only, when it is set).
labels_for() {
  local label
  for label in $(all_labels_for "$1"); do
    [ -z "$LABELS" ] || [[ " $LABELS " == *" $label "* ]] || continue
    printf '%s ' "$label"
  done
}

# The lab relays of URINGLAB that mode $1 measures: `monoio-api` answers the request API's
# calls, every other variant relays forward-proxy requests.
relay_labels() {
  local variant
  for variant in $URINGLAB; do
    case $1/$variant in
      absolute/monoio-api) ;;
      api/monoio-api | absolute/*) printf 'uringlab-%s ' "$variant" ;;
    esac
  done
}

all_labels_for() {
  local base=${BASE_BIN:+ sortie-base}
  case $1 in
    absolute) echo "direct squid tinyproxy nginx-hop haproxy sortie$base $(relay_labels absolute)" ;;
    # The request API beside the best single hop (the target's own figure).
    api) echo "direct nginx-hop sortie$base $(relay_labels api)" ;;
    # Reverse hops cannot open tunnels.
    *) echo "direct squid tinyproxy sortie$base" ;;
  esac
}

# Median (by req/s) of the result lines in $1.
median_line() {
  printf '%s' "$1" | awk 'NF' | sort -t= -k4 -g | awk '{ l[NR] = $0 } END { print l[int((NR + 1) / 2)] }'
}

# Requests per CPU-second of the result lines $1 over those of $2, round by round (both lists in
# round order): the spread between rounds, beside the ratio of the medians.
round_ratios() {
  paste -d'|' <(printf '%s' "$1" | awk 'NF') <(printf '%s' "$2" | awk 'NF') | awk -F'|' '
    function per_cpu(line, kv, n, i, req, cpu) {
      n = split(line, kv, " ")
      for (i = 1; i <= n; i++) {
        if (kv[i] ~ /^requests=/) req = substr(kv[i], 10)
        if (kv[i] ~ /^cpu_s=/) cpu = substr(kv[i], 7)
      }
      return (cpu > 0) ? req / cpu : 0
    }
    {
      s = per_cpu($1); p = per_cpu($2)
      printf "%s%s", (NR > 1 ? " " : ""), (p > 0 ? sprintf("%.2f", s / p) : "-")
    }'
}

main() {
  init_run
  apt_install nginx wrk squid tinyproxy haproxy
  [ "$CALLGRIND" != 1 ] || apt_install valgrind
  RESULTS_FILE="$RESULTS_DIR/proxy-$(date -u +%Y%m%dT%H%M%SZ).txt"
  log "building perf/tunnelbench"
  cargo build --release --quiet --manifest-path "$PERF_DIR/tunnelbench/Cargo.toml" ||
    die "building perf/tunnelbench failed"
  TUNNELBENCH="${CARGO_TARGET_DIR:-$PERF_DIR/tunnelbench/target}/release/sortie-tunnelbench"
  local bin
  bin=$(gateway_binary)
  start_peers
  start_sortie "$bin"
  [ -z "$URINGLAB" ] || start_uringlab
  [ "$SPLIT_CPUS" != 1 ] || split_cpus
  say "proxy benchmark $(date -u +%FT%TZ): $(nproc) CPUs, sortie cores=$GATEWAY_CORES${GATEWAY_AFFINITY:+ (affinity $GATEWAY_AFFINITY)}$([ "$SPLIT_CPUS" != 1 ] || echo ", hops on CPU $HOP_CPUS, load on CPU $LOAD_CPUS"), wrk -t$THREADS -c$CONNECTIONS, tunnels $TUNNEL_CONNECTIONS connections, $DURATION x $ROUNDS rounds (median)"
  [ "$ROUNDS" -eq 0 ] || quiet_check
  local round mode size label
  for ((round = 1; round <= ROUNDS; round++)); do
    for mode in $MODES; do
      for size in $SIZES; do
        for label in $(labels_for "$mode"); do
          measure "$mode" "$size" "$label"
        done
      done
    done
  done
  [ "$ROUNDS" -eq 0 ] || print_tables
  say "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  [ "$COUNT_ALLOCS" != 1 ] || count_allocs_all "$bin"
  [ "$COUNT_POLLS" != 1 ] || count_polls_all "$bin"
  [ "$SYSCALLS" != 1 ] || syscalls_all
  [ "$PROFILE" != 1 ] || profile_all
  [ "$CALLGRIND" != 1 ] || callgrind_all "$bin"
  say ""
  say "results: $RESULTS_FILE"
}

# The table of the measured rounds' medians and Sortie's ratio to its peer per mode and size.
print_tables() {
  say ""
  say "| mode | size | proxy | req/s | p50 ms | p99 ms | ratio to direct | req per proxy CPU-s | proxy CPU in kernel | user + kernel µs per request | errors |"
  say "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for mode in $MODES; do
    for size in $SIZES; do
      local direct_rps
      # LABELS may leave the direct row out: the ratios to it are then "-".
      direct_rps=$(field rps "$(median_line "${RESULTS["$mode $size direct"]:-}")")
      for label in $(labels_for "$mode"); do
        local line rps cpu per_cpu kernel ratio errs per_request
        line=$(median_line "${RESULTS["$mode $size $label"]}")
        rps=$(field rps "$line")
        cpu=$(field cpu_s "$line")
        ratio=$(awk -v r="$rps" -v d="$direct_rps" 'BEGIN { if (d > 0) printf "%.2f", r / d; else printf "-" }')
        per_cpu=$(awk -v n="$(field requests "$line")" -v c="$cpu" 'BEGIN { if (c > 0) printf "%.0f", n / c; else printf "-" }')
        kernel=$(awk -v k="$(field sys_s "$line")" -v c="$cpu" 'BEGIN { if (c > 0) printf "%.0f%%", 100 * k / c; else printf "-" }')
        per_request=$(awk -v n="$(field requests "$line")" -v c="$cpu" -v k="$(field sys_s "$line")" \
          'BEGIN { if (c > 0 && n > 0) printf "%.1f + %.1f", 1e6 * (c - k) / n, 1e6 * k / n; else printf "-" }')
        errs=$(($(field read_errors "$line") + $(field non_2xx "$line") + $(field timeouts "$line")))
        say "| $mode | $size | $label | $(printf '%.0f' "$rps") | $(us_to_ms "$(field p50_us "$line")") | $(us_to_ms "$(field p99_us "$line")") | $ratio | $per_cpu | $kernel | $per_request | $errs |"
      done
    done
  done
  say ""
  for mode in $MODES; do
    local peer peer_name
    case $mode in
      absolute | api) peer=nginx-hop peer_name="nginx hop" ;;
      *) peer=squid peer_name=squid ;;
    esac
    for size in $SIZES; do
      # A peer left out of LABELS has no row to compare with.
      [ -z "${RESULTS["$mode $size $peer"]:-}" ] || ratio_line "$mode" "$size" "$peer" "$peer_name"
      [ -z "$BASE_BIN" ] || [ -z "${RESULTS["$mode $size sortie-base"]:-}" ] ||
        ratio_line "$mode" "$size" sortie-base sortie-base
      # The lab relays beside the same peer: the floor any io_uring hop of this shape reaches
      # in this run (decision 122).
      local variant
      for variant in $URINGLAB; do
        [ -z "${RESULTS["$mode $size $peer"]:-}" ] || [ -z "${RESULTS["$mode $size uringlab-$variant"]:-}" ] ||
          ratio_line "$mode" "$size" "$peer" "$peer_name" "uringlab-$variant"
      done
    done
  done
}

# Prints the requests per CPU-second of row $5 (default sortie) over those of row $3 (named $4)
# in mode $1, size $2: of the median rounds, round by round, and the median of the rounds'
# ratios with its 95% interval (six rounds or more). The two medians differ when the host's
# speed drifts between rounds; the rounds' own ratios (each of two rows measured back to back)
# are the steadier figure.
ratio_line() {
  local mode=$1 size=$2 other=$3 name=$4 row=${5:-sortie} s_line o_line rounds
  s_line=$(median_line "${RESULTS["$mode $size $row"]}")
  o_line=$(median_line "${RESULTS["$mode $size $other"]}")
  rounds=$(round_ratios "${RESULTS["$mode $size $row"]}" "${RESULTS["$mode $size $other"]}")
  say "$mode $size: $row / $name requests per CPU-second = $(awk \
    -v sn="$(field requests "$s_line")" -v sc="$(field cpu_s "$s_line")" \
    -v on="$(field requests "$o_line")" -v oc="$(field cpu_s "$o_line")" \
    'BEGIN { if (sc > 0 && oc > 0 && on > 0) printf "%.2f", (sn / sc) / (on / oc); else printf "-" }')" \
    "(medians; round by round: $rounds; median of the rounds $(median_of "$rounds"), its 95% interval $(median_interval "$rounds"))"
}

# One unrecorded run of Sortie per mode and size under `perf record`; prints the top symbols by
# self time (all of the process, kernel included).
profile_all() {
  local mode size data secs=${DURATION%s}
  for mode in $MODES; do
    for size in $SIZES; do
      data="$WORK_DIR/perf-$mode-$size.data"
      perf record -q -F 999 --call-graph "$PROFILE_CALL_GRAPH" -p "$GATEWAY_PID" -o "$data" -- sleep "$secs" \
        >"$WORK_DIR/perf-record.log" 2>&1 &
      local rec=$!
      measure "$mode" "$size" sortie
      wait "$rec" || { cat "$WORK_DIR/perf-record.log" >&2; die "perf record failed"; }
      say "--- profile: $mode $size (top 12 by self time, $(perf_samples "$data") samples)"
      # A profile without samples (the gateway starved of CPU) must not end the run.
      perf report -i "$data" --stdio --no-children --sort sym -g none >"$WORK_DIR/perf-report.txt" 2>&1 || true
      { grep -E '^ +[0-9]' "$WORK_DIR/perf-report.txt" || echo "(no samples)"; } |
        awk 'NR <= 12' | tee -a "$RESULTS_FILE"
      if [ "$PROFILE_CALL_GRAPH" = dwarf ]; then
        say "--- user time: $mode $size (perf/user_profile.py)"
        perf script -i "$data" -F ip,sym 2>/dev/null | python3 "$PERF_DIR/user_profile.py" |
          tee -a "$RESULTS_FILE" || true
      fi
    done
  done
}

# One unrecorded run of Sortie per request mode and size with uprobes on monoio's task poll;
# prints task polls per request.
count_polls_all() {
  local mode size counts requests polls
  poll_probes "$1"
  for mode in $MODES; do
    case $mode in absolute | api) ;; *) continue ;; esac
    for size in $SIZES; do
      counts="$WORK_DIR/polls-$mode-$size.csv"
      perf stat -x, -e "$POLL_EVENTS" -p "$GATEWAY_PID" -o "$counts" 2>/dev/null &
      local counter=$!
      measure "$mode" "$size" sortie
      kill -INT "$counter" 2>/dev/null || true
      wait "$counter" 2>/dev/null || true
      requests=$(field requests "$LAST_LINE")
      polls=$(awk -F, '$3 ~ /^probe_polls:/ { a += $1 } END { print a + 0 }' "$counts")
      say "$mode $size: task polls per request $(awk -v a="$polls" -v r="$requests" \
        'BEGIN { if (r > 0) printf "%.2f", a / r; else printf "-" }') ($polls polls, $requests requests, probes on)"
    done
  done
}

# One unrecorded run of Sortie per mode and size (request modes only: a tunnel's count is per
# tunnel, not per request) with uprobes on the allocator; prints allocator calls per request.
count_allocs_all() {
  local mode size counts requests calls
  alloc_probes "$1"
  for mode in $MODES; do
    case $mode in absolute | api) ;; *) continue ;; esac
    for size in $SIZES; do
      counts="$WORK_DIR/allocs-$mode-$size.csv"
      perf stat -x, -e "$ALLOC_EVENTS" -p "$GATEWAY_PID" -o "$counts" 2>/dev/null &
      local counter=$! sites="" recorder=""
      if [ "$ALLOC_SITES" = 1 ]; then
        sites="$WORK_DIR/alloc-sites-$mode-$size.data"
        perf record -q -e "$ALLOC_EVENTS" --call-graph dwarf,8192 -p "$GATEWAY_PID" -o "$sites" \
          -- sleep "${DURATION%s}" >"$WORK_DIR/perf-record.log" 2>&1 &
        recorder=$!
      fi
      measure "$mode" "$size" sortie
      kill -INT "$counter" 2>/dev/null || true
      wait "$counter" 2>/dev/null || true
      requests=$(field requests "$LAST_LINE")
      calls=$(awk -F, '$3 ~ /^probe_sortie:/ { a += $1 } END { print a + 0 }' "$counts")
      say "$mode $size: allocator calls per request $(awk -v a="$calls" -v r="$requests" \
        'BEGIN { if (r > 0) printf "%.1f", a / r; else printf "-" }') ($calls calls, $requests requests, probes on)"
      if [ -n "$sites" ]; then
        wait "$recorder" || { cat "$WORK_DIR/perf-record.log" >&2; die "perf record failed"; }
        say "--- allocation sites: $mode $size (calls per request by the first caller in Sortie's code)"
        perf script -i "$sites" -F ip,sym,srcline 2>/dev/null |
          python3 "$PERF_DIR/alloc_sites.py" --requests "$requests" --calls "$calls" | tee -a "$RESULTS_FILE"
      fi
    done
  done
}

# One unrecorded run per request mode, size and measured process (not direct) counting system
# calls and io_uring operations per request with tracepoints (needs no hardware counters).
syscalls_all() {
  local mode size label pid counts requests events
  events="raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter,io_uring:io_uring_submit_req,io_uring:io_uring_complete"
  say "--- system calls and io_uring operations per request (tracepoints; one unrecorded run each)"
  say "| mode | size | process | system calls | of which io_uring_enter | ring submissions | ring completions |"
  say "|---|---|---|---:|---:|---:|---:|"
  for mode in $MODES; do
    case $mode in absolute | api) ;; *) continue ;; esac
    for size in $SIZES; do
      for label in $(labels_for "$mode"); do
        label_process "$label"
        pid=$LABEL_PID
        [ -n "$pid" ] || continue
        counts="$WORK_DIR/syscalls-$mode-$size-$label.csv"
        # Every thread of the process (`-p` follows them all), the resolver and cold threads too.
        perf stat -x, -e "$events" -p "$pid" -o "$counts" 2>/dev/null &
        local counter=$!
        measure "$mode" "$size" "$label"
        kill -INT "$counter" 2>/dev/null || true
        wait "$counter" 2>/dev/null || true
        requests=$(field requests "$LAST_LINE")
        say "| $mode | $size | $label | $(awk -F, -v r="$requests" '
          $3 == "raw_syscalls:sys_enter" { s = $1 }
          $3 == "syscalls:sys_enter_io_uring_enter" { e = $1 }
          $3 == "io_uring:io_uring_submit_req" { q = $1 }
          $3 == "io_uring:io_uring_complete" { c = $1 }
          END { if (r > 0) printf "%.2f | %.2f | %.2f | %.2f", s / r, e / r, q / r, c / r; else printf "- | - | - | -" }' "$counts") |"
      done
    done
  done
}

# Instructions per request of the process $1 (pid, running under callgrind) over one wrk run of
# $2 (mode) and $3 (size) against label $4, the counters zeroed after a warm-up; sets CG_PER_REQUEST
# and CG_REQUESTS.
callgrind_count() {
  local pid=$1 mode=$2 size=$3 label=$4 saved=$DURATION
  local saved_c=$CONNECTIONS total requests
  CG_CACHE=""
  CONNECTIONS=$CALLGRIND_CONNECTIONS
  DURATION=3s
  measure "$mode" "$size" "$label"
  callgrind_control -z "$pid" >/dev/null || die "callgrind_control could not reach pid $pid"
  DURATION=${CALLGRIND_SECONDS}s
  measure "$mode" "$size" "$label"
  DURATION=$saved
  CONNECTIONS=$saved_c
  requests=$(field requests "$LAST_LINE")
  total=$(callgrind_total "$pid" "$CG_PREFIX" "$label") || exit 1
  [ "$requests" -gt 0 ] || die "no request answered under callgrind for $label"
  CG_REQUESTS=$requests
  CG_PER_REQUEST=$(awk -v t="$total" -v n="$requests" 'BEGIN { printf "%.0f", t / n }')
  if [ "$CACHE_SIM" = 1 ]; then
    local dump
    dump=$(callgrind_dump "$pid" "$CG_PREFIX")
    [ -n "$dump" ] || die "no callgrind dump of $label to read the cache misses from"
    CG_CACHE="  $(python3 "$PERF_DIR/footprint.py" "$dump" "$requests")"
  fi
}

# Starts `$@` under callgrind, its dumps named after $1 (a label) in the run directory, and
# waits for port $2; sets CG_PID and CG_PREFIX (the dumps' path, less `-PID.N`).
start_callgrind() {
  local label=$1 port=$2
  shift 2
  CG_PREFIX="$WORK_DIR/callgrind-$label"
  start_bg "callgrind-$label" valgrind --tool=callgrind "${CALLGRIND_OPTS[@]}" --callgrind-out-file="$CG_PREFIX-%p" "$@"
  CG_PID=${PID_OF[callgrind-$label]}
  # Valgrind translates the program first: tens of seconds for the gateway.
  wait_port "$port" 180 "$CG_PID" || { cat "$WORK_DIR/callgrind-$label.log" >&2; die "$label did not start under callgrind"; }
}

# Sortie and the nginx hop under callgrind, one after the other, for each request mode and size:
# instructions per request and their ratio. The last step of a run: the gateway stays stopped.
callgrind_all() {
  local bin=$1 mode size hop_dir cfg="$WORK_DIR/gateway/sortie.toml" hop_port=$((NGINX_HOP_PORT + 10))
  command -v valgrind >/dev/null && command -v callgrind_control >/dev/null ||
    die "valgrind is missing: apt-get install valgrind"
  # The hop's config as one process on its own port and directory.
  hop_dir="$WORK_DIR/nginx-hop-callgrind"
  mkdir -p "$hop_dir/logs" "$hop_dir/tmp"
  sed -e "s#$WORK_DIR/nginx-hop#$hop_dir#g" -e "s#127.0.0.1:$NGINX_HOP_PORT#127.0.0.1:$hop_port#" \
    "$WORK_DIR/nginx-hop/nginx.conf" >"$hop_dir/nginx.conf"
  require_free_port "$hop_port" "NGINX_HOP_PORT (+10)"
  kill "$GATEWAY_PID" 2>/dev/null || true
  wait_gone "$GATEWAY_PID" 30 || die "sortie did not stop"
  say ""
  say "--- instructions per request under callgrind (wrk -c$CALLGRIND_CONNECTIONS, ${CALLGRIND_SECONDS}s after a 3 s warm-up; Sortie on the epoll driver)"
  declare -A hop_ir=()
  start_callgrind hop "$hop_port" nginx -e "$hop_dir/logs/error.log" -p "$hop_dir" -c "$hop_dir/nginx.conf" \
    -g 'daemon off; master_process off;'
  local saved_pid=${PID_OF[nginx-hop]} saved_hop_port=$NGINX_HOP_PORT
  PID_OF[nginx-hop]=$CG_PID
  NGINX_HOP_PORT=$hop_port
  for size in $SIZES; do
    callgrind_count "$CG_PID" absolute "$size" nginx-hop
    hop_ir[$size]=$CG_PER_REQUEST
    say "nginx hop $size: $CG_PER_REQUEST instructions per request ($CG_REQUESTS requests)"
    [ -z "$CG_CACHE" ] || say "$CG_CACHE"
  done
  NGINX_HOP_PORT=$saved_hop_port
  PID_OF[nginx-hop]=$saved_pid
  kill "$CG_PID" 2>/dev/null || true
  wait_gone "$CG_PID" 30 || kill -9 "$CG_PID" 2>/dev/null || true
  # Valgrind runs the gateway itself (it does not follow an exec): the variable goes in its
  # environment.
  export MONOIO_FORCE_LEGACY_DRIVER=1
  start_callgrind sortie "$PROXY_PORT" "$bin" serve --config "$cfg"
  unset MONOIO_FORCE_LEGACY_DRIVER
  GATEWAY_PID=$CG_PID
  for mode in $MODES; do
    case $mode in absolute | api) ;; *) continue ;; esac
    for size in $SIZES; do
      callgrind_count "$CG_PID" "$mode" "$size" sortie
      say "sortie $mode $size: $CG_PER_REQUEST instructions per request ($CG_REQUESTS requests)," \
        "$(awk -v a="$CG_PER_REQUEST" -v b="${hop_ir[$size]}" 'BEGIN { printf "%.2f", a / b }')x the nginx hop's"
      [ -z "$CG_CACHE" ] || say "$CG_CACHE"
    done
  done
  kill "$CG_PID" 2>/dev/null || true
  wait_gone "$CG_PID" 30 || kill -9 "$CG_PID" 2>/dev/null || true
  GATEWAY_PID=""
  # The lab relay on the gateway's runtime, when measured: the instructions of the runtime and
  # the least HTTP work, beside the gateway's.
  case " $URINGLAB " in *" monoio-http "*) callgrind_monoio_relay monoio-http absolute ;; esac
  case " $URINGLAB " in *" monoio-decisions "*) callgrind_monoio_relay monoio-decisions absolute ;; esac
  case " $URINGLAB " in *" monoio-api "*) callgrind_monoio_relay monoio-api api ;; esac
}

# The lab relay in variant $1 (monoio-http, monoio-decisions or monoio-api) under callgrind
# (epoll driver) in mode $2, each size.
callgrind_monoio_relay() {
  local variant=$1 mode=$2 size label=uringlab-$1 port=$((URINGLAB_PORT + 20))
  local relay="${CARGO_TARGET_DIR:-$PERF_DIR/uringlab/target}/release/sortie-uringlab"
  local saved_pid=${PID_OF[$label]} saved_port=${PORT_OF[$label]}
  require_free_port "$port" "URINGLAB_PORT (+20)"
  export MONOIO_FORCE_LEGACY_DRIVER=1
  export PROXY_TOKEN=$DEPLOYMENT_TOKEN
  start_callgrind "relay-$variant" "$port" "$relay" "127.0.0.1:$port" "127.0.0.1:$UPSTREAM_PORT" "$variant"
  unset MONOIO_FORCE_LEGACY_DRIVER PROXY_TOKEN
  PID_OF[$label]=$CG_PID
  PORT_OF[$label]=$port
  for size in $SIZES; do
    callgrind_count "$CG_PID" "$mode" "$size" "$label"
    say "relay on monoio ($variant) $size: $CG_PER_REQUEST instructions per request ($CG_REQUESTS requests)"
    [ -z "$CG_CACHE" ] || say "$CG_CACHE"
  done
  kill "$CG_PID" 2>/dev/null || true
  wait_gone "$CG_PID" 30 || kill -9 "$CG_PID" 2>/dev/null || true
  PID_OF[$label]=$saved_pid
  PORT_OF[$label]=$saved_port
}

# Samples in the perf data file $1 (0 when unreadable).
perf_samples() {
  perf report -i "$1" --stdio --no-children --sort sym -g none 2>/dev/null |
    awk '/^# Samples: / { print $3; found = 1; exit } END { if (!found) print 0 }'
}

us_to_ms() { awk -v us="$1" 'BEGIN { printf "%.2f", us / 1000 }'; }

main "$@"
