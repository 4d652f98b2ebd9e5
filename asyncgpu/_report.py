"""Rendering with rich: a scope's activities, the summaries per activity and per device, and the balance.

Each function returns a rich renderable (``rich.print`` it, or put it in a layout); `render` turns any
renderable into plain text (no colour), which ``str(timer)``, logs and tests use. Everything here takes data (a
`Timeline` or its summaries), never a live scope. Times are in ms with three decimals, relative to the scope's start;
``—`` stands for a missing value (an unfinished activity, a device
with no activity). A device whose clock is not aligned to the host is marked ``*`` and explained.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ._records import KINDS, ActivityRecord, Timeline
from ._summary import ActivitySummary, BalanceReport, DeviceSummary, activity_summary, balance, device_summary

__all__ = [
    "activity_table",
    "balance_renderable",
    "bar",
    "device_table",
    "ms",
    "new_table",
    "records_report",
    "render",
    "timeline_report",
    "timeline_table",
]

_EIGHTHS = " ▏▎▍▌▋▊▉"
_ACTIVITY_COLUMNS = (
    ("start (ms)", "right"),
    ("duration (ms)", "right"),
    ("device", "left"),
    ("stream", "left"),
    ("kind", "left"),
    ("activity", "left"),
)


def ms(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:,.3f}"


def new_table(title: str, columns: Iterable[tuple[str, str]], caption: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left", show_edge=False)
    for header, justify in columns:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    return table


def _unaligned(tl: Timeline) -> dict[int, str]:
    """Device code -> why its clock is not aligned."""
    return {i: c.reason or "clock not aligned" for i, c in enumerate(tl.clocks) if not c.aligned}


def timeline_table(tl: Timeline, order: str = "issue", limit: int | None = None) -> Table:
    """The activities, one per row, in issue order (as the host enqueued them) or time order (by start,
    unfinished ones last). With ``limit``, the first ``limit`` rows and a line saying how many more there are:
    only the rows shown are formatted, so this is cheap on a timeline of millions of rows."""
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
    table = new_table(
        f"gpu_timer {tl.label!r}: activities in {order} order", _ACTIVITY_COLUMNS, "\n".join(notes) or None
    )
    start = (tl.start_ns[shown] - tl.scope_start_ns) / 1e6
    duration = tl.duration_ns[shown] / 1e6
    done = np.isfinite(start) & np.isfinite(duration)
    for j, i in enumerate(shown.tolist()):
        code = int(tl.device[i])
        table.add_row(
            ms(start[j]) if done[j] else "—",
            ms(duration[j]) if done[j] else "—",
            tl.devices[code] + (" *" if code in unaligned else ""),
            tl.streams[tl.stream[i]][1],
            KINDS[tl.kind[i]],
            tl.names[tl.name[i]],
        )
    return table


def activity_table(source: Timeline | ActivitySummary) -> Table:
    """Count and duration statistics (ms) per activity name and kind, longest total first; a last row for all."""
    s = source if isinstance(source, ActivitySummary) else activity_summary(source)
    columns = [
        ("activity", "left"),
        ("kind", "left"),
        ("count", "right"),
        ("total (ms)", "right"),
        ("mean (ms)", "right"),
        ("min (ms)", "right"),
        ("max (ms)", "right"),
    ]
    if s.unfinished:
        columns.append(("unfinished", "right"))
    table = new_table("totals per kind and activity", columns)
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


def device_table(source: Timeline | DeviceSummary) -> Table:
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
    table = new_table(
        f"totals per device, in ms, over a window of {ms(s.window_ms)} ms from the scope's start",
        [
            ("device", "left"),
            ("count", "right"),
            ("busy", "right"),
            ("sum", "right"),
            ("idle", "right"),
            ("max gap", "right"),
            ("util.", "right"),
            ("first start", "right"),
            ("last end", "right"),
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


def bar(value: float, top: float, width: int) -> str:
    """``value`` of ``top`` as a bar of ``width`` full blocks, in eighths of a block (at least one if > 0)."""
    if top <= 0 or value <= 0:
        return ""
    eighths = max(1, round(value / top * width * 8))
    return "█" * (eighths // 8) + _EIGHTHS[eighths % 8].strip()


def balance_renderable(source: Timeline | DeviceSummary | BalanceReport, bar_width: int = 20) -> Group:
    """Busy time per device as a bar chart (``bar_width`` blocks for the busiest), how long each device waited
    for the straggler, the suggested split of the work and its predicted makespan, and the report's notes."""
    b = source if isinstance(source, BalanceReport) else balance(source)
    top = max((r.busy_ms for r in b.rows), default=0.0)
    table = new_table("balance: busy time per device", [("device", "left"), ("busy (ms)", "right")])
    table.add_column("", no_wrap=True, min_width=bar_width, overflow="crop")
    table.add_column("wait (ms)", justify="right")
    for header in ("units", "suggested") if b.units_given else ("share",):
        table.add_column(header, justify="right")
    table.add_column("")
    for r in b.rows:
        split = [f"{r.units:,}", f"{r.suggested_units:,}"] if b.units_given else [f"{r.share:.1%}"]
        table.add_row(r.device, ms(r.busy_ms), bar(r.busy_ms, top, bar_width), ms(r.wait_ms), *split, r.note)
    lines = [
        f"imbalance {b.imbalance:.3f} = max busy {ms(b.makespan_ms)} ms / mean busy {ms(b.mean_busy_ms)} ms; "
        f"straggler {b.straggler}"
        if b.imbalance is not None
        else "imbalance —: no device has busy time"
    ]
    what = "split" if b.units_given else "shares (one unit of work per device assumed)"
    if b.predicted_makespan_ms is not None:
        lines.append(
            f"makespan (busy): {ms(b.makespan_ms)} ms now, {ms(b.predicted_makespan_ms)} ms predicted "
            f"with the suggested {what}"
        )
    lines += [f"note: {n}" for n in b.notes]
    return Group(table, Text("\n".join(lines)))


def timeline_report(tl: Timeline, limit: int | None = 50, order: str = "issue") -> Group:
    """The report of a finished scope's timeline, as one renderable: its activities in ``order`` (``issue`` or
    ``time``; the first ``limit``), totals per activity, totals per device, the balance, and a footer (host time
    issuing and waiting, CPU time, unfinished activities, the error, unaligned clocks)."""
    ds = device_summary(tl)
    parts: list[RenderableType] = [
        timeline_table(tl, order=order, limit=limit),
        activity_table(tl),
        device_table(ds),
        balance_renderable(balance(ds)),
        _footer(tl),
    ]
    return Group(*[r for part in parts[:-1] for r in (part, Text(""))], parts[-1])


def _footer(tl: Timeline) -> Text:
    text = Text(
        f"scope {tl.label!r}: host {ms(tl.host_ms)} ms issuing + {ms(tl.wait_ms)} ms waiting "
        f"for the devices, CPU {ms(tl.cpu_ms)} ms"
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
    return f"{how} ({tl.source_note})" if tl.source_note else how


def records_report(records: list[ActivityRecord], indent: str = "") -> Padding:
    """A plain list of records as one table, shifted right by ``len(indent)`` columns (`timing_print`)."""
    done = [r.duration_ms for r in records if r.duration_ms is not None]
    caption = f"{len(records):,} activities, {ms(sum(done))} ms in all"
    if len(done) < len(records):
        caption += f", {len(records) - len(done):,} unfinished"
    table = new_table("activities", _ACTIVITY_COLUMNS, caption)
    for r in records:
        table.add_row(ms(r.start_ms), ms(r.duration_ms), r.device, r.stream, r.kind, r.name)
    return Padding(table, (0, 0, 0, len(indent)), expand=False)


def render(renderable: RenderableType, width: int = 100) -> str:
    """Any renderable as plain text, ``width`` columns wide, without colour."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(renderable)
    return buf.getvalue()
