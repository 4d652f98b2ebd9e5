"""Rendering with rich: a scope's activities, the summaries per activity and per device, and the balance.

Each function returns a rich renderable (``rich.print`` it, or put it in a layout); `render` turns any
renderable into plain text (no colour), which ``str(timer)``, logs and tests use. Everything here takes data (a
`Timeline` or its summaries), never a live scope. Times are in ms with three decimals, relative to the scope's start;
``—`` stands for a missing value (an unfinished activity, a device
with no activity). A device whose clock is not aligned to the host is marked ``*`` and explained.

Tables (`FitTable`) fit the console they are printed on: numbers are never wrapped or cut, text wraps at spaces,
and when even that is too wide the least needed columns are left out (the caption says which). A table of more
than `PLAIN_ROWS` rows is drawn as plain lines, formatted column by column, its numbers by numpy: a report of a
million activities takes 0.3 s to build and 0.65 s as plain text, where rich's own table layout takes about 0.2 ms
a row. ``rich.print`` of it takes about 3.5 s on a 2-CPU machine, half of it the console's own cropping pass over
every line (1.8 s for a million lines handed to it ready-made, which no renderable can skip).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType
from rich.constrain import Constrain
from rich.measure import Measurement
from rich.padding import Padding
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from asyncgpu._analysis.summary import (
    ActivitySummary,
    BalanceReport,
    DeviceSummary,
    activity_summary,
    balance,
    bar,
    device_summary,
    ms,
)
from asyncgpu._base.records import KINDS, ActivityRecord, Timeline

__all__ = [
    "PLAIN_ROWS",
    "Column",
    "FitTable",
    "Report",
    "activity_table",
    "balance_renderable",
    "bar",
    "device_table",
    "ms",
    "ms_strings",
    "new_table",
    "records_report",
    "render",
    "timeline_report",
    "timeline_table",
]

PLAIN_ROWS = 500  #: a `FitTable` of more rows than this is drawn as plain lines (its text does not wrap)
_CHUNK_ROWS = 4096  # rows per %-format call of the plain lines
_FAST_MS = 1e9  #: `ms_strings` writes the digits of smaller values with numpy (exact: the float error stays < 1e-4 µs)
_POWERS_OF_TEN = 10 ** np.arange(1, 13, dtype=np.int64)
_NEW_LINE = Segment.line()


def ms_strings(values: np.ndarray) -> list[str]:
    """`ms` of every value (ms with three decimals and thousands separators, ``—`` for NaN), the same strings as
    ``f"{value:,.3f}"``: digits written by numpy (0.13 s a million), Python's formatting only for a value that lies
    within 0.001 µs of a rounding tie, is over `_FAST_MS` or is not finite."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN, inf and huge values compare False: Python's formatting
        scaled = values * 1000.0  # µs
        us = np.rint(scaled)
        fast = (np.abs(values) < _FAST_MS) & (np.abs(scaled - us) < 0.499)
    us[~fast] = 0
    out = _thousandths(np.abs(us).astype(np.int64), np.signbit(values)).tolist()
    for i in np.flatnonzero(~fast).tolist():
        out[i] = ms(float(values[i]))
    return out


def _thousandths(counts: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """``f"{count / 1000:,.3f}"`` (``-`` in front where ``negative``) of counts from 0 to 10¹², as a numpy array of
    strings: the characters of every string written at once, digit by digit from the right."""
    whole, frac = np.divmod(counts, 1000)
    digits = 1 + np.searchsorted(_POWERS_OF_TEN, whole, side="right")
    length = negative + digits + (digits - 1) // 3 + 4
    width = int(length.max(initial=1))
    chars = np.zeros(len(counts) * width, np.uint32)  # code points, read back as strings of `width` characters
    pos = np.arange(len(counts), dtype=np.int64) * width + length - 1  # where each string's next character goes
    for _ in range(3):
        frac, digit = np.divmod(frac, 10)
        chars[pos] = ord("0") + digit
        pos -= 1
    chars[pos] = ord(".")
    pos -= 1
    rows = np.arange(len(counts))
    for d in range(int(digits.max(initial=1))):
        if d:  # only the strings with a d-th digit go on
            more = digits[rows] > d
            rows, pos, whole = rows[more], pos[more] - (d % 3 == 0), whole[more]
            if d % 3 == 0:
                chars[pos + 1] = ord(",")
        whole, digit = np.divmod(whole, 10)
        chars[pos] = ord("0") + digit
        pos -= 1
    chars[np.flatnonzero(negative) * width] = ord("-")
    return chars.view(f"U{width}")


def new_table(title: str, columns: Iterable[tuple[str, str]], caption: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left", show_edge=False)
    for header, justify in columns:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    return table


@dataclass(frozen=True)
class Column:
    """A column of a `FitTable`. ``wrap``: False for numbers (and bars), which are never wrapped or cut; text
    wraps at spaces. ``drop``: 0 for a column that always shows; 1, 2, …: left out, the highest first, when the
    console is too narrow for the table even with its text wrapped. ``min_width``: in cells."""

    header: str
    justify: JustifyMethod = "left"
    wrap: bool = True
    drop: int = 0
    min_width: int = 0


def number(header: str, drop: int = 0) -> Column:
    """A right-aligned column of numbers (never wrapped or cut)."""
    return Column(header, "right", wrap=False, drop=drop)


class FitTable:
    """A table that fits the console it is printed on, in rich's look (a heavy head, no outer edge).

    At the console's width: every column at its natural width if that fits; else text columns wrap at spaces and
    headers of number columns wrap (numbers never); else columns are left out, the highest `Column.drop` first, and
    the caption names them. More than `PLAIN_ROWS` rows are drawn as plain lines formatted column by column (no
    wrapping, widths counted in characters; a row wider than the console continues on the next line): about 0.4 µs
    a row, where rich's table layout takes about 200. Cells are plain text (no markup)."""

    def __init__(
        self,
        title: str,
        columns: Sequence[Column],
        caption: str | None = None,
        cells: Sequence[list[str]] | None = None,
    ) -> None:
        self.title, self.columns, self.caption = title, tuple(columns), caption
        self.cells: list[list[str]] = [list(c) for c in cells] if cells is not None else [[] for _ in self.columns]
        if len(self.cells) != len(self.columns) or len({len(c) for c in self.cells}) > 1:
            raise ValueError(f"cells must be {len(self.columns)} lists of one length, one per column")
        self.sections: list[int] = []  #: a line goes before each of these rows

    def __len__(self) -> int:
        return len(self.cells[0]) if self.cells else 0

    @property
    def plain(self) -> bool:
        """Whether this table is drawn as plain lines (more than `PLAIN_ROWS` rows)."""
        return len(self) > PLAIN_ROWS

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of this table has {len(self.columns)} cells, not {len(cells)}")
        for column, cell in zip(self.cells, cells):
            column.append(cell)

    def add_section(self) -> None:
        """A line between the rows added so far and the next."""
        self.sections.append(len(self))

    def layout(self, max_width: int) -> tuple[list[int], list[int]]:
        """The columns shown (indices) and their widths in cells, for a console ``max_width`` cells wide."""
        width_of = len if self.plain else cell_len
        natural = [
            max(c.min_width, width_of(c.header), max(map(width_of, cells), default=0))
            for c, cells in zip(self.columns, self.cells)
        ]
        floor = natural if self.plain else [self._floor(c, cells) for c, cells in zip(self.columns, self.cells)]
        shown = list(range(len(self.columns)))
        while True:
            widths = [natural[i] for i in shown]
            excess = sum(widths) + 3 * len(shown) - 1 - max_width  # 1 cell of padding each side, 1 between
            if excess <= 0:
                return shown, widths
            if sum(widths) - sum(floor[i] for i in shown) >= excess:
                for _ in range(excess):  # narrow the widest column that can still give a cell
                    k = max((k for k, i in enumerate(shown) if widths[k] > floor[i]), key=widths.__getitem__)
                    widths[k] -= 1
                return shown, widths
            droppable = [i for i in shown if self.columns[i].drop]
            if not droppable:
                return shown, [floor[i] for i in shown]
            shown.remove(max(droppable, key=lambda i: self.columns[i].drop))

    @staticmethod
    def _floor(c: Column, cells: list[str]) -> int:
        """The narrowest a column gets: its longest word (header included), or its widest cell if it never wraps."""
        words = [cell_len(w) for w in c.header.split()]
        if c.wrap:
            words += [cell_len(w) for cell in cells for w in cell.split()]
        else:
            words += [cell_len(cell) for cell in cells]
        return max(c.min_width, max(words, default=1))

    def _caption(self, shown: list[int], max_width: int) -> str | None:
        left_out = [self.columns[i].header or "bars" for i in range(len(self.columns)) if i not in shown]
        note = f"left out at this width ({max_width} columns): {', '.join(left_out)}"
        return "\n".join(x for x in (self.caption, note if left_out else None) if x) or None

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        shown, widths = self.layout(options.max_width)
        return Measurement(sum(widths) + 3 * len(shown) - 1, sum(widths) + 3 * len(shown) - 1)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType | Segment]:
        shown, widths = self.layout(options.max_width)
        caption = self._caption(shown, options.max_width)
        if self.plain:
            # A console that will not crop: `render`'s, or one printing with ``soft_wrap=True`` (which turns the
            # cropping pass off, and says so as no_wrap with overflow "ignore"). Either way the text is the same.
            uncropped = isinstance(console, _UncroppedConsole) or (
                bool(options.no_wrap) and options.overflow == "ignore"
            )
            yield from self._lines(shown, widths, caption, options.max_width, uncropped)
            return
        table = Table(
            title=Text(self.title, style="table.title"),
            title_justify="left",
            caption=Text(caption, style="table.caption") if caption else None,
            caption_justify="left",
            show_edge=False,
        )
        for i, w in zip(shown, widths):
            c = self.columns[i]
            table.add_column(Text(c.header, overflow="fold"), justify=c.justify, width=w, overflow="fold")
        for r in range(len(self)):
            if r in self.sections:
                table.add_section()
            table.add_row(*(Text(self.cells[i][r], overflow="fold") for i in shown))
        yield table

    def _lines(
        self, shown: list[int], widths: list[int], caption: str | None, max_width: int, uncropped: bool
    ) -> Iterator[RenderableType | Segment]:
        """The plain drawing: title, head, rows (formatted by chunks of rows), caption. For a console that crops
        what it prints (``uncropped`` False: ``rich.print``, every console but `render`'s), a segment per line; else
        a segment per chunk of rows."""
        table_width = sum(widths) + 3 * len(widths) - 1
        yield Constrain(Text(self.title, style="table.title"), table_width)
        head = [self.columns[i].header for i in shown]
        right = [self.columns[i].justify == "right" for i in shown]
        fields = [f"%{'' if r else '-'}{w}s" for r, w in zip(right, widths)]
        if not right[-1]:
            fields[-1] = "%s"  # no padding at the end of a line
        template = " " + " │ ".join(fields) + "\n"
        rule = "╇".join("━" * (w + 2) for w in widths)
        section = "┼".join("─" * (w + 2) for w in widths)
        indent = sum(w + 3 for w in widths[:-1]) + 1  # where the last column starts
        indent = indent if indent <= max_width // 2 else 0
        head_line = _fold((" " + " ┃ ".join(fields)) % tuple(head), max_width, indent)
        yield Segment(f"{head_line}\n{rule[:max_width]}\n")
        columns = [self.cells[i] for i in shown]
        bounds = sorted({0, len(self), *self.sections, *range(0, len(self), _CHUNK_ROWS)})
        for lo, hi in zip(bounds, bounds[1:]):
            if lo in self.sections and lo:
                yield Segment(section[:max_width] + "\n")
            flat: list[str] = [""] * ((hi - lo) * len(columns))
            for j, col in enumerate(columns):
                flat[j :: len(columns)] = col[lo:hi]
            text = (template * (hi - lo)) % tuple(flat)
            if table_width > max_width:  # rows may be too long: the rest of each goes on the next line
                text = "".join(_fold(line, max_width, indent) + "\n" for line in text.split("\n")[:-1])
            yield from [Segment(text)] if uncropped else _line_segments(text)
        if caption:
            yield Constrain(Text(caption, style="table.caption"), table_width)


def _line_segments(text: str) -> list[Segment]:
    """``text`` (lines, each ending in a new line) as a segment per line, each followed by one shared new-line
    segment. A console's cropping pass (`Segment.split_and_crop_lines`, once per line whatever the segments) then
    keeps each line's segment as it is, where a segment of several lines would be cut into new ones."""
    lines = text.split("\n")[:-1]
    segments = [_NEW_LINE] * (2 * len(lines))
    segments[::2] = map(Segment, lines)
    return segments


def _fold(line: str, width: int, indent: int) -> str:
    """``line`` in pieces of at most ``width`` characters, the pieces after the first indented by ``indent``."""
    if len(line) <= width:
        return line
    pieces, line = [line[:width]], line[width:]
    while line:
        pieces.append(" " * indent + line[: width - indent])
        line = line[width - indent :]
    return "\n".join(pieces)


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
    None: every row. Only the rows shown are formatted, column by column: a million rows take about 0.3 s."""
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
    """A report, as one rich renderable (``rich.print`` it); ``str()`` is its plain text, 100 columns wide (no
    cropping pass: a million-row report in 0.65 s, where ``rich.print`` crops each line itself, 3.5 s)."""

    def __str__(self) -> str:
        return render(self)


def timeline_report(tl: Timeline, limit: int | None = 50, order: str = "issue", work_units: Any = None) -> Report:
    """The report of a finished scope's timeline, as one renderable: its activities in ``order`` (``issue`` or
    ``time``; the first ``limit``, 50 by default, and a line saying how many more; None: all of them), totals per
    activity, totals per device, the balance (``work_units`` as in `balance`), and a footer (host time in the
    scope's body and waiting at its exit, CPU time, unfinished activities, the error, unaligned clocks). More
    than `PLAIN_ROWS` activities are listed as plain lines: a million in 0.65 s as text (``str``), 3.5 s through
    ``rich.print``. Bad ``work_units`` raise as `balance` does, before anything is drawn."""
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


class _UncroppedConsole(Console):
    """`render`'s console, which prints without rich's cropping pass: a plain table gives it a segment per chunk
    of rows rather than one per line."""


def render(renderable: RenderableType, width: int = 100) -> str:
    """Any renderable as plain text, ``width`` columns wide, without colour. Lines are not cropped afterwards
    (every renderable here fits ``width`` already), which keeps a million-row table to about 0.4 s."""
    buf = io.StringIO()
    _UncroppedConsole(file=buf, width=width, color_system=None, force_terminal=False).print(renderable, crop=False)
    return buf.getvalue()
