"""Which part of a busy stream makes an event pair cost more than the calibration's held-and-primed pair: events
against CUPTI on the same activities (an events scope nested in a CUPTI-source scope, nothing learned from CUPTI
scopes), per sequence of work queued behind a 3 ms spin (so the GPU never waits for the host), per hold policy.

Sequences: one kind of work repeated (spins of 5, 20 and 50 µs; memsets and ``inc_loop`` on 1 MB and on 40 MB),
kinds in turn (memset, inc_loop, spin: on 1 MB; on 40 MB; on 40 MB 20 times, `bench_accuracy`'s busy stream), 20 µs
spins in turn with 40 MB memsets or ``inc_loop`` (which side of a memory-heavy activity costs the pair more: the
light spin after it, or the heavy work after a spin), memsets and ``inc_loop`` on 4, 16 and 160 MB (does the held
pair's bias on memory-heavy work grow with the bytes moved, or is it a step?), copies between device buffers of 40
and 4 MB (alone, and each behind a 200 µs spin), spins on two streams of the device in turn, and a spin on an idle
GPU. Against asyncgpu's CUPTI source (an outer scope per round), torch.profiler (one profile around a sequence's
rounds), or (``apart``) CUPTI in rounds of its own, compared as distributions: CUPTI's instrumentation of an
activity is then in no event pair. Each row: a kind, or a kernel by name; activities; events − CUPTI p10 / p50 / p90
(µs); the p50 of the first activity behind the lead spin apart from the rest; the largest; how many read more than 1
µs off; and, for the slowest tenth against CUPTI (its own scope only), the median of their start and of their end
differences, less the round's median start difference: which side of the pair the tail's excess sits on.

    python dev/diag_busy_pair.py [--rounds 5] [--holds always,never] [--reference cupti,torch,apart] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import sys as _sys
import tempfile
from collections import defaultdict
from collections.abc import Callable

import numpy as np

import asyncgpu
from asyncgpu._base.records import KINDS

_sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to
from benchmarks.bench_accuracy import _hold, trace_activities

N = 20  #: activities per sequence


def _pairs(inner: asyncgpu.Timeline, outer: asyncgpu.Timeline) -> list[tuple[str, str, int, float]] | str:
    """``(kind, name, position among its stream's activities of that kind, events − CUPTI ns)`` per activity of
    ``inner`` (its name as ``inner`` has it), matched with ``outer``'s by stream and kind in issue order; a string
    saying why not where the counts differ. Each activity's start and end differences (events − CUPTI, less their
    round's medians: the two clocks' placements differ by a constant) go to `_SIDES`, for the tail's row."""
    groups: dict[tuple[str, int], list[list[tuple[str, float, float]]]] = defaultdict(lambda: [[], []])
    for which, tl in enumerate((inner, outer)):
        for r in range(len(tl.start_ns)):
            label = tl.streams[int(tl.stream[r])][1]
            row = (tl.names[int(tl.name[r])], float(tl.duration_ns[r]), float(tl.start_ns[r]))
            groups[(label, int(tl.kind[r]))][which].append(row)
    out = []
    sides = []
    for (label, k), (ev, cu) in groups.items():
        if len(ev) != len(cu):
            return f"{label} {KINDS[k]}: {len(ev)} events rows, {len(cu)} CUPTI rows"
        out.extend((KINDS[k], n, i, e - c) for i, ((n, e, _), (_, c, _)) in enumerate(zip(ev, cu)))
        sides.extend((s0 - s1, s0 + e - s1 - c) for (_, e, s0), (_, c, s1) in zip(ev, cu))
    d = np.array(sides).reshape(-1, 2)
    d -= np.median(d[:, 0])  # (one offset for the round: the start differences' median)
    _SIDES.extend(map(tuple, d))
    return out


_SIDES: list[tuple[float, float]] = []  #: (start, end) differences of `_pairs`' activities, in its order


def _against_torch(timelines: list[asyncgpu.Timeline], path: str) -> list[tuple[str, str, int, float]] | str:
    """The rows of `_pairs` for the events scopes ``timelines`` (one per round, in order) against a torch.profiler
    trace of them all: each stream's activities in order, streams matched by their number of activities."""
    ours: dict[str, list[tuple[str, str, int, float]]] = defaultdict(list)  # label: (kind, name, position, ns)
    for tl in timelines:
        pos: dict[tuple[str, int], int] = defaultdict(int)
        for r in range(len(tl.start_ns)):
            label, k = tl.streams[int(tl.stream[r])][1], int(tl.kind[r])
            ours[label].append((KINDS[k], tl.names[int(tl.name[r])], pos[(label, k)], float(tl.duration_ns[r])))
            pos[(label, k)] += 1
    theirs = trace_activities(path)
    mine = sorted(ours.values(), key=lambda v: -len(v))
    if len(mine) != len(theirs):
        return f"{len(mine)} streams of ours, {len(theirs)} in the trace"
    out = []
    for a, b in zip(mine, (theirs[k] for k in sorted(theirs, key=lambda k: -len(theirs[k])))):
        if len(a) != len(b) or any(x[0] != y[0] for x, y in zip(a, b)):
            return f"a stream of {len(a)} activities against one of {len(b)} (or kinds out of order)"
        out.extend((kind, n, i, e - c) for (kind, n, i, e), (_, _, c) in zip(a, b))
    return out


def _apart(dev, s, fn, rounds: int) -> list[tuple[str, str, int, float]] | str:
    """The ``apart`` reference: each round twice, once in an events scope and once in a CUPTI-source scope (the
    order alternating), never nested, so CUPTI's instrumentation of an activity is not inside any event pair. The
    activities are no longer the same, so the rows compare distributions: per kind and position, the i-th smallest
    events duration less the i-th smallest CUPTI one (a quantile-quantile difference, ns)."""
    durs: dict[str, dict[tuple[str, str, int], list[float]]] = {"events": defaultdict(list), "cupti": defaultdict(list)}
    for r in range(rounds):
        for source in ("events", "cupti") if r % 2 == 0 else ("cupti", "events"):
            dev._internal.forget_pair_excess()
            dev.synchronize()
            with asyncgpu.gpu_timer(dev, source=source) as t:
                if fn is None:
                    s.spin_us(50)
                else:
                    s.spin_us(3000)
                    fn()
            tl = t.timeline
            seen: dict[tuple[str, int], int] = defaultdict(int)
            for i in range(len(tl.start_ns)):
                label, k = tl.streams[int(tl.stream[i])][1], int(tl.kind[i])
                pos = seen[(label, k)]
                seen[(label, k)] += 1
                durs[source][(KINDS[k], tl.names[int(tl.name[i])], pos)].append(float(tl.duration_ns[i]))
    out: list[tuple[str, str, int, float]] = []
    for key, ev in durs["events"].items():
        cu = durs["cupti"].get(key)
        if cu is None or len(cu) != len(ev):
            return f"{key}: {len(ev)} events rows, {0 if cu is None else len(cu)} CUPTI rows"
        out.extend((key[0], key[1], key[2], e - c) for e, c in zip(sorted(ev), sorted(cu)))
    return out


def _replace_d2d_primer(dev: asyncgpu.Device, nbytes: int) -> None:
    """Put a copy of ``nbytes`` between two device buffers (0: nothing) in place of the library's 4-byte primer of
    copies between device buffers (after the calibration, which keeps the library's)."""
    import ctypes

    from asyncgpu._backends.cuda.driver import LIBCUDA

    bd = dev._internal.bd
    bd.prepare("prime")
    buf = dev.alloc(2 * max(nbytes, 1), np.uint8)
    _KEEP.append(buf)
    base = buf.ptr
    d2d = ctypes.CDLL(LIBCUDA).cuMemcpyDtoDAsync_v2
    d2d.restype = ctypes.c_int
    d2d.argtypes = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
    call = (lambda stream: d2d(base + nbytes, base, nbytes, stream)) if nbytes else (lambda stream: 0)
    bd._primer.calls["copy_d2d"] = (call, "cuMemcpyDtoDAsync")
    print(f"the primer of copies between device buffers: {nbytes} bytes")


_KEEP: list = []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", help="a regular expression: the sequences whose name matches")
    p.add_argument("--holds", default="always,never")
    p.add_argument(
        "--reference",
        default="cupti,torch",
        help="cupti (asyncgpu's CUPTI source, the events scope nested in it), torch (torch.profiler around the "
        "rounds), apart (events and CUPTI in separate rounds: `_apart`)",
    )
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", help="also write what is printed to this file")
    p.add_argument(
        "--d2d-primer",
        type=int,
        default=-1,
        help="bytes of the primer copy ahead of a copy between device buffers (0: none; default: the library's own)",
    )
    a = p.parse_args()
    tee_stdout_to(a.out)
    dev = asyncgpu.device(a.device, backend="cuda")
    cal = dev.clock()
    if a.d2d_primer >= 0:
        _replace_d2d_primer(dev, a.d2d_primer)
    by_kind = {k: round(v) for k, v in cal.bracket_overhead_by_kind_ns.items()}
    print(f"{dev.description}: pair overhead (ns) {by_kind}, {cal.bracket_overhead_source}")
    s, s2 = dev.stream, dev.create_stream()
    arr = dev.alloc(250_000, np.float32)  # 1 MB
    big = dev.alloc(10_000_000, np.float32)  # 40 MB, as `bench_accuracy`'s cases
    sized = {mb: dev.alloc(mb * 250_000, np.float32) for mb in (4, 16, 160)}
    big2, sized2 = dev.alloc(10_000_000, np.float32), dev.alloc(1_000_000, np.float32)  # copies' destinations
    seqs: dict[str, Callable[[], object] | None] = {
        "spin 5 us": lambda: [s.spin_us(5) for _ in range(N)],
        "spin 20 us": lambda: [s.spin_us(20) for _ in range(N)],
        "spin 50 us": lambda: [s.spin_us(50) for _ in range(N)],
        "memset 1 MB": lambda: [s.memset(arr, 0) for _ in range(N)],
        "inc_loop x50": lambda: [s.inc_loop(arr, 50) for _ in range(N)],
        "in turn": lambda: [(s.memset(arr, 0), s.inc_loop(arr, 50), s.spin_us(50)) for _ in range(N // 3)],
        "in turn 40 MB": lambda: [(s.memset(big, 0), s.inc_loop(big, 50), s.spin_us(50)) for _ in range(N // 3)],
        "as the bench": lambda: [(s.memset(big, 0), s.inc_loop(big, 50), s.spin_us(50)) for _ in range(N)],
        "spin/memset": lambda: [(s.memset(big, 0), s.spin_us(20)) for _ in range(N // 2)],
        "spin/inc_loop": lambda: [(s.inc_loop(big, 50), s.spin_us(20)) for _ in range(N // 2)],
        "memset 40 MB": lambda: [s.memset(big, 0) for _ in range(N)],
        "inc_loop 40MB": lambda: [s.inc_loop(big, 50) for _ in range(N)],
        **{f"memset {mb} MB": (lambda b=b: [s.memset(b, 0) for _ in range(N)]) for mb, b in sized.items()},
        **{f"inc_loop {mb}MB": (lambda b=b: [s.inc_loop(b, 50) for _ in range(N)]) for mb, b in sized.items()},
        "spin/copy d2d": lambda: [(s.spin_us(200), s.copy(big2, big)) for _ in range(N // 2)],
        "copy d2d 40MB": lambda: [s.copy(big2, big) for _ in range(N)],
        "copy d2d 4MB": lambda: [s.copy(sized2, sized[4]) for _ in range(N)],
        "two streams": lambda: [(s.spin_us(50), s2.spin_us(50)) for _ in range(N // 2)],
        "idle spin 50": None,
    }
    for fn in seqs.values():  # loaded and warm
        if fn is not None:
            fn()
    dev.synchronize()
    head = f"{'against':<7} {'hold':<7} {'sequence':<13} {'kind':<9} {'n':>4}"
    print(f"{head} {'p10':>6} {'p50':>6} {'p90':>6} {'first':>6} {'max':>6} {'>1us':>5}  tail: start end")
    refs = a.reference.split(",")  # (torch last: torch.profiler keeps CUPTI for the rest of the process)
    for ref in sorted(refs, key=lambda r: r == "torch"):
        for mode in a.holds.split(","):
            _hold(mode)
            for name, fn in seqs.items():
                if a.only and not re.search(a.only, name):
                    continue
                rounds = a.rounds if fn is not None else a.rounds * N
                got: list[tuple[str, str, int, float]] | str = []
                _SIDES.clear()
                timelines = []
                prof = None
                if ref == "apart":
                    got = _apart(dev, s, fn, rounds)
                    _SIDES.clear()
                elif ref == "torch":
                    from torch.profiler import ProfilerActivity, profile

                    prof = profile(activities=[ProfilerActivity.CUDA])
                    prof.__enter__()
                for _ in range(rounds if ref != "apart" else 0):
                    dev._internal.forget_pair_excess()
                    dev.synchronize()
                    outer = asyncgpu.gpu_timer(dev, source="cupti") if ref == "cupti" else None
                    if outer is not None:
                        outer.__enter__()
                    with asyncgpu.gpu_timer(dev, source="events") as inner:
                        if fn is None:
                            s.spin_us(50)
                        else:
                            s.spin_us(3000)
                            fn()
                    if outer is not None:
                        outer.__exit__(None, None, None)
                        rows = _pairs(inner.timeline, outer.timeline)
                        if isinstance(rows, str):
                            got = rows
                            break
                        assert not isinstance(got, str)
                        got.extend(rows)
                    timelines.append(inner.timeline)
                if prof is not None:
                    dev.synchronize()
                    prof.__exit__(None, None, None)
                    path = os.path.join(tempfile.mkdtemp(), "trace.json")
                    prof.export_chrome_trace(path)
                    got = _against_torch(timelines, path)
                if isinstance(got, str):
                    print(f"{ref:<7} {mode:<7} {name:<13} unmatched: {got}")
                    continue
                sides = _SIDES if len(_SIDES) == len(got) else [(np.nan, np.nan)] * len(got)
                if fn is not None:  # each stream's first kernel (the lead spin; on the second stream, an idle start)
                    keep = [not (k == "kernel" and i == 0) for k, _, i, _ in got]
                    got = [(k, n, i - (k == "kernel"), d) for (k, n, i, d), ok in zip(got, keep) if ok]
                    sides = [x for x, ok in zip(sides, keep) if ok]
                for kind in sorted({n if k == "kernel" else k for k, n, _, _ in got}):
                    mine = [kind in (k, n) for k, n, _, _ in got]
                    d = np.array([x for (_, _, _, x), m in zip(got, mine) if m]) / 1e3
                    se = np.array([x for x, m in zip(sides, mine) if m]).reshape(-1, 2) / 1e3
                    first = np.array([x for k, n, i, x in got if kind in (k, n) and i == 0]) / 1e3
                    q = np.percentile(d, [10, 50, 90])
                    f = f"{np.median(first):>6.2f}" if len(first) and fn is not None else f"{'':>6}"
                    row = f"{ref:<7} {mode:<7} {name:<13} {kind:<9} {len(d):>4}"
                    over = np.abs(d) > 1.0
                    tail = d >= np.percentile(d, 90)  # where the tail's excess sits: at the start or at the end
                    sided = ""
                    if np.isfinite(se).all():
                        sided = f"  {np.median(se[tail, 0]):>+5.2f} {np.median(se[tail, 1]):>+5.2f}"
                    print(f"{row} {q[0]:>6.2f} {q[1]:>6.2f} {q[2]:>6.2f} {f} {d.max():>6.2f} {over.sum():>5}{sided}")
    _hold("library")


if __name__ == "__main__":
    main()
