"""Who pays for the driver's queries under load, and what each costs: bench_load's cases with every
``cuEventQuery`` counted by its caller and timed.

    PYTHONPATH=$PWD python dev/diag_queries.py 1000@8k,1000@40k,100@burst [asyncio,uvloop] [repetitions]

Per case and repetition: the excess p50/p99 (µs, against the kernels' `%globaltimer` end stamps, as
`bench_load.py`), CPU µs per wait, and per wait: the looks of the waiter thread (``thread``) and of the loop's
poller (``poller``), the queries each made, and the others (``other``: a wait's own query when it registers, an
owner polling its own event); then the first look that found completed waits: how many, how long it took, how many
queries it made and what they cost (µs, p50 and sum, found done / not done). A diagnostic: it wraps
`Engine.collect` and the device's query. Needs a CUDA GPU.
"""

import argparse
import collections
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import numpy as np  # noqa: E402

import asyncgpu  # noqa: E402
from asyncgpu._runtime import engine as E  # noqa: E402
from benchmarks import bench_load as B  # noqa: E402
from benchmarks._common import tee_stdout  # noqa: E402

_now = time.perf_counter_ns
_WHO = threading.local()
COUNTS: collections.Counter = collections.Counter()
QUERIES: list = []  # (start ns, took ns, done)
LOOKS: list = []  # (start ns, took ns, waits popped, who)


def _instrument(dev) -> None:
    query = dev._internal.bd.query

    def timed(raw):
        t0 = _now()
        done = query(raw)
        QUERIES.append((t0, _now() - t0, done))
        COUNTS["queries: " + getattr(_WHO, "who", "other")] += 1
        return done

    dev._internal.bd.query = timed
    collect = E.Engine.collect

    def counted(self, skip_covered=False, due_only=False, limit=0):
        who = "thread" if skip_covered else ("poller" if due_only else "other look")
        _WHO.who = who
        COUNTS["looks: " + who] += 1
        t0 = _now()
        try:
            fired = collect(self, skip_covered, due_only, limit)
        finally:
            _WHO.who = "other"
        LOOKS.append((t0, _now() - t0, len(fired), who))
        return fired

    E.Engine.collect = counted


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cases", nargs="?", default="1000@8k,1000@40k,100@burst", help="comma list of N@RATE")
    p.add_argument("loops", nargs="?", default="asyncio,uvloop", help="comma list (default asyncio,uvloop)")
    p.add_argument("reps", nargs="?", type=int, default=2, help="repetitions (default 2)")
    p.add_argument("--out", help="also write what is printed to this file")
    args = p.parse_args(argv)
    with tee_stdout(args.out):
        _run(args.cases.split(","), args.loops.split(","), args.reps)


def _run(cases: list[str], loops: list[str], reps: int) -> None:
    dev = asyncgpu.devices()[0]
    _instrument(dev)
    truth = B.Truth(dev, 20_000)
    for _ in range(3):
        truth.offset(3)
    setups = [(dev, truth, [dev.create_stream() for _ in range(8)])]
    print(f"{dev.description}; command: {' '.join(sys.argv)}", flush=True)
    for case in cases:
        n, rate = int(case.split("@")[0]), B.RATES[case.split("@")[1]]
        for lp in loops:
            for rep in range(reps):
                COUNTS.clear()
                QUERIES.clear()
                LOOKS.clear()
                r = B.run_case(lp, "asyncgpu", setups, n, rate, 8)
                per = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(COUNTS.items()))
                print(
                    f"{case} {lp} rep {rep}: p50 {r['p50_us']:.0f} p99 {r['p99_us']:.0f} cpu {r['cpu_us_per_wait']:.0f}"
                    f" | per wait: {per}",
                    flush=True,
                )
                first = next((look for look in LOOKS if look[2]), None)
                if first is None:
                    continue
                t0, took, popped, who = first
                inside = [q for q in QUERIES if t0 <= q[0] <= t0 + took]
                done = [q[1] / 1e3 for q in inside if q[2]]
                not_done = [q[1] / 1e3 for q in inside if not q[2]]

                def cost(xs):
                    return f"{len(xs)} x p50 {np.median(xs) if xs else 0:.2f} (sum {sum(xs):.0f})"

                print(
                    f"   first look with completions ({who}): {popped} waits in {took / 1e3:.0f} us; "
                    f"queries done {cost(done)}, not done {cost(not_done)}",
                    flush=True,
                )
    truth.close()
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
