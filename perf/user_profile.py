#!/usr/bin/env python3
"""Where the gateway's user time goes, from a `perf record --call-graph dwarf` profile.

Reads `perf script -F ip,sym` output on stdin (one sample per block: the leaf frame first, then
its callers) and prints, over the samples whose leaf is in user space:

- self time grouped by component (the runtime, the allocator, copies, httparse, clock reads,
  the gateway's own code, the rest);
- the inclusive share of each stage of a proxied request (a sample counts for a stage when
  any frame of its stack is in it);
- the first caller of the copy routines and of the allocator outside the standard library
  and the allocator itself (the gateway's code, or a crate's it calls).

Used by `proxy.sh PROFILE=1 PROFILE_CALL_GRAPH=dwarf`; see perf/README.md. The shares are of
user samples only: kernel time is in the profile's own table.
"""

import collections
import re
import sys

ALLOCATOR = r"\bmi_|_mi_|mimalloc|__rust_alloc|__rust_dealloc|__rust_realloc|sortie_io::alloc|\bmalloc|\bfree\b"
COPIES = r"memmove|memcpy|memset"

# Self time: the first group whose pattern the leaf's symbol matches.
GROUPS = [
    ("runtime (monoio tasks, wakers, driver)", r"monoio|flume|RawWaker|[Ww]aker"),
    ("httparse", r"httparse"),
    ("allocator", ALLOCATOR),
    ("copies (memmove, memcpy, memset)", COPIES),
    ("clock reads", r"clock_gettime|vdso"),
    ("bytes, Rc, Arc", r"^bytes::|<bytes::|alloc::rc::|alloc::sync::"),
    ("the gateway's own code", r"sortie"),
]

# Inclusive stages of a proxied request, by a symbol on the stack.
STAGES = [
    ("request head parse", r"parse_request_head_with"),
    ("target URL parse", r"parse_target_url"),
    ("routing hints", r"proxy::route_hints"),
    ("routing and assignment", r"dispatch::assign"),
    ("  of which the rule and worker choice", r"RoutingTable::route"),
    ("connection from the pool", r"Pool::checkout"),
    ("upstream request head written", r"streaming::stream_head"),
    ("upstream request write", r"streaming::write_from"),
    ("response head read", r"client::read_head"),
    ("response head parse", r"parse_response_head_offsets"),
    ("relayed fields chosen", r"proxy::relay_fields"),
    ("response head encoded", r"encode_head_for"),
    ("response written to the client", r"conn::write_stream"),
    ("connection back to the pool", r"Pool::put"),
    ("metrics", r"Metrics::record"),
    ("proxy credentials", r"tokens::secrets_equal"),
    ("coarse timers: registration", r"Timer::is_due|timer::register|Wheel::register|timer::check"),
    ("coarse timers: cancel", r"Timer as core::ops::drop|timer::cancel|Wheel::cancel"),
    ("coarse clock", r"timer::now|tick_after|tick_of|coarse_ns"),
    ("idle read's cancel handle (monoio)", r"CancelHandle|AssociateGuard"),
    ("idle-close latch", r"LatchWait"),
    ("runtime park (completions, timers)", r"TimeDriver.*park|inner_park"),
]

# Frames skipped when looking for the caller of a copy or an allocation: the standard
# library's and the allocator's own.
SKIP = re.compile(
    r"^core::|^alloc::|<alloc::|__rustc::|_mi_|^mi_|mimalloc|<core::|<(T|str) as alloc|"
    r"<F as core::future|copy_from_slice|extend_from|memmove|memcpy|memset|GlobalAlloc"
)


def samples(text):
    for block in re.split(r"\n\s*\n", text):
        frames = []
        for line in block.strip().split("\n"):
            line = line.strip()
            if not line:
                continue
            ip, _, sym = line.partition(" ")
            frames.append((ip, sym.strip()))
        if frames:
            yield frames


def first_caller(frames):
    for _, sym in frames[1:]:
        if not SKIP.search(sym):
            return sym
    return "(none)"


def main():
    text = sys.stdin.read()
    user = 0
    groups = collections.Counter()
    stages = collections.Counter()
    copy_callers = collections.Counter()
    alloc_callers = collections.Counter()
    copy_re = re.compile(COPIES)
    alloc_re = re.compile(ALLOCATOR)
    for frames in samples(text):
        leaf_ip = frames[0][0]
        if leaf_ip.startswith("ffffffff"):
            continue
        user += 1
        # The function the sample's instruction is in: frames inlined into it come first,
        # with the same address.
        leaf = next(
            (sym for ip, sym in frames if ip == leaf_ip and not sym.endswith("(inlined)")),
            frames[0][1],
        )
        for label, pattern in GROUPS:
            if re.search(pattern, leaf):
                groups[label] += 1
                break
        else:
            groups["the rest (libc, std)"] += 1
        stack = " | ".join(sym for _, sym in frames)
        for label, pattern in STAGES:
            if re.search(pattern, stack):
                stages[label] += 1
        if copy_re.search(leaf):
            copy_callers[re.sub(r" \(inlined\)$", "", first_caller(frames))] += 1
        elif alloc_re.search(leaf):
            alloc_callers[re.sub(r" \(inlined\)$", "", first_caller(frames))] += 1
    if user == 0:
        print("no user-space samples")
        return
    pct = lambda n: 100.0 * n / user  # noqa: E731
    print(f"user-space samples: {user}")
    print("self time by component (share of user samples):")
    for label, n in groups.most_common():
        print(f"  {pct(n):5.1f}%  {label}")
    print("inclusive by stage (a sample counts for each stage on its stack):")
    for label, _ in STAGES:
        print(f"  {pct(stages[label]):5.1f}%  {label}")
    for title, callers in (("copies", copy_callers), ("allocator", alloc_callers)):
        total = sum(callers.values())
        print(f"first callers of the {title} ({total} samples):")
        for sym, n in callers.most_common(10):
            print(f"  {100.0 * n / total:5.1f}%  {sym[:110]}")


if __name__ == "__main__":
    main()
