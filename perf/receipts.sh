#!/usr/bin/env bash
# Receipt throughput and memory: uploads a 1 GiB receipt in 64 MiB parts, completes it and
# downloads it again, on the fs backend and on the s3 backend (against a local s3s-fs), and
# prints throughput, the gateway's CPU time and its peak RSS growth. The baseline, measured in
# the same run on the same disk: `dd` writing 1 GiB with a final fsync.
#
#   bash perf/receipts.sh
#   SIZE_MIB=256 PART_MIB=32 BACKENDS=fs SORTIE_BIN=target/release/sortie bash perf/receipts.sh
#
# Targets: peak RSS growth < 64 MiB on both backends; fs upload throughput >= 50% of dd's.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

SIZE_MIB=${SIZE_MIB:-1024}
PART_MIB=${PART_MIB:-64}
BACKENDS=${BACKENDS:-"fs s3"}
S3_PORT=${S3_PORT:-18093}
TICKS=$(getconf CLK_TCK)
[ "$SIZE_MIB" -le 4096 ] || die "SIZE_MIB is at most 4096"

init_run
apt_install curl coreutils
BIN=$(gateway_binary)
AUTH="Authorization: Bearer $DEPLOYMENT_TOKEN"
BASE="http://127.0.0.1:$API_PORT/api/v1/receipts"

# Seconds since the epoch with nanoseconds, for durations.
now() { date +%s.%N; }
# Rate in MiB/s of $1 MiB over $2 seconds.
mib_per_s() { awk -v m="$1" -v s="$2" 'BEGIN { printf "%.1f", m / s }'; }

stop_gateway() {
  [ -n "$GATEWAY_PID" ] || return 0
  kill "$GATEWAY_PID" 2>/dev/null || true
  wait_gone "$GATEWAY_PID" 15 || kill -9 "$GATEWAY_PID" 2>/dev/null || true
  wait "$GATEWAY_PID" 2>/dev/null || true
  GATEWAY_PID=""
}

log "writing a ${SIZE_MIB} MiB test body"
BLOB="$WORK_DIR/blob"
head -c "$((SIZE_MIB * 1024 * 1024))" /dev/urandom >"$BLOB"
SHA=$(sha256sum "$BLOB" | cut -d' ' -f1)
mkdir -p "$WORK_DIR/parts"
split -b "${PART_MIB}M" -d -a 4 "$BLOB" "$WORK_DIR/parts/p."
PARTS=("$WORK_DIR"/parts/p.*)

# Baseline: dd to the same filesystem as the gateway's data directory, with a final fsync.
mkdir -p "$WORK_DIR/gateway/data"
sync
t0=$(now)
dd if="$BLOB" of="$WORK_DIR/gateway/data/dd.out" bs=64M conv=fsync status=none
t1=$(now)
DD_S=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
DD_RATE=$(mib_per_s "$SIZE_MIB" "$DD_S")
rm -f "$WORK_DIR/gateway/data/dd.out"
log "dd: ${SIZE_MIB} MiB in ${DD_S}s = ${DD_RATE} MiB/s"

run_backend() {
  local backend=$1 extra id rss0 cpu0 cpu1 cpu2 t0 t1 t2 t3 n=1 part got peak
  case $backend in
    fs) extra=$'[object_storage]\nenabled = true\nbackend = "fs"' ;;
    s3)
      start_s3s "$S3_PORT" perf
      export PERF_S3_AK=AKPERF PERF_S3_SK=SKPERF
      extra=$'[object_storage]\nenabled = true\nbackend = "s3"\nbucket = "perf"\nregion = "us-east-1"\nforce_path_style = true\naccess_key_env = "PERF_S3_AK"\nsecret_key_env = "PERF_S3_SK"\n'"endpoint = \"http://127.0.0.1:$S3_PORT\""
      ;;
  esac
  rm -rf "$WORK_DIR/gateway/data"
  start_gateway "$BIN" 2 "$extra"
  rss0=$(rss_kib "$GATEWAY_PID")
  id=$(curl -sS -H "$AUTH" -H 'Content-Type: application/json' \
    -d "{\"direction\":\"response\",\"size_bytes\":$((SIZE_MIB * 1024 * 1024)),\"sha256_hex\":\"$SHA\"}" \
    "$BASE" | sed -n 's/.*"receipt_id":"\([a-z0-9_]*\)".*/\1/p')
  [ -n "$id" ] || die "$backend: create failed"
  cpu0=$(cpu_ticks "$GATEWAY_PID")
  t0=$(now)
  for part in "${PARTS[@]}"; do
    curl -sS -f -o /dev/null -T "$part" -H "$AUTH" "$BASE/$id/parts/$n" ||
      die "$backend: part $n failed"
    n=$((n + 1))
  done
  t1=$(now)
  curl -sS -f -o "$WORK_DIR/complete.json" -X POST -H "$AUTH" "$BASE/$id/complete" ||
    die "$backend: complete failed"
  grep -q '"state":"verified"' "$WORK_DIR/complete.json" ||
    die "$backend: not verified: $(cat "$WORK_DIR/complete.json")"
  t2=$(now)
  cpu1=$(cpu_ticks "$GATEWAY_PID")
  got=$(curl -sS -f -H "$AUTH" "$BASE/$id/content" | sha256sum | cut -d' ' -f1)
  t3=$(now)
  cpu2=$(cpu_ticks "$GATEWAY_PID")
  [ "$got" = "$SHA" ] || die "$backend: downloaded body differs"
  peak=$(peak_rss_kib "$GATEWAY_PID")
  awk -v b="$backend" -v m="$SIZE_MIB" -v p="$PART_MIB" -v t0="$t0" -v t1="$t1" -v t2="$t2" \
    -v t3="$t3" -v c0="$cpu0" -v c1="$cpu1" -v c2="$cpu2" -v hz="$TICKS" -v r0="$rss0" \
    -v pk="$peak" -v dd="$DD_RATE" 'BEGIN {
      up = t1 - t0; comp = t2 - t1; down = t3 - t2
      printf "RECEIPTS backend=%s size_mib=%d part_mib=%d upload_mib_s=%.1f upload_vs_dd=%.2f complete_s=%.2f upload_and_complete_mib_s=%.1f download_mib_s=%.1f upload_cpu_s=%.2f download_cpu_s=%.2f rss_start_mib=%.1f peak_rss_mib=%.1f peak_growth_mib=%.1f dd_mib_s=%.1f\n",
        b, m, p, m / up, (m / up) / dd, comp, m / (up + comp), m / down,
        (c1 - c0) / hz, (c2 - c1) / hz, r0 / 1024, pk / 1024, (pk - r0) / 1024, dd
    }' | tee -a "$RESULTS_DIR/receipts.txt"
  stop_gateway
}

for b in $BACKENDS; do
  run_backend "$b"
done
