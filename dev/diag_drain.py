"""The 10,000-record test's flow with each late tick tagged by the producer's phase: 8 held streams, records from a
task that awaits room when refused, a release after 0.3 s, then the drain (await every event). ``--switch S``
sets ``sys.setswitchinterval`` (a tick late by the GIL's switch interval points at a thread that holds the GIL).

    python dev/diag_drain.py [--backend cuda] [--switch 0.005] [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import os as _os
import sys
import sys as _sys
import threading
import time

import anyio

import asyncgpu
from asyncgpu.errors import QueueFullError

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to


async def once(backend: str) -> list[tuple[float, str]]:
    dev = asyncgpu.device(f"{backend}:0", streams=8)
    await dev.prepare(events=10_000)
    await dev.asynchronize()
    holds = [dev._internal.bd.hold(s._internal.raw) for s in dev.streams]
    phase = ["burst"]
    late: list[tuple[float, str]] = []
    stop = threading.Event()
    events = []

    async def ticker() -> None:
        while not stop.is_set():
            nxt = time.perf_counter_ns() + 1_000_000
            before = phase[0]
            await anyio.sleep(0.001)
            late.append(((time.perf_counter_ns() - nxt) / 1e6, f"{before}->{phase[0]}"))

    async def producer() -> None:
        for i in range(10_000):
            s = dev.streams[i % 8]
            if i % 50 == 49:
                await anyio.sleep(0)
            while True:
                try:
                    events.append(dev.record(s))
                    break
                except QueueFullError:
                    phase[0] = "room"
                    await s.room()
                    phase[0] = "burst"
        phase[0] = "drain"
        for ev in events:
            await ev.wait()
            ev.release()
        phase[0] = "done"
        stop.set()

    def release() -> None:
        for h in holds:
            dev._internal.bd.release(h)
        phase[0] = phase[0] + "+released"

    threading.Timer(0.3, release).start()
    gc.disable()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            tg.start_soon(producer)
    finally:
        gc.enable()
    asyncgpu.close_all()
    return late[1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--switch", type=float)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    p.add_argument("--out", help="also write what is printed to this file")
    a = p.parse_args()
    tee_stdout_to(a.out)
    if a.switch:
        sys.setswitchinterval(a.switch)
    for _ in range(a.runs):
        backend, options = ("trio", {}) if a.loop == "trio" else ("asyncio", {"use_uvloop": a.loop == "uvloop"})
        late = anyio.run(once, a.backend, backend=backend, backend_options=options)
        bad = [(round(x, 2), ph) for x, ph in late if x >= 2.0]
        print(
            f"switch {sys.getswitchinterval() * 1e3:.1f} ms: {len(late)} ticks, worst {max(x for x, _ in late):.2f} ms;"
            f" >= 2 ms: {bad}"
        )


if __name__ == "__main__":
    main()
