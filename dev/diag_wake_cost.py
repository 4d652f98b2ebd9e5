"""What a wake costs the loop's thread in a burst, without a GPU: 256 waits on 8 streams of a simulated device all
complete at once; the loop's poller looks (`Engine.collect`), hands them over (`Engine.dispatch`, which resumes
them), and the loop runs the 256 tasks to their end. Against the floor: the same 256 futures resolved directly
(``set_result``) and their tasks run.

    PYTHONPATH=$PWD python dev/diag_wake_cost.py [--nested] [--reps 40]

Prints ns per wait (median of the repetitions) for the look, the hand-over with the resumes, and the tasks' steps,
and the floor's total. ``--nested``: each task awaits through one coroutine frame more (as `Event.wait` did when
it was an ``async def`` around the engine's coroutine). No GPU: the device's query is a Python attribute read.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from asyncgpu._runtime import engine as E
from asyncgpu._runtime.waiting import await_completion
from benchmarks._common import tee_stdout  # noqa: E402

_now = time.perf_counter_ns
N = 256


class _Raw:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


class _Device:
    name = "simulated:0"
    on_progress = None

    @staticmethod
    def query(raw: _Raw) -> bool:
        return raw.done


async def _engine_burst(eng: E.Engine, dev: _Device, nested: bool) -> tuple[float, float, float]:
    loop = asyncio.get_running_loop()
    raws = [_Raw() for _ in range(N)]
    left = [N]

    def wait(i: int):  # as `Event.wait`: returns the engine's coroutine
        return await_completion(eng, dev.query, E.WaitFor(raws[i], i % 8, i, "t", 0, None))

    async def nested_wait(i: int) -> None:  # as `Event.wait` was: an ``async def`` around it
        await wait(i)

    async def task(i: int) -> None:
        await (nested_wait(i) if nested else wait(i))
        left[0] -= 1

    tasks = [loop.create_task(task(i)) for i in range(N)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # every wait registered
    for r in raws:
        r.done = True
    poller = E.Poller(E.KIND_ASYNCIO, loop, loop.call_soon)
    t0 = _now()
    fired = eng.collect(limit=0)
    t1 = _now()
    eng.dispatch(fired, 0, here=poller)
    t2 = _now()
    while left[0]:
        await asyncio.sleep(0)
    t3 = _now()
    del tasks
    return (t1 - t0) / N, (t2 - t1) / N, (t3 - t2) / N


async def _floor_burst() -> float:
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(N)]
    left = [N]

    async def task(i: int) -> None:
        await futs[i]
        left[0] -= 1

    tasks = [loop.create_task(task(i)) for i in range(N)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    t0 = _now()
    for f in futs:
        f.set_result(None)
    while left[0]:
        await asyncio.sleep(0)
    del tasks
    return (_now() - t0) / N


async def _reps(reps: int, nested: bool) -> tuple[np.ndarray, np.ndarray]:
    dev = _Device()
    eng = E.Engine(dev)
    eng._thread = object()  # (no waiter thread: this loop's poller does every look)
    ours = np.array([await _engine_burst(eng, dev, nested) for _ in range(reps)])
    floor = np.array([await _floor_burst() for _ in range(reps)])
    return ours, floor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nested", action="store_true")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--out", help="also write what is printed to this file")
    args = p.parse_args()
    with tee_stdout(args.out):
        _run(args)


def _run(args: argparse.Namespace) -> None:
    gc.disable()
    ours, floor = asyncio.run(_reps(args.reps, args.nested))
    look, hand, steps = np.median(ours, axis=0)
    print(
        f"ns per wait, a burst of {N}{' (nested)' if args.nested else ''}: look {look:.0f}, hand-over and resume "
        f"{hand:.0f}, task steps {steps:.0f}, total {look + hand + steps:.0f}; floor {np.median(floor):.0f}"
    )


if __name__ == "__main__":
    main()
