#!/usr/bin/env python3
"""Soak driver: a loopback upstream with several failure modes, a fixed-rate client mix against
the gateway's request API, and a sampler of the gateway's RSS and open descriptors.

The mix (per 100 requests): 70 successes (1 KiB body), 8 destination errors (503, transported),
6 upstream resets, 6 refused connections, 5 timeouts (the upstream answers after the request's
1 s deadline) and 5 client disconnects (the caller closes 100 ms after sending, while the
upstream is still slow). Every request is bounded in time; only 127.0.0.1 is contacted.

Prints one line per sample and, at the end, the least-squares slope of RSS and descriptors
after the warm-up, over its last two thirds and per third, with a verdict on the last two
thirds: flat when neither grows beyond a small bound.
"""

import argparse
import asyncio
import json
import os
import random
import socket
import struct
import sys
import time

BODY_1K = b"x" * 1024


async def upstream_conn(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].split(b" ")
            path = line[1] if len(line) > 1 else b"/"
            if path.startswith(b"/ok"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY_1K) + BODY_1K)
            elif path.startswith(b"/err"):
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
            elif path.startswith(b"/reset"):
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            elif path.startswith(b"/slow"):
                await asyncio.sleep(3)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
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


def sample(pid):
    rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    fds = len(os.listdir("/proc/%d/fd" % pid))
    return rss, fds


def slope(points):
    """Least-squares slope of (t, v) points, per second."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--api-port", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--seconds", type=int, default=1800)
    ap.add_argument("--rate", type=int, default=400)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=60)
    args = ap.parse_args()

    server = await asyncio.start_server(upstream_conn, "127.0.0.1", 0, backlog=1024)
    up = server.sockets[0].getsockname()[1]
    refused = closed_port()
    kinds = (
        [("http://127.0.0.1:%d/ok" % up, False)] * 70
        + [("http://127.0.0.1:%d/err" % up, False)] * 8
        + [("http://127.0.0.1:%d/reset" % up, False)] * 6
        + [("http://127.0.0.1:%d/x" % refused, False)] * 6
        + [("http://127.0.0.1:%d/slow" % up, False)] * 5
        + [("http://127.0.0.1:%d/slow" % up, True)] * 5
    )
    bodies = [(envelope(u), d) for u, d in kinds]
    rng = random.Random(7)
    stats = Stats()
    tasks = set()
    samples = []
    started = time.monotonic()
    next_sample = started
    tick = 1.0 / args.rate
    next_send = started
    print("  t(s)   rss(KiB)  fds  sent  in-flight", flush=True)
    while True:
        now = time.monotonic()
        if now - started >= args.seconds:
            break
        if now >= next_sample:
            rss, fds = sample(args.pid)
            samples.append((now - started, rss, fds))
            print("%6.0f %10d %4d %5d %5d" % (now - started, rss, fds, stats.sent, len(tasks)), flush=True)
            next_sample += args.interval
        while next_send <= now:
            body, disconnect = rng.choice(bodies)
            t = asyncio.ensure_future(one_request(args.api_port, args.token, body, stats, disconnect))
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
    rss, fds = sample(args.pid)
    samples.append((time.monotonic() - started, rss, fds))
    server.close()

    after = [s for s in samples if s[0] >= args.warmup]
    span = (after[-1][0] - after[0][0]) if len(after) > 1 else 0
    # The verdict is taken on the last two thirds of the run after the warm-up: the allocator's
    # arenas and the per-core tables fill during the first minutes, which a fit over the whole
    # run reads as growth; a leak grows at the same rate all along and shows in the last two
    # thirds as well. The slope of each third is printed so the shape can be seen.
    tail = [s for s in after if s[0] >= after[0][0] + span / 3] if after else []
    print()
    print("requests sent: %d (skipped while behind: %d)" % (stats.sent, stats.late))
    for k in sorted(stats.by_outcome):
        print("  %-32s %d" % (k, stats.by_outcome[k]))
    print("RSS after warm-up: first %d KiB, last %d KiB, max %d KiB" % (
        after[0][1], after[-1][1], max(r for _, r, _ in after)) if after else "no samples after warm-up")
    print("descriptors after warm-up: first %d, last %d, max %d" % (
        after[0][2], after[-1][2], max(f for _, _, f in after)) if after else "")
    for name, part in (("after warm-up", after), ("last 2/3", tail)):
        part_span = (part[-1][0] - part[0][0]) if len(part) > 1 else 0
        print("%-14s RSS slope %+8.1f KiB per 10 min (%+.0f KiB over %.0f s); descriptor slope %+.2f per 10 min" % (
            name, slope([(t, r) for t, r, _ in part]) * 600,
            slope([(t, r) for t, r, _ in part]) * part_span, part_span,
            slope([(t, f) for t, _, f in part]) * 600))
    if span > 0:
        for i in range(3):
            lo, hi = after[0][0] + span * i / 3, after[0][0] + span * (i + 1) / 3
            third = [s for s in after if lo <= s[0] <= hi]
            print("  third %d (%4.0f-%4.0f s): RSS slope %+8.1f KiB per 10 min, mean %d KiB" % (
                i + 1, lo, hi, slope([(t, r) for t, r, _ in third]) * 600,
                sum(r for _, r, _ in third) / max(1, len(third))))
    tail_span = (tail[-1][0] - tail[0][0]) if len(tail) > 1 else 0
    rss_drift = slope([(t, r) for t, r, _ in tail]) * tail_span
    fd_drift = slope([(t, f) for t, _, f in tail]) * tail_span
    # Flat: over the last two thirds the fitted growth stays under 2 MiB (allocator noise) and
    # under 5 descriptors (connections in flight at the sample instant).
    flat = rss_drift < 2048 and fd_drift < 5
    print("verdict (last 2/3): %s (RSS %+.0f KiB, descriptors %+.1f over %.0f s)" % (
        "flat" if flat else "GROWING", rss_drift, fd_drift, tail_span))
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
