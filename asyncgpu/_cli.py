"""The ``asyncgpu`` command: ``asyncgpu demo`` and ``asyncgpu devices``.

Exit codes: 0 success, 1 the work failed (a backend error, a wrong result), 2 a usage mistake (bad options,
no such device, no GPU when one was asked for). User mistakes print one line, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import anyio
import numpy as np
from rich.console import Console

from . import _select
from ._errors import AsyncGPUError, BackendError, NoDeviceError, UnknownDeviceError
from ._timer import gpu_timer

__all__ = ["main", "run_demo"]

DEMO_ITERATIONS = (500, 1000, 1500)
DEMO_ELEMENTS = 10_000_000


def _choose_backend(asked: str | None) -> tuple[str, str]:
    """The backend for the demo and the sentence that says why."""
    if asked is not None:
        return asked, f"the {asked} backend, as asked"
    ok, why = _select.load_backend("cuda").available()
    if ok:
        return "cuda", "CUDA"
    return "host", f"the HOST backend (CPU worker threads): no usable GPU here ({why})"


async def _demo_device(dev, n: int) -> np.ndarray:
    stream = dev.stream
    a = dev.alloc(n, np.float32)
    out = dev.alloc_pinned(n, np.float32)
    stream.memset(a, 0)
    for iterations in DEMO_ITERATIONS:
        stream.inc_loop(a, iterations)
    stream.copy_to_host(a, out)
    with dev.record() as done:
        await done.wait()
    return out


async def run_demo(console: Console, backend: str | None, elements: int | None, count: int | None) -> int:
    """The seed workload, concurrently on every device (one task each); prints the report. Returns the exit code."""
    name, why = _choose_backend(backend)
    devs = _select.devices(name, count=count)
    n = elements or DEMO_ELEMENTS
    models = ", ".join(sorted({d.description for d in devs}))
    console.print(f"asyncgpu demo on {why}: {len(devs)} device(s) ({models}), {n:,} float32 elements each")
    results: dict[str, np.ndarray] = {}
    async with gpu_timer(devs, label="demo") as t:
        async with anyio.create_task_group() as tg:
            async def one(dev):
                results[dev.name] = await _demo_device(dev, n)

            for dev in devs:
                tg.start_soon(one, dev)
    console.print(t)
    expected = float(sum(DEMO_ITERATIONS))
    bad = [k for k, v in results.items() if not np.all(v == expected)]
    if bad:
        console.print(f"[red]wrong result on {', '.join(bad)}: expected every element = {expected}[/red]")
        return 1
    console.print(f"checked: every element is {expected:g} on {', '.join(results)}")
    return 0


def _devices(console: Console, backend: str | None) -> int:
    name = backend or _select.default_backend()
    if name == "cuda":
        ok, why = _select.load_backend("cuda").available()
        if not ok:
            console.print(f"no usable CUDA GPU: {why}")
            return 0
    for d in _select.devices(name):
        console.print(f"{d.name}: {d.description}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncgpu", description="Time and orchestrate GPU work from asyncio/trio.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the seed workload on every device and print where the time went")
    demo.add_argument("--backend", choices=("cuda", "host"), help="default: CUDA when a GPU is usable, else host")
    demo.add_argument("--elements", type=int, help="float32 elements per device (default 10 M)")
    demo.add_argument("--devices", type=int, dest="count", help="how many devices (default: all; host: 2)")
    demo.add_argument("--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    devices = sub.add_parser("devices", help="list the devices of a backend")
    devices.add_argument("--backend", choices=("cuda", "host"))
    args = parser.parse_args(argv)
    console = Console()
    try:
        if args.command == "devices":
            return _devices(console, args.backend)
        if args.elements is not None and args.elements <= 0:
            parser.error("--elements must be positive")
        backend, options = ("trio", {}) if args.loop == "trio" else ("asyncio", {"use_uvloop": args.loop == "uvloop"})
        return anyio.run(run_demo, console, args.backend, args.elements, args.count, backend=backend,
                         backend_options=options)
    except (NoDeviceError, UnknownDeviceError) as exc:
        console.print(f"asyncgpu: {exc}", markup=False)
        return 2
    except (BackendError, AsyncGPUError) as exc:
        console.print(f"asyncgpu: {type(exc).__name__}: {exc}", markup=False)
        return 1
    finally:
        _select.close_all()


if __name__ == "__main__":
    sys.exit(main())
