#!/usr/bin/env python3
"""The futures of `async fn`s whose state before the first poll spans many bytes.

Reads the output of `rustc -Zprint-type-sizes` (nightly) and lists, for each `async fn` body,
its whole size and the size of its `Unresumed` variant: the bytes from the start of the future
to the end of its arguments. A future is moved between being built and being polled (into a
`pin!`, a `Race`, a spawned task), and the compiler copies that span whole, padding included.
The compiler lays some arguments out after the fields the future keeps across its waits (one
of smaller alignment than theirs, such as a byte array by value, among them), so a function
with a large state and one such argument copies its whole state on each move.

    future_sizes.py SIZES_TXT [--min BYTES] [--match REGEX]

Prints `unresumed whole name`, largest first; `--min` (default 512) drops the smaller ones,
`--match` keeps the names that match (default: the request path's modules).
"""

import argparse
import re

TYPE = re.compile(r"print-type-size type: `\{async fn body of (.*)\}`: (\d+) bytes")
UNRESUMED = re.compile(r"print-type-size\s+variant `Unresumed`: (\d+) bytes")
REQUEST_PATH = r"^(<)?(http|ingress|dispatch|egress|remote|worker|bus)::"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes")
    ap.add_argument("--min", type=int, default=512)
    ap.add_argument("--match", default=REQUEST_PATH)
    args = ap.parse_args()
    keep = re.compile(args.match)
    rows = {}
    current = None
    with open(args.sizes, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = TYPE.match(line)
            if m:
                current = (m.group(1), int(m.group(2)))
                continue
            m = UNRESUMED.match(line)
            if m and current:
                name, whole = current
                rows[name] = (int(m.group(1)), whole)
                current = None
    shown = sorted(
        ((u, w, n) for n, (u, w) in rows.items() if u >= args.min and keep.search(n)),
        reverse=True,
    )
    print(f"{'unresumed':>9} {'whole':>6}  async fn (bytes; moved before the first poll, the"
          " unresumed span is copied)")
    for u, w, n in shown:
        print(f"{u:9} {w:6}  {n}")


if __name__ == "__main__":
    main()
