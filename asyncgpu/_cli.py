"""The ``asyncgpu`` command: ``asyncgpu demo`` and ``asyncgpu devices``.

``asyncgpu demo`` runs the seed workload on every device at once, prints the timeline and the summaries, writes a
Perfetto trace, and ends with the workload balance report. ``asyncgpu devices`` lists the devices with their
clock calibration (offset of each device clock to the host clock, and the error bound).

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
from rich.table import Table

from . import _select
from ._errors import AsyncGPUError, BackendError, ClockError, NoDeviceError, UnknownDeviceError
from ._export import write_trace
from ._report import activity_table, balance_renderable, device_table, timeline_table
from ._timer import gpu_timer

__all__ = ["main", "run_demo"]

DEMO_ITERATIONS = (500, 1000, 1500)
DEMO_ELEMENTS = 10_000_000
DEMO_TRACE = "asyncgpu-demo.trace.json"


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


async def run_demo(console: Console, backend: str | None, elements: int | None, count: int | None,
                   trace: str | None = DEMO_TRACE) -> int:
    """The seed workload, concurrently on every device (one task each); prints the report, writes the trace
    (unless ``trace`` is None) and ends with the balance report. Returns the exit code."""
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
    tl = t.timeline
    for part in (timeline_table(tl, limit=50), activity_table(tl), device_table(tl)):
        console.print(part)
        console.print()
    expected = float(sum(DEMO_ITERATIONS))
    bad = [k for k, v in results.items() if not np.all(v == expected)]
    if bad:
        console.print(f"[red]wrong result on {', '.join(bad)}: expected every element = {expected}[/red]")
        return 1
    console.print(f"checked: every element is {expected:g} on {', '.join(results)}")
    clocks = "; ".join(f"{c.device} ±{c.bound_ns / 1e3:.1f} µs" if c.aligned else f"{c.device} NOT aligned ({c.reason})"
                       for c in tl.clocks)
    console.print(f"time base: host clock, devices aligned: {clocks}")
    console.print(f"host: {t.host_ms:,.3f} ms issuing + {t.wait_ms:,.3f} ms waiting for the devices, "
                  f"CPU {t.cpu_ms:,.3f} ms")
    if trace is not None:
        try:
            write_trace(t, trace)
        except OSError as exc:
            console.print(f"[red]could not write the trace: {exc}[/red]")
            return 1
        console.print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")
    console.print()
    console.print(balance_renderable(t.balance()))
    return 0


def _devices(console: Console, backend: str | None) -> int:
    name = backend or _select.default_backend()
    if name == "cuda":
        ok, why = _select.load_backend("cuda").available()
        if not ok:
            console.print(f"no usable CUDA GPU: {why}")
            return 0
    table = Table(title=f"{name} devices, clocks against the host clock (time.perf_counter_ns)", title_justify="left",
                  show_edge=False)
    for col, justify in (("device", "left"), ("model", "left"), ("event anchor ± µs", "right"),
                         ("%globaltimer − host (s)", "right"), ("± µs", "right"), ("drift ppm", "right")):
        table.add_column(col, justify=justify)
    for d in _select.devices(name):
        try:
            cal = d.clock(refresh=True, samples=32)
        except ClockError as exc:
            table.add_row(d.name, d.description, f"failed: {exc}", "", "", "")
            continue
        gt = "—" if cal.globaltimer_offset_ns is None else f"{cal.globaltimer_offset_ns / 1e9:,.6f}"
        gb = "—" if cal.globaltimer_bound_ns is None else f"{cal.globaltimer_bound_ns / 1e3:.2f}"
        drift = "—" if cal.drift_ppm is None else f"{cal.drift_ppm:+.2f}"
        table.add_row(d.name, d.description, f"{cal.bound_ns / 1e3:.2f}", gt, gb, drift)
    console.print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncgpu", description="Time and orchestrate GPU work from asyncio/trio.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the seed workload on every device and print where the time went")
    demo.add_argument("--backend", choices=("cuda", "host"), help="default: CUDA when a GPU is usable, else host")
    demo.add_argument("--elements", type=int, help="float32 elements per device (default 10 M)")
    demo.add_argument("--devices", type=int, dest="count", help="how many devices (default: all; host: 2)")
    demo.add_argument("--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    demo.add_argument("--trace", default=DEMO_TRACE, help=f"Perfetto trace to write (default {DEMO_TRACE})")
    demo.add_argument("--no-trace", dest="trace", action="store_const", const=None, help="write no trace")
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
        return anyio.run(run_demo, console, args.backend, args.elements, args.count, args.trace, backend=backend,
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
