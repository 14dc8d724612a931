# Shared pieces of the perf scripts: package installs, the nginx upstream, the gateway's config
# and process, readiness waits and cleanup. Sourced, not run.
# shellcheck shell=bash

PERF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$PERF_DIR")
RESULTS_DIR="$PERF_DIR/results"

# Loopback ports; override when something else holds them.
UPSTREAM_PORT=${UPSTREAM_PORT:-18090}
API_PORT=${API_PORT:-18080}
# The nginx reverse hop peers are measured against (write_nginx_hop).
NGINX_HOP_PORT=${NGINX_HOP_PORT:-19133}
ADMIN_PORT=${ADMIN_PORT:-18081}

# Credentials of the throwaway gateway instance; they protect nothing but this run.
DEPLOYMENT_TOKEN=perf-token-0123456789abcdef
ADMIN_TOKEN=perf-admin-0123456789abcdef

# The body nginx answers on /small: 100 bytes, so that both paths move a small fixed payload.
SMALL_BODY=$(printf 'x%.0s' {1..99})
# The body nginx answers on /kib: 1 KiB (1023 bytes and the newline).
KIB_BODY=$(printf 'x%.0s' {1..1023})

WORK_DIR=""
NGINX_PID=""
GATEWAY_PID=""
# Other background processes of this run (load generators) to stop on exit.
EXTRA_PIDS=()
# A command start_gateway runs the gateway under (empty: none).
LAUNCH=()
APT_UPDATED=0

log() { printf '[perf] %s\n' "$*" >&2; }
# Prints a line and appends it to the results file ($RESULTS_FILE, set by each script).
say() { printf '%s\n' "$*" | tee -a "$RESULTS_FILE"; }
# The quiet-machine check (quiet_check below): wait, require or skip; how long to wait; the
# highest 1-minute load average that counts as quiet.
QUIET=${QUIET:-wait}
QUIET_WAIT=${QUIET_WAIT:-120}
QUIET_LOAD=${QUIET_LOAD:-$(awk -v n="$(nproc)" 'BEGIN { printf "%.1f", n / 2 }')}
# The names of processes that make a machine busy for a measurement.
# (`pgrep -x` matches the kernel's 15-character process names: valgrind's tools run as
# `memcheck-amd64-` and `callgrind-amd64`.)
BUSY_PROCESSES="cargo rustc cc1 cc1plus ld ld.lld ld.gold collect2 cargo-nextest valgrind memcheck-amd64- callgrind-amd64"

# What of BUSY_PROCESSES is running (names, space-separated).
busy_processes() {
  local name found=""
  for name in $BUSY_PROCESSES; do
    if pgrep -x "$name" >/dev/null 2>&1; then
      found="$found $name"
    fi
  done
  printf '%s' "${found# }"
}

# Measure only on a quiet machine: a CPU figure taken beside a build or a test suite says more
# about them than about the gateway. Called once before the first measured run, after the
# script's own builds: waits up to QUIET_WAIT seconds (120) until no compiler, linker, cargo or
# valgrind process is running and the 1-minute load average is at most QUIET_LOAD (half the
# CPUs), then prints one line, "quiet:" or "NOT QUIET:", with the load average and what was
# running, into the results. QUIET=require stops a run whose machine stays busy; QUIET=skip
# prints the line without waiting.
quiet_check() {
  case "$QUIET" in
  wait | require | skip) ;;
  *) die "QUIET is wait, require or skip" ;;
  esac
  local waited=0 load busy
  while :; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    busy=$(busy_processes)
    if [ -z "$busy" ] && awk -v l="$load" -v m="$QUIET_LOAD" 'BEGIN { exit !(l <= m) }'; then
      local after=""
      [ "$waited" -eq 0 ] || after=" after waiting ${waited} s"
      say "quiet: load average $(cut -d' ' -f1-3 /proc/loadavg) (at most $QUIET_LOAD), nothing building or testing$after"
      return 0
    fi
    if [ "$QUIET" = skip ] || [ "$waited" -ge "$QUIET_WAIT" ]; then
      break
    fi
    [ "$waited" -gt 0 ] || log "waiting up to ${QUIET_WAIT} s for a quiet machine (load $load, running: ${busy:-nothing})"
    sleep 5
    waited=$((waited + 5))
  done
  say "NOT QUIET: load average $(cut -d' ' -f1-3 /proc/loadavg) (wanted at most $QUIET_LOAD), running: ${busy:-none of the builders}; these CPU figures are not a record"
  [ "$QUIET" != require ] || die "the machine stayed busy for ${QUIET_WAIT} s (QUIET=require)"
}

# Value of key $1 in a "KEY=value KEY=value" result line $2; dies when it is missing.
field() {
  local pair
  for pair in $2; do
    [ "${pair%%=*}" != "$1" ] || { echo "${pair#*=}"; return 0; }
  done
  die "no $1 in result line: $2"
}
# The median of whitespace-separated numbers, "-" entries left out ("-" when none is left); of
# an even count, the lower of the middle two, as `proxy.sh` picks its median round.
median_of() {
  printf '%s\n' $1 | awk 'NF && $1 != "-"' | sort -g | awk '{ v[NR] = $1 }
    END { if (NR == 0) print "-"; else print v[int((NR + 1) / 2)] }'
}
# A distribution-free 95% interval for the median of whitespace-separated numbers ("-" entries
# left out): the k-th smallest and k-th largest, k the largest rank whose binomial tail
# P(Bin(n, 1/2) < k) stays at or below 2.5%. It assumes only that the rounds are independent
# draws of one distribution; fewer than six rounds give none ("-"). A ratio's target is met at
# 95% when the whole interval is on its side.
median_interval() {
  printf '%s\n' $1 | awk 'NF && $1 != "-"' | sort -g | awk '{ v[NR] = $1 }
    END {
      n = NR; k = 0; tail = 0; p = 0.5 ^ n; c = 1
      # tail = P(Bin(n, 1/2) <= j); c = n choose j.
      for (j = 0; j < n; j++) {
        tail += c * p
        if (tail > 0.025) break
        k = j + 1
        c = c * (n - j) / (j + 1)
      }
      if (k < 1) print "-"; else printf "%s-%s\n", v[k], v[n - k + 1]
    }'
}
# Microseconds $1 as milliseconds with three decimals.
us_to_ms() { awk -v us="$1" 'BEGIN { printf "%.3f", us / 1000 }'; }
die() {
  log "error: $*"
  exit 1
}

# The dump that process $1, run under callgrind with `--callgrind-out-file=$2-%p`, wrote last
# ($2-$1.N), or nothing when there is none yet.
callgrind_dump() {
  find "$(dirname "$2")" -maxdepth 1 -name "$(basename "$2")-$1.*" -size +0 | head -n 1
}

# Instructions process $1, running under callgrind with `--callgrind-out-file=$2-%p` (so its
# dumps are $2-$1.N), executed since its counters were last zeroed (`callgrind_control -z`):
# asks it for a dump, waits for the file and prints its total. $3 names it in errors.
callgrind_total() {
  local pid=$1 label=$3 file="" deadline total
  rm -f "$2-$1".*
  callgrind_control -d "$pid" >/dev/null || die "callgrind_control could not dump pid $pid"
  # The dump is written by the process itself, a moment after the request for it.
  deadline=$((SECONDS + 30))
  while [ -z "$file" ] && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.5
    file=$(callgrind_dump "$pid" "$2")
  done
  [ -n "$file" ] || die "callgrind wrote no dump for $label"
  sleep 1
  total=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
  [ -n "$total" ] || die "no instruction total for $label"
  echo "$total"
}

# Attaches uprobes to mimalloc's entry points in the binary $1 and sets ALLOC_EVENTS to the perf
# events that count them (every Rust allocation of the gateway goes through one of the three).
# The probes are removed with the run's cleanup. They slow every allocation down: a run with
# them gives counts per request, not req/s or CPU figures to compare.
ALLOC_EVENTS=""
alloc_probes() {
  perf probe -d 'probe_sortie:*' >/dev/null 2>&1 || true
  # The gateway's allocator (io/src/alloc.rs) calls mimalloc's plain entry points for layouts of
  # word alignment and the aligned ones otherwise: every allocation passes one of these six.
  local f events=""
  # Set before the probes: one that fails to attach leaves none of the others behind.
  trap "cleanup; perf probe -d 'probe_sortie:*' >/dev/null 2>&1 || true" EXIT
  for f in mi_malloc mi_zalloc mi_realloc mi_malloc_aligned mi_zalloc_aligned mi_realloc_aligned; do
    # Named explicitly: perf would name the group after the binary's file name.
    perf probe -x "$1" -a "probe_sortie:$f=$f" >/dev/null 2>&1 ||
      die "perf probe could not attach to $f in $1 (needs its symbols)"
    events="${events:+$events,}probe_sortie:$f"
  done
  ALLOC_EVENTS=$events
}

# Uprobes on every monomorphization of monoio's task poll in binary $1 (group probe_polls):
# a count per request of how often the request's tasks are polled, which on io_uring is about
# one per ring completion (callgrind's counts, taken on the epoll driver, see fewer). Sets
# POLL_EVENTS.
poll_probes() {
  perf probe -d 'probe_polls:*' >/dev/null 2>&1 || true
  trap "cleanup; perf probe -d 'probe_polls:*' >/dev/null 2>&1 || true" EXIT
  local sym i=0 events=""
  for sym in $(nm "$1" | awk '$3 ~ /^_ZN6monoio4task3raw4poll17h[0-9a-f]+E$/ { print $3 }'); do
    i=$((i + 1))
    perf probe -x "$1" -a "probe_polls:p$i=$sym" >/dev/null 2>&1 ||
      die "perf probe could not attach to monoio's task poll in $1 (needs its symbols)"
    events="${events:+$events,}probe_polls:p$i"
  done
  [ -n "$events" ] || die "no monoio task poll symbol in $1"
  POLL_EVENTS=$events
}

# Creates the run's scratch directory and arranges for every process started here to be
# stopped however the script ends.
init_run() {
  WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/sortie-perf.XXXXXX")
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mkdir -p "$RESULTS_DIR"
}

cleanup() {
  local pid nginx_workers=""
  [ -z "$NGINX_PID" ] || nginx_workers=$(pgrep -P "$NGINX_PID" || true)
  for pid in "${EXTRA_PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "$GATEWAY_PID" "$NGINX_PID"; do
    [ -n "$pid" ] || continue
    kill "$pid" 2>/dev/null || true
  done
  for pid in "$GATEWAY_PID" "$NGINX_PID"; do
    [ -n "$pid" ] || continue
    wait_gone "$pid" 5 || kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  # A master killed hard leaves its worker behind; those pids were read before the kill.
  for pid in $nginx_workers; do
    if is_alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
  done
  GATEWAY_PID=""
  NGINX_PID=""
  if [ -n "$WORK_DIR" ] && [ -d "$WORK_DIR" ] && [ "${KEEP_WORK_DIR:-0}" != 1 ]; then
    rm -rf "$WORK_DIR"
  fi
}

# True while process $1 runs; an exited child that is not yet reaped (a zombie) counts as gone.
is_alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $state != Z* ]]
}

# Waits up to $2 seconds for process $1 to exit.
wait_gone() {
  local pid=$1 deadline=$((SECONDS + $2))
  while is_alive "$pid"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# Installs Debian packages that are missing; `apt-get update` runs at most once per script.
# Service start-up during install is suppressed where no policy does it already, so that
# installing nginx never leaves a system nginx on port 80.
apt_install() {
  local missing=() pkg added_policy=0
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$pkg")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}: install them or run as root"
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    apt-get update -qq
    APT_UPDATED=1
  fi
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    added_policy=1
  fi
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { [ "$added_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d; die "apt-get install failed"; }
  [ "$added_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
}

# Fails early when a port this run needs is already taken.
require_free_port() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    die "port $1 on 127.0.0.1 is in use; set ${2:-the port variable} to a free port"
  fi
}

# Waits up to $2 seconds for 127.0.0.1:$1 to accept a TCP connection while process $3 lives.
wait_port() {
  local port=$1 deadline=$((SECONDS + $2)) pid=$3
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    is_alive "$pid" || return 1
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# The main context of every nginx the perf scripts start, whose files live under $1: one
# worker (the other core belongs to the load generator and the gateway), enough descriptors for
# the connection counts the scripts use, its pid and error log in $1.
nginx_main_context() {
  cat <<CONF
worker_processes 1;
worker_rlimit_nofile 20000;
pid $1/nginx.pid;
error_log $1/logs/error.log warn;
events { worker_connections 16384; }
CONF
}

# The `*_temp_path` lines of an nginx config whose files live under $1, so that nginx writes
# nothing under its default prefix (which needs root).
nginx_temp_paths() {
  local t="$1/tmp" kind
  for kind in client_body proxy fastcgi uwsgi scgi; do
    printf '    %s_temp_path %s/%s;\n' "$kind" "$t" "${kind#client_}"
  done
}

# Starts nginx in the foreground (in the background of this shell) as the upstream. One worker
# process: on a 2-core machine the load generator and the gateway need the other core, and
# the same single-worker upstream serves both the direct and the gateway runs.
start_nginx() {
  local dir="$WORK_DIR/nginx"
  mkdir -p "$dir/logs" "$dir/tmp"
  require_free_port "$UPSTREAM_PORT" UPSTREAM_PORT
  # NGINX_ACCESS_LOG, when set, logs each request's source address there (one per line).
  local access_log="access_log off;"
  [ -z "${NGINX_ACCESS_LOG:-}" ] || access_log="access_log $NGINX_ACCESS_LOG source;"
  cat >"$dir/nginx.conf" <<CONF
$(nginx_main_context "$dir")
http {
    log_format source '\$remote_addr';
    $access_log
    keepalive_timeout 120s;
    keepalive_requests 10000000;
$(nginx_temp_paths "$dir")
    server {
        listen 127.0.0.1:$UPSTREAM_PORT backlog=4096;
        location = /small {
            default_type text/plain;
            return 200 "$SMALL_BODY\n";
        }
        location = /kib {
            default_type text/plain;
            return 200 "$KIB_BODY\n";
        }
        location / {
            return 404;
        }
    }
}
CONF
  nginx -t -q -e "$dir/logs/error.log" -p "$dir" -c "$dir/nginx.conf" ||
    die "nginx rejected its config"
  nginx -e "$dir/logs/error.log" -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' &
  NGINX_PID=$!
  wait_port "$UPSTREAM_PORT" 10 "$NGINX_PID" ||
    { cat "$dir/logs/error.log" >&2 || true; die "nginx did not start on port $UPSTREAM_PORT"; }
  log "nginx (pid $NGINX_PID) on 127.0.0.1:$UPSTREAM_PORT"
}

# Starts s3s-fs, an S3-compatible server, on 127.0.0.1:$1 with one bucket $2 (its data under
# $WORK_DIR/s3, credentials AKPERF / SKPERF); stopped with the run.
start_s3s() {
  local port=$1 bucket=$2 bin=${S3S_FS:-$(command -v s3s-fs || echo "$HOME/.cargo/bin/s3s-fs")}
  [ -x "$bin" ] || die "s3s-fs is missing: cargo install s3s-fs@0.14.1 --features binary --locked"
  require_free_port "$port" S3_PORT
  mkdir -p "$WORK_DIR/s3/$bucket"
  "$bin" --host 127.0.0.1 --port "$port" --access-key AKPERF --secret-key SKPERF \
    "$WORK_DIR/s3" >"$WORK_DIR/s3s.log" 2>&1 &
  EXTRA_PIDS+=($!)
  wait_port "$port" 20 "$!" || die "s3s-fs did not start"
}

# Writes the config of an nginx reverse hop to the upstream nginx (one worker, keep-alive to
# the upstream, buffers for a 64 KiB body in memory) listening on NGINX_HOP_PORT, and prints
# its directory: the single hop that proxy.sh and rate_cpu.sh measure Sortie against.
write_nginx_hop() {
  local dir="$WORK_DIR/nginx-hop"
  mkdir -p "$dir/logs" "$dir/tmp"
  cat >"$dir/nginx.conf" <<CONF
$(nginx_main_context "$dir")
http {
    access_log off;
    keepalive_timeout 120s;
    keepalive_requests 10000000;
$(nginx_temp_paths "$dir")
    upstream up {
        server 127.0.0.1:$UPSTREAM_PORT;
        keepalive 256;
        keepalive_requests 10000000;
    }
    server {
        listen 127.0.0.1:$NGINX_HOP_PORT backlog=4096;
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # Enough memory buffers for a 64 KiB body: no temp files.
            proxy_buffer_size 16k;
            proxy_buffers 8 16k;
        }
    }
}
CONF
  echo "$dir"
}

# Pid of nginx's single worker process (the one that holds the connections).
nginx_worker_pid() {
  local deadline=$((SECONDS + 5)) pid
  while [ "$SECONDS" -lt "$deadline" ]; do
    pid=$(pgrep -P "$NGINX_PID" | head -n 1 || true)
    [ -z "$pid" ] || { echo "$pid"; return 0; }
    sleep 0.1
  done
  return 1
}

# Builds the release binary unless SORTIE_BIN names one; prints the binary's path.
gateway_binary() {
  if [ -n "${SORTIE_BIN:-}" ]; then
    [ -x "$SORTIE_BIN" ] || die "SORTIE_BIN=$SORTIE_BIN is not an executable"
    echo "$SORTIE_BIN"
    return 0
  fi
  command -v cargo >/dev/null || die "cargo not found; install Rust or set SORTIE_BIN"
  log "cargo build --release"
  (cd "$REPO_DIR" && cargo build --release -q) >&2 || die "cargo build --release failed"
  echo "${CARGO_TARGET_DIR:-$REPO_DIR/target}/release/sortie"
}

# Builds the fixed-rate load generator (perf/fixedrate, a cargo project of its own) in release
# mode and prints the binary's path. Cargo's output is shown only when the build fails.
fixedrate_binary() {
  local log="$WORK_DIR/fixedrate-build.log"
  command -v cargo >/dev/null ||
    die "cargo not found; the fixed-rate generator needs a Rust toolchain"
  log "cargo build --release (perf/fixedrate)"
  cargo build --release --quiet --manifest-path "$PERF_DIR/fixedrate/Cargo.toml" >"$log" 2>&1 ||
    { cat "$log" >&2; die "building the fixed-rate generator failed"; }
  echo "${CARGO_TARGET_DIR:-$PERF_DIR/fixedrate/target}/release/sortie-fixedrate"
}

# Writes the gateway's static config and bootstrap snapshot into the run directory. The
# snapshot allows loopback destinations, which the default policy denies.
write_gateway_config() {
  local cores=$1 dir="$WORK_DIR/gateway"
  mkdir -p "$dir/data"
  # PERF_SNAPSHOT_JSON replaces the bootstrap snapshot (perf/upstream-proxy.sh puts the pool
  # behind squid).
  if [ -n "${PERF_SNAPSHOT_JSON:-}" ]; then
    printf '%s\n' "$PERF_SNAPSHOT_JSON" >"$dir/snapshot.json"
  else
    cat >"$dir/snapshot.json" <<'JSON'
{"default_timeout_ms":60000,"routing":{"rules":[{"id":"default","priority":100,"constraints":{},"pools":["direct"],"sticky_session_ttl_seconds":0,"allow_sticky_fallback":true}]},"pools":[{"id":"direct"}],"destinations":{"allow":["127.0.0.0/8"],"deny":[]}}
JSON
  fi
  # GATEWAY_PROXY_PORT, when set, opens the forward-proxy listener on that port.
  local proxy_listen=""
  [ -z "${GATEWAY_PROXY_PORT:-}" ] || proxy_listen="proxy_listen = \"127.0.0.1:$GATEWAY_PROXY_PORT\""
  cat >"$dir/sortie.toml" <<TOML
[control]
api_listen = "127.0.0.1:$API_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"
$proxy_listen
data_dir = "$dir/data"
cores = $cores
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
  echo "$dir/sortie.toml"
}

# Starts `sortie serve` with `cores = $2` and waits until its API port accepts connections.
# $3, when given, is TOML appended to the config (for example an `[object_storage]` table).
start_gateway() {
  local bin=$1 cores=$2 config
  require_free_port "$API_PORT" API_PORT
  require_free_port "$ADMIN_PORT" ADMIN_PORT
  config=$(write_gateway_config "$cores")
  [ -z "${3:-}" ] || printf '\n%s\n' "$3" >>"$config"
  "$bin" check-config "$config" >&2 || die "the gateway rejected the perf config"
  # LAUNCH: a command the gateway runs under (perf/bus.sh puts valgrind there), START_WAIT the
  # seconds it may take to accept connections.
  "${LAUNCH[@]}" "$bin" serve --config "$config" >"$WORK_DIR/gateway.log" 2>&1 &
  GATEWAY_PID=$!
  if ! wait_port "$API_PORT" "${START_WAIT:-30}" "$GATEWAY_PID"; then
    tail -n 30 "$WORK_DIR/gateway.log" >&2 || true
    is_alive "$GATEWAY_PID" ||
      die "the gateway exited before accepting connections (its output is above)"
    die "the gateway did not accept connections on 127.0.0.1:$API_PORT within ${START_WAIT:-30} s"
  fi
  log "gateway (pid $GATEWAY_PID, cores = $cores) on 127.0.0.1:$API_PORT"
}

# The request envelope that asks the gateway for nginx's /small.
envelope_json() {
  printf '{"method":"GET","url":"http://127.0.0.1:%s/small","timeout_ms":5000}' "$UPSTREAM_PORT"
}

# Peak resident set size of process $1 in KiB (VmHWM), from /proc/PID/status.
peak_rss_kib() {
  awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"
}

# CPU time (user + system) of process $1 in clock ticks, from /proc/PID/stat.
cpu_ticks() {
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# Kernel CPU clock ticks used so far by process $1 (stime).
kernel_ticks() {
  awk '{ print $15 }' "/proc/$1/stat"
}

# Resident set size of process $1 in KiB, from /proc/PID/status.
rss_kib() {
  awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}
