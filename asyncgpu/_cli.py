"""The ``asyncgpu`` command: ``demo``, ``devices``, ``bench`` and ``report``.

``asyncgpu demo`` runs the seed workload on every device at once, prints the timeline and the summaries, writes a
Perfetto trace, and ends with the workload balance report. ``asyncgpu devices`` lists the devices with their
memory and clock calibration (offset of each device clock to the host clock, and the error bound).
``asyncgpu bench MODULE:FUNCTION`` runs `asyncgpu.benchmark` on ``FUNCTION(stream)`` across devices.
``asyncgpu report TRACE.json`` prints the summaries and the balance report of a trace written by asyncgpu.
``--help`` on the command and on each subcommand.

Exit codes: 0 success, 1 the work failed (a backend error, a wrong result, the benchmarked function raised),
2 a usage mistake (bad options, no such device, file or function, no GPU when one was asked for, a trace that
is not asyncgpu's). User mistakes print one line, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import anyio
import numpy as np
from rich.console import Console, JustifyMethod
from rich.table import Table

from ._core import select
from ._errors import AsyncGPUError, BackendError, ClockError, NoDeviceError, SourceError, UnknownDeviceError
from ._export import write_trace
from ._report import activity_table, balance_renderable, device_table, durations_from, timeline_table
from ._timer import gpu_timer

__all__ = ["main", "run_demo"]

_PACKAGE_DIR = str(Path(__file__).resolve().parent)

DEMO_ITERATIONS = (500, 1000, 1500)
DEMO_ELEMENTS = 10_000_000
DEMO_TRACE = "asyncgpu-demo.trace.json"


def _choose_backend(asked: str | None) -> tuple[str, str]:
    """The backend for the demo and the sentence that says why."""
    if asked is not None:
        return asked, f"the {asked} backend, as asked"
    ok, why = select.backend_available("cuda")
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


async def run_demo(
    console: Console,
    backend: str | None,
    elements: int | None,
    count: int | None,
    trace: str | None = DEMO_TRACE,
    source: str = "events",
) -> int:
    """The seed workload, concurrently on every device (one task each); prints the report, writes the trace
    (unless ``trace`` is None) and ends with the balance report. ``source``: `gpu_timer`'s. Returns the exit
    code."""
    name, why = _choose_backend(backend)
    devs = select.devices(name, count=count)
    n = elements or DEMO_ELEMENTS
    models = ", ".join(sorted({d.description for d in devs}))
    console.print(f"asyncgpu demo on {why}: {len(devs)} device(s) ({models}), {n:,} float32 elements each")
    results: dict[str, np.ndarray] = {}
    async with gpu_timer(devs, label="demo", source=source) as t:
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
    clocks = "; ".join(
        f"{c.device} ±{c.bound_ns / 1e3:.1f} µs" if c.aligned else f"{c.device} NOT aligned ({c.reason})"
        for c in tl.clocks
    )
    console.print(f"time base: host clock, devices aligned: {clocks}")
    console.print(f"durations: {durations_from(tl)}", soft_wrap=True)
    console.print(
        f"host: {t.host_ms:,.3f} ms issuing + {t.wait_ms:,.3f} ms waiting for the devices, CPU {t.cpu_ms:,.3f} ms"
    )
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


class _Usage(Exception):
    """A user mistake: printed as one line, exit code 2."""


class _UserCodeFailed(Exception):
    """The user's module or function raised: printed as one line with where, exit code 1."""


def _memory(d: Any) -> str:
    """Free / total memory in GiB: the GPU's, or the host RAM the host devices share."""
    info = d.memory_info()
    if info is None:
        return "—"
    gib = 1 << 30
    return f"{info[0] / gib:,.1f} / {info[1] / gib:,.1f}"


def _devices(console: Console, backend: str | None) -> int:
    name = backend or select.default_backend()
    if name == "cuda":
        ok, why = select.backend_available("cuda")
        if not ok:
            console.print(f"no usable CUDA GPU: {why}")
            return 0
    caption = "host devices are threads: they share the host's RAM" if name == "host" else None
    table = Table(
        title=f"{name} devices, clocks against the host clock (time.perf_counter_ns)",
        title_justify="left",
        show_edge=False,
        caption=caption,
        caption_justify="left",
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("device", "left"),
        ("model", "left"),
        ("GiB free / total", "right"),
        ("event anchor ± µs", "right"),
        ("%globaltimer − host (s)", "right"),
        ("± µs", "right"),
        ("drift ppm", "right"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify, no_wrap=col in ("device", "event anchor ± µs"))
    for d in select.devices(name):
        memory = _memory(d)
        try:
            cal = d.clock(refresh=True, samples=32)
        except ClockError as exc:
            table.add_row(d.name, d.description, memory, f"failed: {exc}", "", "", "")
            continue
        gt = "—" if cal.globaltimer_offset_ns is None else f"{cal.globaltimer_offset_ns / 1e9:,.6f}"
        gb = "—" if cal.globaltimer_bound_ns is None else f"{cal.globaltimer_bound_ns / 1e3:.2f}"
        drift = "—" if cal.drift_ppm is None else f"{cal.drift_ppm:+.2f}"
        table.add_row(d.name, d.description, memory, f"{cal.bound_ns / 1e3:.2f}", gt, gb, drift)
    console.print(table)
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
            raise _UserCodeFailed(f"importing {path} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
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
            raise _UserCodeFailed(f"importing {module_name} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
        except Exception as exc:
            raise _UserCodeFailed(f"importing {module_name} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise _Usage(f"{module_name} has no {attr!r}: name a function defined in it (MODULE:FUNCTION)")
        fn = getattr(fn, part)
    if not callable(fn):
        raise _Usage(f"{module_name}:{attr} is a {type(fn).__name__}, not a function")
    return fn


def _bench(console: Console, args: argparse.Namespace) -> int:
    saved = sys.path[:]
    try:
        return _run_bench(console, args)
    finally:
        sys.path[:] = saved  # _load_function may add the module's folder


def _run_bench(console: Console, args: argparse.Namespace) -> int:
    from ._bench import benchmark, parse_devices
    from ._errors import BenchmarkError

    fn = _load_function(args.target)
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
        if exc.result.n_repeat:
            console.print(exc.result)
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise _UserCodeFailed(f"{exc}{_where(cause)}") from exc
    console.print(result)
    if args.json is not None:
        try:
            Path(args.json).write_text(json.dumps(result.to_dict(times=True), indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            console.print(f"[red]could not write {args.json}: {exc.strerror or exc}[/red]")
            return 1
        console.print(f"results written to {args.json}")
    return 0


# -- report ------------------------------------------------------------------------------------------------------
def _report(console: Console, args: argparse.Namespace) -> int:
    from ._export import read_trace

    try:
        tl = read_trace(args.trace)
    except OSError as exc:
        raise _Usage(f"cannot read {args.trace}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    described = ", ".join(f"{n} ({d})" if d else n for n, d in zip(tl.devices, tl.descriptions))
    console.print(f"trace {args.trace}: scope {tl.label!r}, {len(tl):,} activities on {described}", soft_wrap=True)
    parts: list[Any] = []
    if args.timeline:
        parts.append(timeline_table(tl, order=args.order, limit=args.timeline))
    parts += [activity_table(tl), device_table(tl), balance_renderable(tl)]
    for part in parts:
        console.print(part)
        console.print()
    clocks = "; ".join(
        f"{c.device} ±{c.bound_ns / 1e3:.1f} µs" if c.aligned else f"{c.device} NOT aligned ({c.reason})"
        for c in tl.clocks
    )
    console.print(f"time base: host clock, devices aligned: {clocks}")
    console.print(f"durations: {durations_from(tl)}", soft_wrap=True)
    if tl.error:
        console.print(f"the scope raised {tl.error}")
    return 0


# -- the parser --------------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage mistakes exit 2 without the usage block)."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
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


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="asyncgpu",
        description="Time and orchestrate GPU work from asyncio/trio.",
        epilog="Exit codes: 0 success, 1 the work failed, 2 a usage mistake.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,devices,bench,report}")
    demo = sub.add_parser(
        "demo",
        help="run the seed workload on every device and print where the time went",
        description="Run the seed workload (memset, inc_loop x3, copy back) concurrently on every "
        "device; print the timeline, the summaries and the balance report; write a trace.",
    )
    demo.add_argument("--backend", choices=("cuda", "host"), help="default: CUDA when a GPU is usable, else host")
    demo.add_argument("--elements", type=int, help="float32 elements per device (default 10 M)")
    demo.add_argument("--devices", type=int, dest="count", help="how many devices (default: all; host: 2)")
    demo.add_argument("--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    demo.add_argument(
        "--source",
        choices=("events", "auto", "cupti"),
        default="events",
        help="where durations come from (cupti needs the asyncgpu[cupti] extra; default events)",
    )
    demo.add_argument("--trace", default=DEMO_TRACE, help=f"Perfetto trace to write (default {DEMO_TRACE})")
    demo.add_argument("--no-trace", dest="trace", action="store_const", const=None, help="write no trace")
    devices = sub.add_parser(
        "devices",
        help="list the devices of a backend: memory and clock offsets",
        description="List the devices with their memory and their clock calibration against the host clock.",
    )
    devices.add_argument("--backend", choices=("cuda", "host"), help="default: $ASYNCGPU_BACKEND, else cuda")
    bench = sub.add_parser(
        "bench",
        help="benchmark FUNCTION(stream) on several devices at once",
        description="Run asyncgpu.benchmark on FUNCTION(stream): called once per device per "
        "repeat with that device's asyncgpu Stream, on which it must enqueue its work. Prints "
        "the CPU and per-device GPU times (mean, std, min, median, max).",
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
    report = sub.add_parser(
        "report",
        help="summaries and the balance report of a saved trace",
        description="Read a trace written by asyncgpu (asyncgpu.write_trace, asyncgpu demo) and "
        "print the totals per activity and per device, and the balance report.",
    )
    report.add_argument("trace", metavar="TRACE.json")
    report.add_argument(
        "--timeline", type=_count(0), default=0, metavar="N", help="also print the first N activities (default 0)"
    )
    report.add_argument("--order", choices=("issue", "time"), default="issue", help="order of --timeline")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console()
    try:
        if args.command == "devices":
            return _devices(console, args.backend)
        if args.command == "bench":
            return _bench(console, args)
        if args.command == "report":
            return _report(console, args)
        if args.elements is not None and args.elements <= 0:
            parser.error("--elements must be positive")
        backend, options = ("trio", {}) if args.loop == "trio" else ("asyncio", {"use_uvloop": args.loop == "uvloop"})
        return anyio.run(
            run_demo,
            console,
            args.backend,
            args.elements,
            args.count,
            args.trace,
            args.source,
            backend=backend,
            backend_options=options,
        )
    except (_Usage, NoDeviceError, UnknownDeviceError, SourceError) as exc:
        console.print(f"asyncgpu {args.command}: {exc}", markup=False, soft_wrap=True)
        return 2
    except _UserCodeFailed as exc:
        console.print(f"asyncgpu {args.command}: {exc}", markup=False, soft_wrap=True)
        return 1
    except (BackendError, AsyncGPUError) as exc:
        console.print(f"asyncgpu {args.command}: {type(exc).__name__}: {exc}", markup=False, soft_wrap=True)
        return 1
    finally:
        select.close_all()


if __name__ == "__main__":
    sys.exit(main())
