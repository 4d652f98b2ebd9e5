"""The ``asyncgpu`` command: ``demo``, ``devices``, ``bench`` and ``report``.

``asyncgpu demo`` runs the seed workload on every device at once, prints the timeline and the summaries, writes a
Perfetto trace, and ends with the workload balance report. ``asyncgpu devices`` lists the devices with their
memory and clock calibration (offset of each device clock to the host clock, and the error bound).
``asyncgpu bench MODULE:FUNCTION`` runs `asyncgpu.benchmark` on ``FUNCTION(stream)`` across devices.
``asyncgpu report TRACE.json`` prints the summaries and the balance report of a trace written by asyncgpu.
``--help`` on the command and on each subcommand; ``--version``.

Output: results on stdout, as tables that fit the terminal (numbers are never cut: narrow terminals wrap text
and leave columns out) or, with ``--format json``, as one JSON document for scripts. Progress and errors go to
stderr; an error is one line, without a traceback.

Exit codes: 0 success; 1 the work failed (a backend error, a wrong result, not enough memory, a trace that could
not be written, the benchmarked function raised); 2 a usage mistake (bad options, no such device, file or
function, no GPU when one was asked for, a trace that is not asyncgpu's, a trace path that cannot be written);
130 interrupted (Ctrl-C prints one line and exits at once, without waiting for the work still queued).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import importlib
import importlib.util
import json
import math
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import anyio
import numpy as np
from rich.console import Console

from asyncgpu._analysis.report import (
    Column,
    FitTable,
    activity_table,
    balance_renderable,
    device_table,
    durations_from,
    number,
    timeline_table,
)
from asyncgpu._analysis.summary import activity_summary, balance, device_summary
from asyncgpu._backends import cupti
from asyncgpu._base.errors import AsyncGPUError, ClockError, NoDeviceError, SourceError, UnknownDeviceError
from asyncgpu._base.records import Timeline
from asyncgpu._runtime import select
from asyncgpu._timing.scope import gpu_timer
from asyncgpu._trace.export import write_trace
from asyncgpu._version import __version__

__all__ = ["main", "run_demo"]

_PACKAGE_DIR = str(Path(__file__).resolve().parent)

DEMO_ITERATIONS = (500, 1000, 1500)
DEMO_ELEMENTS = 10_000_000
#: The demo's trace: Perfetto's native format when the ``perfetto`` package is there (``asyncgpu[perfetto]``),
#: else Chrome trace JSON (which Perfetto also opens).
DEMO_TRACE = "asyncgpu-demo.pftrace" if importlib.util.find_spec("perfetto") is not None else "asyncgpu-demo.trace.json"
EXIT_INTERRUPTED = 130  #: 128 + SIGINT, as shells report a process ended by Ctrl-C
_GIB = 1 << 30


class _Usage(Exception):
    """A user mistake: printed as one line, exit code 2."""


class _Failed(Exception):
    """The work failed (the user's module or function raised, not enough memory): one line, exit code 1."""


@dataclasses.dataclass(frozen=True)
class _Out:
    """Where the command writes: ``out`` (stdout) for results, ``err`` (stderr) for progress and errors."""

    out: Console
    err: Console
    json: bool = False  #: results as one JSON document on stdout instead of tables
    quiet: bool = False  #: no progress lines

    def progress(self, text: str) -> None:
        if not self.quiet:
            self.err.print(text, markup=False, highlight=False, soft_wrap=True)

    def document(self, data: Any) -> None:
        """``data`` as JSON on stdout (NaN and infinities as null)."""
        self.out.file.write(json.dumps(_finite(data), indent=1) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# -- demo --------------------------------------------------------------------------------------------------------
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


def _no_gpu(why: str) -> _Usage:
    return _Usage(f"no usable CUDA GPU ({why}): add --backend host to run on host worker threads instead")


def _open(backend: str, count: int | None) -> list[Any]:
    """The devices of ``backend`` (the first ``count``); a missing GPU is a usage mistake naming the option."""
    if backend == "cuda":
        ok, why = select.backend_available("cuda")
        if not ok:
            raise _no_gpu(why)
    return select.devices(backend, count=count)


def _check_output_path(option: str, path: str) -> None:
    """Raise `_Usage` naming why ``path`` (given with ``option``: ``--trace``, ``--json``) cannot be written;
    checked before the run, so that a mistake costs no run (nothing is left there)."""
    p = Path(path)
    if p.is_dir():
        raise _Usage(f"{option} {path}: that is a directory: give a file name")
    folder = p.parent
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist: create it first"
        raise _Usage(f"{option} {path}: the directory {folder} {what}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        why = {
            errno.EACCES: "no permission",
            errno.EPERM: "no permission",
            errno.EROFS: "a read-only file system",
        }.get(exc.errno or 0, "the file system takes no new files there")
        raise _Usage(f"{option} {path}: cannot write a file in {folder} ({why}): choose a writable path") from None
    if p.exists() and not os.access(p, os.W_OK):
        raise _Usage(f"{option} {path}: no permission to overwrite it: choose a writable path")


def _check_memory(devs: list[Any], n: int) -> None:
    """Raise `_Failed` when ``n`` float32 elements per device (and as many in pinned host memory) cannot fit."""
    if devs[0].backend == "host":  # host devices and the pinned copies share the host's RAM
        pools = [(f"the host RAM of {len(devs)} host devices", devs[0], 8 * len(devs))]
    else:
        pools = [(d.name, d, 4) for d in devs]
    for where, d, bytes_per_element in pools:
        info = d.memory_info()
        if info is not None and n * bytes_per_element > info[0]:
            raise _Failed(
                f"--elements {n:,} needs {n * bytes_per_element / _GIB:,.1f} GiB of {where}, which has "
                f"{info[0] / _GIB:,.1f} GiB free: use --elements {info[0] // bytes_per_element:,} or fewer"
            )


async def _demo_setup(dev: Any, n: int) -> tuple[Any, np.ndarray]:
    """Everything the workload needs before its first launch, off the loop's thread (the devices set up at once):
    device memory, the page-locked buffer for the result (pinning 40 MB holds a thread ~20-80 ms, and the driver
    holds back other threads' calls meanwhile), and the kernels (compiled with NVRTC once per process, loaded into
    each GPU)."""
    a = await dev.aalloc(n, np.float32)
    host = await dev.aalloc_pinned(n, np.float32)
    await dev.prepare()
    return a, host


async def _demo_device(dev: Any, a: Any, host: np.ndarray, t0_s: float, out: _Out) -> np.ndarray:
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
    out: _Out,
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
    devs = _open(name, count)
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
    out: _Out, why: str, devs: list[Any], n: int, trace: str | None, source: str, shown: Callable[[], None] | None
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
            raise _Failed(f"could not write the trace: {exc}") from None
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
                **_summaries(tl),
            }
        )
    else:
        for part in (timeline_table(tl, limit=50), activity_table(tl), device_table(tl)):
            out.out.print(part)
            out.out.print()
        if not bad:
            out.out.print(f"checked: every element is {expected:g} on {', '.join(results)}", highlight=False)
        _print_footer(out.out, tl)
        out.out.print(f"host: {host}", highlight=False)
        if trace is not None and not bad:
            out.out.print(f"trace written to {trace} (open it in https://ui.perfetto.dev)", highlight=False)
        out.out.print()
        out.out.print(balance_renderable(t.balance()))
    if bad:
        raise _Failed(f"wrong result on {', '.join(bad)}: expected every element = {expected:g}")
    if shown is not None:
        shown()
    return 0


def _exit_on_ctrl_c(command: str) -> Callable[[], None]:
    """What the command calls once its output is complete: from then on Ctrl-C ends the process at once with
    130 (freeing gigabytes of pinned memory can take a second, and an interrupt inside the driver's free would
    print a traceback from a callback that cannot raise). Main thread only; `main` puts the handler back."""

    def install() -> None:
        def on_sigint(signum: int, frame: Any) -> None:
            sys.stdout.flush()
            print(f"asyncgpu {command}: interrupted", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)

        signal.signal(signal.SIGINT, on_sigint)

    return install


async def _cancel_on_ctrl_c(scope: anyio.CancelScope, pressed: list[bool]) -> None:
    """On Ctrl-C, cancel ``scope``: a cancelled `gpu_timer` does not wait for the work still queued (a
    KeyboardInterrupt raised into it, as trio does, would be an error of the body: it would wait)."""
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            pressed.append(True)
            scope.cancel()
            return


def _summaries(tl: Timeline) -> dict[str, Any]:
    """The summaries of a timeline as JSON-ready data (demo and report)."""
    ds = device_summary(tl)
    return {
        "label": tl.label,
        "activities": len(tl),
        "durations": durations_from(tl),
        "clocks": [
            {"device": c.device, "aligned": c.aligned, "bound_ns": c.bound_ns, "reason": c.reason} for c in tl.clocks
        ],
        "activity_summary": activity_summary(tl).to_dict(),
        "device_summary": ds.to_dict(),
        "balance": balance(ds).to_dict(),
        "error": tl.error,
    }


def _print_footer(console: Console, tl: Timeline) -> None:
    clocks = "; ".join(
        f"{c.device} ±{c.bound_ns / 1e3:.1f} µs" if c.aligned else f"{c.device} NOT aligned ({c.reason})"
        for c in tl.clocks
    )
    console.print(f"time base: host clock, devices aligned: {clocks}", markup=False, highlight=False)
    console.print(f"durations: {durations_from(tl)}", markup=False, highlight=False)


# -- devices -----------------------------------------------------------------------------------------------------
def _memory(d: Any) -> tuple[str, dict[str, int | None]]:
    """Free / total memory in GiB (the GPU's, or the host RAM the host devices share), as text and as data."""
    info = d.memory_info()
    if info is None:
        return "—", {"memory_free_bytes": None, "memory_total_bytes": None}
    return f"{info[0] / _GIB:,.1f} / {info[1] / _GIB:,.1f}", {
        "memory_free_bytes": int(info[0]),
        "memory_total_bytes": int(info[1]),
    }


def _devices(out: _Out, backend: str | None) -> int:
    name = backend or select.default_backend()
    if name == "cuda":
        ok, why = select.backend_available("cuda")
        if not ok:  # by default, by $ASYNCGPU_BACKEND or by name: a usage mistake, as in the other commands
            raise _no_gpu(why)
    table = FitTable(
        f"{name} devices, clocks against the host clock (time.perf_counter_ns)",
        [
            Column("device"),
            Column("model", drop=1),
            number("GiB free / total", drop=2),
            number("event anchor ± µs"),
            number("%globaltimer − host (s)", drop=3),
            number("± µs", drop=4),
            number("drift ppm", drop=5),
        ],
        "host devices are threads: they share the host's RAM" if name == "host" else None,
    )
    rows = []
    for d in select.devices(name):
        memory, memory_data = _memory(d)
        row: dict[str, Any] = {"name": d.name, "description": d.description, **memory_data}
        rows.append(row)
        try:
            cal = d.clock(refresh=True, samples=32)
        except ClockError as exc:
            row["clock_error"] = str(exc)
            table.add_row(d.name, d.description, memory, f"failed: {exc}", "", "", "")
            continue
        row.update(
            anchor_bound_ns=cal.bound_ns,
            globaltimer_offset_ns=cal.globaltimer_offset_ns,
            globaltimer_bound_ns=cal.globaltimer_bound_ns,
            drift_ppm=cal.drift_ppm,
        )
        gt = "—" if cal.globaltimer_offset_ns is None else f"{cal.globaltimer_offset_ns / 1e9:,.6f}"
        gb = "—" if cal.globaltimer_bound_ns is None else f"{cal.globaltimer_bound_ns / 1e3:.2f}"
        drift = "—" if cal.drift_ppm is None else f"{cal.drift_ppm:+.2f}"
        table.add_row(d.name, d.description, memory, f"{cal.bound_ns / 1e3:.2f}", gt, gb, drift)
    if out.json:
        out.document({"backend": name, "devices": rows})
    else:
        out.out.print(table)
    return 0


# -- bench -------------------------------------------------------------------------------------------------------
def _where(exc: BaseException) -> str:
    """`` (at file:line)`` of the deepest frame outside asyncgpu and importlib, or ``""``."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith((_PACKAGE_DIR, "<frozen")):
            return f" (at {frame.filename}:{frame.lineno})"
    return ""


def _load_function(target: str) -> Callable[..., Any]:
    """``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` (``FUNCTION`` may be dotted: ``Class.method``)."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise _Usage(f"bench takes MODULE:FUNCTION (e.g. mymodule:step or path/to/file.py:step), not {target!r}")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise _Usage(f"no such file: {path}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # as `python file.py` does: the file can import its neighbours
        name = path.stem if path.stem not in sys.modules else f"_asyncgpu_bench_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise _Usage(f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            del sys.modules[name]
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise _Failed(f"importing {path} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                raise _Usage(
                    f"cannot import {module_name}: {exc}. Run from the folder that holds it, or give its "
                    f"file: path/to/{module_name.replace('.', '/')}.py:{attr}"
                ) from None
            raise _Failed(f"importing {module_name} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
        except Exception as exc:
            raise _Failed(f"importing {module_name} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise _Usage(f"{module_name} has no {attr!r}: name a function defined in it (MODULE:FUNCTION)")
        fn = getattr(fn, part)
    if not callable(fn):
        raise _Usage(f"{module_name}:{attr} is a {type(fn).__name__}, not a function")
    return fn


def _bench(out: _Out, args: argparse.Namespace) -> int:
    saved = sys.path[:]
    try:
        return _run_bench(out, args)
    finally:
        sys.path[:] = saved  # _load_function may add the module's folder


def _run_bench(out: _Out, args: argparse.Namespace) -> int:
    from asyncgpu._base.errors import BenchmarkError
    from asyncgpu._timing.bench import benchmark, parse_devices

    if args.json is not None:
        _check_output_path("--json", args.json)
    fn = _load_function(args.target)
    if args.devices is None:
        _open(args.backend or select.default_backend(), None)  # no GPU: say which option to use
    try:
        devs = parse_devices(args.devices, args.backend)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    try:
        result = benchmark(
            fn,
            n_repeat=args.n_repeat,
            n_warmup=args.n_warmup,
            max_duration_s=args.max_duration,
            devices=devs,
            max_noise=args.max_noise,
            name=args.target.rpartition(":")[2],
            source=args.source,
        )
    except (ValueError, TypeError) as exc:
        raise _Usage(str(exc)) from None
    except BenchmarkError as exc:
        if exc.result.n_repeat and not out.json:
            out.out.print(exc.result)
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise _Failed(f"{exc}{_where(cause)}") from exc
    if out.json:
        out.document(result.to_dict())
    else:
        out.out.print(result)
    if args.json is not None:
        try:
            Path(args.json).write_text(json.dumps(result.to_dict(times=True), indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            raise _Failed(f"could not write {args.json}: {exc.strerror or exc}") from None
        out.progress(f"asyncgpu bench: results written to {args.json}")
    return 0


# -- report ------------------------------------------------------------------------------------------------------
def _report(out: _Out, args: argparse.Namespace) -> int:
    from asyncgpu._trace.export import read_trace

    try:
        tl = read_trace(args.trace)
    except OSError as exc:
        raise _Usage(f"cannot read {args.trace}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    if out.json:
        rows = tl.time_order() if args.order == "time" else np.arange(len(tl))
        timeline = [dataclasses.asdict(tl.row(int(i))) for i in rows[: args.timeline]]
        out.document({"trace": args.trace, **_summaries(tl), "timeline": timeline})
        return 0
    described = ", ".join(f"{n} ({d})" if d else n for n, d in zip(tl.devices, tl.descriptions))
    out.out.print(
        f"trace {args.trace}: scope {tl.label!r}, {len(tl):,} activities on {described}", markup=False, highlight=False
    )
    parts: list[Any] = []
    if args.timeline:
        parts.append(timeline_table(tl, order=args.order, limit=args.timeline))
    parts += [activity_table(tl), device_table(tl), balance_renderable(tl)]
    for part in parts:
        # Tables fit the width already: not cropping keeps long timelines fast, and a long (plain) one printed with
        # soft wrap gets its rows by chunks rather than by lines (1 M rows: 0.7 s instead of 2.3).
        out.out.print(part, crop=False, soft_wrap=bool(getattr(part, "plain", False)))
        out.out.print()
    _print_footer(out.out, tl)
    if tl.error:
        out.out.print(f"the scope raised {tl.error}", markup=False, highlight=False)
    return 0


# -- the parser --------------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors on stderr (usage mistakes exit 2 without the usage block)."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds (inf: no limit), got {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a relative standard deviation like 0.005, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be > 0 (0.005 = 0.5%), got {text}")
    return value


EXIT_CODES = (
    "Exit codes: 0 success; 1 the work failed (backend error, wrong result, not enough memory, a file that could "
    "not be written, the benchmarked function raised); 2 a usage mistake (bad options, no such device, file or "
    "function; no GPU when one was asked for); 130 interrupted (Ctrl-C). Results go to stdout, progress and "
    "errors to stderr."
)


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table (default: fits the terminal) or json (one document on stdout, for scripts)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asyncgpu", description="Time and orchestrate GPU work from asyncio/trio.", epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"asyncgpu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,devices,bench,report}")
    demo = sub.add_parser(
        "demo",
        help="run the seed workload on every device and print where the time went",
        description="Run the seed workload (memset, inc_loop x3, copy back) concurrently on every "
        "device; print the timeline, the summaries and the balance report; write a trace. "
        "Progress goes to stderr.",
        epilog=EXIT_CODES,
    )
    demo.add_argument(
        "--backend",
        choices=("cuda", "host"),
        help="cuda (GPUs) or host (CPU worker threads); default: cuda if a GPU is usable, else host",
    )
    demo.add_argument(
        "--elements", type=_count(1), metavar="N", help="float32 elements per device (default 10,000,000)"
    )
    demo.add_argument(
        "--devices", type=_count(1), dest="count", metavar="N", help="how many devices (default: all; host: 2)"
    )
    demo.add_argument("--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    demo.add_argument(
        "--source",
        choices=("events", "auto", "cupti"),
        default="events",
        help="where durations come from (cupti needs the asyncgpu[cupti] extra; default events)",
    )
    traces = demo.add_mutually_exclusive_group()
    traces.add_argument(
        "--trace", default=DEMO_TRACE, metavar="PATH", help=f"Perfetto trace to write (default {DEMO_TRACE})"
    )
    traces.add_argument("--no-trace", dest="trace", action="store_const", const=None, help="write no trace")
    demo.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    _add_format(demo)
    devices = sub.add_parser(
        "devices",
        help="list the devices of a backend: memory and clock offsets",
        description="List the devices with their memory and their clock calibration against the host clock.",
        epilog=EXIT_CODES,
    )
    devices.add_argument("--backend", choices=("cuda", "host"), help="default: $ASYNCGPU_BACKEND, else cuda")
    _add_format(devices)
    bench = sub.add_parser(
        "bench",
        help="benchmark FUNCTION(stream) on several devices at once",
        description="Run asyncgpu.benchmark on FUNCTION(stream): called once per device per "
        "repeat with that device's asyncgpu Stream, on which it must enqueue its work. Prints "
        "the CPU and per-device GPU times (mean, std, min, median, max).",
        epilog=EXIT_CODES,
    )
    bench.add_argument(
        "target",
        metavar="MODULE:FUNCTION",
        help="an importable module (from the current folder) or a file: mymodule:step, path/to/file.py:step",
    )
    bench.add_argument(
        "-n", "--n-repeat", type=_count(1), default=10000, metavar="N", help="timed repeats (default 10000)"
    )
    bench.add_argument(
        "-w", "--n-warmup", type=_count(0), default=10, metavar="N", help="warm-up calls per device (default 10)"
    )
    bench.add_argument(
        "--max-duration",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="stop after S seconds of timed repeats (default 10; inf: no limit)",
    )
    bench.add_argument(
        "--max-noise", type=_fraction, metavar="F", help="stop once every device's relative std is <= F (0.005 = 0.5%%)"
    )
    bench.add_argument(
        "--devices",
        metavar="LIST",
        help="comma-separated: 0,1 or cuda:0,cuda:1 or host:0,host:1 (default: every device)",
    )
    bench.add_argument("--backend", choices=("cuda", "host"), help="default: $ASYNCGPU_BACKEND, else cuda")
    bench.add_argument(
        "--source",
        choices=("events", "auto", "cupti"),
        default="events",
        help="where GPU times come from (cupti needs the asyncgpu[cupti] extra; default events)",
    )
    bench.add_argument("--json", metavar="FILE", help="also write the statistics and every time to FILE")
    _add_format(bench)
    report = sub.add_parser(
        "report",
        help="summaries and the balance report of a saved trace",
        description="Read a trace written by asyncgpu (asyncgpu.write_trace, asyncgpu demo) and "
        "print the totals per activity and per device, and the balance report.",
        epilog=EXIT_CODES,
    )
    report.add_argument("trace", metavar="TRACE.json")
    report.add_argument(
        "--timeline", type=_count(0), default=0, metavar="N", help="also list the first N activities (default 0)"
    )
    report.add_argument("--order", choices=("issue", "time"), default="issue", help="order of --timeline")
    _add_format(report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``asyncgpu`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    out = _Out(Console(), Console(stderr=True), json=args.format == "json", quiet=getattr(args, "quiet", False))
    interrupted = False
    sigint = signal.getsignal(signal.SIGINT)
    try:
        if args.command == "devices":
            return _devices(out, args.backend)
        if args.command == "bench":
            return _bench(out, args)
        if args.command == "report":
            return _report(out, args)
        if args.trace is not None:
            _check_output_path("--trace", args.trace)
        backend, options = ("trio", {}) if args.loop == "trio" else ("asyncio", {"use_uvloop": args.loop == "uvloop"})
        return anyio.run(
            run_demo,
            out,
            args.backend,
            args.elements,
            args.count,
            args.trace,
            args.source,
            _exit_on_ctrl_c(args.command),
            backend=backend,
            backend_options=options,
        )
    except BaseException as exc:
        outcome = _outcome(exc)
        if outcome is None:
            raise
        code, message = outcome
        interrupted = code == EXIT_INTERRUPTED
        out.err.print(f"asyncgpu {args.command}: {message}", markup=False, highlight=False, soft_wrap=True)
        return code
    finally:
        if not interrupted:  # Ctrl-C: exit now; closing would wait for the work still queued
            select.close_all()
        if signal.getsignal(signal.SIGINT) is not sigint:  # (what `_exit_on_ctrl_c` installed)
            signal.signal(signal.SIGINT, sigint)


def _outcome(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and the one line for an exception the command reports (None: a bug, shown in full).
    Exception groups (from the demo's task group) count by what they hold, cancellations left out."""
    leaves = [e for e in _leaves(exc) if not _is_cancellation(e)] or [exc]
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        return EXIT_INTERRUPTED, "interrupted"
    first = leaves[0]
    if isinstance(first, NoDeviceError):  # the library's advice is for Python code: give the option instead
        return 2, str(_no_gpu(select.backend_available("cuda")[1]))
    if isinstance(first, (_Usage, UnknownDeviceError, SourceError)):
        return 2, str(first)
    if isinstance(first, _Failed):
        return 1, str(first)
    if isinstance(first, MemoryError):
        return 1, f"out of memory ({first or 'an allocation failed'}): ask for less (--elements)"
    if isinstance(first, AsyncGPUError):
        return 1, f"{type(first).__name__}: {first}"
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    """``exc``, or the exceptions an exception group holds (flattened)."""
    inner = getattr(exc, "exceptions", None)
    if not isinstance(inner, tuple):
        return [exc]
    return [leaf for e in inner for leaf in _leaves(e)]


def _is_cancellation(exc: BaseException) -> bool:
    trio = sys.modules.get("trio")
    return isinstance(exc, asyncio.CancelledError) or (trio is not None and isinstance(exc, trio.Cancelled))


if __name__ == "__main__":
    sys.exit(main())
