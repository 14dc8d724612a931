#!/usr/bin/env python3
"""Soak driver: a loopback upstream with several failure modes, a fixed-rate client mix against
the gateway, and a sampler of the gateway's RSS and open descriptors (sockets and pipes apart).

Mode `api` (the default) drives the request API. The mix (per 100 requests): 70 successes
(1 KiB body), 8 destination errors (503, transported), 6 upstream resets, 6 refused
connections, 5 timeouts (the upstream answers after the request's 1 s deadline) and 5 client
disconnects (the caller closes 100 ms after sending, while the upstream is still slow).

Mode `proxy` drives the forward-proxy listener (Basic credentials: deployment id and token).
The mix (per 100 operations) is in PROXY_MIX below: absolute-form GETs of 1 KiB (one to three
on a keep-alive client connection), 256 KiB and 1 MiB (spliced bodies), POSTs echoed back
(4 KiB and 64 KiB, streamed both ways), CONNECT tunnels carrying one or two small exchanges or
bulk data both ways (the tunnel switches to splice), clients that leave mid-body (with bytes
still queued, and during a pause of the upstream), upstream resets and stalls mid-body, a
slow head, refused destinations (absolute-form and CONNECT), and tunnels left idle until the
gateway's tunnel idle timeout closes them.

Every operation is bounded in time; only 127.0.0.1 is contacted. Prints one line per sample
and, at the end, the outcomes by kind and the least-squares slope of RSS and descriptors after
the warm-up, over its last two thirds and per third, with a verdict on the last two thirds:
flat when neither grows beyond a small bound.
"""

import argparse
import asyncio
import base64
import json
import os
import random
import socket
import struct
import sys
import time

BODY_1K = b"x" * 1024
# Bodies of the large GETs: /big/N answers N bytes. 8 MiB is for clients that leave mid-body:
# the kernel's send buffer of the gateway's client socket grows to about 4 MiB on loopback, so
# a smaller body would be all handed to the kernel before they leave.
BIG_BODIES = {n: b"y" * n for n in (256 * 1024, 1024 * 1024, 8 * 1024 * 1024)}
# Bodies of the proxied POSTs, echoed back by /echo.
POST_BODIES = {n: b"p" * n for n in (4 * 1024, 64 * 1024)}
# Large body of /reset-mid, /stall-mid and /pause: announced whole, sent in part.
MID_LEN = 1024 * 1024


def reset(writer):
    """Closes the connection with a TCP reset (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def read_request_body(reader, head):
    """The request's body (Content-Length or chunked); the head is already read."""
    length, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return await reader.readexactly(length)
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # a trailer field
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def head_bytes(status, length):
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, length)


# Connections the upstream accepted and requests it read: their ratio shows the gateway's
# upstream pool at work.
UPSTREAM = {"connections": 0, "requests": 0}


async def upstream_conn(reader, writer):
    UPSTREAM["connections"] += 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            UPSTREAM["requests"] += 1
            line = head.split(b"\r\n", 1)[0].split(b" ")
            path = line[1] if len(line) > 1 else b"/"
            if path.startswith(b"/ok"):
                writer.write(head_bytes(b"200 OK", len(BODY_1K)) + BODY_1K)
            elif path.startswith(b"/big/"):
                body = BIG_BODIES.get(int(path[5:]), BODY_1K)
                writer.write(head_bytes(b"200 OK", len(body)))
                writer.write(body)
            elif path.startswith(b"/echo"):
                body = await read_request_body(reader, head)
                writer.write(head_bytes(b"200 OK", len(body)))
                writer.write(body)
            elif path.startswith(b"/err"):
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
            elif path.startswith(b"/reset-mid"):
                # The head and an eighth of the body, then a reset while the rest is owed.
                writer.write(head_bytes(b"200 OK", MID_LEN) + b"r" * (MID_LEN // 8))
                await writer.drain()
                await asyncio.sleep(0.1)
                reset(writer)
                return
            elif path.startswith(b"/stall-mid"):
                # A sixteenth of the body, then nothing for longer than the proxy's idle limit.
                writer.write(head_bytes(b"200 OK", MID_LEN) + b"s" * (MID_LEN // 16))
                await writer.drain()
                await asyncio.sleep(3)
                return
            elif path.startswith(b"/pause"):
                # A quarter of the body, a pause (the client leaves during it), the rest.
                writer.write(head_bytes(b"200 OK", MID_LEN) + b"q" * (MID_LEN // 4))
                await writer.drain()
                await asyncio.sleep(0.3)
                writer.write(b"q" * (MID_LEN - MID_LEN // 4))
            elif path.startswith(b"/reset"):
                reset(writer)
                return
            elif path.startswith(b"/slow"):
                await asyncio.sleep(3)
                writer.write(head_bytes(b"200 OK", 4) + b"late")
            else:
                writer.write(head_bytes(b"404 Not Found", 0))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
        pass
    except asyncio.CancelledError:
        pass  # the run is over: the gateway's pooled connections are still open
    finally:
        writer.close()


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def envelope(url):
    return json.dumps({"method": "GET", "url": url, "timeout_ms": 1000}).encode()


def request_bytes(api_port, token, body):
    return (
        b"POST /api/v1/requests HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (api_port, token.encode(), len(body))
    ) + body


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    return status, body


class Stats:
    def __init__(self):
        self.sent = 0
        self.by_outcome = {}
        self.late = 0

    def count(self, outcome):
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1


async def one_request(api_port, token, body, stats, disconnect):
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", api_port), 5
        )
    except (OSError, asyncio.TimeoutError):
        stats.count("client_connect_failed")
        return
    try:
        writer.write(request_bytes(api_port, token, body))
        await writer.drain()
        if disconnect:
            await asyncio.sleep(0.1)
            stats.count("client_disconnect")
            return
        status, raw = await asyncio.wait_for(read_response(reader), 10)
        if status == 200:
            stats.count("ok:%d" % json.loads(raw)["status"])
        else:
            stats.count(json.loads(raw).get("code", str(status)))
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, KeyError):
        stats.count("client_error")
    finally:
        writer.close()


def api_mix(args, up, refused):
    """The request API's operations: (weight, factory of the operation's coroutine)."""
    kinds = (
        [("http://127.0.0.1:%d/ok" % up, False, 70)]
        + [("http://127.0.0.1:%d/err" % up, False, 8)]
        + [("http://127.0.0.1:%d/reset" % up, False, 6)]
        + [("http://127.0.0.1:%d/x" % refused, False, 6)]
        + [("http://127.0.0.1:%d/slow" % up, False, 5)]
        + [("http://127.0.0.1:%d/slow" % up, True, 5)]
    )
    return [
        (w, lambda stats, b=envelope(u), d=d: one_request(args.api_port, args.token, b, stats, d))
        for u, d, w in kinds
    ]


class Proxy:
    """One operation's view of the forward proxy: where it is and the credentials it sends."""

    def __init__(self, port, deployment, token, up, refused, tunnel_idle_ms):
        self.port = port
        self.auth = b"Basic " + base64.b64encode(("%s:%s" % (deployment, token)).encode())
        self.up = up
        self.refused = refused
        self.tunnel_idle = tunnel_idle_ms / 1000.0

    def absolute(self, method, path, body=b"", port=None):
        host = b"127.0.0.1:%d" % (port or self.up)
        return (
            b"%s http://%s%s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n"
            b"Content-Length: %d\r\n\r\n" % (method, host, path, host, self.auth, len(body))
        ) + body

    def connect(self, port=None):
        host = b"127.0.0.1:%d" % (port or self.up)
        return b"CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n" % (
            host, host, self.auth)


class Outcome(Exception):
    """Ends an operation with the outcome it names."""


async def read_head(reader):
    """Status and Content-Length (None when absent) of a response head."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = None
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, length


async def expect_body(reader, want):
    """Reads a whole 200 response whose body must be `want` bytes long."""
    status, length = await read_head(reader)
    body = await reader.readexactly(length or 0)
    if status != 200:
        raise Outcome("status:%d" % status)
    if len(body) != want:
        raise Outcome("short_body")


async def expect_truncated(reader):
    """Reads a 200 head and a body the connection cuts short (what a reset or a stall upstream
    must look like to the client once the head is sent)."""
    status, length = await read_head(reader)
    if status != 200:
        await reader.readexactly(length or 0)
        raise Outcome("status:%d" % status)
    try:
        await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        raise Outcome("truncated")
    raise Outcome("whole_body")


async def expect_status(reader, want):
    status, length = await read_head(reader)
    await reader.readexactly(length or 0)
    raise Outcome("status:%d" % status if status != want else "expected:%d" % want)


async def op_get(px, reader, writer, size, count):
    path = b"/ok" if size == len(BODY_1K) else b"/big/%d" % size
    for _ in range(count):
        writer.write(px.absolute(b"GET", path))
        await expect_body(reader, size)
    raise Outcome("ok")


async def op_post(px, reader, writer, size):
    writer.write(px.absolute(b"POST", b"/echo", POST_BODIES[size]))
    await expect_body(reader, size)
    raise Outcome("ok")


async def op_failing_get(px, reader, writer, path):
    writer.write(px.absolute(b"GET", path))
    await expect_truncated(reader)


async def op_slow_head(px, reader, writer):
    writer.write(px.absolute(b"GET", b"/slow"))
    await expect_status(reader, 504)


async def op_refused(px, reader, writer, connect):
    writer.write(px.connect(px.refused) if connect else px.absolute(b"GET", b"/x", port=px.refused))
    await expect_status(reader, 502)


async def op_leave(px, reader, writer, path):
    """Reads the head and a piece of the body, then leaves: on /big while the gateway waits for
    room to write (the client's receive buffer is small, see PROXY_MIX; the close is a reset),
    on /pause during the upstream's pause."""
    writer.write(px.absolute(b"GET", path))
    status, _ = await read_head(reader)
    if status != 200:
        raise Outcome("status:%d" % status)
    await reader.read(8 * 1024)
    await asyncio.sleep(0.1)
    raise Outcome("left")


async def open_tunnel(px, reader, writer):
    writer.write(px.connect())
    status, length = await read_head(reader)
    if status != 200:
        await reader.readexactly(length or 0)
        raise Outcome("status:%d" % status)


async def op_tunnel(px, reader, writer, count):
    await open_tunnel(px, reader, writer)
    host = b"127.0.0.1:%d" % px.up
    for _ in range(count):
        writer.write(b"GET /ok HTTP/1.1\r\nHost: %s\r\n\r\n" % host)
        await expect_body(reader, len(BODY_1K))
    raise Outcome("ok")


async def op_tunnel_bulk(px, reader, writer, upload):
    """1 MiB down through the tunnel; with `upload`, 64 KiB echoed up and back as well (each
    direction's 64 KiB reads switch it to splice)."""
    await open_tunnel(px, reader, writer)
    host = b"127.0.0.1:%d" % px.up
    size = 1024 * 1024
    writer.write(b"GET /big/%d HTTP/1.1\r\nHost: %s\r\n\r\n" % (size, host))
    await expect_body(reader, size)
    if upload:
        body = POST_BODIES[64 * 1024]
        writer.write(b"POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n" % (
            host, len(body)) + body)
        await expect_body(reader, len(body))
    raise Outcome("ok")


async def op_tunnel_idle(px, reader, writer):
    """One exchange, then silence: the gateway must close the tunnel 1–1.25× its idle timeout
    after the last byte (which it relays after the request is sent: the request's sending time
    bounds the early side, the response's arrival the late one)."""
    await open_tunnel(px, reader, writer)
    sent = time.monotonic()
    writer.write(b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % px.up)
    await expect_body(reader, len(BODY_1K))
    try:
        extra = await asyncio.wait_for(reader.read(1), px.tunnel_idle * 1.25 + 2)
    except asyncio.TimeoutError:
        raise Outcome("still_open")
    if extra:
        raise Outcome("unexpected_bytes")
    raise Outcome("closed" if time.monotonic() - sent >= px.tunnel_idle else "closed_early")


# Receive buffer of the clients that leave mid-body: small, so that the gateway's send buffer
# does not grow to hold the whole body and the gateway is still relaying when they leave.
SMALL_RCVBUF = 8 * 1024

# The proxy's operations per 100: (name, weight, operation, client receive buffer or None).
# Each runs on a new client connection, which it closes at the end (a client that leaves
# mid-body closes with bytes unread: a reset).
PROXY_MIX = [
    ("get_1k", 36, lambda px, r, w: op_get(px, r, w, len(BODY_1K), random.randint(1, 3))),
    ("get_256k", 8, lambda px, r, w: op_get(px, r, w, 256 * 1024, 1)),
    ("get_1m", 4, lambda px, r, w: op_get(px, r, w, 1024 * 1024, 1)),
    ("post_4k", 8, lambda px, r, w: op_post(px, r, w, 4 * 1024)),
    ("post_64k", 4, lambda px, r, w: op_post(px, r, w, 64 * 1024)),
    ("tunnel_small", 12, lambda px, r, w: op_tunnel(px, r, w, random.randint(1, 2))),
    ("tunnel_bulk", 4, lambda px, r, w: op_tunnel_bulk(px, r, w, random.random() < 0.5)),
    ("tunnel_idle", 1, op_tunnel_idle),
    ("refused", 4, lambda px, r, w: op_refused(px, r, w, False)),
    ("connect_refused", 2, lambda px, r, w: op_refused(px, r, w, True)),
    ("reset_mid", 4, lambda px, r, w: op_failing_get(px, r, w, b"/reset-mid")),
    ("stall_mid", 3, lambda px, r, w: op_failing_get(px, r, w, b"/stall-mid")),
    ("slow_head", 2, op_slow_head),
    ("leave_queued", 4, lambda px, r, w: op_leave(px, r, w, b"/big/%d" % (8 * 1024 * 1024)),
     SMALL_RCVBUF),
    ("leave_paused", 4, lambda px, r, w: op_leave(px, r, w, b"/pause")),
]


async def connect(port, rcvbuf):
    """A client connection to `port`; with `rcvbuf`, both the socket's receive buffer and the
    stream's (asyncio stops reading the socket at twice its limit) are that small."""
    sock = socket.socket()
    try:
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return await asyncio.open_connection(sock=sock, limit=rcvbuf or 1 << 20)
    except BaseException:
        sock.close()
        raise


async def proxy_op(px, name, op, rcvbuf, stats):
    """Runs one proxy operation on a new connection, bounded to 15 s, and counts its outcome
    as `name:outcome`."""
    try:
        reader, writer = await asyncio.wait_for(connect(px.port, rcvbuf), 5)
    except (OSError, asyncio.TimeoutError):
        stats.count("client_connect_failed")
        return
    try:
        await asyncio.wait_for(op(px, reader, writer), 15)
        stats.count("%s:no_outcome" % name)
    except Outcome as o:
        stats.count("%s:%s" % (name, o.args[0]))
    except asyncio.TimeoutError:
        stats.count("%s:client_timeout" % name)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        stats.count("%s:client_error:%s" % (name, type(e).__name__))
    finally:
        writer.close()


def proxy_mix(args, up, refused):
    px = Proxy(args.proxy_port, args.deployment, args.token, up, refused, args.tunnel_idle_ms)
    return [
        (w, lambda stats, n=n, op=op, b=rest[0] if rest else None: proxy_op(px, n, op, b, stats))
        for n, w, op, *rest in PROXY_MIX
    ]


async def metrics(admin_port, admin_token):
    """The gateway's metrics by name, labelled series summed."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", admin_port), 5)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                     b"Connection: close\r\n\r\n" % admin_token.encode())
        raw = await asyncio.wait_for(reader.read(-1), 10)
    finally:
        writer.close()
    out = {}
    for line in raw.split(b"\r\n\r\n", 1)[-1].decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0]
            out[name] = out.get(name, 0) + float(value)
    return out


async def settled(args):
    """After the run: waits up to 10 s for the gateway to hold no request or tunnel; prints
    what its metrics say; false when something is still held."""
    if not args.admin_port:
        return True
    deadline = time.monotonic() + 10
    while True:
        m = await metrics(args.admin_port, args.admin_token)
        held = m.get("sortie_active_requests", 0) + m.get("sortie_worker_active_requests", 0)
        if held == 0 or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.2)
    print("after the run: active requests %d, worker capacity held %d; tunnels ended %d, "
          "tunnel bytes %d, spliced response bytes %d" % (
              m.get("sortie_active_requests", 0), m.get("sortie_worker_active_requests", 0),
              m.get("sortie_tunnels_total", 0), m.get("sortie_tunnel_bytes_total", 0),
              m.get("sortie_proxy_spliced_bytes_total", 0)))
    return held == 0


def sample(pid):
    """RSS in KiB and open descriptors of `pid`: all, sockets, pipes."""
    rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    fds = sockets = pipes = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue  # closed between the listing and the read
        fds += 1
        sockets += target.startswith("socket:")
        pipes += target.startswith("pipe:")
    return rss, fds, sockets, pipes


def slope(points):
    """Least-squares slope of (t, v) points, per second."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


def report(samples, stats, warmup):
    """Prints outcomes, slopes and the verdict; true when flat."""
    after = [s for s in samples if s[0] >= warmup]
    span = (after[-1][0] - after[0][0]) if len(after) > 1 else 0
    # The verdict is taken on the last two thirds of the run after the warm-up: the allocator's
    # arenas and the per-core tables fill during the first minutes, which a fit over the whole
    # run reads as growth; a leak grows at the same rate all along and shows in the last two
    # thirds as well. The slope of each third is printed so the shape can be seen.
    tail = [s for s in after if s[0] >= after[0][0] + span / 3] if after else []
    print()
    print("operations sent: %d (skipped while behind: %d)" % (stats.sent, stats.late))
    cpu = os.times()
    print("client CPU (this process): %.1f s user + %.1f s system over %.0f s" % (
        cpu.user, cpu.system, samples[-1][0]))
    print("upstream: %d requests on %d connections" % (
        UPSTREAM["requests"], UPSTREAM["connections"]))
    for k in sorted(stats.by_outcome):
        print("  %-40s %d" % (k, stats.by_outcome[k]))
    if not after:
        print("no samples after warm-up")
        return False
    print("RSS after warm-up: first %d KiB, last %d KiB, max %d KiB" % (
        after[0][1], after[-1][1], max(s[1] for s in after)))
    for i, name in ((2, "descriptors"), (3, "sockets"), (4, "pipes")):
        print("%s after warm-up: first %d, last %d, max %d" % (
            name, after[0][i], after[-1][i], max(s[i] for s in after)))
    for name, part in (("after warm-up", after), ("last 2/3", tail)):
        part_span = (part[-1][0] - part[0][0]) if len(part) > 1 else 0
        rss = slope([(s[0], s[1]) for s in part])
        print("%-14s RSS slope %+8.1f KiB per 10 min (%+.0f KiB over %.0f s); descriptor slope "
              "%+.2f per 10 min (sockets %+.2f, pipes %+.2f)" % (
                  name, rss * 600, rss * part_span, part_span,
                  slope([(s[0], s[2]) for s in part]) * 600,
                  slope([(s[0], s[3]) for s in part]) * 600,
                  slope([(s[0], s[4]) for s in part]) * 600))
    if span > 0:
        for i in range(3):
            lo, hi = after[0][0] + span * i / 3, after[0][0] + span * (i + 1) / 3
            third = [s for s in after if lo <= s[0] <= hi]
            print("  third %d (%4.0f-%4.0f s): RSS slope %+8.1f KiB per 10 min, mean %d KiB, "
                  "mean descriptors %.0f" % (
                      i + 1, lo, hi, slope([(s[0], s[1]) for s in third]) * 600,
                      sum(s[1] for s in third) / max(1, len(third)),
                      sum(s[2] for s in third) / max(1, len(third))))
    tail_span = (tail[-1][0] - tail[0][0]) if len(tail) > 1 else 0
    rss_drift = slope([(s[0], s[1]) for s in tail]) * tail_span
    fd_drift = slope([(s[0], s[2]) for s in tail]) * tail_span
    # Flat: over the last two thirds the fitted growth stays under 2 MiB (allocator noise) and
    # under 5 descriptors (connections in flight at the sample instant).
    flat = rss_drift < 2048 and fd_drift < 5
    print("verdict (last 2/3): %s (RSS %+.0f KiB, descriptors %+.1f over %.0f s)" % (
        "flat" if flat else "GROWING", rss_drift, fd_drift, tail_span))
    return flat


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("api", "proxy"), default="api")
    ap.add_argument("--api-port", type=int)
    ap.add_argument("--proxy-port", type=int)
    ap.add_argument("--deployment", default="perf")
    ap.add_argument("--token", required=True)
    ap.add_argument("--tunnel-idle-ms", type=int, default=3000,
                    help="the gateway's control.proxy.tunnel_idle_timeout_ms")
    ap.add_argument("--admin-port", type=int,
                    help="with --admin-token: after the run, check in the gateway's metrics "
                    "that no request or tunnel is still held")
    ap.add_argument("--admin-token")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--seconds", type=int, default=1800)
    ap.add_argument("--rate", type=int, default=400)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--max-in-flight", type=int, default=5000,
                    help="operations in flight beyond which new ones are skipped (counted)")
    args = ap.parse_args()
    if args.mode == "api" and not args.api_port:
        ap.error("--mode api needs --api-port")
    if args.mode == "proxy" and not args.proxy_port:
        ap.error("--mode proxy needs --proxy-port")

    server = await asyncio.start_server(upstream_conn, "127.0.0.1", 0, backlog=1024)
    up = server.sockets[0].getsockname()[1]
    refused = closed_port()
    mix = (api_mix if args.mode == "api" else proxy_mix)(args, up, refused)
    ops = [f for w, f in mix for _ in range(w)]
    rng = random.Random(7)
    random.seed(11)
    stats = Stats()
    tasks = set()
    samples = []
    started = time.monotonic()
    next_sample = started
    tick = 1.0 / args.rate
    next_send = started
    print("  t(s)   rss(KiB)  fds socks pipes   sent  in-flight", flush=True)
    while True:
        now = time.monotonic()
        if now - started >= args.seconds:
            break
        if now >= next_sample:
            rss, fds, socks, pipes = sample(args.pid)
            samples.append((now - started, rss, fds, socks, pipes))
            print("%6.0f %10d %4d %5d %5d %6d %5d" % (
                now - started, rss, fds, socks, pipes, stats.sent, len(tasks)), flush=True)
            next_sample += args.interval
        while next_send <= now:
            if len(tasks) >= args.max_in_flight:
                stats.late += 1
            else:
                t = asyncio.ensure_future(rng.choice(ops)(stats))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                stats.sent += 1
            next_send += tick
            if now - next_send > 1.0:
                # The client fell behind by more than a second: skip rather than burst.
                stats.late += int((now - next_send) / tick)
                next_send = now
        await asyncio.sleep(max(0.0, min(next_send, next_sample) - time.monotonic()))
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(2)
    samples.append((time.monotonic() - started,) + sample(args.pid))
    flat = report(samples, stats, args.warmup)
    released = await settled(args)
    server.close()
    return 0 if flat and released else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
