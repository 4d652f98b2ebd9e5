"""Rendering of a gather (rich): the ranks and their clock offsets, then the cross-rank balance (busy time per rank
as bars, per rank and device, the collective points and who they waited for). Times in ms unless a column says
µs; ``—`` stands for a missing value. Threads: any."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.text import Text

from asyncgpu._analysis.table import new_table
from asyncgpu._analysis.text import bar, ms

if TYPE_CHECKING:
    from asyncgpu.ranks.balance import RankBalance
    from asyncgpu.ranks.merge import RankTimeline

__all__ = ["balance_group", "rank_report"]


def _us_from_ns(ns: float) -> str:
    """A time in ns as µs text, one decimal."""
    return f"{ns / 1e3:,.1f}"


def ranks_table(rt: RankTimeline) -> RenderableType:
    """One row per rank: host, pid, backend, devices, activities, clock offset to the root and its bound (µs)."""
    table = new_table(
        f"gather {rt.label!r}: {rt.world} ranks on the clock of rank {rt.root}",
        [
            ("rank", "right"),
            ("host", "left"),
            ("pid", "right"),
            ("devices", "left"),
            ("activities", "right"),
            ("offset (µs)", "right"),
            ("± (µs)", "right"),
            ("best rtt (µs)", "right"),
        ],
        "offset: the rank's perf_counter minus the root's, measured by ping-pong (± its bound)",
    )
    for r in rt.ranks:
        root = r.rank == rt.root
        table.add_row(
            str(r.rank),
            r.host,
            str(r.pid),
            ", ".join(r.devices),
            f"{r.activities:,}",
            "root" if root else _us_from_ns(r.offset_ns),
            "" if root else _us_from_ns(r.bound_ns),
            "" if root else _us_from_ns(r.rtt_ns),
        )
    return table


def balance_group(b: RankBalance, limit: int = 64, bar_width: int = 20) -> Group:
    """Busy time per rank (bars), per rank and device (the first ``limit`` rows), the collective points per mark
    name, and the summary lines."""
    top = max((r.busy_ms for r in b.ranks), default=0.0)
    split = ("units", "suggested") if b.units_given else ("share",)
    ranks = new_table(
        "balance across ranks: busy time of each rank's busiest device", [("rank", "right"), ("busy (ms)", "right")]
    )
    ranks.add_column("", no_wrap=True, min_width=bar_width, overflow="crop")
    for header, justify in (
        [("device", "left"), ("waited (ms)", "right")] + [(h, "right") for h in split] + [("", "left")]
    ):
        ranks.add_column(header, justify=justify)  # type: ignore[arg-type]
    for r in b.ranks:
        cells = [f"{r.units:,}", f"{r.suggested_units:,}"] if b.units_given else [f"{r.share:.1%}"]
        ranks.add_row(
            str(r.rank),
            ms(r.busy_ms),
            bar(r.busy_ms, top, bar_width),
            r.busiest_device or "—",
            ms(r.wait_ms),
            *cells,
            r.note,
        )
    devices = new_table(
        "per rank and device",
        [
            ("device", "left"),
            ("count", "right"),
            ("busy (ms)", "right"),
            ("util.", "right"),
            ("waited (ms)", "right"),
            ("last at", "right"),
            ("", "left"),
        ],
        f"… {len(b.devices) - limit:,} more devices (RankBalance.devices has them all)"
        if len(b.devices) > limit
        else None,
    )
    for d in b.devices[:limit]:
        devices.add_row(
            d.device,
            f"{d.count:,}",
            ms(d.busy_ms),
            "—" if d.utilisation is None else f"{d.utilisation:.1%}",
            ms(d.wait_ms),
            f"{d.last_at:,}",
            d.note,
        )
    parts: list[RenderableType] = [ranks, Text(""), devices]
    if b.points:
        parts += [Text(""), _points_table(b)]
    lines = [
        f"imbalance across ranks {b.imbalance:.3f} = max busy {ms(b.makespan_ms)} ms / mean "
        f"{ms(b.mean_busy_ms)} ms; straggler rank {b.straggler_rank} (busiest device {b.straggler_device}, "
        f"imbalance over all devices {b.device_imbalance:.3f})"
        if b.imbalance is not None
        else "imbalance —: no rank has busy time"
    ]
    if b.predicted_makespan_ms is not None:
        what = "split" if b.units_given else "shares (one unit of work per rank assumed)"
        lines.append(
            f"makespan (busy): {ms(b.makespan_ms)} ms now, {ms(b.predicted_makespan_ms)} ms predicted "
            f"with the suggested {what}"
        )
    lines += [f"note: {n}" for n in b.notes]
    return Group(*parts, Text("\n".join(lines)))


def _points_table(b: RankBalance) -> RenderableType:
    table = new_table(
        "collective points (mark_collective): who arrived last (how often), how long the others waited, in ms",
        [
            ("mark", "left"),
            ("points", "right"),
            ("last rank", "left"),
            ("last device", "left"),
            ("mean spread", "right"),
            ("max spread", "right"),
            ("waited, all", "right"),
        ],
        "spread: last arrival minus first at one point; waited: every device's wait, added up",
    )
    by_name: dict[str, list] = {}
    for p in b.points:
        by_name.setdefault(p.name, []).append(p)
    for name, pts in by_name.items():
        rank, n_rank = Counter(p.straggler_rank for p in pts).most_common(1)[0]
        dev, n_dev = Counter(p.straggler for p in pts).most_common(1)[0]
        table.add_row(
            name,
            f"{len(pts):,}",
            f"r{rank} ({n_rank:,})",
            f"{dev} ({n_dev:,})",
            ms(sum(p.spread_ms for p in pts) / len(pts)),
            ms(max(p.spread_ms for p in pts)),
            ms(sum(p.waited_ms for p in pts)),
        )
    return table


def rank_report(rt: RankTimeline, b: RankBalance, limit: int = 64) -> Group:
    """The ranks table, then the balance."""
    return Group(ranks_table(rt), Text(""), balance_group(b, limit))
