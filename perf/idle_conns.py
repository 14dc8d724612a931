#!/usr/bin/env python3
"""Memory cost of idle keep-alive connections on a server process.

Reads the server's resident set size (VmRSS in /proc/PID/status), opens N connections to a
loopback port, sends one complete request on each and reads its complete response (so every
connection has been through the server's request path and sits idle in keep-alive), reads the
RSS again, and prints the growth per connection that is still open. Then closes them all.

The default request is a POST to the request API with a wrong bearer token: the gateway answers
401 without any upstream, and the connection stays open. The whole run gives up after
--timeout seconds.

The last line printed is machine-readable:
IDLE_RESULT connections=... open=... rss_before_kib=... rss_after_kib=... kib_per_conn=...
"""

import argparse
import asyncio
import ipaddress
import os
import resource
import sys
import time

# Bounds that keep a run within what the machine and the harness allow.
MAX_CONNECTIONS = 50_000
MAX_TIMEOUT_SECONDS = 120
# File descriptors this process needs beyond the connections (stdio, the event loop, imports).
SPARE_FDS = 64

# Responses larger than this are treated as errors; the targets answer a few hundred bytes.
MAX_RESPONSE_BYTES = 1 << 20

BAD_TOKEN_BODY = b'{"method":"GET","url":"http://127.0.0.1:9/idle","timeout_ms":1000}'


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


def bad_token_request(host, port):
    head = (
        "POST /api/v1/requests HTTP/1.1\r\n"
        "Host: %s:%d\r\n"
        "Authorization: Bearer not-a-valid-token-for-idle-connections\r\n"
        "Content-Type: application/json\r\n"
        "Content-Length: %d\r\n\r\n" % (host, port, len(BAD_TOKEN_BODY))
    )
    return head.encode() + BAD_TOKEN_BODY


def get_request(host, port, path):
    return ("GET %s HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (path, host, port)).encode()


def rss_kib(pid):
    """VmRSS of process pid in KiB."""
    with open("/proc/%d/status" % pid, encoding="ascii", errors="replace") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS line for pid %d (a kernel thread?)" % pid)


def raise_fd_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


class IdleConnection(asyncio.Protocol):
    """Sends one request, waits for its response, then stays open and idle."""

    def __init__(self, request, answered):
        self.request = request
        self.answered = answered
        self.transport = None
        self.buf = bytearray()
        self.status = None
        self.is_open = False

    def connection_made(self, transport):
        self.transport = transport
        self.is_open = True
        transport.write(self.request)

    def data_received(self, data):
        if self.status is not None:
            # An idle connection should receive nothing more; note it and ignore the bytes.
            return
        self.buf += data
        try:
            parsed = parse_response(self.buf)
        except ResponseError as exc:
            self._finish(exc)
            return
        if parsed is None:
            return
        self.status = parsed[0]
        self.buf = bytearray()
        self._finish(None)

    def connection_lost(self, exc):
        self.is_open = False
        self._finish(ConnectionError("closed before a response"))

    def _finish(self, error):
        if self.answered.done():
            return
        if error is None:
            self.answered.set_result(self.status)
        else:
            self.answered.set_exception(error)


async def open_all(args, request):
    loop = asyncio.get_running_loop()
    conns = []
    statuses = {}
    failures = {}
    gate = asyncio.Semaphore(args.concurrency)

    async def one():
        async with gate:
            answered = loop.create_future()
            try:
                _, conn = await loop.create_connection(
                    lambda: IdleConnection(request, answered), args.host, args.port
                )
            except OSError as exc:
                kind = "connect: %s" % (exc.strerror or exc)
                failures[kind] = failures.get(kind, 0) + 1
                return
            conns.append(conn)
            try:
                status = await asyncio.wait_for(answered, 10)
            except (ResponseError, ConnectionError, asyncio.TimeoutError) as exc:
                kind = "response: %s" % (str(exc) or type(exc).__name__)
                failures[kind] = failures.get(kind, 0) + 1
                return
            statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(one() for _ in range(args.connections)))
    return conns, statuses, failures


async def run(args, request):
    rss_before = rss_kib(args.pid)
    started = time.monotonic()
    conns, statuses, failures = await open_all(args, request)
    opened_in = time.monotonic() - started
    # Let the server finish whatever follows its last response before reading its memory.
    await asyncio.sleep(args.settle)
    still_open = sum(1 for c in conns if c.is_open)
    rss_after = rss_kib(args.pid)
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    await asyncio.sleep(args.settle)
    rss_closed = rss_kib(args.pid)
    return rss_before, rss_after, rss_closed, still_open, statuses, failures, opened_in


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="loopback address of the server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="server process whose RSS is read")
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--request", choices=["bad-token", "get"], default="bad-token")
    parser.add_argument("--path", default="/", help="path of the GET request")
    parser.add_argument("--expect-status", type=int, help="fail unless every response has it")
    parser.add_argument("--concurrency", type=int, default=256, help="connects in progress at once")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds to wait before reading RSS")
    parser.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    args = parser.parse_args()
    if not ipaddress.ip_address(args.host).is_loopback:
        parser.error("--host must be a loopback address")
    if not 0 < args.connections <= MAX_CONNECTIONS:
        parser.error("--connections must be in [1, %d]" % MAX_CONNECTIONS)
    if not 0 < args.timeout <= MAX_TIMEOUT_SECONDS:
        parser.error("--timeout must be in (0, %d]" % MAX_TIMEOUT_SECONDS)
    if not os.path.exists("/proc/%d/status" % args.pid):
        parser.error("no process with pid %d" % args.pid)

    limit = raise_fd_limit(args.connections + SPARE_FDS)
    if limit < args.connections + SPARE_FDS:
        print(
            "idle_conns: the open-files limit is %d, below the %d needed; raise it (ulimit -n)"
            % (limit, args.connections + SPARE_FDS),
            file=sys.stderr,
        )
        return 2
    if args.request == "bad-token":
        request = bad_token_request(args.host, args.port)
    else:
        request = get_request(args.host, args.port, args.path)

    try:
        result = asyncio.run(asyncio.wait_for(run(args, request), args.timeout))
    except asyncio.TimeoutError:
        print("idle_conns: gave up after %g s" % args.timeout, file=sys.stderr)
        return 1
    rss_before, rss_after, rss_closed, still_open, statuses, failures, opened_in = result

    status_text = ", ".join("%d: %d" % kv for kv in sorted(statuses.items())) or "none"
    print("responses by status: %s" % status_text)
    for kind, count in sorted(failures.items()):
        print("failed: %s: %d" % (kind, count), file=sys.stderr)
    per_conn = (rss_after - rss_before) / still_open if still_open else float("nan")
    print(
        "opened %d connections in %.1f s; %d still open after %.1f s idle"
        % (args.connections, opened_in, still_open, args.settle)
    )
    print(
        "RSS of pid %d: %d KiB before, %d KiB with the connections open, %d KiB after closing them"
        % (args.pid, rss_before, rss_after, rss_closed)
    )
    print("RSS per idle connection: %.2f KiB" % per_conn)
    print(
        "IDLE_RESULT connections=%d open=%d rss_before_kib=%d rss_after_kib=%d rss_closed_kib=%d "
        "kib_per_conn=%.2f failures=%d"
        % (args.connections, still_open, rss_before, rss_after, rss_closed, per_conn, sum(failures.values()))
    )
    if failures or still_open == 0:
        return 1
    if args.expect_status is not None and set(statuses) != {args.expect_status}:
        print("idle_conns: expected every response to be %d" % args.expect_status, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
