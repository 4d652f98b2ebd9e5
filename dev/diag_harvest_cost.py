"""Where a step timer's harvest spends its time per step on a GPU: the driver's calls it makes per event, timed
alone, and the harvest of chained steps with no work in them under cProfile.

    PYTHONPATH=$PWD python dev/diag_harvest_cost.py [--devices N] [--steps 2000]

Prints µs per call, p50 of ``--reps`` rounds of ``--steps`` calls: ``cuEventElapsedTime`` through the hot path
(ctypes, the GIL kept) and through cuda.bindings, the same ctypes call with its output reused (the Python around it),
``cuEventQuery`` on a completed event; then µs per step of `StepTimer._harvest` on ``--devices`` devices and its
profile (the functions with the most own time). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu  # noqa: E402


def per_call_us(fn, args_list, reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for a in args_list:
            fn(*a)
        out.append((time.perf_counter_ns() - t0) / len(args_list) / 1e3)
    return statistics.median(out)


def calls(dev: asyncgpu.Device, n: int, reps: int) -> dict[str, float]:
    di = dev._internal
    bd, pool, stream = di.bd, di.timing_pool, dev.stream
    raws = [pool.take() for _ in range(n + 1)]
    for raw in raws:
        di.record_raw(stream, raw)
    dev.synchronize()
    anchor, evs = raws[0], raws[1:]
    pairs = [(anchor, e) for e in evs]
    out = {"elapsed (hot path)": per_call_us(bd.elapsed_ms, pairs, reps)}
    d = bd._drv.d
    out["elapsed (cuda.bindings)"] = per_call_us(lambda a, b: d.cuEventElapsedTime(a[1], b[1]), pairs, reps)
    elapsed_c = bd._drv.elapsed_c
    if elapsed_c is not None:
        ms = ctypes.c_float()
        p = ctypes.byref(ms)
        out["elapsed (ctypes, output reused)"] = per_call_us(lambda a, b: elapsed_c(p, a[3], b[3]), pairs, reps)
    out["query, completed (hot path)"] = per_call_us(bd.query, [(e,) for e in evs], reps)
    out["a Python call doing nothing"] = per_call_us(lambda a, b: None, pairs, reps)
    pool.give_many(raws)
    return out


async def harvest(devs: list, n: int, reps: int) -> tuple[float, str]:
    per_step, prof = [], cProfile.Profile()
    for rep in range(reps):
        async with asyncgpu.step_timer(devs, harvest_s=3600, max_pending=2 * n) as st:
            for _ in range(n):
                with st.step():
                    pass
            for d in devs:
                await d.asynchronize()
            last = rep == reps - 1
            if last:
                prof.enable()
            t0 = time.perf_counter_ns()
            k = st._harvest()
            t1 = time.perf_counter_ns()
            if last:
                prof.disable()
            else:
                per_step.append((t1 - t0) / max(k, 1) / 1e3)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    return statistics.median(per_step), s.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--steps", type=int, default=800)  # (below a stream's queue bound: no work between them)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    devs = asyncgpu.devices()[: args.devices]
    if devs[0].backend != "cuda":
        print("needs a CUDA GPU")
        return 2
    for d in devs:
        for name, us in calls(d, args.steps, args.reps).items():
            print(f"{d.name}: {name}: {us:.2f} µs a call")
    us, profile = asyncio.run(harvest(devs, args.steps, args.reps))
    print(f"harvest of chained steps, {len(devs)} devices: {us:.2f} µs a step (p50 of {args.reps - 1})")
    print(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
