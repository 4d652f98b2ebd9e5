"""Summaries of a `Timeline`: per activity and per device (the balance across devices, built on the device
summary, is in `asyncgpu._analysis.balance`).

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
from dataclasses import dataclass
from typing import Any, NamedTuple, final

import numpy as np

from asyncgpu._base.records import GC_KIND, KINDS, Timeline

__all__ = [
    "ActivityStats",
    "ActivitySummary",
    "DeviceStats",
    "DeviceSummary",
    "Plain",
    "activity_summary",
    "as_timeline",
    "device_summary",
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
    tl = as_timeline(tl, "activity_summary")
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
    #: the host's time in Python's garbage collection during the window (its `GC_KIND` host ranges), ms
    collector_ms: float = 0.0


def device_summary(tl: Timeline) -> DeviceSummary:
    """Busy time (union of intervals), idle time and what it waited for (launch-bound, dependency), largest gap,
    utilisation, first start, last end and issue times per device (ms), over the window described in the
    module's docstring. ``tl``: a `Timeline` (or a finished `Timer`)."""
    tl = as_timeline(tl, "device_summary")
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
    collected_ns = sum(
        max(0, min(r.end_ns, tl.scope_start_ns + window_ns) - max(r.start_ns, tl.scope_start_ns))
        for r in tl.host_ranges
        if r.kind == GC_KIND
    )
    return DeviceSummary(tl.label, window_ns / 1e6, tuple(rows), tl.error, collected_ns / 1e6)


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


# -- shared -------------------------------------------------------------------------------------------------
def as_timeline(source: Any, what: str) -> Timeline:
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
