"""Waits under load, two variants of the completion engine interleaved in one process (an A/B: machines differ
more than the variants do, so only a same-process comparison tells).

    PYTHONPATH=$PWD python dev/ab_load.py --variant due [--cases 1000@8k,1000@40k] [--loops asyncio,uvloop]
    PYTHONPATH=$PWD python dev/ab_load.py --variant gc
    PYTHONPATH=$PWD python dev/ab_load.py --variant engine:/path/to/engine.py

Variants (A against B):
* ``due``: a loop's poller queries only the stream heads that are due (the library's way) / every head (its
  `Engine.collect` patched to ignore ``due_only``);
* ``gc``: the collector on / off during each case (does it set the tail?);
* ``chunk``: a look pops at most `engine.poller.COLLECT_LIMIT` completed waits (a burst handed over in parts) / all;
* ``oracle``: the driver queries of the case's own events answered from the pinned `%globaltimer` stamps their
  kernels write (a pinned-word read, no driver call: what a GPU-written completion word per stream would at best
  give) / the driver's ``cuEventQuery``;
* ``triotask``: a trio run's poller passes run in a system task (`Poller`) / each pass schedules the next with
  ``TrioToken.run_sync_soon``, as before 2026-11-24 (asyncio is the same in both);
* ``forget``: the engine keeps what it learned in the cases before (as a long-lived process does) / forgets it
  before each case (the per-stream estimates and spreads, the loops' delivery delays: a fresh process);
* ``engine:PATH``: this tree's waiter-thread planning and hand-over (`Engine._pause`, `Engine.dispatch`, with
  this module's pollers) / those of the engine module at PATH (e.g. ``git show REV:asyncgpu/_core/engine.py``).

Each case as `bench_load.py` (the same kernels, `%globaltimer` ground truth and the loop's floor, once per case),
``--reps`` repetitions, the order of A and B alternating; prints per variant the median and every repetition of
p50 and p99 excess (µs), CPU per wait (µs) and driver queries per wait. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.util
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu  # noqa: E402
from asyncgpu._runtime import engine as E  # noqa: E402
from asyncgpu._runtime.engine import poller as E_poller  # noqa: E402
from asyncgpu._runtime.engine import thread as E_thread  # noqa: E402
from benchmarks import bench_load as B  # noqa: E402
from benchmarks._common import tee_stdout  # noqa: E402


def _variants(spec: str) -> tuple[tuple[str, str], object]:
    """The names of A and B and a function that switches to one (True: A)."""
    if spec == "due":
        collect = E.Engine.collect

        def collect_all(self, skip_covered=False, due_only=False, limit=0):  # every head at every pass
            return collect(self, skip_covered, False, limit)

        def use_due(a: bool) -> None:
            E.Engine.collect = collect if a else collect_all

        return ("due", "all"), use_due
    if spec == "chunk":
        limit = E.COLLECT_LIMIT

        def use_chunk(a: bool) -> None:  # (the thread and the pollers each read their own binding)
            E_poller.COLLECT_LIMIT = E_thread.COLLECT_LIMIT = limit if a else 0

        return ("chunk", "whole"), use_chunk
    if spec == "gc":

        def use_gc(a: bool) -> None:
            gc.collect()
            (gc.enable if a else gc.disable)()

        return ("gc", "nogc"), use_gc
    if spec == "oracle":
        state = {"on": True, "map": {}}

        def on_events(truth, evs, burst, sidx):
            m = state["map"] = {}
            for i, (j, ev) in enumerate(evs):
                m[id(ev._raw)] = (truth.stamps, sidx[i] if burst else j)

        B.ON_EVENTS = on_events

        def use_oracle(a: bool) -> None:
            state["on"] = a

        return ("oracle", "driver"), (use_oracle, state)
    if spec == "triotask":
        task_wake = E.Poller._wake_trio_task

        def soon_wake(self) -> None:  # the pass at once, the next through the token (`Poller.run`'s asyncio form)
            self.run()

        def use_triotask(a: bool) -> None:
            E.Poller._wake_trio_task = task_wake if a else soon_wake

        return ("task", "soon"), use_triotask
    if spec == "forget":
        state = {"on": False}

        def use_forget(a: bool) -> None:
            state["on"] = not a

        return ("keep", "forget"), (use_forget, state)
    if spec.startswith("engine:"):
        path = spec.split(":", 1)[1]
        name = "asyncgpu._runtime.engine_b"  # (inside the package: its relative imports resolve)
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise SystemExit(f"cannot load an engine module from {path}")
        other = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = other
        loader_spec.loader.exec_module(other)
        ours = (E.Engine._pause, E.Engine.dispatch)
        theirs = (other.Engine._pause, other.Engine.dispatch)

        def use_engine(a: bool) -> None:
            E.Engine._pause, E.Engine.dispatch = ours if a else theirs

        return ("this", "other"), use_engine
    raise SystemExit(f"--variant: due, chunk, gc or engine:PATH, not {spec!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variant", required=True)
    p.add_argument("--cases", default="1000@8k,1000@40k,1000@150k,1000@burst,100@burst")
    p.add_argument("--loops", default="asyncio,uvloop")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", help="also write what is printed to this file")
    args = p.parse_args()
    with tee_stdout(args.out):
        _run(args)


def _run(args: argparse.Namespace) -> None:
    (name_a, name_b), use = _variants(args.variant)
    oracle = forget = None
    if isinstance(use, tuple):
        use, extra = use
        if args.variant == "forget":
            forget = extra
        else:
            oracle = extra
    dev = asyncgpu.devices()[0]
    queries = [0]
    query = dev._internal.bd.query

    def counted(raw):
        queries[0] += 1
        return query(raw)

    if oracle is not None:

        def counted(raw):  # noqa: F811 - the oracle's form
            queries[0] += 1
            if oracle["on"]:
                hit = oracle["map"].get(id(raw))
                if hit is not None:
                    return hit[0][hit[1]] != 0
            return query(raw)

    dev._internal.bd.query = counted
    truth = B.Truth(dev, 20_000)
    for _ in range(3):
        truth.offset(3)
    setups = [(dev, truth, [dev.create_stream() for _ in range(8)])]
    res = collections.defaultdict(list)
    print(f"A/B on {dev.description}: {name_a} against {name_b}; command: {' '.join(sys.argv)}", flush=True)
    for rep in range(args.reps):
        for lp in args.loops.split(","):
            for case in args.cases.split(","):
                n, rate = int(case.split("@")[0]), B.RATES[case.split("@")[1]]
                if rep == 0:
                    fl = B.run_case(lp, "floor", setups, n, rate, 8)
                    res[(lp, case, "floor")].append((fl["p50_us"], fl["p99_us"], fl["cpu_us_per_wait"], 0.0))
                for a in (True, False) if rep % 2 == 0 else (False, True):
                    use(a)
                    queries[0] = 0
                    if forget is not None and forget["on"]:
                        with dev._internal.engine._lock:
                            dev._internal.engine._queues.clear()
                            dev._internal.engine._delivery_ns = dict(E.INITIAL_DELIVERY_NS)
                    r = B.run_case(lp, "asyncgpu", setups, n, rate, 8)
                    row = (r["p50_us"], r["p99_us"], r["cpu_us_per_wait"], queries[0] / n)
                    res[(lp, case, name_a if a else name_b)].append(row)
    use(True)
    for (lp, case, k), v in sorted(res.items()):
        a = np.array(v)
        reps50 = " ".join(f"{x:.0f}" for x in a[:, 0])
        reps99 = " ".join(f"{x:.0f}" for x in a[:, 1])
        print(
            f"{lp:8s} {case:11s} {k:6s} p50 {np.median(a[:, 0]):8.1f} [{reps50}]  p99 {np.median(a[:, 1]):8.1f} "
            f"[{reps99}]  cpu/wait {np.median(a[:, 2]):6.1f}  queries/wait {np.median(a[:, 3]):5.2f}",
            flush=True,
        )
    truth.close()
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
