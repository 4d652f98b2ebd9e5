"""Where each device's `prepare()` spends its time when every device prepares at once (the demo's start): a log of
the backend's compile, load, primer and calibration calls per worker thread, in ms from the start.

    python dev/diag_prepare.py [--devices N] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import os as _os
import sys as _sys
import threading
import time

import anyio

import asyncgpu
from asyncgpu._backends.cuda import hotpath as cuda_mod  # `_compiled` is looked up there

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to

LOG: list[tuple[str, str, float, float]] = []
T0 = time.perf_counter()


def logged(owner: object, name: str) -> None:
    real = getattr(owner, name)

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            what = name if not args or not hasattr(args[0], "name") else f"{args[0].name} {name}"
            if len(args) > 1 and isinstance(args[1], str):
                what += f"({args[1]})"
            LOG.append((threading.current_thread().name, what, (t0 - T0) * 1e3, (time.perf_counter() - T0) * 1e3))

    setattr(owner, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int)
    p.add_argument("--out", help="also write what is printed to this file")
    args = p.parse_args()
    tee_stdout_to(args.out)
    device_class = type(asyncgpu.device("cuda:0")._internal.bd)
    for name in ("prepare", "prepare_kernel", "_make_primer", "_calibration", "_kernel"):
        if hasattr(device_class, name):
            logged(device_class, name)
    logged(cuda_mod, "_compiled")
    devs = asyncgpu.devices("cuda", count=args.devices)
    done: dict[str, float] = {}

    async def one(d: asyncgpu.Device) -> None:
        await d.prepare()
        done[d.name] = (time.perf_counter() - T0) * 1e3

    async def go() -> None:
        global T0
        T0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for d in devs:
                tg.start_soon(one, d)

    anyio.run(go)
    for thread, what, t0, t1 in sorted(LOG, key=lambda r: r[2]):
        print(f"{t0:9.2f} {t1:9.2f} {t1 - t0:8.2f} ms  {thread:<28} {what}")
    print("prepare() returned (ms):", {k: round(v, 2) for k, v in done.items()})
    print(f"KEY prepare ends spread {max(done.values()) - min(done.values()):.2f} ms")


if __name__ == "__main__":
    main()
