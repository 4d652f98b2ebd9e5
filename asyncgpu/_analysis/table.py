"""Tables that fit the console they are printed on (`FitTable`), and `render`: any renderable as plain text.

A `FitTable` never wraps or cuts a number: at the console's width text wraps at spaces, and when even that is too
wide the least needed columns are left out (the caption says which). A table of more than `PLAIN_ROWS` rows is drawn
as plain lines, formatted column by column: rich's own table layout measures every cell, which costs far more per
row than one %-format per chunk of rows, and a report may list millions of activities.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, OverflowMethod, RenderableType
from rich.constrain import Constrain
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

__all__ = ["PLAIN_ROWS", "Column", "FitTable", "new_table", "number", "render"]

PLAIN_ROWS = 500  #: a `FitTable` of more rows than this is drawn as plain lines (its text does not wrap)
_CHUNK_ROWS = 4096  # rows per %-format call of the plain lines
_NEW_LINE = Segment.line()


def new_table(title: str, columns: Iterable[tuple[str, str]], caption: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left", show_edge=False)
    for header, justify in columns:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    return table


@dataclass(frozen=True)
class Column:
    """A column of a `FitTable`. ``wrap``: False for numbers (and bars), which are never wrapped or cut; text
    wraps at spaces. ``drop``: 0 for a column that always shows; 1, 2, …: left out, the highest first, when the
    console is too narrow for the table even with its text wrapped. ``min_width``: in cells. ``note``: a part of
    the caption, there only while the column is shown (what the column means). A new line in ``header`` breaks
    it."""

    header: str
    justify: JustifyMethod = "left"
    wrap: bool = True
    drop: int = 0
    min_width: int = 0
    note: str = ""


def number(header: str, drop: int = 0, note: str = "") -> Column:
    """A right-aligned column of numbers (never wrapped or cut)."""
    return Column(header, "right", wrap=False, drop=drop, note=note)


class FitTable:
    """A table that fits the console it is printed on, in rich's look (a heavy head, no outer edge).

    At the console's width: every column at its natural width if that fits; else text columns wrap at spaces and
    headers of number columns wrap (numbers never); else columns are left out, the highest `Column.drop` first, and
    the caption names them. More than `PLAIN_ROWS` rows are drawn as plain lines formatted column by column (no
    wrapping, widths counted in characters; a row wider than the console continues on the next line). Cells are
    plain text (no markup).

    The caption is ``caption``, the `Column.note` of each column shown, and a note naming the columns left out,
    joined by ``caption_separator``. ``too_narrow``: what a table drawn by rich does when even the columns that
    always show do not fit at their narrowest: ``"fold"`` narrows them further (numbers fold onto more lines),
    ``"wide"`` keeps every number whole and runs past the console's width."""

    def __init__(
        self,
        title: str,
        columns: Sequence[Column],
        caption: str | None = None,
        cells: Sequence[list[str]] | None = None,
        *,
        caption_separator: str = "\n",
        too_narrow: Literal["fold", "wide"] = "fold",
    ) -> None:
        self.title, self.columns, self.caption = title, tuple(columns), caption
        self.caption_separator, self.too_narrow = caption_separator, too_narrow
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
            max(c.min_width, *map(width_of, c.header.split("\n")), max(map(width_of, cells), default=0))
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
        notes = [self.columns[i].note for i in shown]
        left_out = [
            self.columns[i].header.replace("\n", " ") or "bars" for i in range(len(self.columns)) if i not in shown
        ]
        left_out_note = f"left out at this width ({max_width} columns): {', '.join(left_out)}" if left_out else None
        return self.caption_separator.join(x for x in (self.caption, *notes, left_out_note) if x) or None

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
        wide = self.too_narrow == "wide" and sum(widths) + 3 * len(shown) - 1 > options.max_width
        overflow: OverflowMethod | None = None if wide else "fold"
        for i, w in zip(shown, widths):
            c = self.columns[i]
            if wide:  # every column at least its narrowest, numbers unwrapped: the table runs past the console
                table.add_column(Text(c.header), justify=c.justify, no_wrap=not c.wrap, min_width=w)
            else:
                table.add_column(Text(c.header, overflow="fold"), justify=c.justify, width=w, overflow="fold")
        for r in range(len(self)):
            if r in self.sections:
                table.add_section()
            table.add_row(*(Text(self.cells[i][r], overflow=overflow) for i in shown))
        yield table

    def _lines(
        self, shown: list[int], widths: list[int], caption: str | None, max_width: int, uncropped: bool
    ) -> Iterator[RenderableType | Segment]:
        """The plain drawing: title, head, rows (formatted by chunks of rows), caption. For a console that crops
        what it prints (``uncropped`` False: ``rich.print``, every console but `render`'s), a segment per line; else
        a segment per chunk of rows."""
        table_width = sum(widths) + 3 * len(widths) - 1
        yield Constrain(Text(self.title, style="table.title"), table_width)
        head = [self.columns[i].header.split("\n") for i in shown]
        right = [self.columns[i].justify == "right" for i in shown]
        fields = [f"%{'' if r else '-'}{w}s" for r, w in zip(right, widths)]
        if not right[-1]:
            fields[-1] = "%s"  # no padding at the end of a line
        template = " " + " │ ".join(fields) + "\n"
        rule = "╇".join("━" * (w + 2) for w in widths)
        section = "┼".join("─" * (w + 2) for w in widths)
        indent = sum(w + 3 for w in widths[:-1]) + 1  # where the last column starts
        indent = indent if indent <= max_width // 2 else 0
        depth = max(map(len, head), default=1)  # (a header's lines at the bottom of the head, as rich puts them)
        head_lines = [
            _fold((" " + " ┃ ".join(fields)) % tuple(([""] * (depth - len(h)) + h)[k] for h in head), max_width, indent)
            for k in range(depth)
        ]
        yield Segment("\n".join(head_lines) + f"\n{rule[:max_width]}\n")
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


class _UncroppedConsole(Console):
    """`render`'s console, which prints without rich's cropping pass: a plain table gives it a segment per chunk
    of rows rather than one per line."""


def render(renderable: RenderableType, width: int = 100) -> str:
    """Any renderable as plain text, ``width`` columns wide, without colour. Lines are not cropped afterwards
    (every renderable here fits ``width`` already): the cropping pass walks every line, the largest cost of a
    long table after its formatting."""
    buf = io.StringIO()
    _UncroppedConsole(file=buf, width=width, color_system=None, force_terminal=False).print(renderable, crop=False)
    return buf.getvalue()
