#!/usr/bin/env python3
"""Hot code footprint and simulated cache misses per request, from one callgrind dump.

The dump must come from `valgrind --tool=callgrind --dump-instr=yes --compress-pos=no`
(`proxy.sh CACHE_SIM=1` adds `--cache-sim=yes` too). A 64-byte line of code is *hot* when the
instructions executed in it, over the dump, reach THRESHOLD per request (default 0.5): the code a
request runs through, which the CPU fetches into its 32-64 KiB instruction cache again after every
kernel entry evicted it.

    footprint.py DUMP REQUESTS                 # one summary line
    footprint.py DUMP REQUESTS --top 30        # and the functions with the most hot lines
    footprint.py DUMP REQUESTS --files 30      # and the source files (inlined code by its own)

Prints `hot_code_kib=… i1_misses=… d1_misses=… per request` (the misses only when the dump has
the cache simulation's events).
"""

import argparse
import collections
import re
import sys

NAMED = re.compile(r"\((\d+)\)(?: (.*))?")


def name_of(text, table):
    """Callgrind's name compression: `(id) name` defines, `(id)` refers."""
    m = NAMED.match(text)
    if not m:
        return text
    if m.group(2):
        table[m.group(1)] = m.group(2)
    return table.get(m.group(1), "?")


def cost_lines(path):
    """Each cost line of a dump, positions in lines or in instructions and lines, as (function,
    source file, line, callee, calls, instructions): `callee` and `calls` name the call the
    cost is of (its inclusive cost), or are None for the function's own instructions."""
    fns, files = {}, {}
    fn = src = file = cfn = None
    calls = None
    line = 0
    instr_first = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            text = raw.rstrip("\n")
            if text.startswith("positions:"):
                instr_first = text.split()[1:2] == ["instr"]
            elif text.startswith("fn="):
                fn = name_of(text[3:], fns)
                src = file
            elif text.startswith("fl="):
                file = src = name_of(text[3:], files)
            elif text.startswith(("fi=", "fe=")):
                src = name_of(text[3:], files)
            elif text.startswith("cfn="):
                cfn = name_of(text[4:], fns)
            elif text.startswith(("cfi=", "cfl=")):
                name_of(text[4:], files)
            elif text.startswith("calls="):
                calls = int(text[6:].split()[0])
            elif text and (text[0].isdigit() or text[0] in "+-*"):
                parts = text.split()
                pos = parts[1] if instr_first and len(parts) > 1 else parts[0]
                if pos == "*":
                    pass
                elif pos[0] in "+-":
                    line += int(pos)
                elif pos.startswith("0x"):
                    line = int(pos, 16)
                else:
                    line = int(pos)
                at = 2 if instr_first else 1
                cost = int(parts[at]) if len(parts) > at else 0
                if calls is not None:
                    yield fn, src, line, cfn, calls, cost
                    calls = None
                else:
                    yield fn, src, line, None, None, cost


def read(path):
    events = []
    fns, files = {}, {}
    cost = collections.Counter()  # (object, line of code) -> instructions
    owner = collections.defaultdict(collections.Counter)  # line of code -> (fn, file) -> instructions
    totals = None
    obj = fn = file = src = None
    after_call = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("positions:") and line.split()[1:] != ["instr", "line"]:
                sys.exit("footprint.py: the dump needs --dump-instr=yes --compress-pos=no")
            elif line.startswith("totals:") or line.startswith("summary:"):
                totals = [int(v) for v in line.split()[1:]]
            elif line.startswith("ob="):
                obj = line[3:]
            elif line.startswith("fl="):
                file = src = name_of(line[3:], files)
            elif line.startswith(("fi=", "fe=")):
                src = name_of(line[3:], files)
            elif line.startswith("fn="):
                fn = name_of(line[3:], fns)
                src = file
            elif line.startswith("cfn="):
                name_of(line[4:], fns)
            elif line.startswith(("cfi=", "cfl=")):
                name_of(line[4:], files)
            elif line.startswith("calls="):
                after_call = True
            elif line.startswith("0x"):
                if after_call:
                    # The cost of a call, inclusive of the callee: not this line's own.
                    after_call = False
                    continue
                parts = line.split()
                if len(parts) < 3:
                    continue
                key = (obj, int(parts[0], 16) >> 6)
                ir = int(parts[2])
                cost[key] += ir
                owner[key][(fn, src)] += ir
    return events, totals, cost, owner


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump")
    p.add_argument("requests", type=float)
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--top", type=int, default=0)
    p.add_argument("--files", type=int, default=0)
    a = p.parse_args()
    events, totals, cost, owner = read(a.dump)
    n = a.requests
    hot = [k for k, v in cost.items() if v / n >= a.threshold]
    out = [f"hot_code_kib={len(hot) * 64 / 1024:.1f}"]
    if totals and "I1mr" in events:
        per = dict(zip(events, totals))
        out.append(f"i1_misses={per['I1mr'] / n:.0f}")
        out.append(f"d1_misses={(per['D1mr'] + per['D1mw']) / n:.0f}")
    print(" ".join(out) + " per request")
    for count, what in ((a.top, 0), (a.files, 1)):
        if not count:
            continue
        tally = collections.Counter()
        for k in hot:
            (fn, src), _ = owner[k].most_common(1)[0]
            tally[(fn, src)[what] or "?"] += 1
        for name, lines in tally.most_common(count):
            print(f"{lines * 64 / 1024:7.1f} KiB  {name[:150]}")


if __name__ == "__main__":
    main()
