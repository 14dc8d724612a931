#!/usr/bin/env bash
# The worker bus against the in-process executor, in one run: the request API answering a 1 KiB
# nginx body through `sortie serve` (local worker) and through `sortie control` + one remote
# `sortie worker` over a plain-TCP bus on loopback. Prints req/s, requests per CPU-second of the
# measured processes (CPU from /proc), and the ratio (target ≥ 0.70). See perf/README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-1}
BUS_PORT=${BUS_PORT:-18070}
# Cores of the control (and of the gateway it is compared with) and of the worker.
CORES=${CORES:-1}
WORKER_CORES=${WORKER_CORES:-1}
# COUNT_OPS=1: also count io_uring operations and context switches per request (perf stat).
COUNT_OPS=${COUNT_OPS:-0}
# COUNT_ALLOCS=1 (implies COUNT_OPS): also count calls into the allocator per request, with
# uprobes on mimalloc's entry points in the binary. The probes slow every allocation down, so
# the run's req/s and CPU figures are not comparable with a run without them; the counts are.
COUNT_ALLOCS=${COUNT_ALLOCS:-0}
# CALLGRIND=1: after the rounds (ROUNDS=0 runs none), the in-process gateway and then the control
# and the worker run under valgrind's callgrind (on the epoll driver: valgrind cannot run
# io_uring) for one wrk run of CALLGRIND_SECONDS after a 3 s warm-up, the counters zeroed in
# between; prints the instructions each process executed per request. They move by under 0.5%
# between runs of one build, where CPU time moves by ±10%.
CALLGRIND=${CALLGRIND:-0}
CALLGRIND_SECONDS=${CALLGRIND_SECONDS:-10}
# COUNT_POLLS=1 (implies COUNT_OPS): also count polls of the processes' tasks per request
# (uprobes on monoio's task poll): on io_uring about one per ring completion. The probes slow
# the run; compare counts, not CPU.
COUNT_POLLS=${COUNT_POLLS:-0}
# BASE_BIN=<binary>: every round also measures that build (in process and over the bus) beside
# the one under test, the two in alternating order from round to round; each build's median
# ratio is printed, and the builds' bus CPU per request against each other. A change to the
# remote path moves its ratio by less than the spread of runs minutes apart; within a round the
# two builds see the same host.
BASE_BIN=${BASE_BIN:-}
# PROFILE=1: each measured run also under `perf record` (the measured processes, 999 Hz); the
# top symbols by self time, kernel included, are printed after each round.
PROFILE=${PROFILE:-0}
PROFILE_TOP=${PROFILE_TOP:-25}
OPS_EVENTS=io_uring:io_uring_submit_req,context-switches
TARGET_RATIO=0.70
TARGET_CPU_RATIO=0.77
WORKER_PID=""
WORKER_TOKEN=perf-worker-token-0123456789

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p; s/^WRK_RESULT $1=\([^ ]*\).*/\1/p" <<<"$2" | head -n 1; }

stop_pid() {
  [ -n "$1" ] || return 0
  kill "$1" 2>/dev/null || true
  wait_gone "$1" 10 || kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

start_control() {
  local bin=$1 dir="$WORK_DIR/gateway" config worker_launch=()
  # Under CALLGRIND=1, each process of the pair under callgrind, its dumps named after it.
  [ "$CALLGRIND" != 1 ] || [ "${#LAUNCH[@]}" = 0 ] ||
    worker_launch=(valgrind --tool=callgrind --callgrind-out-file="$WORK_DIR/callgrind-worker-%p")
  config=$(write_gateway_config "$CORES")
  # The control keeps its config but drops the local worker and opens the bus.
  sed -i '/^\[\[workers\]\]/,$d' "$config"
  sed -i "s|^cores = .*|cores = $CORES\nbus_listen = \"127.0.0.1:$BUS_PORT\"|" "$config"
  printf '\n[control.bus]\ntoken = "%s"\nplaintext = true\n' "$WORKER_TOKEN" >>"$config"
  require_free_port "$API_PORT" API_PORT
  require_free_port "$BUS_PORT" BUS_PORT
  "${LAUNCH[@]}" "$bin" control --config "$config" >"$WORK_DIR/control.log" 2>&1 &
  GATEWAY_PID=$!
  wait_port "$API_PORT" "${START_WAIT:-30}" "$GATEWAY_PID" || { tail "$WORK_DIR/control.log" >&2; die "control did not start"; }
  cat >"$dir/worker.toml" <<TOML
[worker]
id = "perf-worker"
controls = ["127.0.0.1:$BUS_PORT"]
token = "$WORKER_TOKEN"
plaintext = true
cores = $WORKER_CORES
capacity = 100000
TOML
  "${worker_launch[@]}" "$bin" worker --config "$dir/worker.toml" >"$WORK_DIR/worker.log" 2>&1 &
  WORKER_PID=$!
  EXTRA_PIDS+=("$WORKER_PID")
  local deadline=$((SECONDS + ${START_WAIT:-30}))
  until curl -s -H "Authorization: Bearer $ADMIN_TOKEN" "http://127.0.0.1:$ADMIN_PORT/api/v1/admin/workers" |
    grep -q '"state":"connected"'; do
    [ "$SECONDS" -lt "$deadline" ] || { tail "$WORK_DIR/worker.log" >&2; die "worker did not register"; }
    sleep 0.1
  done
  log "control (pid $GATEWAY_PID) and worker (pid $WORKER_PID) on bus 127.0.0.1:$BUS_PORT"
}

probe() {
  local code
  code=$(curl -s -o "$WORK_DIR/probe.json" -w '%{http_code}' -H "Authorization: Bearer $DEPLOYMENT_TOKEN" \
    -H 'Content-Type: application/json' \
    --data "{\"method\":\"GET\",\"url\":\"http://127.0.0.1:$UPSTREAM_PORT/kib\",\"timeout_ms\":5000}" \
    "http://127.0.0.1:$API_PORT/api/v1/requests")
  [ "$code" = 200 ] && grep -q '"status":200' "$WORK_DIR/probe.json" ||
    die "probe failed (HTTP $code): $(cat "$WORK_DIR/probe.json")"
}

# wrk posting the request envelope for nginx's 1 KiB body to the API port for $1 (a duration),
# its output in $2 (/dev/null for a warm-up); more wrk flags after them.
api_wrk() {
  local duration=$1 out=$2
  shift 2
  SORTIE_PERF_URL="http://127.0.0.1:$UPSTREAM_PORT/kib" SORTIE_PERF_TOKEN=$DEPLOYMENT_TOKEN \
    SORTIE_PERF_DIR=$PERF_DIR timeout 200 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$duration" "$@" \
    -s "$PERF_DIR/envelope.lua" "http://127.0.0.1:$API_PORT/api/v1/requests" >"$out" 2>&1
}

# Runs wrk for DURATION and prints "rps=… cpu_s=… req_per_cpu_s=… user_us=… kernel_us=…
# p99_us=… errors=…", CPU being the sum over the pids given.
measure() {
  local label=$1; shift
  local out="$WORK_DIR/wrk-$label.txt"
  local before=0 after=0 pid tck
  tck=$(getconf CLK_TCK)
  api_wrk "$WARMUP" /dev/null || die "wrk warmup failed"
  local counter="" counts="$WORK_DIR/ops-$label.csv"
  if [ "$COUNT_OPS" = 1 ]; then
    # io_uring operations submitted and context switches of the measured processes: counts per
    # request that do not move with the machine's background load as CPU time does.
    perf stat -x, -e "$OPS_EVENTS" -p "$(IFS=,; echo "$*")" -o "$counts" 2>/dev/null &
    counter=$!
  fi
  local recorder="" data="$WORK_DIR/perf-$label.data"
  if [ "$PROFILE" = 1 ]; then
    perf record -q -F 999 -g -p "$(IFS=,; echo "$*")" -o "$data" -- sleep "${DURATION%s}" \
      >"$WORK_DIR/perf-record-$label.log" 2>&1 &
    recorder=$!
  fi
  local sys_before=0 sys_after=0
  for pid in "$@"; do
    before=$((before + $(cpu_ticks "$pid")))
    sys_before=$((sys_before + $(kernel_ticks "$pid")))
  done
  api_wrk "$DURATION" "$out" --latency || { cat "$out" >&2; die "wrk failed"; }
  for pid in "$@"; do
    after=$((after + $(cpu_ticks "$pid")))
    sys_after=$((sys_after + $(kernel_ticks "$pid")))
  done
  if [ -n "$recorder" ]; then
    wait "$recorder" || { cat "$WORK_DIR/perf-record-$label.log" >&2; die "perf record failed"; }
    perf report -i "$data" --stdio --no-children --sort dso,sym -g none 2>/dev/null |
      grep -E '^ +[0-9]' | awk -v n="$PROFILE_TOP" 'NR <= n' >"$WORK_DIR/profile-$label.txt" || true
  fi
  local line requests rps cpu errors ops=""
  line=$(grep '^WRK_RESULT ' "$out") || die "wrk printed no result"
  requests=$(field requests "$line")
  if [ -n "$counter" ]; then
    kill -INT "$counter" 2>/dev/null || true
    wait "$counter" 2>/dev/null || true
    ops=$(awk -F, -v r="$requests" '
      $3 == "io_uring:io_uring_submit_req" { s = $1 } $3 == "context-switches" { c = $1 }
      $3 ~ /^probe_sortie:/ { a += $1; has_allocs = 1 }
      $3 ~ /^probe_polls:/ { p += $1; has_polls = 1 }
      END {
        if (r > 0) printf " uring_ops_per_req=%.2f switches_per_req=%.2f", s / r, c / r
        if (r > 0 && has_allocs) printf " allocs_per_req=%.1f", a / r
        if (r > 0 && has_polls) printf " task_polls_per_req=%.2f", p / r
      }' "$counts")
  fi
  rps=$(field rps "$line")
  errors=$(($(field connect_errors "$line") + $(field read_errors "$line") + $(field write_errors "$line") + $(field timeouts "$line") + $(field non_2xx "$line")))
  cpu=$(awk -v t=$((after - before)) -v hz="$tck" 'BEGIN { printf "%.2f", t / hz }')
  # User and kernel CPU per request, in µs: whether a difference is the processes' own work or
  # the kernel's (the remote path has two more loopback hops per request than the local one).
  local split
  split=$(awk -v all=$((after - before)) -v sys=$((sys_after - sys_before)) -v hz="$tck" -v r="$requests" \
    'BEGIN { if (r > 0) printf "user_us=%.1f kernel_us=%.1f", (all - sys) / hz / r * 1e6, sys / hz / r * 1e6 }')
  printf 'rps=%s cpu_s=%s req_per_cpu_s=%s %s p99_us=%s errors=%s%s\n' "$rps" "$cpu" \
    "$(awk -v r="$requests" -v c="$cpu" 'BEGIN { printf "%.0f", (c > 0 ? r / c : 0) }')" \
    "$split" "$(field p99_us "$line")" "$errors" "$ops"
}

# Instructions per request of the processes given (each running under callgrind, dumping to
# $WORK_DIR/callgrind-<label>-<pid>): a warm-up, the counters zeroed, one wrk run of
# CALLGRIND_SECONDS, a dump of each. Prints "label=instructions ..." and the sum.
callgrind_measure() {
  local out="$WORK_DIR/wrk-callgrind.txt"
  local pid label total requests line sum=0 report=""
  api_wrk 3s /dev/null || die "wrk warmup failed"
  for pid in "$@"; do
    callgrind_control -z "${pid#*=}" >/dev/null || die "callgrind_control could not reach pid ${pid#*=}"
  done
  api_wrk "${CALLGRIND_SECONDS}s" "$out" || { cat "$out" >&2; die "wrk failed"; }
  line=$(grep '^WRK_RESULT ' "$out") || die "wrk printed no result"
  requests=$(field requests "$line")
  [ "${requests:-0}" -gt 0 ] || die "no request answered under callgrind"
  for pid in "$@"; do
    label=${pid%%=*} pid=${pid#*=}
    total=$(callgrind_total "$pid" "$WORK_DIR/callgrind-$label" "$label") || exit 1
    sum=$((sum + total))
    report="$report $label=$((total / requests))"
  done
  printf 'requests=%s%s total=%s\n' "$requests" "$report" "$((sum / requests))"
}

# The in-process gateway, then the control and its worker, under callgrind.
callgrind_all() {
  local bin=$1 line
  command -v valgrind >/dev/null && command -v callgrind_control >/dev/null ||
    die "valgrind is missing: apt-get install valgrind"
  say "--- instructions per request under callgrind (wrk -c$CONNECTIONS, ${CALLGRIND_SECONDS}s after a 3 s warm-up; epoll driver)"
  # Valgrind runs the binary itself (it does not follow an exec): the variable goes in its
  # environment. It translates the program first: tens of seconds before the ports open.
  export MONOIO_FORCE_LEGACY_DRIVER=1
  START_WAIT=240
  LAUNCH=(valgrind --tool=callgrind --callgrind-out-file="$WORK_DIR/callgrind-gateway-%p")
  start_gateway "$bin" "$CORES"
  probe
  line=$(callgrind_measure "gateway=$GATEWAY_PID")
  say "in-process: $line"
  stop_pid "$GATEWAY_PID"; GATEWAY_PID=""
  LAUNCH=(valgrind --tool=callgrind --callgrind-out-file="$WORK_DIR/callgrind-control-%p")
  start_control "$bin"
  probe
  line=$(callgrind_measure "control=$GATEWAY_PID" "worker=$WORKER_PID")
  say "bus:        $line"
  stop_pid "$WORKER_PID"; WORKER_PID=""
  stop_pid "$GATEWAY_PID"; GATEWAY_PID=""
  LAUNCH=()
  START_WAIT=30
  unset MONOIO_FORCE_LEGACY_DRIVER
}

# Per build ("test" the build under test, "base" BASE_BIN): each round's ratios; the bus's
# requests per CPU-second of the round's first build, until the second compares with it.
declare -A RATIOS CPU_RATIOS BUS_PER_CPU
BUS_CPU_VS_BASE=()

# One round of build $1 ("test" or "base", $2) as round $3: the in-process gateway, then the
# control and its worker; prints the round (the base's lines say so) and records its ratios.
bus_round() {
  local bin=$1 tag=$2 round=$3 name="" suffix="" local_r remote_r ratio cpu_ratio bus_cpu
  [ "$tag" = test ] || { name="$tag "; suffix="-$tag"; }
  start_gateway "$bin" "$CORES"
  probe
  local_r=$(measure "local-$round$suffix" "$GATEWAY_PID")
  stop_pid "$GATEWAY_PID"; GATEWAY_PID=""
  start_control "$bin"
  probe
  remote_r=$(measure "remote-$round$suffix" "$GATEWAY_PID" "$WORKER_PID")
  stop_pid "$WORKER_PID"; WORKER_PID=""
  stop_pid "$GATEWAY_PID"; GATEWAY_PID=""
  ratio=$(awk -v a="$(field rps " $remote_r")" -v b="$(field rps " $local_r")" 'BEGIN { printf "%.2f", a / b }')
  bus_cpu=$(field req_per_cpu_s " $remote_r")
  cpu_ratio=$(awk -v a="$bus_cpu" -v b="$(field req_per_cpu_s " $local_r")" 'BEGIN { printf "%.2f", a / b }')
  RATIOS[$tag]="${RATIOS[$tag]:-} $ratio"
  CPU_RATIOS[$tag]="${CPU_RATIOS[$tag]:-} $cpu_ratio"
  say "round $round  ${name}in-process: $local_r"
  say "round $round  ${name}bus:        $remote_r  (CPU of control + worker)"
  say "round $round  ${name}ratio bus/in-process: req/s $ratio, requests per CPU-second $cpu_ratio"
  # The build under test's bus CPU per request against the base's in the same round (each
  # round measures the base too when BASE_BIN is set; the later of the two compares).
  if [ -n "$BASE_BIN" ]; then
    if [ -n "${BUS_PER_CPU[other]:-}" ]; then
      if [ "$tag" = test ]; then
        BUS_CPU_VS_BASE+=("$(awk -v t="$bus_cpu" -v b="${BUS_PER_CPU[other]}" 'BEGIN { printf "%.3f", b / t }')")
      else
        BUS_CPU_VS_BASE+=("$(awk -v t="${BUS_PER_CPU[other]}" -v b="$bus_cpu" 'BEGIN { printf "%.3f", b / t }')")
      fi
      BUS_PER_CPU[other]=""
    else
      BUS_PER_CPU[other]=$bus_cpu
    fi
  fi
  if [ "$PROFILE" = 1 ]; then
    say "--- profile, ${name}in process (round $round, top $PROFILE_TOP by self time)"
    tee -a "$RESULTS_FILE" <"$WORK_DIR/profile-local-$round$suffix.txt"
    say "--- profile, ${name}control + worker (round $round)"
    tee -a "$RESULTS_FILE" <"$WORK_DIR/profile-remote-$round$suffix.txt"
  fi
}

# The medians of build $1's rounds ("test" or "base").
report_medians() {
  local tag=$1 name=""
  [ "$tag" = test ] || name="$tag "
  say "${name}median ratio req/s: $(median_of "${RATIOS[$tag]}") (target >= $TARGET_RATIO); median ratio requests per CPU-second: $(median_of "${CPU_RATIOS[$tag]}") (target >= $TARGET_CPU_RATIO, 1.3x the in-process CPU), its 95% interval $(median_interval "${CPU_RATIOS[$tag]}")"
}

main() {
  init_run
  RESULTS_FILE="$RESULTS_DIR/$(date +%F)-bus.txt"
  apt_install nginx wrk curl
  [ "$CALLGRIND" != 1 ] || apt_install valgrind
  [ "$PROFILE" != 1 ] || apt_install linux-perf
  local bin
  bin=$(gateway_binary)
  if [ "$COUNT_ALLOCS" = 1 ]; then
    COUNT_OPS=1
    alloc_probes "$bin"
    OPS_EVENTS="$OPS_EVENTS,$ALLOC_EVENTS"
    say "COUNT_ALLOCS=1: uprobes on the allocator slow both paths; compare counts, not req/s or CPU"
  fi
  if [ "$COUNT_POLLS" = 1 ]; then
    COUNT_OPS=1
    poll_probes "$bin"
    OPS_EVENTS="$OPS_EVENTS,$POLL_EVENTS"
    say "COUNT_POLLS=1: uprobes on the task poll slow both paths; compare counts, not req/s or CPU"
  fi
  start_nginx
  say ""
  say "=== sortie bus run $(date -u +%FT%TZ)"
  say "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  say "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  [ "$ROUNDS" -eq 0 ] || quiet_check
  say "knobs: DURATION=$DURATION WARMUP=$WARMUP ROUNDS=$ROUNDS CONNECTIONS=$CONNECTIONS CORES=$CORES WORKER_CORES=$WORKER_CORES body=1 KiB"
  [ -z "$BASE_BIN" ] || [ -x "$BASE_BIN" ] || die "BASE_BIN=$BASE_BIN is not an executable"
  [ -z "$BASE_BIN" ] || say "base: $BASE_BIN (alternating with the build under test in every round)"
  local round order which
  for round in $(seq 1 "$ROUNDS"); do
    order="test"
    if [ -n "$BASE_BIN" ]; then
      if [ $((round % 2)) = 1 ]; then order="base test"; else order="test base"; fi
    fi
    for which in $order; do
      if [ "$which" = base ]; then bus_round "$BASE_BIN" base "$round"; else bus_round "$bin" test "$round"; fi
    done
  done
  [ "$ROUNDS" = 0 ] || report_medians test
  if [ "$ROUNDS" != 0 ] && [ -n "$BASE_BIN" ]; then
    report_medians base
    say "bus CPU per request, test over base, by round: ${BUS_CPU_VS_BASE[*]}; median $(median_of "${BUS_CPU_VS_BASE[*]}"), its 95% interval $(median_interval "${BUS_CPU_VS_BASE[*]}")"
  fi
  [ "$CALLGRIND" != 1 ] || callgrind_all "$bin"
}

main "$@"
