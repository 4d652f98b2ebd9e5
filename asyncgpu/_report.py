"""Rendering a finished `Timer` with rich: activities, totals per kind, totals per device, host and CPU time.

`timer_report` returns one renderable (a rich ``Group``); `render_text` renders it as plain text (no colour)
for ``str(timer)``, logs and tests.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ._timer import Timer

__all__ = ["timer_report", "render_text"]


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.3f}"


def timer_report(timer: Timer) -> Group:
    """The report of a finished scope, as one rich renderable."""
    title = f"gpu_timer {timer.label!r}"
    acts = Table(title=f"{title}: activities", title_justify="left", show_edge=False)
    for col, justify in (("start (ms)", "right"), ("duration (ms)", "right"), ("device", "left"),
                         ("stream", "left"), ("kind", "left"), ("activity", "left")):
        acts.add_column(col, justify=justify)
    for r in timer.records:
        acts.add_row(_ms(r.start_ms), _ms(r.duration_ms), r.device, r.stream, r.kind, r.name)

    kinds = Table(title="totals per kind", title_justify="left", show_edge=False)
    for col, justify in (("kind", "left"), ("count", "right"), ("total (ms)", "right")):
        kinds.add_column(col, justify=justify)
    for kind, (n, total) in sorted(timer.totals_by("kind").items()):
        kinds.add_row(kind, str(n), _ms(total))

    devs = Table(title="totals per device", title_justify="left", show_edge=False)
    for col, justify in (("device", "left"), ("model", "left"), ("activities", "right"),
                         ("sum (ms)", "right"), ("last end (ms)", "right")):
        devs.add_column(col, justify=justify)
    counts = timer.totals_by("device")
    for d in timer.devices:
        n, total = counts.get(d.name, (0, 0.0))
        devs.add_row(d.name, d.description, str(n), _ms(total), _ms(timer.device_span_ms.get(d.name)))

    incomplete = sum(1 for r in timer.records if r.duration_ms is None)
    footer = Text(f"scope {timer.label!r}: host {_ms(timer.host_ms)} ms issuing + {_ms(timer.wait_ms)} ms waiting "
                  f"for the devices, CPU {_ms(timer.cpu_ms)} ms")
    if incomplete:
        footer.append(f"; {incomplete} activities unfinished when the scope ended")
    if timer.error:
        footer.append(f"; the scope raised {timer.error}")
    return Group(acts, Text(""), kinds, Text(""), devs, Text(""), footer)


def render_text(timer: Timer, width: int = 100) -> str:
    """The report as plain text."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(timer_report(timer))
    return buf.getvalue()
