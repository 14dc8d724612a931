#!/usr/bin/env python3
"""Open-loop HTTP/1.1 load at a fixed request rate, for latency at a known load.

Requests are scheduled at evenly spaced instants (rate R for T seconds) whether or not earlier
ones have finished, and sent over a fixed set of keep-alive connections, one request in flight
per connection (no pipelining). A request whose instant comes while every connection is busy
waits in a queue; that wait is reported as scheduler lag, so a run in which this client could
not keep the rate says so instead of reporting flattering numbers.

Two latencies are kept per request: service latency (request written -> response complete),
which is the headline, and open-loop latency (scheduled instant -> response complete), which
adds any queueing in this client. Only loopback targets are accepted.

The last line printed is machine-readable:
FIXEDRATE_RESULT rate=... sent=... ok=... errors=... achieved_rps=... p50_us=... p99_us=... ...
"""

import argparse
import asyncio
import ipaddress
import sys
from urllib.parse import urlsplit

# Bounds that keep every run short whatever the arguments say.
MAX_SECONDS = 15.0
MAX_RATE = 200_000
MAX_CONNECTIONS = 1024
# How long to wait for responses still in flight once the schedule is over.
DRAIN_SECONDS = 5.0
# Scheduler lag above this means the client fell behind its schedule. About 1 ms of lag is
# normal: the event loop's timers have millisecond granularity.
MAX_HEALTHY_LAG_US = 5000
# Responses larger than this are treated as errors; the targets answer a few hundred bytes.
MAX_RESPONSE_BYTES = 1 << 20


class ResponseError(Exception):
    """A response this client cannot parse or does not accept."""


def parse_response(buf):
    """Returns (status, body, consumed, wants_close) for one complete response at the start of
    buf, or None when more bytes are needed."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        if len(buf) > MAX_RESPONSE_BYTES:
            raise ResponseError("response head too large")
        return None
    lines = bytes(buf[:head_end]).split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ResponseError("bad status line %r" % lines[0][:80])
    status = int(parts[1])
    length = None
    chunked = False
    wants_close = parts[0] == b"HTTP/1.0"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        value = value.strip().lower()
        if name == b"content-length":
            if not value.isdigit():
                raise ResponseError("bad content-length")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        elif name == b"connection":
            wants_close = b"close" in value
    start = head_end + 4
    if chunked:
        return parse_chunked(buf, start, status, wants_close)
    if length is None:
        # Without a length the body runs to the end of the connection, which a keep-alive
        # load cannot use.
        raise ResponseError("response without content-length or chunked encoding")
    if length > MAX_RESPONSE_BYTES:
        raise ResponseError("response body too large")
    if len(buf) < start + length:
        return None
    return status, bytes(buf[start:start + length]), start + length, wants_close


def parse_chunked(buf, pos, status, wants_close):
    body = bytearray()
    while True:
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size_text = bytes(buf[pos:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError as exc:
            raise ResponseError("bad chunk size") from exc
        if size > MAX_RESPONSE_BYTES or len(body) + size > MAX_RESPONSE_BYTES:
            raise ResponseError("chunked body too large")
        pos = line_end + 2
        if size == 0:
            # Trailer section: lines until an empty one.
            while True:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    return None
                if line_end == pos:
                    return status, bytes(body), line_end + 2, wants_close
                pos = line_end + 2
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos:pos + size]
        pos += size + 2


class Stats:
    """Counters and samples of one run."""

    def __init__(self):
        self.sent = 0
        self.ok = 0
        self.errors = 0
        self.error_kinds = {}
        self.service_us = []
        self.open_loop_us = []
        self.lag_us = []

    def error(self, kind):
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


class Connection(asyncio.Protocol):
    """One keep-alive connection that carries one request at a time."""

    def __init__(self, client):
        self.client = client
        self.transport = None
        self.buf = bytearray()
        self.scheduled = None
        self.sent_at = None
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport

    def is_idle(self):
        return not self.closed and self.scheduled is None

    def send(self, scheduled, now):
        self.scheduled = scheduled
        self.sent_at = now
        self.transport.write(self.client.request)

    def data_received(self, data):
        self.buf += data
        if self.scheduled is None:
            self.fail("bytes without a request")
            return
        try:
            parsed = parse_response(self.buf)
        except ResponseError as exc:
            self.fail(str(exc))
            return
        if parsed is None:
            return
        status, body, consumed, wants_close = parsed
        if consumed != len(self.buf):
            self.fail("extra bytes after response")
            return
        self.buf.clear()
        self.client.complete(self, status, body)
        if wants_close:
            self.fail("server closed keep-alive")
            return
        self.client.dispatch()

    def fail(self, kind):
        if self.scheduled is not None:
            self.client.stats.error(kind)
            self.client.in_flight -= 1
            self.scheduled = None
        if not self.closed:
            self.closed = True
            self.transport.close()
            self.client.replace(self)

    def connection_lost(self, exc):
        if not self.closed:
            self.fail("connection lost" if exc is None else "connection lost: %s" % exc)


class Client:
    """Schedules requests and hands them to idle connections."""

    def __init__(self, args, host, port, request):
        self.args = args
        self.host = host
        self.port = port
        self.request = request
        self.expect = args.expect.encode() if args.expect else None
        self.stats = Stats()
        self.conns = []
        self.backlog = []
        self.backlog_head = 0
        self.loop = asyncio.get_running_loop()
        self.reconnects = 0
        self.tasks = set()
        self.in_flight = 0
        self.all_done = asyncio.Event()
        self.scheduling_over = False

    async def connect(self):
        _, conn = await self.loop.create_connection(lambda: Connection(self), self.host, self.port)
        return conn

    def replace(self, conn):
        # A lost connection is reopened so the run keeps its concurrency; the number of
        # reconnects is bounded so a server that closes every connection ends the run.
        if conn in self.conns:
            self.conns.remove(conn)
        self._check_done()
        if self.scheduling_over or self.reconnects >= self.args.connections * 10:
            return
        self.reconnects += 1
        # The loop keeps only weak references to tasks; this set keeps them alive.
        task = self.loop.create_task(self._reconnect())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _reconnect(self):
        try:
            conn = await self.connect()
        except OSError:
            self.stats.error("reconnect failed")
            return
        self.conns.append(conn)
        self.dispatch()

    def complete(self, conn, status, body):
        now = self.loop.time()
        if 200 <= status < 300 and (self.expect is None or self.expect in body):
            self.stats.ok += 1
            self.stats.service_us.append((now - conn.sent_at) * 1e6)
            self.stats.open_loop_us.append((now - conn.scheduled) * 1e6)
        elif 200 <= status < 300:
            self.stats.error("body without expected text")
        else:
            self.stats.error("status %d" % status)
        conn.scheduled = None
        self.in_flight -= 1
        self._check_done()

    def _check_done(self):
        if self.scheduling_over and self.in_flight <= 0 and self.backlog_head >= len(self.backlog):
            self.all_done.set()

    def dispatch(self):
        now = self.loop.time()
        for conn in self.conns:
            if self.backlog_head >= len(self.backlog):
                return
            if conn.is_idle():
                scheduled = self.backlog[self.backlog_head]
                self.backlog_head += 1
                self.stats.lag_us.append((now - scheduled) * 1e6)
                self.stats.sent += 1
                self.in_flight += 1
                conn.send(scheduled, now)

    async def run(self):
        self.conns = list(await asyncio.gather(*(self.connect() for _ in range(self.args.connections))))
        total = int(self.args.rate * self.args.seconds)
        interval = 1.0 / self.args.rate
        start = self.loop.time() + 0.05
        queued = 0
        while queued < total:
            due = min(total, int((self.loop.time() - start) / interval) + 1)
            while queued < due:
                self.backlog.append(start + queued * interval)
                queued += 1
            self.dispatch()
            if queued < total:
                await asyncio.sleep(max(0.0, start + queued * interval - self.loop.time()))
        self.scheduling_over = True
        self._check_done()
        try:
            await asyncio.wait_for(self.all_done.wait(), DRAIN_SECONDS)
        except asyncio.TimeoutError:
            unsent = len(self.backlog) - self.backlog_head
            for _ in range(unsent + max(self.in_flight, 0)):
                self.stats.error("not answered within the drain time")
        elapsed = self.loop.time() - start
        for conn in self.conns:
            conn.closed = True
            conn.transport.close()
        return elapsed


def percentile(sorted_values, pct):
    """Nearest-rank percentile of an ascending list; 0 for an empty one."""
    if not sorted_values:
        return 0
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(min(rank, len(sorted_values))) - 1]


def build_request(args, host, port, path):
    lines = ["%s %s HTTP/1.1" % (args.method, path), "Host: %s:%d" % (host, port)]
    lines += args.header
    body = args.body.encode() if args.body is not None else b""
    if args.body is not None:
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def loopback_target(url):
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise SystemExit("only http:// URLs with a host are supported")
    try:
        is_loopback = ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        is_loopback = parts.hostname == "localhost"
    if not is_loopback:
        raise SystemExit("refusing a non-loopback target: %s" % parts.hostname)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, parts.port or 80, path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="loopback http:// URL")
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="schedule length (max 15)")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections")
    parser.add_argument("--method", default="GET")
    parser.add_argument("--header", action="append", default=[], help="'Name: value', repeatable")
    parser.add_argument("--body", help="request body (sets Content-Length)")
    parser.add_argument("--expect", help="text every 2xx body must contain to count as ok")
    parser.add_argument("--label", default="target", help="name printed with the results")
    args = parser.parse_args()
    if not 0 < args.seconds <= MAX_SECONDS:
        parser.error("--seconds must be in (0, %g]" % MAX_SECONDS)
    if not 0 < args.rate <= MAX_RATE:
        parser.error("--rate must be in (0, %d]" % MAX_RATE)
    if not 0 < args.connections <= MAX_CONNECTIONS:
        parser.error("--connections must be in [1, %d]" % MAX_CONNECTIONS)
    host, port, path = loopback_target(args.url)
    request = build_request(args, host, port, path)

    async def go():
        client = Client(args, host, port, request)
        elapsed = await client.run()
        return client, elapsed

    try:
        client, elapsed = asyncio.run(go())
    except OSError as exc:
        print("fixedrate: cannot connect to %s:%d: %s" % (host, port, exc), file=sys.stderr)
        return 2
    stats = client.stats
    service = sorted(stats.service_us)
    open_loop = sorted(stats.open_loop_us)
    lag = sorted(stats.lag_us)
    achieved = stats.ok / elapsed if elapsed > 0 else 0.0
    if stats.error_kinds:
        kinds = ", ".join("%s: %d" % kv for kv in sorted(stats.error_kinds.items()))
        print("fixedrate %s: errors: %s" % (args.label, kinds), file=sys.stderr)
    lag_p99 = percentile(lag, 99)
    if achieved < 0.95 * args.rate or lag_p99 > MAX_HEALTHY_LAG_US:
        print(
            "fixedrate %s: warning: this client did not hold %.0f req/s (achieved %.0f, scheduler "
            "lag p99 %.0f us); the latencies are of a lower rate" % (args.label, args.rate, achieved, lag_p99),
            file=sys.stderr,
        )
    print(
        "FIXEDRATE_RESULT label=%s rate=%.0f seconds=%.1f connections=%d sent=%d ok=%d errors=%d "
        "achieved_rps=%.1f p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d "
        "open_loop_p50_us=%d open_loop_p99_us=%d lag_p99_us=%d reconnects=%d"
        % (
            args.label, args.rate, args.seconds, args.connections, stats.sent, stats.ok, stats.errors,
            achieved, percentile(service, 50), percentile(service, 90), percentile(service, 99),
            percentile(service, 99.9), service[-1] if service else 0,
            percentile(open_loop, 50), percentile(open_loop, 99), lag_p99, client.reconnects,
        )
    )
    return 0 if stats.ok > 0 and stats.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
