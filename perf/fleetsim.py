#!/usr/bin/env python3
"""A simulated fleet of remote workers for one control, speaking the published bus protocol
(docs/bus-protocol.md, versions 3 and 4) from one process: for perf/fleet.sh.

Each simulated worker opens lane 0 (Hello with lanes = 0), learns the control's core count
from the Welcome, applies the configuration push (ConfigApplied), then opens its other lanes.
Every lane sends a Heartbeat at the interval the Welcome names; every Assign is answered with
Accept, a 200 ResponseHead and a two-byte body. Plain TCP only, loopback only.

Output, one line each, machine-readable:
  FLEETSIM_REGISTERED workers=N lanes=L seconds=S     once every lane of every worker is welcomed
  FLEETSIM_APPLIED version=V workers=N seconds=S      once every worker acknowledged revision V
                                                      (S counted from its first push after start)
  FLEETSIM_RESULT workers=N lanes_up=L assigns=A refused_lanes=R errors=E
"""

import argparse
import asyncio
import os
import random
import resource
import struct
import sys
import time

HELLO, WELCOME, REJECT, HEARTBEAT, CONFIG_PUSH, CONFIG_APPLIED = 1, 2, 3, 4, 5, 6
ASSIGN, ACCEPT, RESPONSE_HEAD, DATA, GOAWAY = 0x10, 0x11, 0x13, 0x14, 0x20
MAX_FRAME = 4 * 1024 * 1024 + 64 * 1024


def s16(b):
    return struct.pack(">H", len(b)) + b


def text(s):
    return s16(s.encode())


def frame(kind, payload):
    return struct.pack(">IB", len(payload) + 1, kind) + payload


def hello(worker_id, session, token, lane, lanes, tags, country, capacity, version):
    p = struct.pack(">HH", 3, version) + text(worker_id) + text(session) + s16(token)
    p += struct.pack(">HH", lane, lanes)
    p += struct.pack(">H", len(tags)) + b"".join(text(t) for t in tags)
    p += b"\x01" + text(country)  # country
    p += b"\x00\x00"  # region, ip_type: none
    p += struct.pack(">H", 0) * 3  # ingress, pools, fingerprint profiles: none
    p += struct.pack(">I", capacity)
    return frame(HELLO, p)


class Stats:
    def __init__(self):
        self.lanes_up = 0
        self.assigns = 0
        self.refused = 0
        self.errors = 0
        self.retries = 0
        self.writers = set()
        self.reject_reasons = {}
        self.heartbeat_s = 0.0
        self.applied = {}  # version -> workers that acknowledged it
        self.first_push = {}  # version -> monotonic time of its first push


async def read_frame(reader):
    head = await reader.readexactly(5)
    length, kind = struct.unpack(">IB", head)
    if not 1 <= length <= MAX_FRAME:
        raise ValueError(f"frame length {length}")
    return kind, await reader.readexactly(length - 1)


async def lane(args, stats, worker_id, session, index, lanes, cores_future, applied_future):
    """One lane, dialled again after a failure before its Welcome (the control closes
    connections beyond its pre-authentication limit in a storm), with the backoff of a real
    worker: 100 ms doubling to 5 s, +-50 %."""
    backoff = 0.1
    while True:
        try:
            if await lane_once(args, stats, worker_id, session, index, lanes, cores_future,
                               applied_future):
                return
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        stats.retries += 1
        await asyncio.sleep(backoff * (0.5 + random.random()))
        backoff = min(backoff * 2, 5.0)


async def lane_once(args, stats, worker_id, session, index, lanes, cores_future, applied_future):
    """One connection of a lane; whether it was welcomed (it then ran until it closed)."""
    host, port = args.control.rsplit(":", 1)
    # Workers spread over several loopback source addresses: one address's ephemeral ports run
    # out under a storm's retries (each closed connection waits in TIME_WAIT).
    source = f"127.0.1.{hash(worker_id) % args.source_ips + 1}"
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
    tags = [f"t{hash(worker_id) % args.tag_groups}"]
    country = ["us", "de", "jp", "br"][hash(worker_id) % 4]
    writer.write(hello(worker_id, session, args.token.encode(), index, lanes, tags, country, args.capacity, args.protocol))
    await writer.drain()
    kind, payload = await read_frame(reader)
    if kind == REJECT:
        stats.refused += 1
        n = struct.unpack(">H", payload[:2])[0]
        reason = payload[2:2 + n].decode(errors="replace")
        stats.reject_reasons[reason] = stats.reject_reasons.get(reason, 0) + 1
        writer.close()
        return False
    if kind != WELCOME:
        raise ValueError(f"frame {kind} instead of welcome")
    version, = struct.unpack(">H", payload[:2])
    n = struct.unpack(">H", payload[2:4])[0]
    rest = payload[4 + n:]
    _core, cores, heartbeat_ms = struct.unpack(">HHI", rest[:8])
    stats.lanes_up += 1
    # One ticker writes every lane's heartbeat (a timer per lane costs the simulator more than
    # the control); it learns the interval from the first welcome.
    stats.heartbeat_s = heartbeat_ms / 1000
    # From version 4 on only lane 0 carries heartbeats (decision 118).
    if index == 0 or version < 4:
        stats.writers.add(writer)
    try:
        while True:
            kind, payload = await read_frame(reader)
            if kind == CONFIG_PUSH:
                version, = struct.unpack(">Q", payload[:8])
                stats.first_push.setdefault(version, time.monotonic())
                writer.write(frame(CONFIG_APPLIED, struct.pack(">Q", version)))
                stats.applied[version] = stats.applied.get(version, 0) + 1
                if cores_future is not None and not cores_future.done():
                    cores_future.set_result(cores)
                if applied_future is not None and not applied_future.done():
                    applied_future.set_result(version)
            elif kind == ASSIGN:
                stream, = struct.unpack(">I", payload[:4])
                stats.assigns += 1
                writer.write(
                    frame(ACCEPT, struct.pack(">I", stream))
                    + frame(RESPONSE_HEAD, struct.pack(">IHH", stream, 200, 0))
                    + frame(DATA, struct.pack(">IBI", stream, 1, 2) + b"ok")
                )
            elif kind == GOAWAY:
                pass
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        stats.writers.discard(writer)
        stats.lanes_up -= 1
        writer.close()
    return True


async def heartbeats(args, stats):
    """Every lane's heartbeat, once per interval, written in one pass."""
    beat = frame(HEARTBEAT, struct.pack(">II", 0, args.capacity))
    while True:
        await asyncio.sleep(stats.heartbeat_s or 0.1)
        for w in list(stats.writers):
            if not w.is_closing():
                w.write(beat)


async def worker(args, stats, i, done_lanes):
    worker_id = f"sim-{i:05d}"
    session = "s" + os.urandom(12).hex()
    loop = asyncio.get_running_loop()
    cores = loop.create_future()
    applied = loop.create_future()
    tasks = [asyncio.ensure_future(lane(args, stats, worker_id, session, 0, 0, cores, applied))]
    try:
        n = await asyncio.wait_for(cores, timeout=args.timeout)
    except (asyncio.TimeoutError, Exception) as e:  # noqa: BLE001
        stats.errors += 1
        print(f"{worker_id}: lane 0: {e!r}", file=sys.stderr)
        return
    for index in range(1, n):
        tasks.append(asyncio.ensure_future(lane(args, stats, worker_id, session, index, n, None, None)))
    done_lanes.append(n)
    await asyncio.gather(*tasks, return_exceptions=True)


async def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--control", required=True, help="the control's bus address, 127.x.x.x:port")
    p.add_argument("--token", required=True, help="the bus token")
    p.add_argument("--workers", type=int, default=100)
    p.add_argument("--capacity", type=int, default=64)
    p.add_argument("--protocol", type=int, default=4, choices=(3, 4),
                   help="the highest bus protocol version to offer (3: heartbeats on every lane)")
    p.add_argument("--tag-groups", type=int, default=16)
    p.add_argument("--seconds", type=float, default=30, help="how long to stay connected")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--source-ips", type=int, default=16,
                   help="loopback source addresses 127.0.1.1.. the workers dial from")
    p.add_argument("--connect-rate", type=float, default=0,
                   help="workers started per second (0: all at once, a registration storm)")
    args = p.parse_args()
    if not args.control.startswith("127."):
        sys.exit("refusing a control that is not on 127.0.0.0/8")
    # Every simulated lane is a socket: take the whole open-file allowance.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    stats = Stats()
    done_lanes = []
    started = time.monotonic()
    tasks = [asyncio.ensure_future(heartbeats(args, stats))]
    for i in range(args.workers):
        tasks.append(asyncio.ensure_future(worker(args, stats, i, done_lanes)))
        if args.connect_rate > 0:
            await asyncio.sleep(1 / args.connect_rate)
        elif i % 200 == 199:
            await asyncio.sleep(0)
    deadline = started + args.timeout
    while time.monotonic() < deadline:
        if len(done_lanes) == args.workers and stats.lanes_up >= sum(done_lanes):
            break
        if stats.errors + stats.refused > 0 and len(done_lanes) + stats.errors >= args.workers:
            break
        await asyncio.sleep(0.01)
    print(f"FLEETSIM_REGISTERED workers={len(done_lanes)} lanes={stats.lanes_up} "
          f"seconds={time.monotonic() - started:.3f}", flush=True)
    end = started + args.seconds
    reported = set()
    while time.monotonic() < end:
        for version, count in list(stats.applied.items()):
            if version not in reported and count >= len(done_lanes) and version in stats.first_push:
                if version != min(stats.applied):
                    secs = time.monotonic() - stats.first_push[version]
                    print(f"FLEETSIM_APPLIED version={version} workers={count} seconds={secs:.3f}",
                          flush=True)
                reported.add(version)
        await asyncio.sleep(0.005)
    print(f"FLEETSIM_RESULT workers={len(done_lanes)} lanes_up={stats.lanes_up} "
          f"assigns={stats.assigns} refused_lanes={stats.refused} retries={stats.retries} "
          f"errors={stats.errors}", flush=True)
    if stats.reject_reasons:
        print(f"rejected lanes by reason: {stats.reject_reasons}", file=sys.stderr)
    for t in tasks:
        t.cancel()


# uvloop (perf/fleet.sh installs it) runs the same event loop two to three times faster, which
# decides how large a fleet one process can keep on time; plain asyncio works too.
try:
    import uvloop

    uvloop.install()
except ImportError:
    print("uvloop is missing: pip install uvloop (plain asyncio is slower)", file=sys.stderr)

asyncio.run(main())
