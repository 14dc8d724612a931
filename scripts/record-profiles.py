#!/usr/bin/env python3
"""Records built-in browser profiles from curl_cffi's impersonation targets.

Two `sortie fingerprints --capture` servers run for the whole recording (one offering h2 and
http/1.1, one http/1.1 only), and curl_cffi connects to them for each target: twelve times over
HTTP/2 (the strings must agree; differing extension orders mean the browser shuffles them, a
padding extension that comes and goes is stated as such), the first of them with libcurl's
verbose log on (the request header names in the order sent), and once over HTTP/1.1 (the same
names read off the wire, as a cross-check). What the capture saw becomes
`core/profiles/<name>.toml`; the build compiles it in, and the profile tests and `sortie
fingerprints --verify` check it (decision 100).

    python3 scripts/record-profiles.py [--sortie target/debug/sortie] [TARGET ...]

Without targets it records every target of the table below that has no hand-kept file. Needs
curl_cffi (`scripts/ci-deps.sh` installs the pinned version).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import curl_cffi
from curl_cffi import requests as cr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILES = os.path.join(ROOT, "core", "profiles")

# curl_cffi target -> (profile name, browser, family, version).
TARGETS = {
    "chrome99": ("chrome_99", "Chrome 99", "chrome", "99"),
    "chrome100": ("chrome_100", "Chrome 100", "chrome", "100"),
    "chrome101": ("chrome_101", "Chrome 101", "chrome", "101"),
    "chrome104": ("chrome_104", "Chrome 104", "chrome", "104"),
    "chrome107": ("chrome_107", "Chrome 107", "chrome", "107"),
    "chrome110": ("chrome_110", "Chrome 110", "chrome", "110"),
    "chrome116": ("chrome_116", "Chrome 116", "chrome", "116"),
    "chrome119": ("chrome_119", "Chrome 119", "chrome", "119"),
    "chrome120": ("chrome_120", "Chrome 120", "chrome", "120"),
    "chrome123": ("chrome_123", "Chrome 123", "chrome", "123"),
    "chrome124": ("chrome_124", "Chrome 124", "chrome", "124"),
    "chrome131": ("chrome_131", "Chrome 131", "chrome", "131"),
    "chrome133a": ("chrome_133a", "Chrome 133 (variant A)", "chrome", "133"),
    "chrome136": ("chrome_136", "Chrome 136", "chrome", "136"),
    "chrome142": ("chrome_142", "Chrome 142", "chrome", "142"),
    "chrome145": ("chrome_145", "Chrome 145", "chrome", "145"),
    "chrome146": ("chrome_146", "Chrome 146", "chrome", "146"),
    "chrome150": ("chrome_150", "Chrome 150", "chrome", "150"),
    "chrome99_android": ("chrome_android_99", "Chrome 99 on Android", "chrome_android", "99"),
    "chrome131_android": ("chrome_android_131", "Chrome 131 on Android", "chrome_android", "131"),
    "edge99": ("edge_99", "Edge 99", "edge", "99"),
    "edge101": ("edge_101", "Edge 101", "edge", "101"),
    "safari153": ("safari_15_3", "Safari 15.3", "safari", "15.3"),
    "safari155": ("safari_15_5", "Safari 15.5", "safari", "15.5"),
    "safari170": ("safari_17_0", "Safari 17.0", "safari", "17.0"),
    "safari180": ("safari_18_0", "Safari 18.0", "safari", "18.0"),
    "safari184": ("safari_18_4", "Safari 18.4", "safari", "18.4"),
    "safari260": ("safari_26_0", "Safari 26.0", "safari", "26.0"),
    "safari2601": ("safari_26_0_1", "Safari 26.0.1", "safari", "26.0.1"),
    "safari172_ios": ("safari_ios_17_2", "Safari 17.2 on iOS", "safari_ios", "17.2"),
    "safari180_ios": ("safari_ios_18_0", "Safari 18.0 on iOS", "safari_ios", "18.0"),
    "safari184_ios": ("safari_ios_18_4", "Safari 18.4 on iOS", "safari_ios", "18.4"),
    "safari260_ios": ("safari_ios_26_0", "Safari 26.0 on iOS", "safari_ios", "26.0"),
    "firefox133": ("firefox_133", "Firefox 133", "firefox", "133"),
    "firefox135": ("firefox_135", "Firefox 135", "firefox", "135"),
    "firefox144": ("firefox_144", "Firefox 144", "firefox", "144"),
    "firefox147": ("firefox_147", "Firefox 147", "firefox", "147"),
    "tor145": ("tor_14_5", "Tor Browser 14.5", "tor", "14.5"),
}

# curl_cffi's older spellings of the same targets, accepted as aliases too.
EXTRA_ALIASES = {
    "safari153": ["safari15_3"],
    "safari155": ["safari15_5"],
    "safari170": ["safari17_0"],
    "safari172_ios": ["safari17_2_ios"],
    "safari180": ["safari18_0"],
    "safari180_ios": ["safari18_0_ios"],
}

# Targets whose ClientHello the BoringSSL that btls builds cannot send, with the reason: the
# profile is recorded and listed, never advertised (decision 100).
UNSUPPORTED = {
    "chrome150": "Chrome 150 offers the ML-DSA signature algorithms 0x0904, 0x0905 and 0x0906 "
    "first in signature_algorithms; the BoringSSL that btls 0.5.6 builds does not know them and "
    "refuses any list that names them, and no other setting puts them on the wire (decision 100)",
}

# Files kept by hand (their source line says why); recorded only when named explicitly.
HAND_KEPT = {"chrome131", "firefox133"}

# Connections per target: enough to see extensions shuffled and padding come and go.
CONNECTIONS = 12
PADDING = 21

GREASE = lambda v: (v & 0x0F0F) == 0x0A0A and (v >> 8) == (v & 0xFF)


class Capture:
    """A running `sortie fingerprints --capture`."""

    def __init__(self, sortie, http1):
        self.dir = tempfile.mkdtemp(prefix="sortie-record-")
        self.ca = os.path.join(self.dir, "ca.pem")
        args = [sortie, "fingerprints", "--capture", "--ca-out", self.ca]
        if http1:
            args.append("--http1")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        if line[:1] != ["listening"]:
            sys.exit(f"the capture server did not start: {line}")
        self.port = int(line[1].rsplit(":", 1)[1])

    def next(self):
        line = self.proc.stdout.readline()
        if not line:
            sys.exit("the capture server stopped")
        c = json.loads(line)
        if "error" in c:
            sys.exit(f"capture: {c['error']}")
        return c

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def fetch(target, port):
    r = cr.get(f"https://localhost:{port}/", impersonate=target, verify=False, timeout=20)
    if r.status_code != 200:
        sys.exit(f"{target}: the capture server answered {r.status_code}")


def h2_header_names(target, port):
    """One request with libcurl's verbose log on (in a child process, whose stderr it is):
    the log names every HTTP/2 request field in the order libcurl encodes it. Reading the
    capture's HPACK block instead would need HPACK's Huffman code."""
    code = (
        "import curl_cffi.requests as r\n"
        f"r.get('https://localhost:{port}/', impersonate='{target}', verify=False, "
        "timeout=20, debug=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    names = []
    for line in (out.stdout + out.stderr).splitlines():
        m = re.match(r"^\* \[HTTP/2\] \[1\] \[([^:\]][^:\]]*): ", line)
        if m:
            names.append(m.group(1).lower())
    if not names:
        sys.exit(f"{target}: libcurl's verbose log named no HTTP/2 request field")
    return names


def is_subsequence(short, long):
    it = iter(long)
    return all(x in it for x in short)


def hexes(values):
    return "[" + ", ".join(f"0x{v:04x}" for v in values) + "]"


def strings(values):
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def record(target, h2, h1):
    name, browser, family, version = TARGETS[target]
    headers = h2_header_names(target, h2.port)
    caps = [h2.next()]
    for _ in range(CONNECTIONS - 1):
        fetch(target, h2.port)
        caps.append(h2.next())
    # BoringSSL pads a ClientHello of 256-511 bytes; a randomly sized ECH GREASE payload moves
    # some browsers' hellos across that bound, so padding comes and goes: such a profile states
    # its strings without padding (`padding_varies`).
    padded = {PADDING in c["tls"]["extensions"] for c in caps}
    padding_varies = len(padded) > 1
    strings_of = (lambda c: c["unpadded"]) if padding_varies else (lambda c: c)
    for key in ("ja4", "ja4_r", "ja3n"):
        if len({strings_of(c)[key] for c in caps}) != 1:
            sys.exit(f"{target}: {key} differs between connections: {[c[key] for c in caps]}")
    if len({(c["http2"] or {}).get("akamai") for c in caps}) != 1:
        sys.exit(f"{target}: the Akamai string differs between connections")
    # The same request over HTTP/1.1, read off the wire: its names must come in the same order
    # (HTTP/2 may add some, such as `priority`).
    fetch(target, h1.port)
    wire = h1.next()["header_names"]
    if not is_subsequence(wire, headers):
        sys.exit(f"{target}: HTTP/1.1 order {wire} is not the HTTP/2 order {headers}")
    c = caps[0]
    t = c["tls"]
    h = c["http2"]
    if h is None or c["alpn_chosen"] != "h2":
        sys.exit(f"{target}: did not speak HTTP/2")
    if h["window_update"] is None:
        sys.exit(f"{target}: no connection WINDOW_UPDATE (the profile format needs one)")
    skip = lambda x: GREASE(x) or (padding_varies and x == PADDING)
    orders = {tuple(x for x in cap["tls"]["extensions"] if not skip(x)) for cap in caps}
    permute = len(orders) > 1
    extensions = [x for x in t["extensions"] if not skip(x)]
    if permute:
        extensions = sorted(extensions)
    drop = lambda xs: [x for x in xs if not GREASE(x)]
    lines = [
        f"# {browser}, recorded from curl_cffi {curl_cffi.__version__} (target `{target}`) by",
        "# scripts/record-profiles.py: the capture server's view of its connections.",
        f'name = "{name}"',
        f'browser = "{browser}"',
        f'family = "{family}"',
        f'version = "{version}"',
        f"aliases = {strings([target] + EXTRA_ALIASES.get(target, []))}",
        f'source = "curl_cffi {curl_cffi.__version__} target {target}, recorded on loopback"',
    ]
    if target in UNSUPPORTED:
        lines.append(f"unsupported = {json.dumps(UNSUPPORTED[target])}")
    lines += [
        f"header_order = {strings(headers)}",
        "",
        "[tls]",
        f"ciphers = {hexes(drop(t['ciphers']))}",
        f"grease = {'true' if any(GREASE(x) for x in t['ciphers']) else 'false'}",
        f"groups = {hexes(drop(t['groups']))}",
        f"key_shares = {hexes(drop(t['key_shares']))}",
        f"signature_algorithms = {hexes(t['signature_algorithms'])}",
        f"versions = {hexes(drop(t['supported_versions']))}",
        f"alpn = {strings(t['alpn'])}",
        f"extensions = [{', '.join(str(x) for x in extensions)}]",
        f"permute_extensions = {'true' if permute else 'false'}",
        f"cert_compression = {hexes(t['cert_compression'])}",
        f"delegated_credentials = {hexes(t['delegated_credentials'])}",
    ]
    if t["record_size_limit"] is not None:
        lines.append(f"record_size_limit = {t['record_size_limit']}")
    if padding_varies:
        lines.append("padding_varies = true")
    frames = ", ".join(
        "{ stream = %d, exclusive = %s, depends_on = %d, weight = %d }"
        % (p["stream"], str(p["exclusive"]).lower(), p["depends_on"], p["weight"])
        for p in h["priority_frames"]
    )
    lines += [
        "",
        "[http2]",
        "settings = [" + ", ".join(f"[{i}, {v}]" for i, v in h["settings"]) + "]",
        f"connection_window = {h['window_update'] + 65535}",
        f"priority_frames = [{frames}]",
        f'pseudo_order = "{"".join(p[0] for p in h["pseudo_headers"])}"',
    ]
    hp = h["headers_priority"]
    if hp is not None:
        lines.append(
            "headers_priority = { exclusive = %s, depends_on = %d, weight = %d }"
            % (str(hp["exclusive"]).lower(), hp["depends_on"], hp["weight"])
        )
    lines += [
        "",
        "[expected]",
        f'ja4 = "{strings_of(c)["ja4"]}"',
        f'ja4_r = "{strings_of(c)["ja4_r"]}"',
        f'ja3n = "{strings_of(c)["ja3n"]}"',
        f'akamai = "{h["akamai"]}"',
        "",
    ]
    path = os.path.join(PROFILES, f"{name}.toml")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    note = "  (padding varies)" if padding_varies else ""
    print(f"{target:20} -> {name:20} {strings_of(c)['ja4']}  {h['akamai']}{note}")


def accepted_names():
    """Every name a request may give: each profile's name and aliases, and each family's name
    for its newest profile (as core/build.rs computes them)."""
    import tomllib

    names, newest = [], {}
    key = lambda v: [int(x) for x in v.split(".")]
    for f in sorted(os.listdir(PROFILES)):
        if not f.endswith(".toml"):
            continue
        with open(os.path.join(PROFILES, f), "rb") as fh:
            p = tomllib.load(fh)
        names += [p["name"]] + p.get("aliases", [])
        n = newest.get(p["family"])
        if "unsupported" in p:
            continue
        if n is None or key(p["version"]) > key(n["version"]):
            newest[p["family"]] = p
    return sorted(names + list(newest))


def update_openapi():
    """Writes the accepted names into the request API's OpenAPI document (its test checks
    them against the compiled catalogue)."""
    path = os.path.join(ROOT, "docs", "openapi", "api.json")
    with open(path) as f:
        doc = json.load(f)
    field = doc["components"]["schemas"]["RequestEnvelope"]["properties"]["fingerprint_profile"]
    field["enum"] = accepted_names()
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sortie", default=os.path.join(ROOT, "target", "debug", "sortie"))
    ap.add_argument("--openapi-only", action="store_true", help="only rewrite the OpenAPI names")
    ap.add_argument("targets", nargs="*")
    args = ap.parse_args()
    if args.openapi_only:
        update_openapi()
        return
    targets = args.targets or [t for t in TARGETS if t not in HAND_KEPT]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        sys.exit(f"unknown targets {unknown}: add them to TARGETS first")
    h2, h1 = Capture(args.sortie, False), Capture(args.sortie, True)
    try:
        for t in targets:
            record(t, h2, h1)
    finally:
        h2.stop()
        h1.stop()
    update_openapi()


if __name__ == "__main__":
    main()
