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

This module holds the parser, the dispatch and the mapping of errors to exit codes; each subcommand has a module
of its own (`asyncgpu._cli.demo`, `.devices`, `.bench`, `.report`), and `asyncgpu._cli.common` what they share.

Threads: `main` runs on the main thread (it installs a SIGINT handler).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
from typing import Any, Callable, Sequence

import anyio
from rich.console import Console

from asyncgpu._base.errors import AsyncGPUError, NoDeviceError, SourceError, UnknownDeviceError
from asyncgpu._cli.bench import run_bench
from asyncgpu._cli.common import Failed, Out, Usage, check_output_path, no_gpu
from asyncgpu._cli.demo import DEMO_TRACE, run_demo
from asyncgpu._cli.devices import run_devices
from asyncgpu._cli.report import run_report
from asyncgpu._runtime import select
from asyncgpu._version import __version__

__all__ = ["main", "run_demo"]

EXIT_INTERRUPTED = 130  #: 128 + SIGINT, as shells report a process ended by Ctrl-C


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


# -- running a command -------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``asyncgpu`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    out = Out(Console(), Console(stderr=True), json=args.format == "json", quiet=getattr(args, "quiet", False))
    interrupted = False
    sigint = signal.getsignal(signal.SIGINT)
    try:
        if args.command == "devices":
            return run_devices(out, args.backend)
        if args.command == "bench":
            return run_bench(out, args)
        if args.command == "report":
            return run_report(out, args)
        if args.trace is not None:
            check_output_path("--trace", args.trace)
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


def _exit_on_ctrl_c(command: str) -> Callable[[], None]:
    """What the command calls once its output is complete: from then on Ctrl-C ends the process at once with
    130 (freeing gigabytes of pinned memory takes a while, and an interrupt inside the driver's free would
    print a traceback from a callback that cannot raise). Main thread only; `main` puts the handler back."""

    def install() -> None:
        def on_sigint(signum: int, frame: Any) -> None:
            sys.stdout.flush()
            print(f"asyncgpu {command}: interrupted", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)

        signal.signal(signal.SIGINT, on_sigint)

    return install


def _outcome(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and the one line for an exception the command reports (None: a bug, shown in full).
    Exception groups (from the demo's task group) count by what they hold, cancellations left out."""
    leaves = [e for e in _leaves(exc) if not _is_cancellation(e)] or [exc]
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        return EXIT_INTERRUPTED, "interrupted"
    first = leaves[0]
    if isinstance(first, NoDeviceError):  # the library's advice is for Python code: give the option instead
        return 2, str(no_gpu(select.backend_available("cuda")[1]))
    if isinstance(first, (Usage, UnknownDeviceError, SourceError)):
        return 2, str(first)
    if isinstance(first, Failed):
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
