"""Where the engine's looks at the device go under load: per `Engine.collect`, the driver queries (done / not yet,
count and ns each), the wait for the engine's lock and the time per wait it found, by thread (the loop's poller or
the waiter thread); also one ``cuEventQuery``'s cost on this host.

    PYTHONPATH=$PWD python dev/diag_collect.py [asyncio,uvloop,trio] [1000@150k,1000@40k,1000@burst]

A diagnostic: it wraps `asyncgpu._runtime.engine.Engine.collect` and the backend's query. Each case also runs the
loop's floor (`bench_load.py`) for comparison. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu  # noqa: E402
from asyncgpu._runtime import engine as E  # noqa: E402
from benchmarks import bench_load as B  # noqa: E402
from benchmarks._common import tee_stdout  # noqa: E402

_now = time.perf_counter_ns
_TL = threading.local()
STATS: list[tuple] = []  # (thread, fired, ns, lock wait ns, done queries, their ns, not-ready queries, their ns)
_collect = E.Engine.collect


def collect(self, skip_covered=False, **kw):
    t0 = _now()
    with self._lock:
        t1 = _now()
    _TL.acc = [0, 0, 0, 0]
    fired = _collect(self, skip_covered, **kw)
    STATS.append((threading.current_thread().name[:6], len(fired), _now() - t0, t1 - t0, *_TL.acc))
    _TL.acc = None
    return fired


def counting(query):
    def q(raw):
        t = _now()
        done = query(raw)
        dt = _now() - t
        acc = getattr(_TL, "acc", None)
        if acc is not None:
            k = 0 if done else 2
            acc[k] += 1
            acc[k + 1] += dt
        return done

    return q


def query_cost(dev, truth) -> None:
    s = dev.create_stream()
    release = truth.hold([s], 20)
    evs = [s.record(timing=False) for _ in range(200)]
    q = dev._internal.bd.query
    for label in ("not ready", "done"):
        if label == "done":
            release()
            dev.synchronize()
        t = _now()
        for _ in range(20):
            for e in evs[:50]:
                q(e._raw)
        print(f"cuEventQuery through the backend, {label}: {(_now() - t) / 1000:.0f} ns", flush=True)
    for e in evs:
        e.release()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("loops", nargs="?", default="asyncio,uvloop", help="comma list (default asyncio,uvloop)")
    p.add_argument("cases", nargs="?", default="1000@150k,1000@40k,1000@burst", help="comma list of N@RATE")
    p.add_argument("--out", help="also write what is printed to this file")
    args = p.parse_args(argv)
    with tee_stdout(args.out):
        _run(args.loops.split(","), args.cases.split(","))


def _run(loops: list[str], cases: list[str]) -> None:
    dev = asyncgpu.devices()[0]
    truth = B.Truth(dev, 20_000)
    for _ in range(3):
        truth.offset(3)
    query_cost(dev, truth)
    E.Engine.collect = collect
    dev._internal.bd.query = counting(dev._internal.bd.query)
    setups = [(dev, truth, [dev.create_stream() for _ in range(8)])]
    for lp in loops:
        for case in cases:
            n, rate = int(case.split("@")[0]), B.RATES[case.split("@")[1]]
            STATS.clear()
            row = B.run_case(lp, "asyncgpu", setups, n, rate, 8)
            stats = list(STATS)
            fl = B.run_case(lp, "floor", setups, n, rate, 8)
            print(
                f"== {lp} {case}: p50 {row['p50_us']:.1f} p99 {row['p99_us']:.1f} (floor {fl['p50_us']:.1f} / "
                f"{fl['p99_us']:.1f}); collects {len(stats)}, {sum(1 for x in stats if x[1])} found some",
                flush=True,
            )
            agg: dict[str, np.ndarray] = collections.defaultdict(lambda: np.zeros(7))
            for x in stats:
                agg[x[0]] += np.array(x[1:], dtype=float)
            for th, a in agg.items():
                per = a[1] / max(a[0], 1) / 1e3
                print(
                    f"   {th:6s} found {a[0]:.0f} in {a[1] / 1e3:.0f} us ({per:.2f} a wait), lock wait "
                    f"{a[2] / 1e3:.0f} us; queries done {a[3]:.0f} x {a[4] / max(a[3], 1):.0f} ns, not ready "
                    f"{a[5]:.0f} x {a[6] / max(a[5], 1):.0f} ns",
                    flush=True,
                )
    truth.close()
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
