"""Summaries of a `Timeline`: per activity, per device, and the balance of the work across devices (what bounded
the scope's wall makespan, and a re-split of the work).

Every figure is computed with numpy over whole columns (no Python loop per activity; loops run per device or
per activity name). Times are in ms; starts and ends are relative to the scope's start.

The window: every device is measured over the same stretch of host time, from the scope's start to the later
of the scope's end and the last end of any activity (of the aligned devices). A device whose clock is not
aligned (`DeviceClock.aligned` False) has times relative to its own start mark; its window ends at the later of
that end and its own last end, so its times never stretch the others' window. Activities that start before the
scope's start (clock placement error) count from the scope's start.

Busy time is the length of the union of a device's activity intervals: work overlapping on several streams is
counted once. Idle time is the window minus busy time, and it is made of the gaps: the stretch before the first
activity, the stretches between activities, and the stretch after the last one. ``largest_gap_ms`` is the
longest of those, the leading and trailing stretches included.

What a device waited for, from the activities' issue times (`Timeline.issued_ns`: when the host had issued
each one): each stretch before a busy block (the leading one included) is split at the issue time of the
block's first activity. Before it the device was *launch-bound*: nothing had been issued to it yet, the host's
time. After it the activity was issued and had not started: *dependency* time, which holds stream waits on other
devices' events, handoffs, and the launch latency. The stretch after the last activity is neither (the device
was done). A device whose clock is not aligned has no such split (its times are not host times).

Unfinished activities (NaN times: the scope was cancelled before the device finished them) are counted apart
and left out of every time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any, NamedTuple, final

import numpy as np

from asyncgpu._base.records import KINDS, Timeline

__all__ = [
    "HOST",
    "ActivityStats",
    "ActivitySummary",
    "BalanceReport",
    "BusySplit",
    "BusySpread",
    "DeviceBalance",
    "DeviceStats",
    "DeviceSummary",
    "Plain",
    "StepSplit",
    "activity_summary",
    "balance",
    "bar",
    "busy_split",
    "busy_spread",
    "device_note",
    "device_summary",
    "ms",
    "step_split",
    "suggest_split",
]


class Plain:
    """``to_dict`` / ``to_json`` for the frozen result dataclasses (also those of `asyncgpu.ranks`)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain types (dict, list, str, int, float, bool, None), ready for `json.dumps`."""
        return _plain(dataclasses.asdict(self))  # type: ignore[call-overload]

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# -- per activity -------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class ActivityStats:
    """One activity name and kind. Times over its finished activities, in ms; None when none finished."""

    name: str
    kind: str
    count: int  #: finished activities
    unfinished: int  #: activities the device had not finished when the scope ended (in no time below)
    total_ms: float
    mean_ms: float | None
    min_ms: float | None
    max_ms: float | None


@final
@dataclass(frozen=True, slots=True)
class ActivitySummary(Plain):
    """Per activity name and kind, longest total first. Make one with `activity_summary`."""

    label: str
    rows: tuple[ActivityStats, ...]
    count: int  #: finished activities, all names
    unfinished: int
    total_ms: float  #: sum of the durations of the finished activities


def activity_summary(tl: Timeline) -> ActivitySummary:
    """Count, total, mean, min and max duration (ms) per activity name and kind, sorted by total, longest first
    (ties in the order the names first appeared). ``tl``: a `Timeline` (or a finished `Timer`)."""
    tl = _timeline(tl, "activity_summary")
    done = _finished(tl)
    nk = len(KINDS)
    size = len(tl.names) * nk
    key = tl.name.astype(np.int64) * nk + tl.kind
    key_done = key[done]
    dur = tl.duration_ns[done]
    count = np.bincount(key_done, minlength=size)
    pending = np.bincount(key[~done], minlength=size)
    total = np.bincount(key_done, weights=dur, minlength=size)
    lo = np.full(size, np.inf)
    hi = np.full(size, -np.inf)
    np.minimum.at(lo, key_done, dur)
    np.maximum.at(hi, key_done, dur)
    groups = np.flatnonzero(count + pending)
    groups = groups[np.lexsort((groups, -total[groups]))]
    rows = []
    for g in groups.tolist():
        n = int(count[g])
        t = float(total[g]) / 1e6
        rows.append(
            ActivityStats(
                tl.names[g // nk],
                KINDS[g % nk],
                n,
                int(pending[g]),
                t,
                t / n if n else None,
                float(lo[g]) / 1e6 if n else None,
                float(hi[g]) / 1e6 if n else None,
            )
        )
    return ActivitySummary(tl.label, tuple(rows), int(done.sum()), int(len(tl) - done.sum()), float(dur.sum()) / 1e6)


# -- per device ---------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class DeviceStats:
    """One device over the window (see the module's docstring). Times in ms."""

    device: str
    aligned: bool  #: False: this device's times are relative to its own start mark, not host time
    count: int  #: finished activities
    unfinished: int
    busy_ms: float  #: length of the union of the activity intervals (overlaps counted once)
    sum_ms: float  #: plain sum of the durations (overlapping work counted once per activity)
    idle_ms: float  #: window minus busy
    largest_gap_ms: float  #: longest stretch of the window with no activity, leading and trailing ones included
    utilisation: float | None  #: busy / window, 0..1; None for an empty window
    first_start_ms: float | None  #: from the scope's start; None without a finished activity
    last_end_ms: float | None
    window_ms: float
    note: str  #: why the clock is not aligned, if it is not
    launch_bound_ms: float | None  #: idle because its next activity had not been issued yet; None: not known
    dependency_ms: float | None  #: idle with its next activity issued and not started; None: not known
    first_issued_ms: float | None  #: from the scope's start, over its finished activities with an issue time
    last_issued_ms: float | None
    issued: int  #: finished activities with an issue time


@final
@dataclass(frozen=True, slots=True)
class DeviceSummary(Plain):
    """Every device of the timeline, in its order, including devices with no activity. Make one with
    `device_summary`."""

    label: str
    window_ms: float  #: scope start to the later of scope end and the last end on an aligned device
    rows: tuple[DeviceStats, ...]
    error: str | None  #: what the scope's body raised, if anything


def device_summary(tl: Timeline) -> DeviceSummary:
    """Busy time (union of intervals), idle time and what it waited for (launch-bound, dependency), largest gap,
    utilisation, first start, last end and issue times per device (ms), over the window described in the
    module's docstring. ``tl``: a `Timeline` (or a finished `Timer`)."""
    tl = _timeline(tl, "device_summary")
    done = _finished(tl)
    nd = len(tl.devices)
    dev = tl.device[done]
    rel_start = tl.start_ns[done] - tl.scope_start_ns
    rel_end = np.maximum(tl.end_ns[done] - tl.scope_start_ns, rel_start)
    rel_issued = tl.issued_ns[done] - tl.scope_start_ns
    count = np.bincount(dev, minlength=nd)
    pending = np.bincount(tl.device[~done], minlength=nd)
    sums = np.bincount(dev, weights=tl.duration_ns[done], minlength=nd)
    last = np.full(nd, -np.inf)
    np.maximum.at(last, dev, rel_end)
    aligned = [_clock(tl, i)[0] for i in range(nd)]
    scope_ns = float(tl.scope_end_ns - tl.scope_start_ns)
    window_ns = max([scope_ns] + [float(last[i]) for i in range(nd) if aligned[i] and count[i]])
    by_dev = np.argsort(dev, kind="stable") if nd > 1 else np.arange(len(dev))
    bounds = np.concatenate(([0], np.cumsum(count)))
    rows = []
    for i, name in enumerate(tl.devices):
        idx = by_dev[bounds[i] : bounds[i + 1]]
        w = window_ns if aligned[i] or not count[i] else max(window_ns, float(last[i]))
        issued = rel_issued[idx] if aligned[i] else None  # (an unaligned device's times are not host times)
        g = _union(rel_start[idx], rel_end[idx], w, issued)
        known = np.zeros(0) if issued is None else issued[np.isfinite(issued)]
        ok, reason = _clock(tl, i)
        rows.append(
            DeviceStats(
                name,
                ok,
                int(count[i]),
                int(pending[i]),
                g.busy / 1e6,
                float(sums[i]) / 1e6,
                (w - g.busy) / 1e6,
                g.largest / 1e6,
                g.busy / w if w > 0 else None,
                _ms(g.first),
                _ms(g.last),
                w / 1e6,
                reason,
                _ms(g.launch_bound),
                _ms(g.dependency),
                float(known.min()) / 1e6 if known.size else None,
                float(known.max()) / 1e6 if known.size else None,
                int(known.size),
            )
        )
    return DeviceSummary(tl.label, window_ns / 1e6, tuple(rows), tl.error)


class _Gaps(NamedTuple):
    """`_union`'s answer, in ns (None: not known)."""

    busy: float
    largest: float
    first: float | None
    last: float | None
    launch_bound: float | None
    dependency: float | None


def _union(start: np.ndarray, end: np.ndarray, window: float, issued: np.ndarray | None = None) -> _Gaps:
    """Busy time, largest gap, first start and last end of intervals in ns from the window's start, over
    ``[0, window]``: sort by start, carry the furthest end so far; a start beyond it opens a new busy block.
    ``issued`` (per interval, ns from the window's start) splits each gap before a block (the leading one
    included) at the issue time of the block's first activity: launch-bound before it, dependency after it;
    a gap whose activity has no issue time is in neither. None: not known."""
    if start.size == 0:
        return _Gaps(0.0, window, None, None, None, None)
    order = np.argsort(start, kind="stable")
    lo = np.maximum(start[order], 0.0)
    reach = np.maximum(np.maximum.accumulate(end[order]), 0.0)
    opens = np.concatenate(([0], np.flatnonzero(lo[1:] > reach[:-1]) + 1))
    block_lo = lo[opens]
    block_hi = reach[np.append(opens[1:] - 1, -1)]
    gap_lo = np.concatenate(([0.0], block_hi[:-1]))
    gaps = block_lo - gap_lo
    host = waiting = None
    if issued is not None:
        at = issued[order[opens]]
        known = np.isfinite(at)
        if known.any():
            before = np.clip(at[known] - gap_lo[known], 0.0, gaps[known])
            host, waiting = float(before.sum()), float((gaps[known] - before).sum())
    largest = float(max(gaps.max(), window - block_hi[-1]))
    return _Gaps(float((block_hi - block_lo).sum()), largest, float(lo[0]), float(block_hi[-1]), host, waiting)


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


# -- balance ------------------------------------------------------------------------------------------------
HOST = "host"  #: `BalanceReport.straggler` when the host bounds the makespan
_REMEDY = (
    "launch each device's work from a thread of its own (its worker: await device.run(step)), capture repeated "
    "steps as CUDA graphs (asyncgpu.Graph), or launch fewer and larger kernels"
)


@final
@dataclass(frozen=True, slots=True)
class DeviceBalance:
    """One device in a `BalanceReport`. Times in ms, from the scope's start unless said otherwise."""

    device: str
    busy_ms: float
    last_end_ms: float | None
    wait_ms: float | None  #: the last device's last end minus this one's (≥ 0); None: no activity, not comparable
    units: int  #: the work units given (1 each when none were)
    throughput: float | None  #: units per busy ms; None without busy time or without units
    share: float  #: suggested fraction of all the units
    suggested_units: int | None  #: the share in whole units (when work units were given)
    note: str
    first_start_ms: float | None
    start_offset_ms: float | None  #: first start minus the earliest first start of the devices
    launch_bound_ms: float | None  #: idle before its next activity had been issued (`DeviceStats`)
    dependency_ms: float | None  #: idle with its next activity issued and not started (`DeviceStats`)
    issue_rate: float | None  #: activities the host issued per ms, between its first and last issue
    predicted_end_ms: float | None  #: wall end with the suggested split; None: no work, or no model


@final
@dataclass(frozen=True, slots=True)
class BalanceReport(Plain):
    """What bounded the scope's wall makespan, how evenly the work was spread, and a re-split of it. Make one
    with `balance`; ``rich.print`` it for the table and the verdict.

    The critical path: the device that ends last, its time from the scope's start to its last end split into
    busy time (the device), launch-bound time (the host had not issued its next work yet) and dependency time
    (issued, not started: waits on other devices or events, handoffs, launch latency). The straggler is the host
    when that path is mostly host time, or when the device ends last because its work came later, not because
    it had more; then the verdict says so and names what would help, and the split is left as it is.

    The model of the re-split: device i ends at ``start_i + shift_i + units_i / rate_i``: ``start_i`` its first
    start, ``rate_i`` its units per ms from its first start to its last end (busy time and the gaps inside,
    launch-bound ones included). ``shift_i`` models a host that issued the devices one after another: where
    device j's issuing ended before device i's began, i starts later by j's extra units over j's issue rate. The
    suggested split makes the devices that get work end together (a device whose start comes after that gets
    none). Without aligned clocks the model is busy time alone: units in proportion to units per busy ms.
    """

    label: str
    rows: tuple[DeviceBalance, ...]
    verdict: str  #: what bounded the makespan, in words
    straggler: str | None  #: what bounds the wall makespan: a device, or ``"host"``; None without activity
    critical_device: str | None  #: the device whose last end is the makespan; None when not comparable
    critical_path: dict[str, float]  #: ms of the makespan: ``{device: busy, "host", "dependency", "unknown"}``
    makespan_ms: float  #: wall: scope start to the last end (the longest busy time when clocks are not aligned)
    predicted_makespan_ms: float | None  #: the same with the suggested split
    busy_makespan_ms: float  #: the longest busy time now
    predicted_busy_ms: float | None  #: the longest busy time with the suggested split
    mean_busy_ms: float  #: over every device of the timeline
    imbalance: float | None  #: max busy / mean busy (1.0: even); None without busy time
    comparable: bool  #: every clock is aligned to the host, so wall times compare across devices
    units_given: bool  #: False: one unit per device was assumed
    total_units: int
    notes: tuple[str, ...]

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        """The table (columns left out, least needed first, where the console is too narrow) and the verdict."""
        yield from _render(self, options.max_width)


def balance(source: Timeline | DeviceSummary, work_units: Any = None) -> BalanceReport:
    """What bounded the wall makespan (a device, the host, dependencies), and a split of the work that the model
    in `BalanceReport` predicts ends soonest. ``work_units``: per device (a dict keyed by device or device name,
    or a sequence in the timeline's device order) the whole units of work it got (items, batches, rows); default
    one unit each, and the suggestion is then in fractions only. Devices without busy time keep their units.
    ``source`` may be a `DeviceSummary` already made from the timeline (or a finished `Timer`)."""
    ds = source if isinstance(source, DeviceSummary) else device_summary(_timeline(source, "balance"))
    rows = ds.rows
    units = _work_units([r.device for r in rows], work_units)
    integral = work_units is not None
    busy = np.array([r.busy_ms for r in rows])
    spread = busy_spread(busy)
    fit = busy_split(units, busy, integral)
    active = [r.count > 0 and r.last_end_ms is not None for r in rows]
    if any(active) and all(r.aligned for r, a in zip(rows, active) if a):
        wall = _wall(rows, units, fit, integral)
    else:
        wall = _busy_only(rows, units, fit)
    amount = wall.amount
    share = amount / units.sum() if units.sum() > 0 else np.zeros_like(units)
    m = fit.measured
    out = [
        DeviceBalance(
            r.device,
            r.busy_ms,
            r.last_end_ms,
            _wait(rows, i, wall.reference),
            int(units[i]),
            float(fit.throughput[i]) if fit.measured[i] else None,
            float(share[i]),
            int(amount[i]) if integral else None,
            device_note(r, ("ends last" if wall.straggler == HOST else "straggler") if i == wall.reference else ""),
            r.first_start_ms,
            wall.offsets[i],
            r.launch_bound_ms,
            r.dependency_ms,
            _issue_rate(r),
            wall.ends[i],
        )
        for i, r in enumerate(rows)
    ]
    return BalanceReport(
        ds.label,
        tuple(out),
        wall.verdict,
        wall.straggler,
        wall.critical,
        wall.path,
        wall.makespan_ms,
        wall.predicted_ms,
        spread.max_ms,
        float((amount[m] / fit.throughput[m]).max()) if m.any() else None,
        spread.mean_ms,
        spread.imbalance,
        all(r.aligned for r in rows),
        integral,
        int(units.sum()),
        _notes(ds, fit.measured, all(r.aligned for r in rows)) + wall.notes,
    )


def _issue_rate(r: DeviceStats) -> float | None:
    """Activities the host issued to the device per ms, between its first and last issue."""
    first, last = r.first_issued_ms, r.last_issued_ms
    return (r.issued - 1) / (last - first) if first is not None and last is not None and last > first else None


class BusySpread(NamedTuple):
    """`busy_spread`'s answer."""

    mean_ms: float  #: the mean busy time (0.0 for none)
    max_ms: float  #: the longest busy time (0.0 for none)
    imbalance: float | None  #: max / mean (1.0: even); None without busy time
    busiest: int | None  #: the index of the longest busy time (the first of equal ones); None without busy time


def busy_spread(busy_ms: np.ndarray) -> BusySpread:
    """How evenly busy time is spread over devices (or ranks): `balance`'s imbalance and busiest device, and the
    ones `asyncgpu.ranks` reports across ranks and across every (rank, device)."""
    mean = float(busy_ms.mean()) if busy_ms.size else 0.0
    top = float(busy_ms.max()) if busy_ms.size else 0.0
    return BusySpread(mean, top, top / mean if mean > 0 else None, int(busy_ms.argmax()) if busy_ms.any() else None)


class BusySplit(NamedTuple):
    """`busy_split`'s answer, per device (or rank)."""

    throughput: np.ndarray  #: units per busy ms (0 where not measured)
    measured: np.ndarray  #: has both busy time and units
    share: np.ndarray  #: suggested fraction of all the units
    amount: np.ndarray  #: suggested units (whole when integral)
    predicted_ms: float | None  #: the longest busy time with ``amount``; None: nothing measured


def busy_split(units: np.ndarray, busy_ms: np.ndarray, integral: bool) -> BusySplit:
    """The split of ``units`` in proportion to units per busy ms, which ends every busy time together; devices
    (or ranks) without busy time or units keep theirs. The busy-time model `balance` falls back to, and the one
    `asyncgpu.ranks` uses across ranks."""
    measured = (busy_ms > 0) & (units > 0)
    throughput = np.where(measured, units / np.where(busy_ms > 0, busy_ms, 1.0), 0.0)
    share, amount = suggest_split(units, throughput, measured, integral)
    predicted = float((amount[measured] / throughput[measured]).max()) if throughput.any() else None
    return BusySplit(throughput, measured, share, amount, predicted)


def suggest_split(
    units: np.ndarray, throughput: np.ndarray, measured: np.ndarray, integral: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(share, amount)``: devices without a throughput keep their units; the rest of the units are split in
    proportion to throughput (whole units by largest remainder when ``integral``)."""
    total = units.sum()
    amount = units.copy()
    if throughput.any():
        rest = total - units[~measured].sum()
        quota = rest * throughput[measured] / throughput[measured].sum()
        amount[measured] = _whole(quota, rest) if integral else quota
    return (amount / total if total > 0 else np.zeros_like(units)), amount


def _whole(quota: np.ndarray, total: float) -> np.ndarray:
    """``quota`` in whole numbers that add up to ``total``: floors, then one more for the largest remainders."""
    whole = np.floor(quota)
    order = np.argsort(-(quota - whole), kind="stable")
    whole[order[: round(total - whole.sum())]] += 1
    return whole


def _work_units(names: list[str], work_units: Any) -> np.ndarray:
    if work_units is None:
        return np.ones(len(names))
    if isinstance(work_units, Mapping):
        given = {getattr(k, "name", k): v for k, v in work_units.items()}
        unknown = [str(k) for k in given if k not in names]
        if unknown:
            raise ValueError(
                f"work_units names {', '.join(unknown)}, not in this timeline: use some of {', '.join(names)}"
            )
        missing = [n for n in names if n not in given]
        if missing:
            raise ValueError(
                f"work_units has no entry for {', '.join(missing)}: give every device of the timeline "
                "(0 for a device that got no work)"
            )
        values = [given[n] for n in names]
    elif isinstance(work_units, (str, bytes)) or not isinstance(work_units, Iterable):
        raise TypeError(
            f"work_units is a dict {{device: units}} or one count per device in the timeline's order "
            f"({', '.join(names)}), not {work_units!r}"
        )
    else:
        values = list(work_units)
        if len(values) != len(names):
            raise ValueError(
                f"work_units has {len(values)} values for {len(names)} devices ({', '.join(names)}): "
                "give one per device in that order, or a dict {device: units}"
            )
    bad = [f"{n}={v!r}" for n, v in zip(names, values) if not _whole_units(v)]
    if bad:
        raise ValueError(
            f"work units must be whole numbers from 0 to 2**53 (items, batches, rows), not {', '.join(bad)}"
        )
    return np.asarray(values, dtype=np.float64)


def _whole_units(v: Any) -> bool:
    """A count of work units: a real number (not a string or a bool), whole, 0 .. 2**53 (exact in float64)."""
    if isinstance(v, bool) or not isinstance(v, Real):
        return False
    x = float(v)
    return math.isfinite(x) and 0 <= x <= 2**53 and x == int(x)


class _Wall(NamedTuple):
    """The balance's model part (wall times or, without aligned clocks, busy times alone)."""

    amount: np.ndarray  #: suggested units per device
    offsets: list[float | None]  #: first start minus the earliest one (ms)
    ends: list[float | None]  #: predicted wall ends (ms)
    reference: int | None  #: the device the others' waits are measured to
    critical: str | None
    straggler: str | None
    path: dict[str, float]
    makespan_ms: float
    predicted_ms: float | None
    verdict: str
    notes: tuple[str, ...]


def _busy_only(rows: tuple[DeviceStats, ...], units: np.ndarray, fit: BusySplit) -> _Wall:
    """Without aligned clocks: the busiest device, and the busy-time split."""
    busy = np.array([r.busy_ms for r in rows])
    spread = busy_spread(busy)
    ref = spread.busiest
    none: list[float | None] = [None] * len(rows)
    if ref is None:
        return _Wall(fit.amount, none, none, None, None, None, {}, 0.0, None, "no device has busy time", ())
    verdict = (
        f"{rows[ref].device} has the most busy time ({_short(busy[ref])} ms); the clocks are not all aligned to "
        "the host, so wall times are not compared and the split is by busy time"
    )
    return _Wall(fit.amount, none, none, ref, None, rows[ref].device, {}, spread.max_ms, fit.predicted_ms, verdict, ())


def _wall(rows: tuple[DeviceStats, ...], units: np.ndarray, fit: BusySplit, integral: bool) -> _Wall:
    """The critical path, the straggler and the wall-model split (see `BalanceReport`)."""
    model = _Model(rows, units, fit.measured)
    act = np.flatnonzero(model.active)
    c = int(act[np.nanargmax(model.end[act])])
    makespan = float(model.end[c])
    offsets = [float(model.start[i] - np.nanmin(model.start)) if model.active[i] else None for i in range(len(rows))]
    others = [int(j) for j in act if j != c]
    runner = max(others, key=lambda j: model.end[j]) if others else None
    bound = _bound(rows, c, runner, makespan)
    path = {rows[c].device: rows[c].busy_ms}
    host, dependency = rows[c].launch_bound_ms, rows[c].dependency_ms
    if host is not None and dependency is not None:
        path[HOST], path["dependency"] = host, dependency
    if makespan - sum(path.values()) > 1e-6:  # (a ns)
        path["unknown"] = makespan - sum(path.values())
    notes: list[str] = []
    amount = units.copy()
    if bound:
        notes.append("not re-split: the host bounds the makespan (a re-split moves host work, it does not remove it)")
    else:
        amount = model.split(integral)
        ends = model.ends(amount)
        if np.isfinite(ends).any() and np.nanmax(ends) > makespan + 1e-9:  # (rounding, or a model not settled)
            amount = units.copy()
    ends = model.ends(amount)
    predicted = float(np.nanmax(ends)) if np.isfinite(ends).any() else None
    idle = [rows[i].device for i in act if model.measured[i] and amount[i] == 0 and units[i] > 0]
    if idle:
        notes.append(f"the suggested split gives {_names(idle)} no work: it starts after the others would end")
    if all(r.launch_bound_ms is None for r in rows):
        notes.append(
            "no issue times (Timeline.issued_ns is NaN: synthetic data, or a trace of an older asyncgpu): idle "
            "time is not split into launch-bound and dependency, and the model keeps each device's start as measured"
        )
    verdict = _verdict(rows, model, c, runner, bound, makespan, offsets, predicted)
    return _Wall(
        amount,
        offsets,
        [None if not np.isfinite(e) else float(e) for e in ends],
        c,
        rows[c].device,
        HOST if bound else rows[c].device,
        path,
        makespan,
        predicted,
        verdict,
        tuple(notes),
    )


class _Model:
    """The wall model of `BalanceReport`, over the devices with activity (ms from the scope's start)."""

    def __init__(self, rows: tuple[DeviceStats, ...], units: np.ndarray, measured: np.ndarray) -> None:
        def column(values: Iterable[float | None]) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in values], np.float64)

        self.units = units
        self.active = np.array([r.count > 0 and r.last_end_ms is not None for r in rows])
        self.start = column(r.first_start_ms if a else None for r, a in zip(rows, self.active))
        self.end = column(r.last_end_ms if a else None for r, a in zip(rows, self.active))
        span = np.nan_to_num(self.end - self.start)
        self.measured = measured & (span > 0)
        self.rate = np.where(self.measured, units / np.where(span > 0, span, 1.0), 0.0)  # units per active ms
        first = column(r.first_issued_ms for r in rows)
        last = column(r.last_issued_ms for r in rows)
        k = np.array([r.issued for r in rows])
        issue_ms = np.where(k > 1, np.nan_to_num(last - first) * k / np.maximum(k - 1, 1), 0.0)
        self.issue_per_unit = np.where(self.measured, issue_ms / np.where(units > 0, units, 1.0), 0.0)
        with np.errstate(invalid="ignore"):  # (NaN: no issue times, never before)
            self.before = (last[None, :] <= first[:, None]) & ~np.eye(len(rows), dtype=bool)  # [i, j]: j's first

    def ends(self, amount: np.ndarray) -> np.ndarray:
        """Each device's wall end with ``amount`` units (NaN: no activity, or no units given to it)."""
        start = self.start + self.before @ ((amount - self.units) * self.issue_per_unit)
        out = np.where(self.measured, start + amount / np.where(self.rate > 0, self.rate, 1.0), self.end)
        out[self.measured & (amount <= 0)] = np.nan
        return out

    def split(self, integral: bool) -> np.ndarray:
        """The units that end the measured devices together: water-filling over their starts, which depend on
        the split where the host issued the devices one after another (a damped fixed point)."""
        m = self.measured
        total = float(self.units[m].sum())
        u = self.units.astype(np.float64)
        if not m.any():
            return u
        for _ in range(200):
            start = self.start + self.before @ ((u - self.units) * self.issue_per_unit)
            new = u.copy()
            new[m] = _water_fill(start[m], self.rate[m], total)
            settled = np.abs(new - u).max(initial=0.0) <= 1e-12 * max(total, 1.0)
            u = new if settled else (u + new) / 2
            if settled:
                break
        if integral:
            u[m] = _whole(u[m], total)
        return u


def _water_fill(start: np.ndarray, rate: np.ndarray, total: float) -> np.ndarray:
    """Units per device so that every device that gets some ends at one level: ``(level - start) * rate``, the
    level where they add up to ``total`` (a device starting at or after the level gets none)."""
    order = np.argsort(start, kind="stable")
    s, r = start[order], rate[order]
    level = (total + np.cumsum(r * s)) / np.cumsum(r)  # the level if the first k + 1 devices take part
    k = int(np.argmax(level <= np.append(s[1:], np.inf)))
    out = np.zeros_like(start)
    out[order] = np.maximum(level[k] - s, 0.0) * r
    return out


def _bound(rows: tuple[DeviceStats, ...], c: int, runner: int | None, makespan: float) -> str:
    """Why the host bounds the makespan: ``"launch"`` (the critical device's path is mostly launch-bound),
    ``"stagger"`` (it ends last because its work came later, by at least a tenth of the makespan, rather than
    because it had more), or ``""`` (it does not)."""
    host = rows[c].launch_bound_ms
    if host is None or makespan <= 0:
        return ""
    if host >= 0.5 * makespan:
        return "launch"
    if runner is None or rows[runner].launch_bound_ms is None:
        return ""
    lead = host - rows[runner].launch_bound_ms  # type: ignore[operator]  # (checked above)
    return "stagger" if lead > max(rows[c].busy_ms - rows[runner].busy_ms, 0.0) and lead >= 0.1 * makespan else ""


def _verdict(
    rows: tuple[DeviceStats, ...],
    model: _Model,
    c: int,
    runner: int | None,
    bound: str,
    makespan: float,
    offsets: list[float | None],
    predicted: float | None,
) -> str:
    r = rows[c]
    act = [int(i) for i in np.flatnonzero(model.active)]
    spread = max(o for o in offsets if o is not None)
    stagger = ""
    if len(act) > 1 and spread >= 0.05 * makespan and spread > 0:
        by_issue = sorted(act, key=lambda i: rows[i].first_issued_ms or 0.0)
        serial = all(
            rows[a].last_issued_ms is not None
            and rows[b].first_issued_ms is not None
            and rows[a].last_issued_ms <= rows[b].first_issued_ms  # type: ignore[operator]
            for a, b in zip(by_issue, by_issue[1:])
        )
        names = _names([rows[i].device for i in by_issue])
        how = (
            f"the host issued work for {names} one after another"
            if serial
            else "the devices' work came at different times"
        )
        starts = ", ".join(_short(offsets[i] or 0.0) for i in sorted(act, key=lambda i: offsets[i] or 0.0))
        stagger = f"{how}, and the devices started {starts} ms apart"
    if bound == "launch":
        text = (
            f"the host bounds the makespan: {r.device} was idle {_short(r.launch_bound_ms or 0.0)} ms of its "
            f"{_short(makespan)} ms because its next work had not been issued yet (launch-bound)"
        )
        return text + (f"; {stagger}" if stagger else "") + f". A re-split would not help: {_REMEDY}."
    if bound == "stagger":
        j = rows[runner]  # type: ignore[index]  # (a stagger needs a runner-up)
        lead = (r.launch_bound_ms or 0.0) - (j.launch_bound_ms or 0.0)
        return (
            f"the host's stagger bounds the makespan: {stagger or 'the devices started at different times'}; "
            f"{r.device} ends last because its work came {_short(lead)} ms later than {j.device}'s, not because "
            f"it had more (busy {_short(r.busy_ms)} ms, {j.device} {_short(j.busy_ms)} ms). A re-split would not "
            f"help: {_REMEDY}."
        )
    text = f"{r.device} bounds the makespan: busy {_short(r.busy_ms)} ms of its {_short(makespan)} ms"
    if r.dependency_ms is not None and r.dependency_ms >= 0.25 * makespan:
        text += (
            f", {_short(r.dependency_ms)} ms with its work issued and not started (waits on other devices or "
            "events, handoffs, launch latency)"
        )
    if stagger:
        text += f"; {stagger} (the model keeps that)"
    if predicted is not None and predicted < makespan * (1 - 1e-9):
        text += f"; the suggested split predicts {_short(predicted)} ms"
    return text + "."


def _names(names: list[str]) -> str:
    """``cuda:0..3`` for numbered names in a run, ``a and b`` for two, else a list."""
    parts = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if len(names) > 2 and all(parts) and len({p.group(1) for p in parts if p}) == 1:
        nums = [int(p.group(2)) for p in parts if p]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            return f"{names[0][: -len(str(nums[0]))]}{nums[0]}..{nums[-1]}"
    return " and ".join(names) if len(names) == 2 else ", ".join(names)


def _short(value: float) -> str:
    """ms in words: 0, 0.123, 2.35, 21.4, 1,234."""
    a = abs(value)
    if a == 0:
        return "0"
    return f"{value:,.{0 if a >= 100 else 1 if a >= 10 else 2 if a >= 0.1 else 3}f}"


def _wait(rows: tuple[DeviceStats, ...], i: int, ref: int | None) -> float | None:
    """The reference device's last end minus device ``i``'s (≥ 0); None without activity, or across unaligned
    clocks."""
    if ref is None or rows[i].last_end_ms is None:
        return None
    if i != ref and not (rows[i].aligned and rows[ref].aligned):
        return None
    return max(0.0, rows[ref].last_end_ms - rows[i].last_end_ms)  # type: ignore[operator]


def device_note(r: DeviceStats, role: str = "") -> str:
    """A device row's note: its ``role`` in the balance (``straggler``, ``ends last``, ``busiest``; none when
    empty), then ``no activity`` and ``clock not aligned`` where they hold (in `balance` and `asyncgpu.ranks`)."""
    parts = [role] if role else []
    if r.busy_ms == 0:
        parts.append("no activity")
    if not r.aligned:
        parts.append("clock not aligned")
    return ", ".join(parts)


def _notes(ds: DeviceSummary, measured: np.ndarray, comparable: bool) -> tuple[str, ...]:
    notes = []
    if not comparable:
        off = ", ".join(f"{r.device} ({r.note})" if r.note else r.device for r in ds.rows if not r.aligned)
        notes.append(
            f"not aligned to the host clock: {off}; wait times across devices are not comparable (busy times are)"
        )
    idle = [r.device for r in ds.rows if r.busy_ms == 0]
    if idle and measured.any():
        notes.append(
            f"no finished activity on {', '.join(idle)}: throughput unknown, the split leaves their units as they are"
        )
    if not measured.any():
        notes.append("no device has both busy time and work units: no split to suggest")
    unfinished = sum(r.unfinished for r in ds.rows)
    if unfinished:
        notes.append(f"{unfinished} unfinished {'activity is' if unfinished == 1 else 'activities are'} not counted")
    if ds.error:
        notes.append(f"the scope raised {ds.error} (the figures cover the work enqueued before it)")
    return tuple(notes)


# -- the balance, drawn -------------------------------------------------------------------------------------
_BAR_WIDTH = 20
_EIGHTHS = " ▏▎▍▌▋▊▉"
_CAPTIONS = (
    ("launch-bound", "launch-bound: idle before its next work was issued"),
    ("dependency", "dependency: idle with it issued and not started"),
    ("wait", "wait: until the last device's end"),
    ("predicted end", "predicted end: with the suggested split"),
)


def _render(b: BalanceReport, max_width: int) -> Iterator[Any]:
    """`BalanceReport.__rich_console__`: a table of the devices (the least needed columns left out when the
    console is too narrow: numbers are never cut) and the verdict, the critical path and the notes."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    top = max((r.busy_ms for r in b.rows), default=0.0)
    split = (
        [("units", 0, [f"{r.units:,}" for r in b.rows]), ("suggested", 0, [f"{r.suggested_units:,}" for r in b.rows])]
        if b.units_given
        else [("share", 0, [f"{r.share:.1%}" for r in b.rows])]
    )
    columns: list[tuple[str, bool, int, list[str]]] = [  # header, a number, left out at this width rank, cells
        ("device", True, 0, [r.device for r in b.rows]),  # (True: never wrapped)
        ("busy", True, 0, [ms(r.busy_ms) for r in b.rows]),
        ("", True, 6, [bar(r.busy_ms, top) for r in b.rows]),
        ("launch-bound", True, 1, [ms(r.launch_bound_ms) for r in b.rows]),
        ("dependency", True, 3, [ms(r.dependency_ms) for r in b.rows]),
        ("start", True, 5, [ms(r.first_start_ms) for r in b.rows]),
        ("end", True, 2, [ms(r.last_end_ms) for r in b.rows]),
        ("wait", True, 7, [ms(r.wait_ms) for r in b.rows]),
        *[(h, True, d, cells) for h, d, cells in split],
        ("predicted\nend", True, 4, [ms(r.predicted_end_ms) for r in b.rows]),
        ("", False, 0, [r.note for r in b.rows]),
    ]
    known = [i for i, c in enumerate(columns) if i == 0 or not c[1] or any(x != "—" for x in c[3])]  # ("—": none)

    def floor(header: str, number: bool, cells: list[str]) -> int:
        """The narrowest the column gets: numbers (and their header lines) whole; text wraps at spaces."""
        pieces = [x for c in [header, *cells] for x in (c.split("\n") if number else c.split())]
        return max([_BAR_WIDTH if not header and number else 1, *map(cell_len, pieces)])

    floors = [floor(h, n, cells) for h, n, _, cells in columns]
    shown = list(known)
    while sum(floors[i] + 3 for i in shown) - 1 > max_width and any(columns[i][2] for i in shown):
        shown.remove(max((i for i in shown if columns[i][2]), key=lambda i: columns[i][2]))
    left_out = [columns[i][0].replace("\n", " ") or "bars" for i in known if i not in shown]
    headers = {columns[i][0].replace("\n", " ") for i in shown}
    caption = "; ".join(
        ["times in ms from the scope's start"]
        + [text for header, text in _CAPTIONS if header in headers]
        + ([f"left out at this width ({max_width} columns): {', '.join(left_out)}"] if left_out else [])
    )
    table = Table(
        title=Text("balance: busy time per device", style="table.title"),
        title_justify="left",
        caption=Text(caption, style="table.caption"),
        caption_justify="left",
        show_edge=False,
    )
    for i in shown:
        header = columns[i][0]
        wraps = i == len(columns) - 1  # (only the notes wrap: numbers and device names never do)
        right = bool(columns[i][1] and header and i)  # (device names, bars and notes: left)
        table.add_column(Text(header), justify="right" if right else "left", no_wrap=not wraps, min_width=floors[i])
    for k in range(len(b.rows)):
        table.add_row(*(Text(columns[i][3][k]) for i in shown))
    yield table
    yield Text("\n".join(_lines(b)))


def _lines(b: BalanceReport) -> list[str]:
    lines = [f"verdict: {b.verdict}"]
    if b.critical_path:
        total = b.makespan_ms or 1.0
        parts = ", ".join(f"{k} {ms(v)} ms ({v / total:.0%})" for k, v in b.critical_path.items())
        lines.append(f"critical path over the {ms(b.makespan_ms)} ms makespan ({b.critical_device}): {parts}")
    if b.imbalance is not None:
        lines.append(
            f"imbalance {b.imbalance:.3f} = max busy {ms(b.busy_makespan_ms)} ms / mean busy {ms(b.mean_busy_ms)} "
            f"ms; straggler {b.straggler}"
        )
    what = "split" if b.units_given else "shares (one unit of work per device assumed)"
    if b.predicted_makespan_ms is not None and b.critical_device is not None:
        lines.append(
            f"makespan (wall): {ms(b.makespan_ms)} ms now, {ms(b.predicted_makespan_ms)} ms predicted with the "
            f"suggested {what}; busy {ms(b.busy_makespan_ms)} ms now, {ms(b.predicted_busy_ms)} ms predicted"
        )
    elif b.predicted_makespan_ms is not None:
        lines.append(
            f"makespan (busy): {ms(b.makespan_ms)} ms now, {ms(b.predicted_makespan_ms)} ms predicted "
            f"with the suggested {what}"
        )
    return lines + [f"note: {n}" for n in b.notes]


def ms(value: float | None) -> str:
    """A time in ms as the reports write it: three decimals, thousands separated; ``—`` for None or NaN."""
    return "—" if value is None or math.isnan(value) else f"{value:,.3f}"


def bar(value: float, top: float, width: int = _BAR_WIDTH) -> str:
    """``value`` of ``top`` as a bar of ``width`` full blocks, in eighths of a block (at least one if > 0)."""
    if top <= 0 or value <= 0:
        return ""
    eighths = max(1, round(value / top * width * 8))
    return "█" * (eighths // 8) + _EIGHTHS[eighths % 8].strip()


# -- shared -------------------------------------------------------------------------------------------------
def _timeline(source: Any, what: str) -> Timeline:
    """``source`` as a `Timeline`: a Timeline, or what has one as ``.timeline`` (a finished `Timer`, whose
    ``timeline`` raises `ScopeError` naming the fix while it is open)."""
    if isinstance(source, Timeline):
        return source
    tl = getattr(source, "timeline", None) if not isinstance(source, (str, bytes)) else None
    if isinstance(tl, Timeline):
        return tl
    raise TypeError(f"{what}() takes a Timeline (t.timeline) or a finished Timer, not {source!r}")


def _finished(tl: Timeline) -> np.ndarray:
    """Rows with a finite start, end and duration."""
    return tl.complete & np.isfinite(tl.end_ns)


def _clock(tl: Timeline, i: int) -> tuple[bool, str]:
    """``(aligned, reason)`` of device ``i``."""
    c = tl.clocks[i]
    return c.aligned, "" if c.aligned else (c.reason or "clock not aligned")


# -- steps: the balance of one step per row, vectorized ------------------------------------------------------------
class StepSplit(NamedTuple):
    """`step_split`'s answer: one row per step, one column per device (ns), and the straggler of each step."""

    step_ns: np.ndarray  #: (steps,) the step's window: its begin to the later of the host's exit and the last end
    busy_ns: np.ndarray  #: (steps, devices) the device's busy block of the step
    launch_bound_ns: np.ndarray  #: (steps, devices) idle before the block, the host still issuing the step
    dependency_ns: np.ndarray  #: (steps, devices) idle before the block, all of it issued (waits, earlier work)
    straggler: np.ndarray  #: (steps,) int: the device index, or -1 for the host (`HOST`)


def step_split(
    begin_ns: np.ndarray,
    exit_ns: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    issued_ns: np.ndarray,
    measured: tuple[np.ndarray, np.ndarray] | None = None,
) -> StepSplit:
    """The balance of many steps at once, each step a scope with one busy block per device: the arithmetic of
    `device_summary` and `balance` for that case, over whole arrays (no Python loop per step).

    ``begin_ns``/``exit_ns`` (steps,): the host's entry and exit of each step; ``start_ns``/``end_ns`` (steps,
    devices): the device's step events on the host clock; ``issued_ns`` (steps, devices): when the host had issued
    all of the step's work to the device (its end event's record). The block is ``[max(start, min(end, issued)),
    end]``: one event pair cannot see gaps inside the step, so the part of the span while the host was still issuing
    counts as the host's (the gap before the block is split at ``issued`` as `_union` splits gaps: launch-bound
    before it, dependency after). The straggler is `balance`'s: the device that ends last, or the host when its path
    is launch-bound or it ends last only because its work came later (`_bound`). `balance`'s makespan ends at the
    last device's end; a step ends at the later of that and the host's exit, and the host's time after the last
    device end (its tail) counts with the critical device's launch-bound time: the host is the straggler when those
    two make at least half of the step (with no tail, `_bound`'s own "launch" rule).

    ``measured`` = ``(busy_ns, busy_before_issue_ns)`` (steps, devices): the device's work inside its step, as a
    record of each kernel gives it (CUPTI), in all and before ``issued``: then busy is that, and the device's idle
    time of the step is launch-bound while the host was still issuing, dependency after."""
    n, nd = start_ns.shape
    begin = begin_ns[:, None]
    if measured is None:
        lo = np.maximum(start_ns, np.minimum(end_ns, issued_ns))
        lo = np.maximum(lo, begin)
        end = np.maximum(end_ns, lo)
        busy = end - lo
        gap = lo - begin
        launch = np.clip(issued_ns - begin, 0.0, gap)
        dependency = gap - launch
    else:
        end = np.maximum(end_ns, begin)
        window = end - begin
        busy = np.clip(measured[0], 0.0, window)
        idle = window - busy
        launch = np.clip(np.clip(issued_ns - begin, 0.0, window) - measured[1], 0.0, idle)
        dependency = idle - launch
    last = end.max(axis=1) if nd else np.full(n, -np.inf)
    step = np.maximum(exit_ns, last) - begin_ns
    straggler = np.full(n, -1, np.int64)
    if nd:
        order = np.argsort(-end, axis=1, kind="stable")
        rows = np.arange(n)
        c = order[:, 0]
        makespan = end[rows, c] - begin_ns
        tail = np.maximum(exit_ns - last, 0.0)
        host = launch[rows, c] + tail >= 0.5 * (makespan + tail)
        if nd > 1:
            r = order[:, 1]
            lead = launch[rows, c] - launch[rows, r]
            host |= (lead > np.maximum(busy[rows, c] - busy[rows, r], 0.0)) & (lead >= 0.1 * makespan)
        host &= makespan + tail > 0
        straggler = np.where(host, -1, c)
    return StepSplit(step, busy, launch, dependency, straggler)
