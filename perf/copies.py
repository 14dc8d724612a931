#!/usr/bin/env python3
"""The calls of a function per request, by the source line they were made from, from one
callgrind dump: by default the calls of `memcpy`, sorted by instructions per request.

A large copy made once per request is most often a future or a struct moved by value: a future
built in an argument position and then moved into `select!`, a time limit or a box. Callgrind
counts a `rep movsb` copy one step per byte, so `instructions per call` reads as bytes moved
(about one per byte, plus a few dozen of setup).

    copies.py DUMP REQUESTS                      # memcpy call sites, largest share first
    copies.py DUMP REQUESTS --callee malloc      # or those of another function
    copies.py DUMP REQUESTS --min 20 --top 25

The dump is one of `proxy.sh CALLGRIND=1 KEEP_WORK_DIR=1` or `bus.sh CALLGRIND=1
KEEP_WORK_DIR=1` (either position format); REQUESTS is the count the script printed beside it.
Prints, per call site: instructions per request, calls per request, instructions per call, the
source line (inlined code by its own file) and the function the call was compiled into.
"""

import argparse
import collections

# The dump's cost lines, read as the footprint script reads them (run from this directory
# or as `perf/copies.py`: the script's own directory is on the import path).
from footprint import cost_lines


def call_sites(path, callee):
    """(caller, source file, line) -> [instructions, calls] of the calls into `callee`."""
    sites = collections.defaultdict(lambda: [0, 0])
    for fn, src, line, cfn, calls, cost in cost_lines(path):
        if calls is not None and cfn and callee in cfn:
            site = sites[(fn, src, line)]
            site[0] += cost
            site[1] += calls
    return sites


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump")
    p.add_argument("requests", type=float)
    p.add_argument("--callee", default="memcpy")
    p.add_argument("--min", type=float, default=20, help="instructions per request to list")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    rows = []
    for (fn, src, line), (cost, calls) in call_sites(a.dump, a.callee).items():
        per_request = cost / a.requests
        if per_request >= a.min:
            where = "/".join((src or "?").split("/")[-2:])
            rows.append((per_request, calls / a.requests, cost / max(calls, 1), where, line, fn))
    rows.sort(key=lambda r: -r[0])
    print(f"{'instr/req':>9} {'calls/req':>9} {'instr/call':>10}  source line  (in function)")
    for per_request, calls, per_call, where, line, fn in rows[: a.top]:
        print(f"{per_request:9.0f} {calls:9.2f} {per_call:10.0f}  {where}:{line}  ({(fn or '?')[:90]})")


if __name__ == "__main__":
    main()
