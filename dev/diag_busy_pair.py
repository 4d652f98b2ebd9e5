"""Which part of a busy stream makes an event pair cost more than the calibration's held-and-primed pair: events
against CUPTI on the same activities (an events scope nested in a CUPTI-source scope, nothing learned from CUPTI
scopes), per sequence of work queued behind a 3 ms spin (so the GPU never waits for the host), per hold policy.

Sequences: one kind of work repeated (spins of 5, 20 and 50 µs; 1 MB memsets; ``inc_loop``), kinds in turn
(memset, inc_loop, spin, as `bench_accuracy`'s busy stream), spins on two streams of the device in turn, and a
spin on an idle GPU. Each row: activities, events − CUPTI p10 / p50 / p90 (µs), and the p50 of the first activity
behind the lead spin apart from the rest.

    python dev/diag_busy_pair.py [--rounds 5] [--holds always,never] [--out FILE]
"""

from __future__ import annotations

import argparse
import os as _os
import sys as _sys
from collections import defaultdict

import numpy as np

import asyncgpu
from asyncgpu._base.records import KINDS
from asyncgpu._runtime import hooks

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to

N = 20  #: activities per sequence


def _hold(mode: str) -> None:
    """``"always"`` (the library's policy) or ``"never"``: `hooks.should_hold` patched, as `bench_accuracy` does."""
    hooks.should_hold = lambda bd, raw_stream: bool(hooks.HOLD_USERS) and mode == "always"


def _pairs(inner: asyncgpu.Timeline, outer: asyncgpu.Timeline) -> list[tuple[str, int, float]] | str:
    """``(kind, position among its stream's activities of that kind, events − CUPTI ns)`` per activity of
    ``inner``, matched with ``outer``'s by stream and kind in issue order; a string saying why not where the
    counts differ."""
    groups: dict[tuple[str, int], list[list[float]]] = defaultdict(lambda: [[], []])
    for which, tl in enumerate((inner, outer)):
        for r in range(len(tl.start_ns)):
            label = tl.streams[int(tl.stream[r])][1]
            groups[(label, int(tl.kind[r]))][which].append(float(tl.duration_ns[r]))
    out = []
    for (label, k), (ev, cu) in groups.items():
        if len(ev) != len(cu):
            return f"{label} {KINDS[k]}: {len(ev)} events rows, {len(cu)} CUPTI rows"
        out.extend((KINDS[k], i, e - c) for i, (e, c) in enumerate(zip(ev, cu)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--holds", default="always,never")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", help="also write what is printed to this file")
    a = p.parse_args()
    tee_stdout_to(a.out)
    dev = asyncgpu.device(a.device, backend="cuda")
    cal = dev.clock()
    by_kind = {k: round(v) for k, v in cal.bracket_overhead_by_kind_ns.items()}
    print(f"{dev.description}: pair overhead (ns) {by_kind}, {cal.bracket_overhead_source}")
    s, s2 = dev.stream, dev.create_stream()
    arr = dev.alloc(250_000, np.float32)  # 1 MB
    seqs = {
        "spin 5 us": lambda: [s.spin_us(5) for _ in range(N)],
        "spin 20 us": lambda: [s.spin_us(20) for _ in range(N)],
        "spin 50 us": lambda: [s.spin_us(50) for _ in range(N)],
        "memset 1 MB": lambda: [s.memset(arr, 0) for _ in range(N)],
        "inc_loop x50": lambda: [s.inc_loop(arr, 50) for _ in range(N)],
        "in turn": lambda: [(s.memset(arr, 0), s.inc_loop(arr, 50), s.spin_us(50)) for _ in range(N // 3)],
        "two streams": lambda: [(s.spin_us(50), s2.spin_us(50)) for _ in range(N // 2)],
    }
    for fn in seqs.values():  # loaded and warm
        fn()
    dev.synchronize()
    print(f"{'hold':<7} {'sequence':<13} {'kind':<7} {'n':>4} {'p10':>6} {'p50':>6} {'p90':>6} {'first':>6}")
    for mode in a.holds.split(","):
        _hold(mode)
        cases = dict(seqs)
        cases["idle spin 50"] = None  # type: ignore[assignment]
        for name, fn in cases.items():
            got: list[tuple[str, int, float]] = []
            for _ in range(a.rounds if fn is not None else a.rounds * N):
                dev._internal.forget_pair_excess()
                dev.synchronize()
                with asyncgpu.gpu_timer(dev, source="cupti") as outer:
                    with asyncgpu.gpu_timer(dev, source="events") as inner:
                        if fn is None:
                            s.spin_us(50)
                        else:
                            s.spin_us(3000)
                            fn()
                rows = _pairs(inner.timeline, outer.timeline)
                if isinstance(rows, str):
                    print(f"{mode:<7} {name:<13} unmatched: {rows}")
                    break
                if fn is not None:  # each stream's first kernel (the lead spin; on the second stream, an idle start)
                    rows = [(k, i - 1 if k == "kernel" else i, d) for k, i, d in rows if not (k == "kernel" and i == 0)]
                got.extend(rows)
            for kind in sorted({k for k, _, _ in got}):
                d = np.array([x for k, _, x in got if k == kind]) / 1e3
                first = np.array([x for k, i, x in got if k == kind and i == 0]) / 1e3
                q = np.percentile(d, [10, 50, 90])
                f = f"{np.median(first):>6.2f}" if len(first) and fn is not None else f"{'':>6}"
                print(f"{mode:<7} {name:<13} {kind:<7} {len(d):>4} {q[0]:>6.2f} {q[1]:>6.2f} {q[2]:>6.2f} {f}")
    _hold("always")


if __name__ == "__main__":
    main()
