-- Prints one machine-readable line when wrk finishes, so the shell scripts read numbers
-- instead of wrk's human summary. Latencies are in microseconds.
function done(summary, latency, requests)
  local seconds = summary.duration / 1e6
  local errors = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d seconds=%.3f rps=%.1f p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d " ..
      "connect_errors=%d read_errors=%d write_errors=%d timeouts=%d non_2xx=%d\n",
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max,
    errors.connect, errors.read, errors.write, errors.timeout, errors.status))
end
