"""Rendering with rich: a scope's activities, the summaries per activity and per device, and the balance.

Each function returns a rich renderable (``rich.print`` it, or put it in a layout); `render` turns any
renderable into plain text (no colour), which ``str(timer)``, logs and tests use. Everything here takes data (a
`Timeline` or its summaries), never a live scope. Times are in ms with three decimals, relative to the scope's start;
``—`` stands for a missing value (an unfinished activity, a device
with no activity). A device whose clock is not aligned to the host is marked ``*`` and explained.

The tables are `FitTable`s: they fit the console they are printed on, and more than `PLAIN_ROWS` rows are drawn
as plain lines, formatted column by column, their numbers by numpy (`ms_strings`), so that a report of millions of
activities stays quick to build and to print.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from asyncgpu._analysis.balance import BalanceReport, balance
from asyncgpu._analysis.summary import ActivitySummary, DeviceSummary, activity_summary, device_summary
from asyncgpu._analysis.table import Column, FitTable, number, render
from asyncgpu._analysis.text import ms, ms_strings
from asyncgpu._base.records import KINDS, ActivityRecord, Timeline

__all__ = [
    "Report",
    "activity_table",
    "balance_renderable",
    "device_table",
    "durations_from",
    "records_report",
    "render",
    "timeline_report",
    "timeline_table",
]


_ACTIVITY_COLUMNS = (
    Column("start (ms)", "right", wrap=False),
    Column("duration (ms)", "right", wrap=False),
    Column("device"),
    Column("stream", drop=2),
    Column("kind", drop=1),
    Column("activity"),
)


def _unaligned(tl: Timeline) -> dict[int, str]:
    """Device code -> why its clock is not aligned."""
    return {i: c.reason or "clock not aligned" for i, c in enumerate(tl.clocks) if not c.aligned}


def timeline_table(tl: Timeline, order: str = "issue", limit: int | None = None) -> FitTable:
    """The activities, one per row, in issue order (as the host enqueued them) or time order (by start,
    unfinished ones last). With ``limit``, the first ``limit`` rows and a line saying how many more there are;
    None: every row. Only the rows shown are formatted, column by column."""
    if order not in ("issue", "time"):
        raise ValueError(f"order must be 'issue' or 'time', not {order!r}")
    rows = tl.time_order() if order == "time" else np.arange(len(tl))
    shown = rows if limit is None else rows[: max(limit, 0)]
    unaligned = _unaligned(tl)
    notes = [f"… {len(tl) - len(shown):,} more activities"] if len(shown) < len(tl) else []
    if not len(tl):
        notes.append("no activities")
    if unaligned:
        notes.append("* clock not aligned: times from the device's own start mark")
    start = (tl.start_ns[shown] - tl.scope_start_ns) / 1e6
    duration = tl.duration_ns[shown] / 1e6
    unfinished = ~(np.isfinite(start) & np.isfinite(duration))
    start[unfinished] = duration[unfinished] = np.nan
    devices = [name + (" *" if code in unaligned else "") for code, name in enumerate(tl.devices)]
    cells = [
        ms_strings(start),
        ms_strings(duration),
        _labels(devices, tl.device[shown]),
        _labels([label for _, label in tl.streams], tl.stream[shown]),
        _labels(KINDS, tl.kind[shown]),
        _labels(tl.names, tl.name[shown]),
    ]
    title = f"gpu_timer {tl.label!r}: activities in {order} order"
    return FitTable(title, _ACTIVITY_COLUMNS, "\n".join(notes) or None, cells)


def _labels(table: Sequence[str], codes: np.ndarray) -> list[str]:
    """``table[code]`` for every code."""
    return np.array(list(table) or [""], dtype=object)[codes].tolist()


def activity_table(source: Timeline | ActivitySummary) -> FitTable:
    """Count and duration statistics (ms) per activity name and kind, longest total first; a last row for all."""
    s = source if isinstance(source, ActivitySummary) else activity_summary(source)
    columns = [
        Column("activity"),
        Column("kind", drop=2),
        number("count", drop=1),
        number("total (ms)"),
        number("mean (ms)", drop=3),
        number("min (ms)", drop=5),
        number("max (ms)", drop=4),
    ]
    if s.unfinished:
        columns.append(number("unfinished"))
    table = FitTable("totals per kind and activity", columns)
    for r in s.rows:
        table.add_row(
            r.name,
            r.kind,
            f"{r.count:,}",
            ms(r.total_ms),
            ms(r.mean_ms),
            ms(r.min_ms),
            ms(r.max_ms),
            *([f"{r.unfinished:,}"] if s.unfinished else []),
        )
    table.add_section()
    table.add_row(
        "all", "", f"{s.count:,}", ms(s.total_ms), "", "", "", *([f"{s.unfinished:,}"] if s.unfinished else [])
    )
    return table


def device_table(source: Timeline | DeviceSummary) -> FitTable:
    """Per device: activities, busy time (union of the intervals), sum of durations, idle time, largest gap,
    utilisation, first start and last end (ms)."""
    s = source if isinstance(source, DeviceSummary) else device_summary(source)
    unaligned = {r.device: r.note for r in s.rows if not r.aligned}
    caption = "\n".join(
        [
            (
                "busy: time with an activity running (overlaps once); sum: durations added up; max gap: "
                "before the first, between, or after the last activity"
            )
        ]
        + [f"* {name}: clock not aligned ({why}): times from its own start mark" for name, why in unaligned.items()]
    )
    table = FitTable(
        f"totals per device, in ms, over a window of {ms(s.window_ms)} ms from the scope's start",
        [
            Column("device"),
            number("count", drop=3),
            number("busy"),
            number("sum", drop=5),
            number("idle", drop=4),
            number("max gap", drop=6),
            number("util."),
            number("first start", drop=8),
            number("last end", drop=7),
        ],
        caption,
    )
    for r in s.rows:
        table.add_row(
            r.device + (" *" if not r.aligned else ""),
            f"{r.count:,}",
            ms(r.busy_ms),
            ms(r.sum_ms),
            ms(r.idle_ms),
            ms(r.largest_gap_ms),
            "—" if r.utilisation is None else f"{r.utilisation:.1%}",
            ms(r.first_start_ms),
            ms(r.last_end_ms),
        )
    return table


def balance_renderable(source: Timeline | DeviceSummary | BalanceReport, work_units: Any = None) -> BalanceReport:
    """The balance as a renderable: the `BalanceReport` itself (it draws its table and verdict; see
    `BalanceReport.__rich_console__`), made from a timeline or a device summary (with ``work_units``, as in
    `balance`) when one is given."""
    return source if isinstance(source, BalanceReport) else balance(source, work_units)


class Report(Group):
    """A report, as one rich renderable (``rich.print`` it); ``str()`` is its plain text, 100 columns wide, made
    without the cropping pass that ``rich.print`` runs over every line (`render`)."""

    def __str__(self) -> str:
        return render(self)


def timeline_report(tl: Timeline, limit: int | None = 50, order: str = "issue", work_units: Any = None) -> Report:
    """The report of a finished scope's timeline, as one renderable: its activities in ``order`` (``issue`` or
    ``time``; the first ``limit``, 50 by default, and a line saying how many more; None: all of them), totals per
    activity, totals per device, the balance (``work_units`` as in `balance`), and a footer (host time in the
    scope's body and waiting at its exit, CPU time, unfinished activities, the error, unaligned clocks). More
    than `PLAIN_ROWS` activities are listed as plain lines (quicker as text, ``str``, than through ``rich.print``).
    Bad ``work_units`` raise as `balance` does, before anything is drawn."""
    ds = device_summary(tl)
    parts: list[RenderableType] = [
        timeline_table(tl, order=order, limit=limit),
        activity_table(tl),
        device_table(ds),
        balance(ds, work_units),
        _footer(tl),
    ]
    return Report(*[r for part in parts[:-1] for r in (part, Text(""))], parts[-1])


def _footer(tl: Timeline) -> Text:
    text = Text(
        f"scope {tl.label!r}: host {ms(tl.host_ms)} ms in the scope's body + {ms(tl.wait_ms)} ms waiting "
        f"for the devices at its exit, CPU {ms(tl.cpu_ms)} ms"
    )
    unfinished = int(len(tl) - tl.complete.sum())
    if unfinished:
        text.append(
            f"; {unfinished:,} {'activity' if unfinished == 1 else 'activities'} unfinished when the scope ended"
        )
    if tl.error:
        text.append(f"; the scope raised {tl.error}")
    text.append(f"; durations from {durations_from(tl)}")
    unaligned = _unaligned(tl)
    if unaligned:
        text.append(
            "; not aligned to the host clock: " + ", ".join(f"{tl.devices[i]} ({why})" for i, why in unaligned.items())
        )
    return text


def durations_from(tl: Timeline) -> str:
    """Where the timeline's durations come from, in words, with `Timeline.source_note` when there is one."""
    if all(d.startswith("host") for d in tl.devices):
        how = "host events"
    else:
        how = "CUPTI activity records" if tl.source == "cupti" else "held CUDA event pairs"
        if tl.source != "cupti":  # what was taken out of each device's brackets, and how it was measured
            cut = [f"{c.device} {c.overhead_ns / 1e3:.2f} µs ({c.overhead_source})" for c in tl.clocks if c.overhead_ns]
            if cut:
                how += ", less the pair's own latency: " + "; ".join(cut)
    return f"{how} ({tl.source_note})" if tl.source_note else how


def records_report(records: list[ActivityRecord], indent: str = "") -> Padding:
    """A plain list of records as one table, shifted right by ``len(indent)`` columns (`timing_print`)."""
    done = [r.duration_ms for r in records if r.duration_ms is not None]
    caption = f"{len(records):,} activities, {ms(sum(done))} ms in all"
    if len(done) < len(records):
        caption += f", {len(records) - len(done):,} unfinished"
    table = FitTable("activities", _ACTIVITY_COLUMNS, caption)
    for r in records:
        table.add_row(ms(r.start_ms), ms(r.duration_ms), r.device, r.stream, r.kind, r.name)
    return Padding(table, (0, 0, 0, len(indent)), expand=False)
