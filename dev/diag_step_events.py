"""Where the events step timer's overhead goes on a host-bound torch loop: variants of the timer against bare steps,
interleaved in pairs (bare first, then the variant first), in one process.

    PYTHONPATH=$PWD python dev/diag_step_events.py [--steps 200] [--pairs 6] [--devices 1]

Variants: ``default``; ``no-harvest`` (harvest_s=3600: the harvest thread sleeps while timed); ``harvest-250ms``
(fewer harvests, each of more steps); ``big-pool`` (the timing pool grown ahead with ``prepare(events=...)``: no
reclaim or growth while timed); ``records-keep-gil`` (every event record, bare and timed, through a ``ctypes.PyDLL``
``cuEventRecord`` that keeps the GIL for its ~1 µs: does getting the GIL back after each of the step's records, with
the workers' threads launching, cost the loop's thread more than the record?); ``switch-1ms``
(``sys.setswitchinterval(0.001)`` for bare and timed alike: a thread that waits for the GIL waits less);
``idle-timer`` (the timer open, its harvest thread running, but no ``st.step()``: is it the records or the timer's
threads?); ``alternate`` (one timer, steps marked and unmarked in turn, L M U U L M:
`benchmarks.bench_steps.neighbours`, the marking's cost per step, paired with its neighbours so that the loop's drift
cancels, and each phase of a step inside a real loop); ``alternate-keep-gil`` (the same, every record keeping the GIL);
``spill`` (one marked step, then seven unmarked: each step's time by its distance from the marked one: does a mark's
cost land on the steps after it, which ``alternate`` counts as the unmarked side?); ``toggle`` (the whole timer, open
and closed, between neighbours: ``8 * --steps`` steps in blocks of 40, alternately bare and inside a step timer that
marks every step, opened and closed at the blocks' edges; each timed block's median step against the mean of the bare
blocks on either side: the open timer's threads and the marks together, the loop's drift cancelled, the entry and exit
left out); ``overlap`` (one timer marking every step, ``8 * --steps`` steps, each step's host interval kept, and the
timer's harvests and the clock calibrations they make timed on the harvest thread: the steps that overlap a calibration,
a harvest without one, and neither, against each other: what the timer's own thread costs the loop, which ``alternate``
cancels and whole runs cannot resolve; ``overlap-50ms`` the same at the harvest cadence and clock age of run 49, 50 ms
and 0.25 s). Each other variant also prints the step times' p10/p50/p90/p99 bare and timed: a shift of every step is a
per-step cost, a longer tail is a stall (a thread that waits for the GIL, a pool that grows).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import anyio
import numpy as np

import asyncgpu
from benchmarks.bench_steps import ci95, harvest_share, neighbours, run_steps, torch_work

VARIANTS = (
    "default",
    "no-harvest",
    "harvest-250ms",
    "big-pool",
    "records-keep-gil",
    "switch-1ms",
    "idle-timer",
    "alternate",
    "alternate-keep-gil",
    "spill",
    "toggle",
    "overlap",
    "overlap-50ms",
)
TOGGLE_BLOCK = 40  #: ``toggle``: steps a block


async def each_step(devs: list, work: list, steps: int, st: object, into: list[float]) -> float:
    """``steps`` steps as `run_steps` runs them, each one's time (ms) appended to ``into``; returns the mean (ms)."""
    t_all = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        await run_steps(devs, work, 1, st)
        into.append((time.perf_counter() - t0) * 1e3)
    return (time.perf_counter() - t_all) / steps * 1e3


async def timed(devs: list, work: list, steps: int, variant: str | None, into: list[float]) -> float:
    if variant is None:
        await run_steps(devs, work, 20, None)
        return await each_step(devs, work, steps, None, into)
    harvest_s = {"no-harvest": 3600.0, "harvest-250ms": 0.25}.get(variant, 0.05)
    async with asyncgpu.step_timer(devs, harvest_s=harvest_s, max_pending=4 * steps) as st:
        use = None if variant == "idle-timer" else st
        await run_steps(devs, work, 20, use)
        return await each_step(devs, work, steps, use, into)


async def alternate(devs: list, work: list, steps: int, label: str = "alternate", source: str = "events") -> dict:
    """``6 * steps`` steps in one timer (``source``), in the order L M U U L M: `benchmarks.bench_steps.neighbours`
    (per pair of neighbours the ratio of the marked step's time to the unmarked one's, and where a step's time went:
    entering ``st.step()``, the workers' part, leaving it, the records and the waits after it). Prints them; returns
    the unmarked and marked steps' times (ms), the ratios and their 95 % interval."""
    r = await neighbours(devs, work, steps, source=source)
    lo, hi = r["ratio_ci95"]
    print(
        f"{label:<14} {np.median(r['unmarked_ms']):8.3f} {r['median_ms']:9.3f}  {r['ratio_to_bare']:.4f} "
        f"[{lo:.4f}, {hi:.4f}] (step by step, {len(r['paired_ratios'])} neighbour pairs)"
    )
    for cls, ms in (("unmarked", r["unmarked_ms"]), ("marked", r["reps_ms"])):
        parts = ", ".join(f"{p} {v:.1f}" for p, v in r["phases_us"][cls].items())
        step_us = np.percentile(ms, [50, 90]) * 1e3
        print(
            f"{'':<14} {cls:<8} µs p50: {parts}; step {step_us[0]:.1f} (p90 {step_us[1]:.1f}); waits done at once "
            f"{100 * r['waits_at_once'][cls]:.0f} %"
        )
    return {"bare_ms": r["unmarked_ms"], "cupti_ms": r["reps_ms"], "ratios": r["paired_ratios"], "ci95": [lo, hi]}


async def spill(devs: list, work: list, steps: int, period: int = 8) -> None:
    """Does a marked step's cost spill into the steps after it (which ``alternate``'s neighbours would then share)?
    ``steps * period`` steps in one timer, one marked then ``period - 1`` unmarked, repeated: each step's time by its
    distance from the last marked step (0: the marked one), as a ratio to the farthest unmarked step of its own
    period (median [95 % CI]). No spill: 1.0 at every distance but 0; a spill: distance 1 (and on) above 1.0."""
    by_distance: list[list[float]] = [[] for _ in range(period)]
    async with asyncgpu.step_timer(devs, max_pending=8 * period * steps) as st:
        await run_steps(devs, work, 20, st)
        for _ in range(steps):
            ms = []
            for k in range(period):
                t0 = time.perf_counter()
                await run_steps(devs, work, 1, st if k == 0 else None)
                ms.append((time.perf_counter() - t0) * 1e3)
            for k in range(period):
                by_distance[k].append(ms[k] / ms[-1])
    cells = []
    for k, ratios in enumerate(by_distance[:-1]):
        lo, hi = ci95(ratios)
        cells.append(f"{k}: {np.median(ratios):.4f} [{lo:.4f}, {hi:.4f}]")
    what = "step time / the period's last unmarked step, by distance from the marked step"
    print(f"{'spill':<14} {what}: " + "; ".join(cells))


async def toggle(devs: list, work: list, steps: int, block: int = TOGGLE_BLOCK) -> None:
    """About ``8 * steps`` steps in blocks of ``block``, bare and inside a step timer (every step marked) in turn,
    bare at both ends; prints the median ratio of each timed block's median step (its first eighth left out) to
    the mean of its two bare neighbours' medians, with its 95 % interval."""
    bare: list[float] = []
    on: list[float] = []
    await run_steps(devs, work, 20, None)
    for b in range(2 * (4 * steps // block) + 1):
        ms: list[float] = []
        if b % 2:
            async with asyncgpu.step_timer(devs, max_pending=4 * block) as st:
                await each_step(devs, work, block, st, ms)
        else:
            await each_step(devs, work, block, None, ms)
        (on if b % 2 else bare).append(statistics.median(ms[block // 8 :]))
    ratios = [t / ((a + b) / 2) for t, a, b in zip(on, bare, bare[1:])]
    lo, hi = ci95(ratios)
    print(
        f"{'toggle':<14} {statistics.median(bare):8.3f} {statistics.median(on):9.3f}  {statistics.median(ratios):.4f} "
        f"[{lo:.4f}, {hi:.4f}] {{{min(ratios):.3f}, {max(ratios):.3f}}} ({len(ratios)} timed blocks of {block} "
        "steps, each against its two bare neighbours)"
    )


async def overlap(devs: list, work: list, steps: int, label: str = "overlap", **timer: float) -> None:
    """`benchmarks.bench_steps.harvest_share` over ``8 * steps`` marked steps (``timer``: `asyncgpu.step_timer`'s
    ``harvest_s``, ``max_clock_age_s``), printed by class of step."""
    r = await harvest_share(devs, work, 8 * steps, **timer)
    print(
        f"{label:<14} {r['steps']} marked steps in {r['wall_s']:.2f} s, {timer or 'defaults'}; "
        f"{r['calibrations']} calibrations ({r['calibrations'] / r['wall_s']:.1f}/s over {len(devs)} devices), each "
        f"{_us(r['calibration_us'])} µs p50/p90 on the harvest thread; {r['harvests']} harvests, each "
        f"{_us(r['harvest_us'])} µs (calibrations included); clock ages at the end "
        f"{', '.join(f'{a:.1f}' for a in r['clock_ages_s'])} s, last extrapolation errors "
        f"{', '.join('-' if e is None else f'{e:+.2f}' for e in r['clock_errors_us'])} µs"
    )
    for name, c in r["classes"].items():
        print(
            f"{'':<14} steps overlapping {name}: {c['steps']}, step ms p50 {c['p50_ms']:.3f} (p90 {c['p90_ms']:.3f}); "
            f"beyond the neither-mean {r['neither_mean_ms']:.3f}: {c['share_pct']:+.3f} % of the run"
        )
    print(f"{'':<14} KEY {label}: the harvest thread's share of the loop's time {r['share_pct']:+.2f} %")


def _us(values: list[float]) -> str:
    return f"{np.median(values):.0f}/{np.percentile(values, 90):.0f}" if values else "-"


def _quantiles(ms: list[float]) -> str:
    q = np.percentile(ms, [10, 50, 90, 99])
    return "/".join(f"{v:.3f}" for v in q)


def _keep_gil_records(devs: list) -> list:
    """Give each device's backend a ``record`` through ``ctypes.PyDLL`` (the GIL kept during the call); returns the
    ones it had, to put back."""
    import ctypes

    from asyncgpu._backends.cuda.driver import LIBCUDA

    fn = ctypes.PyDLL(LIBCUDA).cuEventRecord
    fn.restype = ctypes.c_int
    kept = []
    for d in devs:
        bd = d._internal.bd
        kept.append(bd.record)

        def record(raw_event, raw_stream, _fn=fn, _bd=bd):
            if _fn(raw_event[3], raw_stream[3]):
                raise RuntimeError("cuEventRecord failed")

        bd.record = record
    return kept


async def main(args: argparse.Namespace) -> None:
    devs = asyncgpu.devices("cuda", count=args.devices)
    ns = argparse.Namespace(layers=8, width=2048, batch=16, size=8192, matmuls=4)
    work = [torch_work(d, "host-bound", ns) for d in devs]
    for d in devs:
        await d.prepare()
    print(f"{'variant':<14} {'bare ms':>8} {'timed ms':>9}  paired ratio p50 [95 % CI] {{min, max}}")
    for v in args.variants.split(","):
        if v == "spill":
            await spill(devs, work, args.steps)
            continue
        if v == "toggle":
            await toggle(devs, work, args.steps)
            continue
        if v == "overlap":
            await overlap(devs, work, args.steps)
            continue
        if v == "overlap-50ms":  # (the cadence and clock age before run 50)
            await overlap(devs, work, args.steps, v, harvest_s=0.05, max_clock_age_s=0.25)
            continue
        if v.startswith("alternate"):
            kept = _keep_gil_records(devs) if v == "alternate-keep-gil" else None
            await alternate(devs, work, args.steps, v)
            for d, record in zip(devs, kept or []):
                d._internal.bd.record = record
            continue
        if v == "big-pool":
            for d in devs:
                await d.prepare(events=4 * args.steps + 200)
        kept = _keep_gil_records(devs) if v == "records-keep-gil" else None
        old = sys.getswitchinterval()
        if v == "switch-1ms":
            sys.setswitchinterval(0.001)
        bare, on, ratios = [], [], []
        steps_ms: dict[str | None, list[float]] = {None: [], v: []}
        for k in range(args.pairs):
            order = (None, v) if k % 2 == 0 else (v, None)
            pair = {m: await timed(devs, work, args.steps, m, steps_ms[m]) for m in order}
            bare.append(pair[None])
            on.append(pair[v])
            ratios.append(pair[v] / pair[None])
        sys.setswitchinterval(old)
        if kept is not None:
            for d, record in zip(devs, kept):
                d._internal.bd.record = record
        lo, hi = ci95(ratios)
        print(
            f"{v:<14} {statistics.median(bare):8.3f} {statistics.median(on):9.3f}  "
            f"{statistics.median(ratios):.4f} [{lo:.4f}, {hi:.4f}] {{{min(ratios):.3f}, {max(ratios):.3f}}}"
        )
        print(f"{'':<14} step ms p10/p50/p90/p99: bare {_quantiles(steps_ms[None])}  timed {_quantiles(steps_ms[v])}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    anyio.run(main, ap.parse_args())
    asyncgpu.close_all()
