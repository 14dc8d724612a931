#!/usr/bin/env python3
"""A fleet of real processes for perf/fleet-procs.sh: three `sortie control` processes on one
PostgreSQL database and one S3-compatible bucket, and N `sortie worker` processes, each with its
own loopback source address, tags and country, dialling all three controls.

For each N it measures, in one run:
- cold start: the time until every worker is connected (routable) on all three controls;
- at rest: each control's CPU over --idle-seconds and its RSS, and a worker's RSS;
- a rollout committed on one control: per (control, worker) pair, the time until the pair
  acknowledged the new revision (p50, p99, max over 3N pairs);
- fixed client load (--rate requests/s per control and ingress: request API and forward
  proxy): requests per control, the share each worker carried (from the upstream's access
  log, by source address), failures;
- kill -9 of control 0 under that load: failures seen by the clients of the other two (target
  0), and the time until a receipt control 0 held is verified again on another control;
- control 0 started again: the time until every worker is connected to it.

It starts and stops every process it uses, and only those. Prints one `FLEETPROCS key=value
...` line per N, which the shell script tabulates, and progress on stderr.
"""

import argparse
import base64
import hashlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

BUS_TOKEN = "perf-bus-token-0123456789abcdef"
DEPLOYMENT = "perf"
DEPLOYMENT_TOKEN = "perf-token-0123456789abcdef"
ADMIN_TOKEN = "perf-admin-0123456789abcdef"
SIGNING_KEY = "".join(f"{i * 7 + 3:02x}" for i in range(32))
COUNTRIES = ["US", "DE", "JP", "BR"]
CONTROLS = 3


def log(msg):
    print(f"[fleetprocs] {msg}", file=sys.stderr, flush=True)


def clk_tck():
    return os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def call(port, method, path, body=None, headers=None, timeout=10):
    """One HTTP request on a new connection; (status, headers, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def admin(port, method, path, body=None, extra=None):
    h = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    h.update(extra or {})
    return call(port, method, path, body, h)


def api(port, method, path, body=None, ctype=None):
    h = {"Authorization": f"Bearer {DEPLOYMENT_TOKEN}"}
    if ctype:
        h["Content-Type"] = ctype
    return call(port, method, path, body, h)


class Control:
    def __init__(self, args, index):
        self.args = args
        self.index = index
        base = args.base_port + 10 * index
        self.api, self.admin, self.proxy, self.bus = base, base + 1, base + 2, base + 3
        self.dir = os.path.join(args.work, f"control-{index}")
        self.proc = None

    def write_config(self, db_url):
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        snapshot = {
            "default_timeout_ms": 60000,
            "routing": {"rules": [{"id": "default", "priority": 100, "constraints": {},
                                   "pools": ["direct"], "sticky_session_ttl_seconds": 0,
                                   "allow_sticky_fallback": True}]},
            "pools": [{"id": "direct"}],
            "destinations": {"allow": ["127.0.0.0/8"], "deny": []},
        }
        with open(os.path.join(self.dir, "snapshot.json"), "w") as f:
            json.dump(snapshot, f)
        a = self.args
        with open(os.path.join(self.dir, "control.toml"), "w") as f:
            f.write(f"""[control]
api_listen = "127.0.0.1:{self.api}"
admin_listen = "127.0.0.1:{self.admin}"
proxy_listen = "127.0.0.1:{self.proxy}"
bus_listen = "127.0.0.1:{self.bus}"
data_dir = "{self.dir}/data"
cores = 1
bootstrap_snapshot = "{self.dir}/snapshot.json"

[control.bus]
token = "{BUS_TOKEN}"
plaintext = true
heartbeat_ms = {a.heartbeat_ms}
api_base_url = "http://127.0.0.1:{self.api}"

[store]
backend = "postgres"
url_env = "SORTIE_PERF_PG_URL"

[object_storage]
enabled = true
backend = "s3"
bucket = "receipts"
endpoint = "http://127.0.0.1:{a.s3_port}"
region = "us-east-1"
force_path_style = true
access_key_env = "SORTIE_PERF_S3_AK"
secret_key_env = "SORTIE_PERF_S3_SK"
signing_key_env = "SORTIE_PERF_SIGNING_KEY"

[[deployments]]
id = "{DEPLOYMENT}"
token = "{DEPLOYMENT_TOKEN}"

[admin]
token = "{ADMIN_TOKEN}"
""")
        self.db_url = db_url

    def start(self):
        env = dict(os.environ, SORTIE_PERF_PG_URL=self.db_url, SORTIE_PERF_S3_AK="AKPERF",
                   SORTIE_PERF_S3_SK="SKPERF", SORTIE_PERF_SIGNING_KEY=SIGNING_KEY)
        out = open(os.path.join(self.dir, "control.log"), "ab")
        self.proc = subprocess.Popen(
            [self.args.bin, "control", "--config", os.path.join(self.dir, "control.toml")],
            stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                s, _, _ = admin(self.admin, "GET", "/api/v1/admin/workers")
                if s == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"control {self.index} did not start; see {self.dir}/control.log")
            time.sleep(0.05)

    def connected(self):
        """Ids of the workers this control lists as connected."""
        s, _, body = admin(self.admin, "GET", "/api/v1/admin/workers")
        if s != 200:
            return set()
        return {w["worker_id"] for w in json.loads(body)["items"] if w.get("state") == "connected"}

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Worker:
    def __init__(self, args, index, controls):
        self.id = f"w{index:03d}"
        self.address = f"127.0.1.{index + 1}"
        self.dir = os.path.join(args.work, "workers", self.id)
        os.makedirs(self.dir, exist_ok=True)
        buses = ", ".join(f'"127.0.0.1:{c.bus}"' for c in controls)
        self.config = os.path.join(self.dir, "worker.toml")
        with open(self.config, "w") as f:
            f.write(f"""[worker]
id = "{self.id}"
controls = [{buses}]
token = "{BUS_TOKEN}"
plaintext = true
cores = 1
capacity = 64
tags = ["g{index % 5}"]
country = "{COUNTRIES[index % len(COUNTRIES)]}"
bind_address = "{self.address}"
""")
        self.bin = args.bin
        self.proc = None

    def start(self):
        out = open(os.path.join(self.dir, "worker.log"), "ab")
        self.proc = subprocess.Popen([self.bin, "worker", "--config", self.config],
                                     stdout=out, stderr=subprocess.STDOUT)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()


def wait_all_connected(controls, ids, limit, t0=None):
    """Seconds from `t0` (default: now) until every control lists every id connected; None
    past `limit`."""
    t0 = time.monotonic() if t0 is None else t0
    while time.monotonic() - t0 < limit:
        if all(ids <= c.connected() for c in controls):
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def rollout(controls, n, timeout_ms):
    """Commits a new revision on control 0; per-pair acknowledgement times in seconds."""
    c0 = controls[0]
    s, h, _ = admin(c0.admin, "GET", "/api/v1/admin/config")
    etag = {k.lower(): v for k, v in h.items()}.get("etag")
    if s != 200 or not etag:
        raise SystemExit(f"GET /api/v1/admin/config answered {s} without an ETag")
    with open(os.path.join(c0.dir, "snapshot.json")) as f:
        snap = json.load(f)
    snap["default_timeout_ms"] = timeout_ms
    before = json.loads(admin(c0.admin, "GET", "/api/v1/admin/rollouts")[2])["config_version"]
    acked = {}
    done = threading.Event()

    def watch(c):
        while not done.is_set():
            try:
                r = json.loads(admin(c.admin, "GET", "/api/v1/admin/rollouts")[2])
            except (OSError, ValueError):
                continue
            now = time.monotonic()
            if r["config_version"] > before:
                for e in r["entries"]:
                    if e["status"] == "applied":
                        acked.setdefault((c.index, e["worker_id"]), now)
            time.sleep(0.005)

    threads = [threading.Thread(target=watch, args=(c,), daemon=True) for c in controls]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    s, _, body = admin(c0.admin, "PUT", "/api/v1/admin/config", json.dumps(snap).encode(),
                       {"If-Match": etag, "Content-Type": "application/json"})
    if s != 200:
        done.set()
        raise SystemExit(f"the rollout's commit answered {s}: {body[:200]!r}")
    deadline = t0 + 30
    while len(acked) < CONTROLS * n and time.monotonic() < deadline:
        time.sleep(0.01)
    done.set()
    return [t - t0 for t in acked.values()], len(acked)


class Load:
    """Fixed-rate clients: for each control, one request API client and one forward-proxy
    client, each sending `rate` requests per second on a keep-alive connection (a new one after
    a failure). Failures are counted per control, with the time of each."""

    def __init__(self, controls, upstream_port, rate):
        self.controls = controls
        self.upstream = upstream_port
        self.rate = rate
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = {}
        self.failed = {}
        self.failure_times = {}
        self.threads = []

    def count(self, key, ok):
        with self.lock:
            d = self.ok if ok else self.failed
            d[key] = d.get(key, 0) + 1
            if not ok:
                self.failure_times.setdefault(key, []).append(time.monotonic())

    def client(self, c, ingress):
        key = (c.index, ingress)
        envelope = json.dumps({"method": "GET", "url": f"http://127.0.0.1:{self.upstream}/small",
                               "timeout_ms": 5000}).encode()
        auth = base64.b64encode(f"{DEPLOYMENT}:{DEPLOYMENT_TOKEN}".encode()).decode()
        conn = None
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self.stop.is_set():
            next_at += period
            try:
                if conn is None:
                    port = c.api if ingress == "api" else c.proxy
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                if ingress == "api":
                    conn.request("POST", "/api/v1/requests", body=envelope,
                                 headers={"Authorization": f"Bearer {DEPLOYMENT_TOKEN}",
                                          "Content-Type": "application/json"})
                    r = conn.getresponse()
                    body = r.read()
                    ok = r.status == 200 and json.loads(body).get("status") == 200
                else:
                    conn.request("GET", f"http://127.0.0.1:{self.upstream}/small",
                                 headers={"Proxy-Authorization": f"Basic {auth}"})
                    r = conn.getresponse()
                    r.read()
                    ok = r.status == 200
                if r.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException, ValueError):
                ok = False
                if conn is not None:
                    conn.close()
                conn = None
            self.count(key, ok)
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)
            else:
                next_at = time.monotonic()

    def start(self):
        for c in self.controls:
            for ingress in ("api", "proxy"):
                t = threading.Thread(target=self.client, args=(c, ingress), daemon=True)
                t.start()
                self.threads.append(t)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(15)

    def snapshot(self):
        with self.lock:
            return dict(self.ok), dict(self.failed)


def access_counts(log_path, offset):
    """Requests per source address in the upstream's access log from byte `offset` on."""
    counts = {}
    with open(log_path, "rb") as f:
        f.seek(offset)
        for line in f:
            ip = line.strip().decode()
            counts[ip] = counts.get(ip, 0) + 1
    return counts


def held_receipt(controls, stall_port):
    """A verified receipt on control 0, then a request on control 0 that sends it to a
    destination that never answers: control 0 holds the receipt (`assigned`) until it dies.
    Returns (receipt id, the held connection)."""
    c0, c1 = controls[0], controls[1]
    body = os.urandom(64 * 1024 + 5)
    create = json.dumps({"direction": "request", "size_bytes": len(body),
                         "sha256_hex": hashlib.sha256(body).hexdigest()}).encode()
    s, _, r = api(c0.api, "POST", "/api/v1/receipts", create, "application/json")
    if s != 201:
        raise SystemExit(f"receipt create answered {s}: {r[:200]!r}")
    rid = json.loads(r)["receipt_id"]
    s, _, r = api(c0.api, "PUT", f"/api/v1/receipts/{rid}/parts/1", body)
    if s != 200:
        raise SystemExit(f"receipt part answered {s}: {r[:200]!r}")
    s, _, r = api(c0.api, "POST", f"/api/v1/receipts/{rid}/complete", b"")
    if s != 200:
        raise SystemExit(f"receipt complete answered {s}: {r[:200]!r}")
    envelope = json.dumps({"method": "POST", "url": f"http://127.0.0.1:{stall_port}/stall",
                           "timeout_ms": 120000,
                           "body": {"mode": "receipt", "receipt_id": rid}}).encode()
    held = socket.create_connection(("127.0.0.1", c0.api))
    held.sendall(b"POST /api/v1/requests HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer "
                 + DEPLOYMENT_TOKEN.encode() + b"\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(envelope)}\r\n\r\n".encode() + envelope)
    deadline = time.monotonic() + 20
    while receipt_state(c1, rid) != "assigned":
        if time.monotonic() > deadline:
            raise SystemExit("the held receipt was never assigned")
        time.sleep(0.05)
    return rid, held


def receipt_state(c, rid):
    try:
        s, _, r = api(c.api, "GET", f"/api/v1/receipts/{rid}")
        return json.loads(r).get("state", "") if s == 200 else ""
    except (OSError, ValueError):
        return ""


def stalling_destination():
    """A listener that accepts and never answers."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held = []

    def run():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=run, daemon=True).start()
    return srv, srv.getsockname()[1]


def create_database(pg_admin_url, name):
    for sql in (f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}"):
        subprocess.run(["psql", "-q", "-d", pg_admin_url, "-c", sql], check=True,
                       stdout=subprocess.DEVNULL, env=dict(os.environ, PGOPTIONS="-c client_min_messages=warning"))


def one_size(args, n):
    db = f"fleet_{n}"
    create_database(args.pg_admin_url, db)
    db_url = args.pg_admin_url.rsplit("/", 1)[0] + "/" + db
    controls = [Control(args, i) for i in range(CONTROLS)]
    for c in controls:
        c.write_config(db_url)
    workers = []
    stall, stall_port = stalling_destination()
    try:
        # The first control commits the bootstrap snapshot; the others find it.
        for c in controls:
            c.start()
        workers = [Worker(args, i, controls) for i in range(n)]
        ids = {w.id for w in workers}
        log(f"N={n}: starting {n} workers")
        t0 = time.monotonic()
        for w in workers:
            w.start()
        # From the first worker's start: starting the processes is part of a cold start.
        cold = wait_all_connected(controls, ids, 120, t0)
        if cold is None:
            raise SystemExit(f"N={n}: not every worker connected to every control in 120 s")
        log(f"N={n}: all connected on {CONTROLS} controls after {cold:.2f} s")
        time.sleep(2)
        # At rest.
        t_idle = [cpu_ticks(c.proc.pid) for c in controls]
        time.sleep(args.idle_seconds)
        idle_pct = [(cpu_ticks(c.proc.pid) - t) / clk_tck() / args.idle_seconds * 100
                    for c, t in zip(controls, t_idle)]
        rss = [rss_kib(c.proc.pid) for c in controls]
        worker_rss = statistics.mean(rss_kib(w.proc.pid) for w in workers)
        # A rollout.
        acks, acked = rollout(controls, n, 61000)
        if acked < CONTROLS * n:
            log(f"N={n}: only {acked} of {CONTROLS * n} pairs acknowledged within 30 s")
        # Fixed load, then kill -9 of control 0 under it.
        offset = os.path.getsize(args.access_log)
        rid, held = held_receipt(controls, stall_port)
        load = Load(controls, args.upstream_port, args.rate)
        load_cpu = [cpu_ticks(c.proc.pid) for c in controls]
        load.start()
        time.sleep(args.load_seconds)
        ok_before, failed_before = load.snapshot()
        load_cpu = [(cpu_ticks(c.proc.pid) - t) / clk_tck() for c, t in zip(controls, load_cpu)]
        shares = access_counts(args.access_log, offset)
        killed_at = time.monotonic()
        controls[0].proc.send_signal(signal.SIGKILL)
        controls[0].proc.wait()
        recovered = None
        while time.monotonic() - killed_at < 60:
            if receipt_state(controls[1], rid) == "verified":
                recovered = time.monotonic() - killed_at
                break
            time.sleep(0.05)
        time.sleep(max(0.0, args.kill_seconds - (time.monotonic() - killed_at)))
        ok_after, failed_after = load.snapshot()
        held.close()
        # Control 0 again: until every worker is back on it, under the same load.
        controls[0].proc = None
        restart_t0 = time.monotonic()
        controls[0].start()
        # Measured from the process's start: its own start-up is part of the wait.
        restarted = wait_all_connected([controls[0]], ids, 120, restart_t0)
        load.finish()
        ok_end, failed_end = load.snapshot()

        def others(d):
            return sum(v for (ci, _), v in d.items() if ci != 0)

        survivors_failed = others(failed_end) - others(failed_before)
        survivors_ok = others(ok_end) - others(ok_before)
        per_control = [sum(v for (ci, _), v in ok_before.items() if ci == c.index)
                       for c in controls]
        total_ok = sum(ok_before.values())
        worker_counts = [shares.get(w.address, 0) for w in workers]
        line = {
            "workers": n,
            "cold_s": f"{cold:.2f}",
            "ack_p50_ms": f"{percentile(acks, 50) * 1000:.0f}" if acks else "none",
            "ack_p99_ms": f"{percentile(acks, 99) * 1000:.0f}" if acks else "none",
            "ack_max_ms": f"{max(acks) * 1000:.0f}" if acks else "none",
            "acked": f"{acked}/{CONTROLS * n}",
            "idle_cpu_pct": "/".join(f"{x:.1f}" for x in idle_pct),
            "rss_mib": "/".join(f"{x / 1024:.0f}" for x in rss),
            "worker_rss_mib": f"{worker_rss / 1024:.1f}",
            "load_rps": f"{total_ok / args.load_seconds:.0f}",
            "load_failed": sum(failed_before.values()),
            "per_control": "/".join(str(x) for x in per_control),
            "control_us_per_req": "/".join(
                f"{cpu / max(1, pc) * 1e6:.0f}" for cpu, pc in zip(load_cpu, per_control)),
            "workers_used": f"{sum(1 for x in worker_counts if x)}/{n}",
            "worker_min_med_max": f"{min(worker_counts)}/{statistics.median(worker_counts):.0f}/"
                                  f"{max(worker_counts)}",
            "kill_survivor_ok": survivors_ok,
            "kill_survivor_failed": survivors_failed,
            "receipt_back_s": f"{recovered:.2f}" if recovered is not None else "none",
            "restart_s": f"{restarted:.2f}" if restarted is not None else "none",
        }
        print("FLEETPROCS " + " ".join(f"{k}={v}" for k, v in line.items()), flush=True)
    finally:
        for w in workers:
            w.stop()
        for c in controls:
            c.stop()
        for w in workers:
            if w.proc:
                try:
                    w.proc.wait(30)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
        stall.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", required=True, help="the sortie binary")
    p.add_argument("--work", required=True, help="a scratch directory")
    p.add_argument("--pg-admin-url", required=True,
                   help="postgres://user@127.0.0.1:port/postgres of a private cluster")
    p.add_argument("--s3-port", type=int, required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--access-log", required=True, help="the upstream's access log")
    p.add_argument("--sizes", default="10 50 100")
    p.add_argument("--base-port", type=int, default=19100)
    p.add_argument("--heartbeat-ms", type=int, default=1000)
    p.add_argument("--idle-seconds", type=float, default=10)
    p.add_argument("--rate", type=float, default=50,
                   help="requests per second per control and ingress")
    p.add_argument("--load-seconds", type=float, default=10)
    p.add_argument("--kill-seconds", type=float, default=15,
                   help="how long the load runs on after the kill before control 0 restarts")
    args = p.parse_args()
    for n in (int(x) for x in args.sizes.split()):
        if not 1 <= n <= 250:
            raise SystemExit("sizes are 1 to 250 (one loopback source address each)")
        one_size(args, n)


if __name__ == "__main__":
    main()
