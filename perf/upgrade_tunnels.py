#!/usr/bin/env python3
"""Long CONNECT tunnels across a binary upgrade, for perf/upgrade.sh.

Opens TUNNELS tunnels through the forward proxy to the upstream, then sends a keep-alive
`GET PATH` inside each every PERIOD seconds for SECONDS seconds, and prints one line:
`TUNNELS_RESULT tunnels=N requests=R failures=F` (and each failure on stderr). A tunnel
opened before the upgrade lives in the old process, which drains until it closes.
Loopback only.
"""

import base64
import os
import socket
import sys
import threading
import time

PROXY = os.environ["PROXY"]  # host:port
TARGET = os.environ["TARGET"]  # host:port
PATH = os.environ.get("TUNNEL_PATH", "/small")
AUTH = os.environ["PROXY_AUTH"]  # user:pass
TUNNELS = int(os.environ.get("TUNNELS", "8"))
SECONDS = float(os.environ.get("SECONDS_", "10"))
PERIOD = float(os.environ.get("PERIOD", "0.1"))

for hostport in (PROXY, TARGET):
    if not hostport.startswith("127."):
        sys.exit(f"refusing {hostport}: loopback only")

lock = threading.Lock()
tally = {"requests": 0, "failures": 0}


def fail(msg):
    with lock:
        tally["failures"] += 1
    print(f"tunnel failure: {msg}", file=sys.stderr)


def read_response(f):
    status = f.readline()
    if not status:
        raise IOError("closed before a response")
    length = 0
    while True:
        line = f.readline()
        if not line:
            raise IOError("closed in the head")
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = f.read(length)
    if len(body) != length:
        raise IOError("short body")
    return status


def one_tunnel(i, deadline):
    host, port = PROXY.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(port)), timeout=10)
    except OSError as e:
        fail(f"tunnel {i}: connect: {e}")
        return
    f = s.makefile("rb")
    auth = base64.b64encode(AUTH.encode()).decode()
    s.sendall(
        f"CONNECT {TARGET} HTTP/1.1\r\nHost: {TARGET}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    try:
        status = f.readline()
        while f.readline() not in (b"\r\n", b"\n", b""):
            pass
        if b" 200" not in status:
            fail(f"tunnel {i}: CONNECT answered {status!r}")
            return
        while time.monotonic() < deadline:
            s.sendall(f"GET {PATH} HTTP/1.1\r\nHost: {TARGET}\r\n\r\n".encode())
            st = read_response(f)
            if b" 200" not in st:
                fail(f"tunnel {i}: {st!r}")
            else:
                with lock:
                    tally["requests"] += 1
            time.sleep(PERIOD)
    except OSError as e:
        fail(f"tunnel {i}: {e}")
    finally:
        s.close()


def main():
    deadline = time.monotonic() + SECONDS
    threads = [threading.Thread(target=one_tunnel, args=(i, deadline)) for i in range(TUNNELS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(
        f"TUNNELS_RESULT tunnels={TUNNELS} requests={tally['requests']} failures={tally['failures']}"
    )


main()
