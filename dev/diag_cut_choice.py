"""Which cut each activity of `bench_accuracy`'s held cases loses, and which cut it should lose: per activity, the
events source (the calibration's cuts: nothing learned from a CUPTI scope) against asyncgpu's CUPTI source around
it (nested scopes), the cut kind it took (`clock.cut_kind`, with the launch's spill flag), that cut, and its raw
pair excess (the events duration before the cut, less CUPTI's). Cases: a one-thread spin on an idle GPU; the first
and second launch of fresh user kernels; spins of 1 to 1,056 blocks, idle and behind a lead spin; the demo's
sequence on 40 MB and on 8 MB; `bench_accuracy`'s busy stream.

    python dev/diag_cut_choice.py [--rounds 12] [--device 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import os as _os
import sys as _sys
import time
from collections import defaultdict

import numpy as np

import asyncgpu
from asyncgpu._base.records import KINDS
from asyncgpu._runtime import stream as stream_mod
from asyncgpu._runtime.clock import cut_kind, placement

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to
from benchmarks.bench_accuracy import _user_kernels  # (distinct spin kernels on %globaltimer, never launched)

_FLAGS: list[bool] = []  # the spill flag of each flagged launch (memset, inc_loop), in order
_original = stream_mod.Stream._run_flagged


def _run_flagged(self, spills, *args):  # noqa: ANN001, ANN202
    _FLAGS.append(bool(spills))
    return _original(self, spills, *args)


stream_mod.Stream._run_flagged = _run_flagged  # type: ignore[method-assign]


def _idle(d: asyncgpu.Device) -> None:
    d.synchronize()
    time.sleep(0.002)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", help="also write what is printed to this file")
    a = p.parse_args()
    tee_stdout_to(a.out)
    from cuda.core import LaunchConfig

    d = asyncgpu.device(a.device, backend="cuda")
    s = d.stream
    cal = d.clock()
    bd = d._internal.bd
    print(f"{d.description}: spill_bytes {bd.spill_bytes}, cache_bytes {bd.cache_bytes}")
    print("cuts (ns): " + ", ".join(f"{k} {v:.0f}" for k, v in cal.bracket_overhead_by_kind_ns.items()))
    print(f"how: {cal.bracket_overhead_source}")
    big = d.alloc(10_000_000, np.float32)
    small = d.alloc(2_000_000, np.float32)
    host = d.alloc_pinned(10_000_000, np.float32)
    fresh = _user_kernels(d, "fresh", a.rounds)
    wide = _user_kernels(d, "wide", 1)[0][1]
    grids = (1, 132, 1056)
    s.launch(wide, LaunchConfig(grid=1, block=128), np.uint64(1000), name="wide")  # (loaded, warm)
    for arr in (big, small):
        s.memset(arr, 0)
        s.inc_loop(arr, 1)
    s.copy_to_host(big, host)
    s.spin_us(10)
    d.synchronize()

    def first(r: int):
        name, k = fresh[r]
        _idle(d)
        return lambda: [
            s.launch(k, LaunchConfig(grid=1, block=1), np.uint64(50_000), name="first"),
            s.launch(k, LaunchConfig(grid=1, block=1), np.uint64(50_000), name="second"),
        ]

    def wide_idle(g: int):
        def f(r: int):
            _idle(d)
            return lambda: s.launch(wide, LaunchConfig(grid=g, block=128), np.uint64(50_000), name=f"grid {g}")

        return f

    def wide_busy(r: int):
        d.synchronize()
        return lambda: (
            [s.spin_us(1000)]
            + [s.launch(wide, LaunchConfig(grid=g, block=128), np.uint64(50_000), name=f"grid {g}") for g in grids * 3]
        )

    def demo(arr):
        def f(r: int):
            _idle(d)

            def run():
                s.memset(arr, 0)
                for it in (500, 1000, 1500):
                    s.inc_loop(arr, it)
                s.copy_to_host(arr, host)

            return run

        return f

    def busy(r: int):
        d.synchronize()

        def run():
            s.spin_us(3000)
            for _ in range(3):
                s.memset(big, 0)
                s.inc_loop(big, 50)
                s.spin_us(50)

        return run

    def idle_spin(r: int):
        _idle(d)
        return lambda: s.spin_us(50)

    cases = {
        "idle spin 50 µs": idle_spin,
        "first launch": first,
        **{f"idle wide {g}": wide_idle(g) for g in grids},
        "busy wide": wide_busy,
        "demo 40 MB": demo(big),
        "demo 8 MB": demo(small),
        "busy stream": busy,
    }
    print(
        f"{'case':<16} {'activity':<22} {'n':>3} {'spill':>5} {'cut kind':<17} {'cut ns':>7} {'CUPTI µs':>9} "
        f"{'err p50':>8} {'raw exc p50':>11} {'p10':>7} {'p90':>7}"
    )
    for case, make in cases.items():
        rows: dict[tuple[str, str, int], list[tuple[float, float, float, bool, str]]] = defaultdict(list)
        bad = ""
        for r in range(a.rounds):
            d._internal.forget_pair_excess()  # (what a CUPTI scope teaches: forgotten, the calibration's cuts apply)
            fn = make(r)
            _FLAGS.clear()
            with asyncgpu.gpu_timer(d, source="cupti") as outer:
                with asyncgpu.gpu_timer(d, source="events") as inner:
                    fn()
                cuts = placement(d).cuts  # (the ones the events scope used: the outer scope's exit teaches others)
            flags = iter(list(_FLAGS))
            ev, cu = inner.timeline, outer.timeline
            by_kind: dict[str, list[tuple[str, float, bool]]] = defaultdict(list)
            for i in sorted(range(len(ev.start_ns)), key=lambda i: ev.start_ns[i]):  # (launch order: one stream)
                kind, name = KINDS[int(ev.kind[i])], ev.names[int(ev.name[i])]
                spills = next(flags, False) if name in ("memset", "inc_loop") else False
                by_kind[kind].append((name, float(ev.duration_ns[i]), spills))
            theirs: dict[str, list[float]] = defaultdict(list)
            for i in sorted(range(len(cu.start_ns)), key=lambda i: cu.start_ns[i]):
                theirs[KINDS[int(cu.kind[i])]].append(float(cu.duration_ns[i]))
            for kind, acts in by_kind.items():
                refs = theirs.get(kind, [])
                if len(refs) != len(acts):
                    bad = f"{kind}: {len(acts)} events rows, {len(refs)} CUPTI rows"
                    continue
                pos: dict[str, int] = defaultdict(int)
                for (name, dur, spills), ref in zip(acts, refs):
                    ck = cut_kind(kind, name, spills)
                    rows[(kind, name, pos[name])].append((dur, ref, cuts.get(ck, 0.0), spills, ck))
                    pos[name] += 1
        if bad:
            print(f"{case:<16} (pairing: {bad})")
        for (kind, name, i), vals in rows.items():
            dur = np.array([v[0] for v in vals])
            ref = np.array([v[1] for v in vals])
            cut = np.array([v[2] for v in vals])
            err = (dur - ref) / 1e3
            raw = (dur + cut - ref) / 1e3  # (no cut here is longer than its activity)
            spill = sum(v[3] for v in vals)
            kinds = "/".join(sorted({v[4] for v in vals}))
            print(
                f"{case:<16} {kind + ' ' + name + ' #' + str(i):<22} {len(vals):>3} {spill:>5} {kinds:<17} "
                f"{np.median(cut):>7.0f} {np.median(ref) / 1e3:>9.2f} {np.median(err):>+8.2f} "
                f"{np.median(raw):>+11.2f} {np.percentile(raw, 10):>+7.2f} {np.percentile(raw, 90):>+7.2f}"
            )


if __name__ == "__main__":
    main()
