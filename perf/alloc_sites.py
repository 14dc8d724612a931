"""Allocation sites from `perf script -F ip,sym,srcline` output of allocator uprobes recorded
with call stacks (perf/proxy.sh, ALLOC_SITES=1).

Each sample is a block of frames, leaf first, each frame's source line on the line after it.
A sample is attributed to its first frame in the gateway's own crates (sortie, sortie_core,
sortie_io) with that frame's source line, and the frame just below it (what allocated: a
`Vec`, a `Box`, a `String`). Prints the sites by calls per request, largest first: samples over
--requests, scaled up to the --calls that perf stat counted in the same run (recording drops
samples under load; counting does not).
"""

import argparse
import collections
import re
import sys

OWN = re.compile(r"\bsortie(_core|_io)?::")
# The gateway's global allocator: the frame every allocation passes, never the site.
ALLOCATOR = re.compile(r"sortie_io::alloc::Allocator|__rustc::__rust_(alloc|realloc|alloc_zeroed)")
FRAME = re.compile(r"^\s*[0-9a-f]+ (.*)$")


def samples(lines):
    """Yields each sample as a list of [symbol, srcline] frames."""
    block = []
    for line in lines:
        if not line.strip():
            if block:
                yield block
            block = []
            continue
        m = FRAME.match(line)
        if m:
            block.append([clean(m.group(1)), ""])
        elif block:
            block[-1][1] = line.strip().replace(" (inlined)", "")
    if block:
        yield block


def clean(sym):
    sym = sym.replace(" (inlined)", "")
    sym = re.sub(r"::h[0-9a-f]{16}$", "", sym)
    sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
    return sym[:140]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument(
        "--calls",
        type=int,
        default=0,
        help="allocator calls counted in the same run: the sites are scaled to that total",
    )
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    sites = collections.Counter()
    total = 0
    for frames in samples(sys.stdin):
        total += 1
        own = [
            i
            for i, (sym, _) in enumerate(frames)
            if OWN.search(sym) and not ALLOCATOR.search(sym)
        ]
        if not own:
            sites["(outside the gateway's crates)"] += 1
            continue
        i = own[0]
        sym, line = frames[i]
        site = f"{sym} ({line})"
        if i > 0:
            site += "\n        allocates in " + frames[i - 1][0]
        sites[site] += 1
    if args.requests <= 0 or total == 0:
        print("(no samples)")
        return
    # perf drops samples when the recorder falls behind; the count (perf stat) does not. The
    # sites are scaled up to the counted total, as if the drops hit every site alike.
    scale = (args.calls / total if args.calls > 0 else 1) / args.requests
    print(f"{total} samples, {total / args.requests:.1f} per request before scaling")
    for site, n in sites.most_common(args.top):
        print(f"{n * scale:6.2f}  {site}")


if __name__ == "__main__":
    main()
