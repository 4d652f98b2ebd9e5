"""Summaries of a `Timeline`: per activity, per device, and the balance of the work across devices.

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

Unfinished activities (NaN times: the scope was cancelled before the device finished them) are counted apart
and left out of every time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any, final

import numpy as np

from ._records import KINDS, Timeline

__all__ = [
    "ActivityStats",
    "ActivitySummary",
    "BalanceReport",
    "DeviceBalance",
    "DeviceStats",
    "DeviceSummary",
    "Plain",
    "activity_summary",
    "balance",
    "device_summary",
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
    """Busy time (union of intervals), idle time, largest gap, utilisation, first start and last end per device
    (ms), over the window described in the module's docstring. ``tl``: a `Timeline` (or a finished `Timer`)."""
    tl = _timeline(tl, "device_summary")
    done = _finished(tl)
    nd = len(tl.devices)
    dev = tl.device[done]
    rel_start = tl.start_ns[done] - tl.scope_start_ns
    rel_end = np.maximum(tl.end_ns[done] - tl.scope_start_ns, rel_start)
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
        busy, gap, first, end = _union(rel_start[idx], rel_end[idx], w)
        ok, reason = _clock(tl, i)
        rows.append(
            DeviceStats(
                name,
                ok,
                int(count[i]),
                int(pending[i]),
                busy / 1e6,
                float(sums[i]) / 1e6,
                (w - busy) / 1e6,
                gap / 1e6,
                busy / w if w > 0 else None,
                None if first is None else first / 1e6,
                None if end is None else end / 1e6,
                w / 1e6,
                reason,
            )
        )
    return DeviceSummary(tl.label, window_ns / 1e6, tuple(rows), tl.error)


def _union(start: np.ndarray, end: np.ndarray, window: float) -> tuple[float, float, float | None, float | None]:
    """``(busy, largest gap, first start, last end)`` of intervals in ns from the window's start, over
    ``[0, window]``: sort by start, carry the furthest end so far; a start beyond it opens a new busy block."""
    if start.size == 0:
        return 0.0, window, None, None
    order = np.argsort(start)
    lo = np.maximum(start[order], 0.0)
    reach = np.maximum(np.maximum.accumulate(end[order]), 0.0)
    opens = np.flatnonzero(lo[1:] > reach[:-1]) + 1
    block_lo = lo[np.concatenate(([0], opens))]
    block_hi = reach[np.concatenate((opens - 1, [-1]))]
    gaps = np.concatenate(([block_lo[0]], block_lo[1:] - block_hi[:-1], [window - block_hi[-1]]))
    return float((block_hi - block_lo).sum()), float(gaps.max()), float(lo[0]), float(block_hi[-1])


# -- balance ------------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True)
class DeviceBalance:
    """One device in a `BalanceReport`. Times in ms."""

    device: str
    busy_ms: float
    last_end_ms: float | None
    wait_ms: float | None  #: straggler's last end minus this one's (≥ 0); None: no activity, or not comparable
    units: int  #: the work units given (1 each when none were)
    throughput: float | None  #: units per busy ms; None without busy time or without units
    share: float  #: suggested fraction of all the units
    suggested_units: int | None  #: the share in whole units (when work units were given)
    note: str


@final
@dataclass(frozen=True, slots=True)
class BalanceReport(Plain):
    """How evenly the work was spread, and a re-split of it. Make one with `balance`.

    The model: a device's busy time grows in proportion to its units, so its throughput is units per busy ms
    and the split that finishes together gives each device units in proportion to its throughput. Launch gaps
    and idle time are not modelled; makespans are busy times.
    """

    label: str
    rows: tuple[DeviceBalance, ...]
    mean_busy_ms: float  #: over every device of the timeline
    imbalance: float | None  #: max busy / mean busy (1.0: even); None without busy time
    straggler: str | None  #: the device with the most busy time
    comparable: bool  #: every clock is aligned to the host, so wait times compare across devices
    units_given: bool  #: False: one unit per device was assumed
    total_units: int
    makespan_ms: float  #: the longest busy time now
    predicted_makespan_ms: float | None  #: the longest busy time with the suggested split
    notes: tuple[str, ...]


def balance(source: Timeline | DeviceSummary, work_units: Any = None) -> BalanceReport:
    """The balance of busy time across devices, and a split of the work in proportion to each device's
    throughput. ``work_units``: per device (a dict keyed by device or device name, or a sequence in the
    timeline's device order) the whole units of work it got (items, batches, rows); default one unit each, and
    the suggestion is then in fractions only. Devices without busy time keep their units. ``source`` may be a
    `DeviceSummary` already made from the timeline (or a finished `Timer`)."""
    ds = source if isinstance(source, DeviceSummary) else device_summary(_timeline(source, "balance"))
    names = [r.device for r in ds.rows]
    units = _work_units(names, work_units)
    busy = np.array([r.busy_ms for r in ds.rows])
    measured = (busy > 0) & (units > 0)
    throughput = np.where(measured, units / np.where(busy > 0, busy, 1.0), 0.0)
    total = int(units.sum())
    share, amount = suggest_split(units, throughput, measured, integral=work_units is not None)
    predicted = float((amount[measured] / throughput[measured]).max()) if throughput.any() else None
    straggler = int(busy.argmax()) if busy.any() else None
    comparable = all(r.aligned for r in ds.rows)
    rows = [
        DeviceBalance(
            r.device,
            r.busy_ms,
            r.last_end_ms,
            _wait(ds.rows, i, straggler),
            int(units[i]),
            float(throughput[i]) if measured[i] else None,
            float(share[i]),
            int(amount[i]) if work_units is not None else None,
            _row_note(r, i == straggler),
        )
        for i, r in enumerate(ds.rows)
    ]
    mean = float(busy.mean()) if busy.size else 0.0
    return BalanceReport(
        ds.label,
        tuple(rows),
        mean,
        float(busy.max()) / mean if mean > 0 else None,
        None if straggler is None else names[straggler],
        comparable,
        work_units is not None,
        total,
        float(busy.max()) if busy.size else 0.0,
        predicted,
        _notes(ds, measured, comparable),
    )


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
        if integral:
            whole = np.floor(quota)
            order = np.argsort(-(quota - whole), kind="stable")
            whole[order[: round(rest - whole.sum())]] += 1
            quota = whole
        amount[measured] = quota
    return (amount / total if total > 0 else np.zeros_like(units)), amount


def _wait(rows: tuple[DeviceStats, ...], i: int, straggler: int | None) -> float | None:
    """The straggler's last end minus device ``i``'s (≥ 0); None without activity, or across unaligned clocks."""
    if straggler is None or rows[i].last_end_ms is None:
        return None
    if i != straggler and not (rows[i].aligned and rows[straggler].aligned):
        return None
    return max(0.0, rows[straggler].last_end_ms - rows[i].last_end_ms)  # type: ignore[operator]


def _row_note(r: DeviceStats, straggler: bool) -> str:
    parts = ["straggler"] if straggler else []
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
