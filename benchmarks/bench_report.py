"""Rendering a full report at scale: ``t.report(order="time", limit=None)`` of 1 M activities (no GPU needed).

    PYTHONPATH=$PWD python benchmarks/bench_report.py [--activities 1000000] [--devices 1] [--repeat 3]
                                                       [--out benchmarks/results/report.txt]

The timeline is `bench_scale.py`'s synthetic one (a training step's mix of kernels, copies and memsets on 2-4
streams per device). Reported, median of ``--repeat`` runs, seconds for:

- ``build``: `timeline_report(tl, order="time", limit=None)` (the summaries, the time order, the cells);
- ``str()``: that report as plain text, 100 columns (``print(t.report(...))``, ``str(timer)``, logs: rendered
  without rich's cropping pass, every line fitting already);
- ``rich.print``: the same through a rich `Console` writing to /dev/null (what ``rich.print(t.report(...))``
  does: rich crops every line to the console's width itself, a pass that no renderable can skip);
- ``console.print(soft_wrap=True)``: that console printing with soft wrap, which skips the cropping pass (the
  report then hands over its rows by chunks);
- ``rich's pass alone``: that console printing the report's text already cut into segments, one per line and a
  shared new line (no build, no formatting): the least ``rich.print`` of that many lines can cost, whatever the
  renderable.

Each timing but the last includes the build. The target: a full report of 1 M activities in <= 2 s. The
``--rich-table N`` option times rich's own table layout (what a `FitTable` of few rows uses) for the first N rows,
for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shlex
import statistics
import sys
import time
from typing import Any, Callable

from rich.console import Console, ConsoleOptions
from rich.segment import Segment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scale import make_timeline

from asyncgpu._analysis import report as _report
from asyncgpu._analysis import table as _table
from asyncgpu._analysis.report import render, timeline_report


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def rich_print(renderable: Any, soft_wrap: bool = False) -> None:
    with open(os.devnull, "w", encoding="utf-8") as f:
        Console(file=f, width=100, color_system=None).print(renderable, soft_wrap=soft_wrap)


class Prebuilt:
    """Text already cut into segments for a console: a segment per line, each followed by one new-line segment."""

    def __init__(self, text: str) -> None:
        self.segments = [s for line in text.splitlines() for s in (Segment(line), Segment.line())]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> list[Segment]:
        return self.segments


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--activities", type=int, default=1_000_000)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rich-table", type=int, default=2000, metavar="N", help="time rich's table layout on N rows")
    ap.add_argument("--out", help="also write the output to this file")
    args = ap.parse_args(argv)
    from importlib.metadata import version

    lines = [
        "$ PYTHONPATH=$PWD python benchmarks/bench_report.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        (
            f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, rich {version('rich')}, median of {args.repeat} runs"
        ),
    ]
    tl = make_timeline(args.devices, args.activities // args.devices)
    tl = dataclasses.replace(tl, host_ms=1.0, wait_ms=1.0, cpu_ms=1.0)  # a finished scope's figures
    build = timed(lambda: timeline_report(tl, order="time", limit=None), args.repeat)
    text = str(timeline_report(tl, order="time", limit=None))
    shown = sum(" │ " in line for line in text.splitlines())
    as_text = timed(lambda: str(timeline_report(tl, order="time", limit=None)), args.repeat)
    printed = timed(lambda: rich_print(timeline_report(tl, order="time", limit=None)), args.repeat)
    soft = timed(lambda: rich_print(timeline_report(tl, order="time", limit=None), soft_wrap=True), args.repeat)
    prebuilt = Prebuilt(text)
    floor = timed(lambda: rich_print(prebuilt), args.repeat)
    lines.append(f"# {len(tl):,} activities on {len(tl.devices)} device(s); the text has {shown:,} table rows")
    lines.append(f"build           {build:8.3f} s")
    lines.append(f"str()           {as_text:8.3f} s   ({as_text / len(tl) * 1e6:.2f} µs per activity)")
    lines.append(f"rich.print      {printed:8.3f} s   ({printed / len(tl) * 1e6:.2f} µs per activity)")
    lines.append(f"console.print(soft_wrap=True) {soft:6.3f} s   (no cropping pass: the report's lines fit already)")
    lines.append(f"rich's pass alone {floor:6.3f} s   (the same lines prebuilt, a segment each: the least possible)")
    if args.rich_table:
        n = min(args.rich_table, len(tl))
        saved = _table.PLAIN_ROWS
        _table.PLAIN_ROWS = n  # rich's own table layout for n rows (no plain lines), to compare with
        try:
            small = tl.select(tl.time_order()[:n])
            laid_out = timed(lambda: render(_report.timeline_table(small, limit=None)), 1)
        finally:
            _table.PLAIN_ROWS = saved
        lines.append(
            f"rich Table, {n:,} rows: {laid_out:.3f} s ({laid_out / n * 1e3:.3f} ms per row; "
            f"{laid_out / n * len(tl):,.0f} s for all {len(tl):,} by extrapolation)"
        )
    fast = [name for name, t in (("str()", as_text), ("soft wrap", soft), ("rich.print", printed)) if t <= 2]
    verdict = "met by " + ", ".join(fast) if fast else "MISSED"
    if printed > 2:
        verdict += "; MISSED by plain rich.print (its cropping pass)"
    lines.append(f"target: a full report of {len(tl):,} activities in <= 2 s: {verdict}")
    out = "\n".join(lines) + "\n"
    print(out, end="")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(out)


if __name__ == "__main__":
    main()
