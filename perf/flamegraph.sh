#!/usr/bin/env bash
# CPU profile of the gateway under wrk load: `perf record` for FLAME_SECONDS, rendered as a
# flamegraph SVG with inferno, plus the top symbols by self time printed as text. See README.md.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FLAME_SECONDS=${FLAME_SECONDS:-10}
FLAME_FREQUENCY=${FLAME_FREQUENCY:-999}
# dwarf unwinds through code built without frame pointers (the release profile keeps debug
# info); fp is cheaper but loses frames in such code.
CALL_GRAPH=${CALL_GRAPH:-dwarf}
CONNECTIONS=${CONNECTIONS:-64}
# As in load.sh: half the CPUs for the gateway, the rest for wrk and nginx; 0 means all.
GATEWAY_CORES=${GATEWAY_CORES:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}
THREADS=${THREADS:-1}
TOP_SYMBOLS=${TOP_SYMBOLS:-15}
INFERNO_VERSION=${INFERNO_VERSION:-0.12.8}
# inferno is installed here (ignored by git) when it is not already on PATH.
TOOLS_DIR="$PERF_DIR/.tools"

# Prints the event to sample: hardware cycles where the machine exposes them, otherwise the
# cpu-clock software timer (virtual machines often have no hardware counters). Fails with a
# clear message when perf cannot profile at all here.
pick_event() {
  local out
  if ! out=$(perf stat -x, -e cpu-clock true 2>&1 >/dev/null) || [[ $out == *"not supported"* ]]; then
    die "perf cannot count events on this machine (kernel.perf_event_paranoid is" \
      "$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo unknown); run as root or" \
      "lower it, and check that the kernel has perf events): $out"
  fi
  out=$(perf stat -x, -e cycles true 2>&1 >/dev/null || true)
  if [[ $out == *"not supported"* ]] || [[ $out == *"not counted"* ]] || [ -z "$out" ]; then
    echo cpu-clock
  else
    echo cycles
  fi
}

ensure_inferno() {
  export PATH="$TOOLS_DIR/bin:$PATH"
  if command -v inferno-collapse-perf >/dev/null && command -v inferno-flamegraph >/dev/null; then
    return 0
  fi
  command -v cargo >/dev/null || die "cargo is needed to install inferno"
  log "cargo install inferno $INFERNO_VERSION (into perf/.tools)"
  cargo install inferno --version "$INFERNO_VERSION" --locked --root "$TOOLS_DIR" -q >&2 ||
    die "cargo install inferno failed"
}

main() {
  case "$CALL_GRAPH" in fp | dwarf | lbr) ;; *) die "CALL_GRAPH is fp, dwarf or lbr" ;; esac
  [ "$FLAME_SECONDS" -le 60 ] || die "FLAME_SECONDS is capped at 60"
  init_run
  apt_install nginx wrk curl linux-perf
  command -v perf >/dev/null || die "perf is not installed (Debian package linux-perf)"
  local event
  event=$(pick_event)
  ensure_inferno
  local bin stamp svg report
  bin=$(gateway_binary)
  stamp=$(date +%F-%H%M%S)
  svg="$RESULTS_DIR/$stamp-flamegraph.svg"
  report="$RESULTS_DIR/$stamp-flamegraph.txt"

  start_nginx
  start_gateway "$bin" "$GATEWAY_CORES"
  export SORTIE_PERF_URL="http://127.0.0.1:$UPSTREAM_PORT/small" SORTIE_PERF_TOKEN="$DEPLOYMENT_TOKEN"
  export SORTIE_PERF_DIR="$PERF_DIR"
  local url="http://127.0.0.1:$API_PORT/api/v1/requests"
  # Warm up, then keep the load running a little longer than the recording on both sides.
  timeout 30 wrk -t"$THREADS" -c"$CONNECTIONS" -d2s -s "$PERF_DIR/envelope.lua" "$url" >/dev/null
  timeout $((FLAME_SECONDS + 30)) wrk -t"$THREADS" -c"$CONNECTIONS" -d"$((FLAME_SECONDS + 2))s" \
    -s "$PERF_DIR/envelope.lua" "$url" >"$WORK_DIR/wrk.txt" 2>&1 &
  local wrk_pid=$!
  EXTRA_PIDS+=("$wrk_pid")
  sleep 1
  log "perf record -e $event -F $FLAME_FREQUENCY --call-graph $CALL_GRAPH for ${FLAME_SECONDS}s"
  perf record -q -e "$event" -F "$FLAME_FREQUENCY" --call-graph "$CALL_GRAPH" -p "$GATEWAY_PID" \
    -o "$WORK_DIR/perf.data" -- sleep "$FLAME_SECONDS" 2>"$WORK_DIR/perf-record.log" ||
    { cat "$WORK_DIR/perf-record.log" >&2; die "perf record failed"; }
  wait "$wrk_pid" || die "wrk failed: $(cat "$WORK_DIR/wrk.txt")"

  log "rendering (perf script | inferno); dwarf call graphs take a minute"
  perf script -i "$WORK_DIR/perf.data" 2>/dev/null | inferno-collapse-perf >"$WORK_DIR/folded.txt"
  cp "$WORK_DIR/folded.txt" "$RESULTS_DIR/$stamp-folded.txt"
  inferno-flamegraph --title "sortie under wrk -c$CONNECTIONS (${FLAME_SECONDS}s, $event)" \
    <"$WORK_DIR/folded.txt" >"$svg"

  perf report -i "$WORK_DIR/perf.data" --stdio --no-children --fields overhead,dso,sym -g none \
    --percent-limit 0.05 2>/dev/null | grep -v -e '^#' -e '^$' >"$WORK_DIR/symbols.txt" || true
  [ -s "$WORK_DIR/symbols.txt" ] || die "perf report found no samples"
  {
    echo "=== sortie flamegraph $(date -u +%FT%TZ)"
    echo "commit: $(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "event $event at $FLAME_FREQUENCY Hz, call graph $CALL_GRAPH, wrk -t$THREADS -c$CONNECTIONS"
    grep -E '^Requests/sec' "$WORK_DIR/wrk.txt" || true
    echo "flamegraph: perf/results/$(basename "$svg")"
    echo ""
    echo "top $TOP_SYMBOLS symbols by self time (share of all samples):"
    head -n "$TOP_SYMBOLS" "$WORK_DIR/symbols.txt"
    echo ""
    echo "top $TOP_SYMBOLS user-space symbols by self time (share of all samples):"
    grep -v -F '[kernel.kallsyms]' "$WORK_DIR/symbols.txt" | head -n "$TOP_SYMBOLS" || true
  } | tee "$report"
  echo "report: perf/results/$(basename "$report")"
}

main "$@"
