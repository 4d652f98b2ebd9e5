"""What a burst of timing records from a coroutine costs the loop's thread: 8 held streams, records until each
stream refuses (`QueueFullError`), with a cold pool (every event created during the burst) and a warm one (the
same burst again). Prints µs per record and the loop's worst tick.

    python dev/diag_burst.py [--backend cuda|host] [--chunk 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import os as _os
import sys as _sys
import time

import anyio

import asyncgpu
from asyncgpu.errors import QueueFullError

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to


async def burst(dev: asyncgpu.Device, chunk: int) -> tuple[float, float, int]:
    holds = [dev._internal.bd.hold(s._internal.raw) for s in dev.streams]
    events, late, stop = [], [], [False]

    async def ticker() -> None:
        while not stop[0]:
            nxt = time.perf_counter_ns() + 1_000_000
            await anyio.sleep(0.001)
            late.append((time.perf_counter_ns() - nxt) / 1e6)

    async def producer() -> None:
        full: set[int] = set()
        t0 = time.perf_counter_ns()
        i = 0
        while len(full) < len(dev.streams):
            s = dev.streams[i % len(dev.streams)]
            i += 1
            if s.handle in full:
                continue
            try:
                events.append(dev.record(s))
            except QueueFullError:
                full.add(s.handle)
            if i % chunk == 0:
                await anyio.sleep(0)
        per_us.append((time.perf_counter_ns() - t0) / 1e3 / len(events))
        for h in holds:
            dev._internal.bd.release(h)
        for ev in events:
            await ev.wait()
            ev.release()
        stop[0] = True

    per_us: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        tg.start_soon(producer)
    return per_us[0], max(late[1:] or [0.0]), len(events)


async def main(backend: str, chunk: int) -> None:
    dev = asyncgpu.device(f"{backend}:0", streams=8)
    await dev.prepare()
    for what in ("cold pool", "warm pool"):
        per, worst, n = await burst(dev, chunk)
        print(f"{what}: {n} records, {per:.1f} us per record, worst tick {worst:.2f} ms late (yield every {chunk})")
        dev.pool_stats()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--chunk", type=int, default=50)
    p.add_argument("--out", help="also write what is printed to this file")
    a = p.parse_args()
    tee_stdout_to(a.out)
    anyio.run(main, a.backend, a.chunk)
