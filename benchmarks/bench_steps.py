"""Step timing's overhead: the step time of a training loop bare, with `asyncgpu.step_timer` on (events source), and
with torch.profiler's peers in the same run, on every GPU, interleaved.

    PYTHONPATH=$PWD python benchmarks/bench_steps.py [--devices N] [--steps 40] [--repeat 30] [--out DIR]
    PYTHONPATH=$PWD python benchmarks/bench_steps.py --backend host    # the script's logic: numpy work, no peers
    PYTHONPATH=$PWD python benchmarks/bench_steps.py --parts           # the always-on cost's parts only (~1 min)

Two loops, one task per GPU launching from its device's worker thread (``await dev.run(step)``) on the device's
asyncgpu stream (handed to torch as an ``ExternalStream``), the loop reading every device's result after each step:

* ``host-bound``: an MLP of ``--layers`` bf16 ``Linear(--width)`` + ReLU on a batch of ``--batch``: forward, MSE,
  backward, SGD: many small kernels, the host's launching bounds the step.
* ``gpu-bound``: ``--matmuls`` bf16 ``(--size x --size)`` matmuls per step: the GPU bounds the step.

Modes, each against bare in ``--repeat`` pairs whose order alternates (bare first, then the mode first: the machine's
drift over the run cancels). Many short pairs (default 30 of 40 steps) rather than a few long ones: a host-bound
loop's step time wanders by ~10 % between runs of seconds, and short runs taken in turns see the same machine;
the median of the pairs' ratios then has a tight bootstrap interval (printed). The step timer's pairs come before
any profiler has run in the process; each run after ``--warmup`` steps of its own:

* ``bare``: no timing at all;
* ``steps``: ``asyncgpu.step_timer(devs)`` around the loop, ``with st.step(i):`` around each step (a pooled event per
  device at each step's exit, steps back to back chained, harvested off the loop's thread);
* ``steps, step.wait``: the same, the loop waiting for each step through ``await step.wait()`` (the timer's end events)
  instead of recording an event per device of its own;
* ``steps, neighbours``: the same cost measured step by step: in one step timer, steps marked and unmarked in turn
  (L M U U L M, ``--neighbours`` groups of six; L, a marked lead-in not counted, lets each counted marked step chain
  as in an always-on loop), each marked step against its unmarked neighbour, so that the loop's drift cancels within
  a pair of steps (a whole run's step time wanders by more than the marking costs); each class's
  steps also by phase (the step's entry, the work, its exit, the records and the waits that follow, and how many
  waits found their event done at once): where a marked step's extra time goes; and ``steps, neighbours, step.wait``:
  the marked steps waited for through ``step.wait()``, the unmarked ones through the loop's own records (the
  always-on cost of a loop that waits on the step);
* ``harvest thread`` (`harvest_share`): what neighbours cancel, the timer's own thread: ``--harvest-steps`` marked
  steps in one timer, the steps that overlap its harvests or its clock calibrations against the others (their time
  beyond the others' mean, as a share of the run's);
* ``steps cupti``: the same with ``source="cupti"`` (every kernel's record, records-only, flushed and attributed to
  steps on the harvest thread), in a child process that takes CUPTI before torch loads (torch's profiler subscribes
  to CUPTI when torch starts CUDA, and CUPTI has one subscriber), against that process's own bare runs. Always-on
  means one timer for a whole run: its in-run cost is the steps' and the harvests' (a flush and parse every
  `CUPTI_HARVEST_S`, 2 s), its exit's last flush comes once. So each of its runs, and each bare run of the child,
  lasts at least ``--cupti-block-s`` (4.5 s: two harvests fall inside, as in a long run), its time is the steps'
  with the harvests that fell in them, and the exit (the last flush and parse) is reported apart, per run (a
  120-step run paying its exit read 1.07×, run 46: the exit, not the loop);
* ``torch.profiler cuda``: ``torch.profiler.profile(activities=[CUDA])`` around the loop (CUPTI, records kept in
  memory until the end; once it has run, torch holds CUPTI for the rest of the process, so it comes after);
* ``torch.profiler cpu+cuda``: the same with CPU activities too.

The report: first, what an empty step costs the host (entry + exit on the loop's thread, and the harvest per step): the
overhead's floor, without the run-to-run noise of whole steps; then per loop and mode, the median step time over the
runs (each: wall time of ``--steps`` steps / steps), min and max, and the median of the pairs' ratios to bare.
JSON goes to ``DIR/bench_steps.json`` with ``--out DIR``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any, Callable

import anyio
import numpy as np

import asyncgpu
from asyncgpu._timing.steps import CUPTI_HARVEST_S

MODES = ("bare", "steps", "steps, step.wait", "torch.profiler cuda", "torch.profiler cpu+cuda")
CUPTI_MODES = ("bare", "steps cupti")  # a child process: CUPTI taken before torch loads (see `main`)


# -- the work ---------------------------------------------------------------------------------------------------------
def torch_work(dev: asyncgpu.Device, loop: str, args: argparse.Namespace) -> Callable[[asyncgpu.Stream], Any]:
    import torch

    cuda = torch.device("cuda", dev.index)
    ts = torch.cuda.ExternalStream(dev.stream.handle, device=cuda)
    with torch.cuda.device(cuda), torch.cuda.stream(ts):
        if loop == "host-bound":
            layers = [m for _ in range(args.layers) for m in (torch.nn.Linear(args.width, args.width), torch.nn.ReLU())]
            net = torch.nn.Sequential(*layers).to(cuda, torch.bfloat16)
            opt = torch.optim.SGD(net.parameters(), lr=1e-3)
            x = torch.randn(args.batch, args.width, device=cuda, dtype=torch.bfloat16)
        else:
            a = torch.randn(args.size, args.size, device=cuda, dtype=torch.bfloat16)

    def mlp(stream: asyncgpu.Stream) -> Any:
        with torch.cuda.device(cuda), torch.cuda.stream(ts):
            opt.zero_grad(set_to_none=True)
            loss = net(x).float().square().mean()
            loss.backward()
            opt.step()
            return loss.detach()

    def matmuls(stream: asyncgpu.Stream) -> Any:
        with torch.cuda.device(cuda), torch.cuda.stream(ts):
            out = a
            for _ in range(args.matmuls):
                out = a @ out
            return out

    return mlp if loop == "host-bound" else matmuls


def host_work(dev: asyncgpu.Device, loop: str, args: argparse.Namespace) -> Callable[[asyncgpu.Stream], Any]:
    rng = np.random.default_rng(dev.index)
    n = 32 if loop == "host-bound" else 256
    a = rng.standard_normal((n, n), np.float32)
    kernels = 20 if loop == "host-bound" else 2

    def step(stream: asyncgpu.Stream) -> None:
        for _ in range(kernels):
            stream.launch(np.dot, None, a, a, name="dot")

    return step


# -- one run ----------------------------------------------------------------------------------------------------------
async def run_steps(devs: list, work: list, steps: int, st: Any, step_wait: bool = False) -> None:
    """``steps`` steps, each waited for (every device's result read): through an event per device that the loop
    records, or with ``step_wait`` through ``await step.wait()`` (the step timer ``st``'s end events)."""
    for _ in range(steps):
        if st is not None:
            with st.step() as step:
                await _one(devs, work)
            if step_wait:
                await step.wait()
                continue
        else:
            await _one(devs, work)
        for d in devs:
            with d.record() as done:
                await done.wait()


async def _one(devs: list, work: list) -> None:
    async with anyio.create_task_group() as tg:
        for d, w in zip(devs, work):
            tg.start_soon(d.run, w)


async def timed_steps(devs: list, work: list, args: argparse.Namespace, st: Any, step_wait: bool = False) -> float:
    """The mean step time (ms) of ``args.steps`` steps, or of as many more (in runs of ``args.steps``) as fill
    ``args.block_s`` seconds (`run_steps`)."""
    n, t0 = 0, time.perf_counter()
    while True:
        await run_steps(devs, work, args.steps, st, step_wait)
        n += args.steps
        dt = time.perf_counter() - t0
        if dt >= args.block_s:
            return dt / n * 1e3


async def one_rep(devs: list, work: list, mode: str, args: argparse.Namespace, exits_ms: list[float]) -> float:
    """The mean step time (ms) of a run in ``mode`` (`timed_steps`), after its warm-up; a step timer's exit
    (ms) goes to ``exits_ms``."""
    if mode.startswith("steps"):
        async with asyncgpu.step_timer(devs, source="cupti" if mode == "steps cupti" else "events") as st:
            wait = mode == "steps, step.wait"
            await run_steps(devs, work, args.warmup, st, wait)
            ms = await timed_steps(devs, work, args, st, wait)
            t0 = time.perf_counter()
        exits_ms.append((time.perf_counter() - t0) * 1e3)
        return ms
    if mode.startswith("torch.profiler"):
        import torch.profiler as tp

        acts = [tp.ProfilerActivity.CUDA] + ([tp.ProfilerActivity.CPU] if "cpu" in mode else [])
        with tp.profile(activities=acts):
            await run_steps(devs, work, args.warmup, None)
            t0 = time.perf_counter()
            await run_steps(devs, work, args.steps, None)
            dt = time.perf_counter() - t0
        return dt / args.steps * 1e3
    await run_steps(devs, work, args.warmup, None)
    return await timed_steps(devs, work, args, None)


async def host_cost(devs: list, n: int = 200, reps: int = 5) -> dict[str, Any]:
    """What a step costs the host, with no work in it: ``with st.step():`` entry + exit on the loop's thread, and
    the harvest per step (run by hand here, on the loop's thread; normally on the harvest thread), in µs."""
    enter_exit, harvest = [], []
    for _ in range(reps):
        async with asyncgpu.step_timer(devs, harvest_s=3600, max_pending=2 * n) as st:  # (no early harvest)
            t0 = time.perf_counter_ns()
            for _ in range(n):
                with st.step():
                    pass
            t1 = time.perf_counter_ns()
            for d in devs:
                await d.asynchronize()
            t2 = time.perf_counter_ns()
            k = st._harvest()
            t3 = time.perf_counter_ns()
        enter_exit.append((t1 - t0) / n / 1e3)
        harvest.append((t3 - t2) / max(k, 1) / 1e3)
    return {
        "devices": len(devs),
        "enter_exit_us": {"median": statistics.median(enter_exit), "min": min(enter_exit), "all": enter_exit},
        "harvest_us": {"median": statistics.median(harvest), "min": min(harvest), "all": harvest},
    }


def _us_or_none(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e3


async def harvest_share(devs: list, work: list, steps: int, profile: bool = False, **timer: float) -> dict[str, Any]:
    """What the step timer's harvest thread costs the loop: ``steps`` marked steps in one timer (``timer``:
    `asyncgpu.step_timer`'s ``harvest_s``, ``max_clock_age_s``), each step's host interval kept, and the intervals of
    the timer's harvests and of the clock calibrations made in them (on the harvest thread). Steps are classed as
    overlapping a calibration, a harvest without one, or neither; the overlapping steps' time beyond the mean of the
    others, as a share of the run's time, is the harvest thread's cost (``share_pct``). The marks' own cost is the
    same in every class (``neighbours`` measures it); whole runs against bare runs cannot resolve either.

    ``profile``: each harvest's parts timed on its thread's CPU clock (`_harvest_parts`): per part, the CPU of all
    harvests (``harvest_parts_cpu_us``), of the longest one (``longest_harvest_parts_cpu_us``) and of each one in
    order (``harvest_parts_each_cpu_us``: the first pays one-off costs). (cProfile cannot
    say it: on Python 3.12 it profiles every thread, the loop's too, against the one thread's clock.)"""
    from asyncgpu._runtime import internal
    from asyncgpu._timing.steps import _clock_age

    cals: list[tuple[int, int]] = []
    harvests: list[tuple[int, int]] = []
    # (Python's collections while the steps run, each (start ns, end ns, generation, on the harvest thread): a full
    # collection in a process that holds torch takes tens of ms, whichever thread's allocations set it off)
    collections: list[tuple[int, int, int, bool]] = []
    started: dict[int, int] = {}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            started[me] = time.perf_counter_ns()
        elif me in started:
            collections.append((started.pop(me), time.perf_counter_ns(), info["generation"], me == harvest_ident[0]))

    harvest_ident = [0]
    parts: dict[str, int] = {}  # (the current harvest's CPU ns per part, `_harvest_parts`)
    each_parts: list[dict[str, int]] = []  # (every harvest's parts, in order: the first one pays one-off costs)
    harvest_cpu: list[int] = []  # (each harvest's own thread's CPU ns: what it could have taken from the loop)
    spans: list[tuple[int, int]] = []
    real_cal = internal.calibrate

    def timed_cal(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return real_cal(*a, **k)
        finally:
            cals.append((t0, time.perf_counter_ns()))

    internal.calibrate = timed_cal  # type: ignore[assignment]
    try:
        async with asyncgpu.step_timer(devs, max_pending=max(256, steps), **timer) as st:  # type: ignore[arg-type]
            real_harvest = st._harvest

            def timed_harvest(final: bool = False) -> int:
                harvest_ident[0] = threading.get_ident()
                parts.clear()
                t0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
                try:
                    return real_harvest(final)
                finally:
                    harvests.append((t0, time.perf_counter_ns()))
                    harvest_cpu.append(time.thread_time_ns() - cpu0)
                    if profile:
                        parts["(the rest)"] = harvest_cpu[-1] - sum(v for k, v in parts.items() if "⊂" not in k)
                        each_parts.append(dict(parts))

            st._harvest = timed_harvest  # type: ignore[method-assign]
            undo = _harvest_parts(st, devs, harvest_ident, parts) if profile else []
            await run_steps(devs, work, 20, st)
            cals.clear()
            harvests.clear()
            harvest_cpu.clear()
            each_parts.clear()
            gc.callbacks.append(on_gc)
            for _ in range(steps):
                t0 = time.perf_counter_ns()
                await run_steps(devs, work, 1, st)
                spans.append((t0, time.perf_counter_ns()))
            gc.callbacks.remove(on_gc)
            for fn in undo:
                fn()
    finally:
        internal.calibrate = real_cal  # type: ignore[assignment]
        if on_gc in gc.callbacks:
            gc.callbacks.remove(on_gc)
    t0s, t1s = (np.array(c, np.int64) for c in zip(*spans))
    end = int(t1s[-1])
    wall_ns = float(end - t0s[0])

    def overlapping(intervals: list[tuple[int, int]]) -> np.ndarray:
        out = np.zeros(len(t0s), bool)
        for a, b in intervals:
            if a < end:  # (the exit's harvest comes after the steps)
                out |= (t0s < b) & (t1s > a)
        return out

    cal = overlapping(cals)
    harvest = overlapping(harvests) & ~cal
    neither = ~(cal | harvest)
    ms = (t1s - t0s) / 1e6
    base = float(np.mean(ms[neither])) if neither.any() else float("nan")
    classes = {}
    for name, sel in (("a calibration", cal), ("a harvest, no calibration", harvest)):
        classes[name] = {
            "steps": int(sel.sum()),
            "p50_ms": float(np.median(ms[sel])) if sel.any() else float("nan"),
            "p90_ms": float(np.percentile(ms[sel], 90)) if sel.any() else float("nan"),
            "share_pct": float(np.sum(ms[sel] - base)) * 1e6 / wall_ns * 100,
        }
    return {
        "steps": steps,
        "wall_s": wall_ns / 1e9,
        "timer": timer,
        "calibrations": len([c for c in cals if c[0] < end]),
        "calibration_us": [(b - a) / 1e3 for a, b in cals if a < end],
        "harvests": len([h for h in harvests if h[0] < end]),
        "harvest_us": [(b - a) / 1e3 for a, b in harvests if a < end],
        "harvest_cpu_us": [c / 1e3 for (a, _), c in zip(harvests, harvest_cpu) if a < end],
        # (each collection of generation 1 or 2, and of 0 from 0.1 ms: µs, generation, whether the harvest ran it)
        "collections": [
            {"us": (b - a) / 1e3, "generation": g, "harvest_thread": h}
            for a, b, g, h in collections
            if g or b - a >= 100_000
        ],
        "neither_mean_ms": base,
        "clock_ages_s": [st._clock_age_s(d) for d in devs],  # (where each device's clock age ended)
        "clock_errors_us": [_us_or_none(_clock_age(d).error_ns) for d in devs],
        "classes": classes,
        "share_pct": sum(c["share_pct"] for c in classes.values()),
    } | _parts_summary([(p, c) for (a, _), c, p in zip(harvests, harvest_cpu, each_parts) if a < end])


def _parts_summary(runs: list[tuple[dict[str, int], int]]) -> dict[str, Any]:
    """The harvests' parts (`_harvest_parts`), each harvest's with its CPU ns, as µs: summed over all of them,
    the longest one's, and each one's in order; nothing when none was profiled."""
    if not runs:
        return {}
    every: dict[str, int] = {}
    for p, _ in runs:
        for k, v in p.items():
            every[k] = every.get(k, 0) + v
    longest = max(runs, key=lambda run: run[1])[0]
    return {
        "harvest_parts_cpu_us": {k: v / 1e3 for k, v in every.items()},
        "longest_harvest_parts_cpu_us": {k: v / 1e3 for k, v in longest.items()},
        "harvest_parts_each_cpu_us": [{k: v / 1e3 for k, v in p.items()} for p, _ in runs],
    }


def _harvest_parts(st: Any, devs: list, ident: list[int], parts: dict[str, int]) -> list[Callable[[], None]]:
    """Time the parts of ``st``'s harvests on the harvest thread's CPU clock into ``parts`` (ns per part; a part
    named "a ⊂ b" is inside part b): the queries for finished steps, the clock's placement (with its calibration),
    the elapsed-time calls that place the events, the events given back to the pools, and the publishing (the
    balance split, the collector's pauses, the ring). Returns the callables that undo the patches."""
    from asyncgpu._runtime import clock, internal
    from asyncgpu._timing import steps as steps_mod

    undo: list[Callable[[], None]] = []

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def part(*a: Any, **k: Any) -> Any:
            if threading.get_ident() != ident[0]:
                return fn(*a, **k)
            c0 = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                parts[name] = parts.get(name, 0) + time.thread_time_ns() - c0

        return part

    def patch(owner: Any, attr: str, name: str) -> None:
        real = getattr(owner, attr)
        in_dict = isinstance(owner, type) or attr in vars(owner)
        setattr(owner, attr, timed(name, real))
        undo.append((lambda: setattr(owner, attr, real)) if in_dict else (lambda: delattr(owner, attr)))

    patch(st, "_finished_prefix", "finished steps (event queries)")
    patch(st, "_give_deferred", "dropped steps' events given back")
    patch(steps_mod, "placement", "clock placement")
    patch(internal, "calibrate", "clock calibration ⊂ clock placement")
    patch(clock.Placement, "host_ns_many", "events placed (elapsed-time calls)")
    patch(type(devs[0]._internal.timing_pool), "give_many", "events given back to the pools")
    patch(st, "_publish", "published")
    patch(steps_mod, "step_split", "balance split ⊂ published")
    patch(steps_mod.collector, "pauses_in", "collector's pauses ⊂ published")
    patch(st._ring, "add", "ring ⊂ published")
    return undo


async def bench(devs: list, args: argparse.Namespace, modes: tuple[str, ...]) -> dict[str, Any]:
    """Each mode against bare in pairs, bare and the mode taking turns to go first (ABBA: a drift of the machine
    over the run, as after a profiler has left CUPTI's callbacks on, cancels within a pair of pairs); the ratio is
    the median of the pairs' ratios. The step timer's pairs come first, before any profiler has run in the
    process: the profilers' pairs after."""
    make = host_work if devs[0].backend == "host" else torch_work
    out: dict[str, Any] = {}
    for d in devs:
        await d.prepare()
    out["host cost per step"] = await host_cost(devs)
    for loop in ("host-bound", "gpu-bound"):
        work = [make(d, loop, args) for d in devs]
        times: dict[str, list[float]] = {m: [] for m in modes}
        ratios: dict[str, list[float]] = {m: [] for m in modes}
        exits: dict[str, list[float]] = {m: [] for m in modes}
        for m in () if args.parts else modes[1:]:
            for k in range(args.repeat):
                order = ("bare", m) if k % 2 == 0 else (m, "bare")
                pair = {mode: await one_rep(devs, work, mode, args, exits[mode]) for mode in order}
                times["bare"].append(pair["bare"])
                times[m].append(pair[m])
                ratios[m].append(pair[m] / pair["bare"])
        ratios["bare"] = [1.0]
        out[loop] = {
            m: {
                "median_ms": statistics.median(v),
                "min_ms": min(v),
                "max_ms": max(v),
                "ratio_to_bare": statistics.median(ratios[m]),
                "ratio_ci95": ci95(ratios[m]),
                "paired_ratios": ratios[m],
                "reps_ms": v,
                "run_s": args.block_s,
            }
            | ({"exit_ms": exits[m]} if exits[m] else {})
            for m, v in times.items()
            if v
        }
        if "steps" in modes and args.neighbours:
            out[loop]["steps, neighbours"] = await neighbours(devs, work, args.neighbours)
            nb = await neighbours(devs, work, args.neighbours, step_wait=True)
            out[loop]["steps, neighbours, step.wait"] = nb
        if "steps" in modes and args.harvest_steps:
            timer = {} if args.harvest_s is None else {"harvest_s": args.harvest_s}
            share = await harvest_share(devs, work, args.harvest_steps, profile=args.profile_harvests, **timer)
            out.setdefault("harvest thread", {})[loop] = share
    return out


async def neighbours(
    devs: list, work: list, groups: int, source: str = "events", step_wait: bool = False
) -> dict[str, Any]:
    """``groups`` of six steps in one step timer (``source``), marked in the order L M U U L M (``2 * groups``
    neighbour pairs), each step timed with its wait for the devices: the median of the marked steps' (M) ratios to
    their unmarked neighbours (U), with its interval, as the other modes report theirs. A lead-in step (L, marked,
    not counted) comes before each counted marked step, so that it follows a marked step and chains (its entry
    records nothing), as every step of an always-on loop does: a marked step after an unmarked one records its own
    start events, which the always-on case never pays.

    Each step is also timed by phase (`PHASES`, µs), marked and unmarked apart: entering the step (nothing for an
    unmarked one), the work (the devices' tasks, launched and back), leaving the step, the records of the waits'
    events, and the waits; and how many waits found their event complete at once (`Event.wait`'s fast path, no trip
    through the engine): where a marked step's extra time goes. ``step_wait``: the marked steps are waited for through
    ``await step.wait()`` (no records of the loop's own: that phase is 0 for them), the unmarked ones as before."""
    steps_ms: dict[bool, list[float]] = {True: [], False: []}
    ratios: list[float] = []
    phases: dict[bool, list[list[float]]] = {True: [], False: []}
    at_once = {True: 0, False: 0}
    async with asyncgpu.step_timer(devs, source=source, max_pending=6 * groups + 64) as st:
        await run_steps(devs, work, 10, st)
        for k in range(6 * groups):
            if k % 6 in (0, 4):  # (a lead-in: marked, not counted)
                await run_steps(devs, work, 1, st)
                continue
            mark = k % 6 in (1, 5)
            t0 = time.perf_counter_ns()
            if mark:
                with st.step() as step:
                    t1 = time.perf_counter_ns()
                    await _one(devs, work)
                    t2 = time.perf_counter_ns()
            else:
                t1 = time.perf_counter_ns()
                await _one(devs, work)
                t2 = time.perf_counter_ns()
            t3 = time.perf_counter_ns()
            rec_ns = wait_ns = 0
            if mark and step_wait:
                await step.wait()
                wait_ns = time.perf_counter_ns() - t3
            else:
                for d in devs:  # (as `run_steps`: each device's event recorded, then waited for)
                    a = time.perf_counter_ns()
                    with d.record() as done:
                        b = time.perf_counter_ns()
                        at_once[mark] += done.query()
                        await done.wait()
                    rec_ns, wait_ns = rec_ns + b - a, wait_ns + time.perf_counter_ns() - b
            t4 = time.perf_counter_ns()
            phases[mark].append([(t1 - t0) / 1e3, (t2 - t1) / 1e3, (t3 - t2) / 1e3, rec_ns / 1e3, wait_ns / 1e3])
            steps_ms[mark].append((t4 - t0) / 1e6)
            if k % 6 in (2, 5):  # (a neighbour pair: M U, then U L M)
                ratios.append(steps_ms[True][-1] / steps_ms[False][-1])
    marked, waits = steps_ms[True], 2 * groups * len(devs)
    return {
        "median_ms": statistics.median(marked),
        "min_ms": min(marked),
        "max_ms": max(marked),
        "ratio_to_bare": statistics.median(ratios),
        "ratio_ci95": ci95(ratios),
        "paired_ratios": ratios,
        "reps_ms": marked,
        "unmarked_ms": steps_ms[False],
        "phases_us": {
            cls: {p: float(np.median([row[i] for row in phases[m]])) for i, p in enumerate(PHASES)}
            for cls, m in (("marked", True), ("unmarked", False))
        },
        # (a step's wait is not looked at beforehand: None)
        "waits_at_once": {"marked": None if step_wait else at_once[True] / waits, "unmarked": at_once[False] / waits},
    }


PHASES = ("step entry", "work", "step exit", "wait records", "waits")  # `neighbours`' phases of a step
#: `neighbours`' rows, and what `always_on` adds to the loop's name for each
_NEIGHBOURS = (("steps, neighbours", ""), ("steps, neighbours, step.wait", ", step.wait"))


def always_on(results: dict[str, Any], shares: dict[str, Any]) -> dict[str, Any]:
    """Per loop, what an always-on step timer costs in all (%): the marks (`neighbours`: the median of the paired
    ratios; and by phase, marked minus unmarked on the loop's own calls: the step's entry and exit and the records
    after it, whose first pays for the step's launches in the driver, so an exit's record takes that from them. Work
    and waits, which hold the devices' time, are left out: whole steps' noise does not blur it) plus the harvest
    thread (`harvest_share`), which neighbours cancel: None where the harvest share did not run
    (``--harvest-steps 0``), with the totals. A loop that waits on the step (``steps, neighbours, step.wait``) is
    ``<loop>, step.wait``, with the same harvest share."""
    out = {}
    for (loop, rows), (name, how) in itertools.product(results.items(), _NEIGHBOURS):
        nb, share = rows.get(name), shares.get(loop)
        if not nb:
            continue
        ph = nb["phases_us"]
        extra_us = sum(ph["marked"][p] - ph["unmarked"][p] for p in ("step entry", "step exit", "wait records"))
        unmarked_us = statistics.median(nb["unmarked_ms"]) * 1e3
        marks, by_phase = (nb["ratio_to_bare"] - 1) * 100, extra_us / unmarked_us * 100
        harvest = share["share_pct"] if share else None
        out[loop + how] = {
            "marks_pct": marks,
            "phases_us": extra_us,
            "phases_pct": by_phase,
            "harvest_pct": harvest,
            "total_pct": None if harvest is None else marks + harvest,
            "total_by_phase_pct": None if harvest is None else by_phase + harvest,
        }
    return out


def ci95(ratios: list[float], resamples: int = 4000) -> list[float]:
    """A 95 % bootstrap interval of the median of ``ratios`` (the pairs resampled with replacement; seeded, so a
    report reproduces): an overhead is shown below 1 % when the interval's top is below 1.01."""
    if len(ratios) < 3:
        return [min(ratios), max(ratios)]
    r = np.asarray(ratios)
    picks = np.random.default_rng(0).integers(0, len(r), (resamples, len(r)))
    lo, hi = np.percentile(np.median(r[picks], axis=1), [2.5, 97.5])
    return [float(lo), float(hi)]


def _cupti_child(argv: list[str], results: dict, skipped: dict) -> None:
    """Run the CUPTI step timer's pairs in a child process and add them to ``results`` (as ``"steps cupti"``, its
    ratio against the child's own bare runs)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rest = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]
        out = subprocess.run([sys.executable, __file__, *rest, "--cupti-child", "--out", tmp], text=True)
        path = os.path.join(tmp, "bench_steps.json")
        if out.returncode != 0 or not os.path.exists(path):
            skipped["steps cupti"] = f"its child process failed (exit {out.returncode})"
            return
        with open(path) as f:
            child = json.load(f)["results"]
    for loop, rows in child.items():
        if loop in results:
            results[loop]["steps cupti"] = rows["steps cupti"] | {"bare_of_its_process_ms": rows["bare"]["median_ms"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cuda", "host"), default=None, help="default: $ASYNCGPU_BACKEND or cuda")
    ap.add_argument("--devices", type=int, default=None, help="how many devices (default: every one)")
    ap.add_argument("--steps", type=int, default=40, help="steps per repetition and mode")
    ap.add_argument("--warmup", type=int, default=10, help="steps before each timed run")
    ap.add_argument("--repeat", type=int, default=30, help="pairs per mode (bare first, then the mode first...)")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=8192, help="matmul size of the gpu-bound loop")
    ap.add_argument("--matmuls", type=int, default=4, help="matmuls per step of the gpu-bound loop")
    ap.add_argument(
        "--neighbours", type=int, default=120, help="`steps, neighbours`: groups L M U U L M (each two neighbour pairs)"
    )
    ap.add_argument(
        "--harvest-steps", type=int, default=1200, help="`harvest thread`: marked steps in one timer (0: not run)"
    )
    ap.add_argument(
        "--harvest-s",
        type=float,
        default=None,
        help="`harvest thread`: the timer's harvest_s (default: the step timer's own, EVENTS_HARVEST_S)",
    )
    ap.add_argument(
        "--parts",
        action="store_true",
        help="only the always-on cost's parts (neighbours, the harvest share): no whole runs, no peers, no CUPTI child",
    )
    ap.add_argument(
        "--profile-harvests",
        action="store_true",
        help="`harvest thread`: each harvest's parts timed on its thread's CPU clock; print them",
    )
    ap.add_argument("--out", metavar="DIR", help="also write DIR/bench_steps.json")
    ap.add_argument("--cupti-steps", type=int, default=40, help="the CUPTI child's runs: steps at a time")
    ap.add_argument(
        "--cupti-block-s",
        type=float,
        default=2 * CUPTI_HARVEST_S + 0.5,
        help="the CUPTI child's runs last at least this long (s): two harvests fall inside each",
    )
    ap.add_argument("--cupti-repeat", type=int, default=8, help="the CUPTI child's pairs per loop")
    ap.add_argument("--cupti-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.block_s = 0.0
    if args.cupti_child:
        args.steps, args.block_s, args.repeat = args.cupti_steps, args.cupti_block_s, args.cupti_repeat
        # torch's profiler (kineto) subscribes to CUPTI when torch starts CUDA, and CUPTI has one subscriber: the
        # CUPTI step timer takes it first, here, before torch loads (torch.profiler then has no GPU events in this
        # process: hence a process of its own)
        from asyncgpu._backends import cupti

        cupti.acquire(cupti.STEPS)
    backend = args.backend or os.environ.get("ASYNCGPU_BACKEND") or "cuda"
    count = args.devices if args.devices is not None else (2 if backend == "host" else None)
    devs = asyncgpu.devices(backend, count=count)
    skipped = {}
    modes: tuple[str, ...] = MODES
    if backend == "host":
        modes = ("bare", "steps", "steps, step.wait")
        skipped = {
            m: "the host backend has no CUPTI and runs no torch: CUDA only" for m in (*MODES[3:], *CUPTI_MODES[1:])
        }
    elif args.cupti_child:
        modes = CUPTI_MODES
    results = anyio.run(bench, devs, args, modes)
    if backend != "host" and not args.cupti_child and not args.parts:
        _cupti_child(argv if argv is not None else sys.argv[1:], results, skipped)
    doc = {
        "devices": [f"{d.name} {d.description}" for d in devs],
        "python": platform.python_version(),
        "argv": sys.argv[1:] if argv is None else argv,
        "steps": args.steps,
        "repeat": args.repeat,
        "results": results,
        "skipped": skipped,
    }
    runs = f"of {args.steps} steps" + (f" at a time for ≥ {args.block_s:.1f} s" if args.block_s else "")
    print(f"devices: {', '.join(doc['devices'])}; {args.repeat} pairs per mode against bare, {runs}")
    cost = results.pop("host cost per step")
    print(
        f"host cost per step, {cost['devices']} devices, no work: enter+exit {cost['enter_exit_us']['median']:.2f} µs "
        f"(loop's thread), harvest {cost['harvest_us']['median']:.2f} µs (harvest thread), medians of 5"
    )
    doc["host_cost_per_step"] = cost
    shares = results.pop("harvest thread", {})
    for loop, r in shares.items():
        cal = f", each {statistics.median(r['calibration_us']):.0f} µs p50" if r["calibration_us"] else ""
        harvest_us = statistics.median(r["harvest_us"] or [math.nan])
        cpu_us = statistics.median(r["harvest_cpu_us"] or [math.nan])
        print(
            f"harvest thread, {loop}: {r['share_pct']:+.2f} % of the loop's time ("
            + (f"harvest_s {r['timer']['harvest_s']:g}; " if "harvest_s" in r["timer"] else "")
            + f"{r['steps']} marked steps in "
            f"{r['wall_s']:.1f} s; {r['harvests']} harvests, each {harvest_us:.0f} µs p50 ({cpu_us:.0f} µs of its "
            "thread's CPU); "
            f"{r['calibrations']} clock calibrations{cal}; the steps that overlap them against the others' mean; "
            f"clock ages at the end {', '.join(f'{a:.0f}' for a in r['clock_ages_s'])} s)"
        )
        if r.get("harvest_parts_cpu_us"):
            every, longest = r["harvest_parts_cpu_us"], r["longest_harvest_parts_cpu_us"]
            total, n = sum(r["harvest_cpu_us"]), r["steps"]
            harvests = len(r["harvest_cpu_us"])
            first = r["harvest_parts_each_cpu_us"][0] if r["harvest_parts_each_cpu_us"] else {}
            print(
                f"    its parts, µs of the harvest thread's CPU: all {harvests} harvests (a step) | the longest | "
                "the first"
            )
            for k in sorted(every, key=lambda k: -every[k]):
                print(
                    f"      {every[k]:9.0f} ({100 * every[k] / total:4.1f} %, {every[k] / n:6.2f} µs a step) | "
                    f"{longest.get(k, 0.0):8.0f} | {first.get(k, 0.0):8.0f}  {k}"
                )
        for who, mine in (("the harvest thread", True), ("the loop's threads", False)):
            got = [c for c in r["collections"] if c["harvest_thread"] == mine]
            if got:
                gens = ", ".join(f"gen {c['generation']} {c['us']:.0f} µs" for c in got[:12])
                print(f"    Python's collections on {who}: {len(got)} ({gens}{', ...' if len(got) > 12 else ''})")
        doc.setdefault("harvest_thread", {})[loop] = r
    for loop, rows in results.items():
        head = "mode                          median ms   min ms    max ms   vs bare (paired p50 [95 % CI] {min, max})"
        print(f"\n{loop}:  {head}")
        for m, r in rows.items():
            pr, (lo, hi) = r["paired_ratios"], r.get("ratio_ci95", (1.0, 1.0))
            print(
                f"    {m:<30} {r['median_ms']:9.3f} {r['min_ms']:9.3f} {r['max_ms']:9.3f}   {r['ratio_to_bare']:.4f}x "
                f"[{lo:.4f}, {hi:.4f}] {{{min(pr):.3f}, {max(pr):.3f}}}"
            )
            if r.get("phases_us"):
                ph, once = r["phases_us"], r["waits_at_once"]
                for cls in ("marked", "unmarked"):
                    parts = ", ".join(f"{p} {ph[cls][p]:.1f}" for p in PHASES)
                    at_once = "" if once[cls] is None else f"; waits done at once {100 * once[cls]:.0f} %"
                    print(f"    {'':30} {cls} steps, µs p50: {parts}{at_once}")
            if r.get("exit_ms") and m == "steps cupti":
                print(
                    f"    {'':30} runs of ≥ {r['run_s']:.1f} s; the timer's exit (its last flush and parse, once a "
                    f"run, left out above) {statistics.median(r['exit_ms']):.1f} ms p50"
                )
    doc["always_on"] = always_on(results, shares)
    for loop, a in doc["always_on"].items():
        marks = (
            f"marks {a['marks_pct']:+.2f} % (neighbours' paired p50; by phase {a['phases_pct']:+.2f} %: "
            f"{a['phases_us']:.1f} µs a step)"
        )
        if a["harvest_pct"] is None:
            print(f"\nalways-on cost, {loop}: {marks}; the harvest thread not run (--harvest-steps 0)")
            continue
        print(
            f"\nalways-on cost, {loop}: {marks} + harvest thread {a['harvest_pct']:+.2f} % = "
            f"{a['total_pct']:+.2f} % ({a['total_by_phase_pct']:+.2f} % by phase)"
        )
    for m, why in skipped.items():
        print(f"skipped {m}: {why}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "bench_steps.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {path}")
    asyncgpu.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
