#!/usr/bin/env python3
"""What the request path's async functions spend on being futures, from one callgrind dump.

For each of the gateway's async functions (a `{{closure}}` of `sortie_io` or `sortie_core`, the
state machine the compiler made of it): its own instructions per request, and the part of them
on lines that are there because it is a future: its resume points (a line with `.await`), its
entry and exit (the `async fn` line, a closing brace, line 0), and the moves of its state
(`ptr::read`, `ptr::write`, `mem::replace` and the like, inlined from the standard library).
Then the copies (`memcpy`, `memset`) and the drops of futures (`drop_in_place<...{{closure}}>`)
those functions call. Their sum is about what a request path without these futures could save
at most (decision 136); the rest of each function's count is the work it does.

    future_lines.py DUMP REQUESTS SOURCE_ROOT            # the functions, largest first
    future_lines.py DUMP REQUESTS SOURCE_ROOT --top 40 --min 10

SOURCE_ROOT is the repository the binary was built from (the lines are read from its files, by
the relative paths callgrind recorded, `io/...` and `core/...` from their crates' directories).
The dump is one of `proxy.sh CALLGRIND=1 KEEP_WORK_DIR=1` or `bus.sh CALLGRIND=1
KEEP_WORK_DIR=1` (either position format); REQUESTS is the count the script printed beside it.
The classification reads source text, so it is an estimate: a resume point that also does work
on its line counts whole.
"""

import argparse
import collections
import os
import re

# The dump's cost lines, read as the footprint script reads them.
from footprint import cost_lines

OWN = ("sortie_io::", "sortie_core::", "<sortie_io::", "<sortie_core::")
STD_MOVES = ("ptr/mod.rs", "mem/mod.rs", "ptr/non_null.rs", "mem/maybe_uninit.rs", "pin.rs")
ASYNC_FN = re.compile(r"\s*(pub(\([a-z]+\))?\s+)?async fn ")
EXITS = {"}", "};", "})", "}));", "},"}


def is_own_future(fn):
    return fn is not None and fn.startswith(OWN) and "{{closure}}" in fn


def read(path):
    """Self cost by (function, source file, line), and each function's calls into callees."""
    own = collections.defaultdict(collections.Counter)
    called = collections.defaultdict(collections.Counter)
    for fn, src, line, cfn, calls, cost in cost_lines(path):
        if not is_own_future(fn):
            continue
        if calls is not None:
            called[fn][cfn] += cost
        else:
            own[fn][(src, line)] += cost
    return own, called


class Sources:
    def __init__(self, root):
        self.root = root
        self.cache = {}

    def line(self, path, number):
        if path not in self.cache:
            text = None
            for base in ("", "io", "core"):
                candidate = path if os.path.isabs(path) else os.path.join(self.root, base, path)
                if os.path.isfile(candidate):
                    with open(candidate, encoding="utf-8", errors="replace") as f:
                        text = f.read().split("\n")
                    break
            self.cache[path] = text
        lines = self.cache[path]
        if lines is None or not 1 <= number <= len(lines):
            return None
        return lines[number - 1]


def is_machinery(sources, src, number):
    if number == 0:
        return True
    src = src or ""
    if any(src.endswith(m) for m in STD_MOVES):
        return True
    text = sources.line(src, number)
    if text is None:
        return False
    return ".await" in text or bool(ASYNC_FN.match(text)) or text.strip() in EXITS


def is_future_copy(callee):
    callee = callee or ""
    return "memcpy" in callee or "memset" in callee or (
        callee.startswith("core::ptr::drop_in_place<") and "{{closure}}" in callee
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump")
    p.add_argument("requests", type=float)
    p.add_argument("source_root")
    p.add_argument("--min", type=float, default=20, help="instructions per request to list")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    sources = Sources(a.source_root)
    own, called = read(a.dump)
    rows = []
    all_own = all_machinery = all_copies = 0
    for fn, lines in own.items():
        total = sum(lines.values())
        machinery = sum(c for (src, n), c in lines.items() if is_machinery(sources, src, n))
        copies = sum(c for callee, c in called[fn].items() if is_future_copy(callee))
        all_own += total
        all_machinery += machinery
        all_copies += copies
        if total / a.requests >= a.min:
            rows.append((total, machinery, copies, fn))
    rows.sort(key=lambda r: -r[0])
    per = a.requests
    print(f"{'own':>8} {'future':>8} {'copies':>8}  async function (instructions per request)")
    for total, machinery, copies, fn in rows[: a.top]:
        print(f"{total / per:8.0f} {machinery / per:8.0f} {copies / per:8.0f}  {fn[:100]}")
    print(
        f"all: {all_own / per:.0f} own, {all_machinery / per:.0f} on being a future, "
        f"{all_copies / per:.0f} in copies and drops of futures"
    )


if __name__ == "__main__":
    main()
