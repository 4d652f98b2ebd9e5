"""The balance across the ranks of a gather (`RankTimeline.balance`), times in ms on the root's clock:

- busy time per rank and device is `device_summary`'s (union of the activity intervals); a rank's busy time is
  its busiest device's, as a rank reaches the next collective when its slowest device does;
- at each collective point (the k-th `mark_collective` of one name on every rank), a device *arrives* when the
  work issued before the mark has finished AND its host has made the mark: ``max(mark time, last end of the
  device's activities issued before the mark)``; the last to arrive is the straggler, and every other device
  waits for it ``straggler's arrival - its own arrival``. Waits are known within the ranks' offset bounds;
- the spread of busy time (mean, imbalance, busiest) and the suggested re-split are `balance`'s arithmetic
  (`busy_spread`, `busy_split`), applied to ranks: each rank gets work in proportion to its throughput (units
  per busy ms).

Threads: any thread; nothing here talks to other ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, final

import numpy as np

from asyncgpu._analysis.balance import device_note
from asyncgpu._analysis.split import busy_split, busy_spread
from asyncgpu._analysis.summary import DeviceSummary, Plain
from asyncgpu._base.records import Timeline
from asyncgpu.ranks.wire import Marks

if TYPE_CHECKING:
    from asyncgpu.ranks.merge import RankInfo

__all__ = ["CollectivePoint", "RankBalance", "RankDeviceRow", "RankRow", "rank_balance"]


@final
@dataclass(frozen=True, slots=True)
class RankDeviceRow:
    """One device of one rank in a `RankBalance`. Times in ms."""

    device: str  #: merged name, ``r1/cuda:0``
    rank: int
    count: int  #: finished activities
    busy_ms: float
    utilisation: float | None  #: busy / the merged window
    wait_ms: float | None  #: waited for stragglers at the collective points, summed; None without points
    last_at: int  #: collective points where this device arrived last
    note: str
    launch_bound_ms: float | None  #: idle before its next activity had been issued (`asyncgpu.device_summary`)
    dependency_ms: float | None  #: idle with its next activity issued and not started


@final
@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank in a `RankBalance`. Times in ms."""

    rank: int
    host: str
    busy_ms: float  #: its busiest device's busy time
    busiest_device: str | None
    wait_ms: float | None  #: waited at the collective points (its last device's arrival), summed
    units: int  #: the work units given (1 each when none were)
    throughput: float | None  #: units per busy ms
    share: float  #: suggested fraction of all the units
    suggested_units: int | None  #: the share in whole units (when work units were given)
    note: str


@final
@dataclass(frozen=True, slots=True)
class CollectivePoint:
    """One collective point: the ``index``-th mark called ``name`` on every rank. Times in ms."""

    name: str
    index: int
    straggler: str  #: the device that arrived last (``r1/cuda:0``)
    straggler_rank: int
    arrival_ms: float  #: the straggler's arrival, from the merged scope start
    spread_ms: float  #: last arrival minus first arrival: the longest any device waited here
    waited_ms: float  #: every other device's wait for the straggler, added up


@final
@dataclass(frozen=True, slots=True)
class RankBalance(Plain):
    """How evenly the work was spread across ranks, and a re-split of it (see the module docstring). Make one
    with `RankTimeline.balance`."""

    label: str
    ranks: tuple[RankRow, ...]
    devices: tuple[RankDeviceRow, ...]
    points: tuple[CollectivePoint, ...]
    mean_busy_ms: float  #: over the ranks (each rank's busiest device)
    imbalance: float | None  #: max rank busy / mean rank busy (1.0: even); None without busy time
    device_imbalance: float | None  #: the same over every (rank, device)
    straggler_rank: int | None  #: the rank with the most busy time
    straggler_device: str | None  #: the (rank, device) with the most busy time
    units_given: bool
    total_units: int
    makespan_ms: float  #: the longest rank busy time now
    predicted_makespan_ms: float | None  #: with the suggested split
    wait_bound_ms: float  #: the largest rank clock bound: waits shorter than this are within the noise
    notes: tuple[str, ...]

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from asyncgpu.ranks.report import balance_group

        yield balance_group(self)


def rank_balance(
    tl: Timeline,
    ds: DeviceSummary,
    ranks: Sequence[RankInfo],
    marks: Marks,
    row_bounds: np.ndarray,
    device_bounds: np.ndarray,
    work_units: Any,
) -> RankBalance:
    """The balance of a merged timeline ``tl`` (``ds``: its `device_summary`): ``row_bounds`` and
    ``device_bounds`` delimit each rank's activities and devices; ``work_units`` as `RankTimeline.balance`."""
    world = len(ranks)
    dev_rank = np.repeat(np.arange(world), np.diff(device_bounds))
    busy = np.array([r.busy_ms for r in ds.rows])
    rank_busy, busiest = _rank_busy(tl, busy, device_bounds, world)
    arrivals, point_notes = _arrivals(tl, marks, row_bounds, dev_rank, world)
    points, dev_wait, last_at = _points(tl, arrivals, dev_rank)
    units = _rank_units(world, work_units)
    throughput, measured, share, amount, predicted = busy_split(units, rank_busy, integral=work_units is not None)
    per_rank, per_device = busy_spread(rank_busy), busy_spread(busy)
    straggler = per_rank.busiest
    have_points = bool(points)
    rank_wait = _rank_waits(arrivals, device_bounds, world) if have_points else None
    rows = tuple(
        RankRow(
            r,
            ranks[r].host,
            float(rank_busy[r]),
            busiest[r],
            None if rank_wait is None else float(rank_wait[r]),
            int(units[r]),
            float(throughput[r]) if measured[r] else None,
            float(share[r]),
            int(amount[r]) if work_units is not None else None,
            ", ".join(
                (["straggler"] if r == straggler else [])
                + (["no activity"] if rank_busy[r] == 0 else [])
                + ([f"scope raised {ranks[r].error}"] if ranks[r].error else [])
            ),
        )
        for r in range(world)
    )
    drow = tuple(
        RankDeviceRow(
            s.device,
            int(dev_rank[i]),
            s.count,
            s.busy_ms,
            s.utilisation,
            float(dev_wait[i]) if have_points and not math.isnan(dev_wait[i]) else None,
            int(last_at[i]),
            device_note(s, "busiest" if i == per_device.busiest else ""),
            s.launch_bound_ms,
            s.dependency_ms,
        )
        for i, s in enumerate(ds.rows)
    )
    bound_ms = max((r.bound_ns for r in ranks), default=0.0) / 1e6
    notes = list(point_notes)
    if have_points and bound_ms > 0:
        notes.append(f"waits are known within ±{bound_ms * 1e3:,.1f} µs (the largest rank clock bound)")
    unaligned = [r.device for r in ds.rows if not r.aligned]
    if unaligned:
        notes.append(f"not aligned to their host clock: {', '.join(unaligned)}; left out of the collective points")
    idle = [f"r{r}" for r in range(world) if rank_busy[r] == 0]
    if idle and measured.any():
        notes.append(f"no finished activity on {', '.join(idle)}: throughput unknown, the split leaves their units")
    return RankBalance(
        label=tl.label,
        ranks=rows,
        devices=drow,
        points=points,
        mean_busy_ms=per_rank.mean_ms,
        imbalance=per_rank.imbalance,
        device_imbalance=per_device.imbalance,
        straggler_rank=straggler,
        straggler_device=None if per_device.busiest is None else tl.devices[per_device.busiest],
        units_given=work_units is not None,
        total_units=int(units.sum()),
        makespan_ms=per_rank.max_ms,
        predicted_makespan_ms=predicted,
        wait_bound_ms=bound_ms,
        notes=tuple(notes),
    )


def _rank_busy(
    tl: Timeline, busy: np.ndarray, device_bounds: np.ndarray, world: int
) -> tuple[np.ndarray, list[str | None]]:
    """Per rank, the busy time of its busiest device (ms) and that device's name (None without busy time)."""
    rank_busy = np.zeros(world)
    busiest: list[str | None] = [None] * world
    for r in range(world):
        lo = int(device_bounds[r])
        top = busy_spread(busy[lo : int(device_bounds[r + 1])]).busiest
        if top is not None:
            rank_busy[r], busiest[r] = busy[lo + top], tl.devices[lo + top]
    return rank_busy, busiest


def _arrivals(
    tl: Timeline, mk: Marks, row_bounds: np.ndarray, dev_rank: np.ndarray, world: int
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Per mark name, arrivals ``[k, device]`` (root ns; NaN for a device left out) at its first ``K`` points,
    ``K`` = the fewest times any rank made that mark; and the notes on what was left out."""
    assert mk.rank is not None  # merged marks carry their rank
    nd = len(tl.devices)
    aligned = np.array([c.aligned for c in tl.clocks])
    counts = np.zeros((len(mk.names), world), np.int64)
    np.add.at(counts, (mk.name, mk.rank), 1)
    out: dict[str, np.ndarray] = {}
    notes = []
    prefix: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for d in range(nd):  # per device: its rows (issue order) and the running max of their ends
        r = int(dev_rank[d])
        lo, hi = int(row_bounds[r]), int(row_bounds[r + 1])
        idx = lo + np.flatnonzero(tl.device[lo:hi] == d)
        ends = tl.end_ns[idx]
        prefix[d] = idx, np.maximum.accumulate(np.where(np.isfinite(ends), ends, -np.inf)) if idx.size else ends
    for code, name in enumerate(mk.names):
        k_all = int(counts[code].min())
        if k_all < int(counts[code].max()):
            seen = ", ".join(f"r{r}: {int(counts[code, r])}" for r in range(world))
            notes.append(f"mark {name!r} was made a different number of times ({seen}): compared the first {k_all}")
        if k_all == 0:
            continue
        arr = np.full((k_all, nd), np.nan)
        for d in range(nd):
            if not aligned[d]:
                continue
            sel = np.flatnonzero((mk.name == code) & (mk.rank == dev_rank[d]))[:k_all]
            idx, pmax = prefix[d]
            before = np.searchsorted(idx, mk.row[sel], side="left")
            done = np.where(before > 0, pmax[np.maximum(before - 1, 0)] if idx.size else -np.inf, -np.inf)
            arr[:, d] = np.maximum(done, mk.ns[sel].astype(np.float64))
        out[name] = arr
    return out, notes


def _points(
    tl: Timeline, arrivals: dict[str, np.ndarray], dev_rank: np.ndarray
) -> tuple[tuple[CollectivePoint, ...], np.ndarray, np.ndarray]:
    """The collective points, and per device its summed wait (ms) and how often it arrived last."""
    nd = len(tl.devices)
    wait = np.zeros(nd)
    last_at = np.zeros(nd, np.int64)
    points = []
    t0 = tl.scope_start_ns
    for name, arr in arrivals.items():
        ok = ~np.isnan(arr)
        if not ok.any():
            continue
        latest = np.nanmax(arr, axis=1)
        straggler = np.nanargmax(arr, axis=1)
        w = np.where(ok, latest[:, None] - arr, 0.0)
        wait += w.sum(axis=0)
        np.add.at(last_at, straggler, 1)
        spread = latest - np.nanmin(arr, axis=1)
        for k in range(arr.shape[0]):
            s = int(straggler[k])
            points.append(
                CollectivePoint(
                    name,
                    k,
                    tl.devices[s],
                    int(dev_rank[s]),
                    float(latest[k] - t0) / 1e6,
                    float(spread[k]) / 1e6,
                    float(w[k].sum()) / 1e6,
                )
            )
    return tuple(points), wait / 1e6, last_at


def _rank_waits(arrivals: dict[str, np.ndarray], device_bounds: np.ndarray, world: int) -> np.ndarray:
    """Per rank, summed over the points: the latest arrival minus the rank's own (its last device's), ms."""
    out = np.zeros(world)
    for arr in arrivals.values():
        per_rank = np.full((arr.shape[0], world), np.nan)
        for r in range(world):
            cols = arr[:, int(device_bounds[r]) : int(device_bounds[r + 1])]
            if cols.size and (~np.isnan(cols)).any():
                per_rank[:, r] = np.nanmax(cols, axis=1)
        if (~np.isnan(per_rank)).any():
            out += np.nan_to_num(np.nanmax(per_rank, axis=1)[:, None] - per_rank).sum(axis=0)
    return out / 1e6


def _rank_units(world: int, work_units: Any) -> np.ndarray:
    if work_units is None:
        return np.ones(world)
    if isinstance(work_units, dict):
        unknown = [k for k in work_units if k not in range(world)]
        missing = [r for r in range(world) if r not in work_units]
        if unknown or missing:
            raise ValueError(
                f"work_units must have one entry per rank 0..{world - 1}"
                + (f"; not ranks: {unknown}" if unknown else "")
                + (f"; missing: {missing}" if missing else "")
            )
        values = [work_units[r] for r in range(world)]
    else:
        values = list(work_units)
        if len(values) != world:
            raise ValueError(
                f"work_units has {len(values)} values for {world} ranks: give one per rank, in rank "
                "order, or a dict {rank: units}"
            )
    units = np.asarray(values, np.float64)
    bad = [f"rank {r}={v!r}" for r, (v, u) in enumerate(zip(values, units)) if not (u >= 0 and u == int(u))]
    if bad:
        raise ValueError(f"work units must be whole numbers ≥ 0 (items, batches, rows), not {', '.join(bad)}")
    return units
