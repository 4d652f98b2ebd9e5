"""``asyncgpu demo``: the seed workload (memset, ``inc_loop`` three times, copy back) on every device at once,
one task per device, timed by one `gpu_timer`; then the timeline, the summaries, the trace and the balance report.

Cancellation: Ctrl-C cancels the timed scope, which then does not wait for the work still queued; `run_demo`
raises `KeyboardInterrupt` after it (`asyncgpu._cli.main` reports it with exit code 130).

Threads: the loop's thread (asyncio, uvloop or trio).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from typing import Any, Callable

import anyio
import numpy as np

from asyncgpu._analysis.report import activity_table, balance_renderable, device_table, timeline_table
from asyncgpu._backends import cupti
from asyncgpu._cli.common import GIB, Failed, Out, open_devices, print_footer, summaries
from asyncgpu._runtime import select
from asyncgpu._timing.scope import gpu_timer
from asyncgpu._trace.export import write_trace

__all__ = ["DEMO_ELEMENTS", "DEMO_ITERATIONS", "DEMO_TRACE", "run_demo"]

DEMO_ITERATIONS = (500, 1000, 1500)  # the three inc_loop launches: each element ends at their sum
DEMO_ELEMENTS = 10_000_000  # float32 elements per device, unless --elements
#: The demo's trace: Perfetto's native format when the ``perfetto`` package is there (``asyncgpu[perfetto]``),
#: else Chrome trace JSON (which Perfetto also opens).
DEMO_TRACE = "asyncgpu-demo.pftrace" if importlib.util.find_spec("perfetto") is not None else "asyncgpu-demo.trace.json"


def _choose_backend(asked: str | None) -> tuple[str, str]:
    """The backend for the demo and the sentence that says why: ``--backend``, else ``$ASYNCGPU_BACKEND``, else
    CUDA when a GPU is usable, else host."""
    if asked is not None:
        return asked, f"the {asked} backend, as asked"
    if os.environ.get("ASYNCGPU_BACKEND", "").strip():
        name = select.default_backend()
        return name, f"the {name} backend, as ASYNCGPU_BACKEND asks"
    ok, why = select.backend_available("cuda")
    if ok:
        return "cuda", "CUDA"
    return "host", f"the HOST backend (CPU worker threads): no usable GPU here ({why})"


def _check_memory(devs: list[Any], n: int) -> None:
    """Raise `Failed` when ``n`` float32 elements per device (and as many in pinned host memory) cannot fit."""
    if devs[0].backend == "host":  # host devices and the pinned copies share the host's RAM
        pools = [(f"the host RAM of {len(devs)} host devices", devs[0], 8 * len(devs))]
    else:
        pools = [(d.name, d, 4) for d in devs]
    for where, d, bytes_per_element in pools:
        info = d.memory_info()
        if info is not None and n * bytes_per_element > info[0]:
            raise Failed(
                f"--elements {n:,} needs {n * bytes_per_element / GIB:,.1f} GiB of {where}, which has "
                f"{info[0] / GIB:,.1f} GiB free: use --elements {info[0] // bytes_per_element:,} or fewer"
            )


async def _demo_setup(dev: Any, n: int) -> tuple[Any, np.ndarray]:
    """Everything the workload needs before its first launch, off the loop's thread (the devices set up at once):
    device memory, the page-locked buffer for the result (pinning tens of MB holds the calling thread for tens of
    ms, and the driver holds back other threads' calls meanwhile), and the kernels (compiled with NVRTC once per
    process, loaded into each GPU)."""
    a = await dev.aalloc(n, np.float32)
    host = await dev.aalloc_pinned(n, np.float32)
    await dev.prepare()
    return a, host


async def _demo_device(dev: Any, a: Any, host: np.ndarray, t0_s: float, out: Out) -> np.ndarray:
    """The workload on one device, enqueued at once; each step's end is awaited in turn to show progress. A
    checkpoint after each launch lets the other devices' tasks launch theirs in turn: one loop thread starts every
    device within a launch or two of each other, rather than one device's whole batch after another's."""
    stream = dev.stream
    checkpoint = anyio.lowlevel.checkpoint
    steps = []
    stream.memset(a, 0)
    steps.append(("memset", dev.record(timing=False)))
    await checkpoint()
    for iterations in DEMO_ITERATIONS:
        stream.inc_loop(a, iterations)
        steps.append((f"inc_loop x{iterations}", dev.record(timing=False)))
        await checkpoint()
    stream.copy_to_host(a, host)
    steps.append(("copy back", dev.record(timing=False)))
    for what, done in steps:
        with done:
            await done.wait()
        out.progress(f"asyncgpu demo: {dev.name}: {what} done at {time.perf_counter() - t0_s:.2f} s")
    return host


async def run_demo(
    out: Out,
    backend: str | None,
    elements: int | None,
    count: int | None,
    trace: str | None = DEMO_TRACE,
    source: str = "events",
    shown: Callable[[], None] | None = None,
) -> int:
    """The seed workload, concurrently on every device (one task each); prints the report, writes the trace
    (unless ``trace`` is None) and ends with the balance report. ``source``: `gpu_timer`'s. ``shown``: called
    once everything is printed, before the demo's memory is freed. Returns the exit code."""
    name, why = _choose_backend(backend)
    devs = open_devices(name, count)
    n = elements or DEMO_ELEMENTS
    _check_memory(devs, n)
    claimed = _claim_source(source, devs)  # (a source that cannot be had is an error before anything is printed)
    try:
        return await _demo_run(out, why, devs, n, trace, source, shown)
    finally:
        if claimed:
            cupti.release(cupti.TIMER)


def _claim_source(source: str, devs: list[Any]) -> bool:
    """Check ``source`` for the demo's scope and claim CUPTI for it when it is to be used (the scope shares the
    session; the caller releases it when this returns True). `SourceError` naming the fix when it cannot be had."""
    if source == "events":
        return False
    used, _ = cupti.choose(source, devs, cupti.TIMER, "this scope")
    return used == "cupti"


async def _demo_run(
    out: Out, why: str, devs: list[Any], n: int, trace: str | None, source: str, shown: Callable[[], None] | None
) -> int:
    """`run_demo` once its options are checked."""
    name = devs[0].backend
    models = ", ".join(sorted({d.description for d in devs}))
    header = f"asyncgpu demo on {why}: {len(devs)} device(s) ({models}), {n:,} float32 elements each"
    if not out.json:
        out.out.print(header, markup=False, highlight=False)
    out.progress(f"asyncgpu demo: running on {', '.join(d.name for d in devs)}")
    t0_s = time.perf_counter()
    results: dict[str, np.ndarray] = {}
    buffers: dict[str, tuple[Any, np.ndarray]] = {}
    pressed: list[bool] = []
    async with anyio.create_task_group() as watch:
        watch.start_soon(_cancel_on_ctrl_c, watch.cancel_scope, pressed)
        async with anyio.create_task_group() as tg:  # every device sets up at once, then the timed work starts

            async def setup(dev: Any) -> None:
                buffers[dev.name] = await _demo_setup(dev, n)

            for dev in devs:
                tg.start_soon(setup, dev)
        out.progress(f"asyncgpu demo: set up in {time.perf_counter() - t0_s:.2f} s (memory, kernels)")
        async with gpu_timer(devs, label="demo", source=source) as t:
            async with anyio.create_task_group() as tg:

                async def one(dev: Any) -> None:
                    results[dev.name] = await _demo_device(dev, *buffers[dev.name], t0_s, out)

                for dev in devs:
                    tg.start_soon(one, dev)
        watch.cancel_scope.cancel()  # the work is done: stop watching
    if pressed:
        raise KeyboardInterrupt
    tl = t.timeline
    expected = float(sum(DEMO_ITERATIONS))
    bad = [k for k, v in results.items() if not np.all(v == expected)]
    host = (
        f"{t.host_ms:,.3f} ms in the scope's body (enqueueing and awaiting the work) + {t.wait_ms:,.3f} ms "
        f"waiting for the devices at its exit, CPU {t.cpu_ms:,.3f} ms"
    )
    if trace is not None and not bad:
        out.progress(f"asyncgpu demo: writing the trace to {trace}")
        try:
            write_trace(t, trace)
        except (OSError, ImportError) as exc:
            raise Failed(f"could not write the trace: {exc}") from None
    if out.json:
        out.document(
            {
                "backend": name,
                "elements": n,
                "devices": [{"name": d.name, "description": d.description} for d in devs],
                "checked": not bad,
                "wrong": bad,
                "host_ms": t.host_ms,
                "wait_ms": t.wait_ms,
                "cpu_ms": t.cpu_ms,
                "trace": trace if not bad else None,
                **summaries(tl),
            }
        )
    else:
        for part in (timeline_table(tl, limit=50), activity_table(tl), device_table(tl)):
            out.out.print(part)
            out.out.print()
        if not bad:
            out.out.print(f"checked: every element is {expected:g} on {', '.join(results)}", highlight=False)
        print_footer(out.out, tl)
        out.out.print(f"host: {host}", highlight=False)
        if trace is not None and not bad:
            out.out.print(f"trace written to {trace} (open it in https://ui.perfetto.dev)", highlight=False)
        out.out.print()
        out.out.print(balance_renderable(t.balance()))
    if bad:
        raise Failed(f"wrong result on {', '.join(bad)}: expected every element = {expected:g}")
    if shown is not None:
        shown()
    return 0


async def _cancel_on_ctrl_c(scope: anyio.CancelScope, pressed: list[bool]) -> None:
    """On Ctrl-C, cancel ``scope``: a cancelled `gpu_timer` does not wait for the work still queued (a
    KeyboardInterrupt raised into it, as trio does, would be an error of the body: it would wait)."""
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            pressed.append(True)
            scope.cancel()
            return
