"""What `asyncgpu.gather` returns: the scopes of several ranks merged into one `Timeline` on the root's host clock,
the ranks' clock offsets, and the balance across ranks.

Merge: rank ``r``'s device ``cuda:0`` becomes ``r{r}/cuda:0`` (a process of its own in the trace); its host
ranges go to host threads named ``r{r}/<thread>``; every time is moved onto the root's ``perf_counter_ns`` by
subtracting the rank's measured offset, and each device's clock bound grows by the offset's bound. Collective
marks become zero-length host ranges of kind ``collective``. Columns are filled rank by rank, so the root holds
one received payload at a time besides the merged columns (43 bytes per activity).

Balance across ranks (times in ms, on the root's clock):

- busy time per rank and device is `device_summary`'s (union of the activity intervals); a rank's busy time is
  its busiest device's, as a rank reaches the next collective when its slowest device does;
- at each collective point (the k-th `mark_collective` of one name on every rank), a device *arrives* when the
  work issued before the mark has finished AND its host has made the mark: ``max(mark time, last end of the
  device's activities issued before the mark)``; the last to arrive is the straggler, and every other device
  waits for it ``straggler's arrival - its own arrival``. Waits are known within the ranks' offset bounds;
- the suggested re-split gives each rank work in proportion to its throughput (units per busy ms), as
  `balance` does across the devices of one process.

Not gathered: a timeline's layers (in-kernel records, handoffs between threads) stay on their rank.

Threads: any thread; nothing here talks to other ranks.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Sequence, final

import numpy as np

from asyncgpu._analysis.summary import DeviceSummary, Plain, busy_split, device_summary
from asyncgpu._base.records import DeviceClock, ScopeInfo, Timeline
from asyncgpu.ranks.wire import (
    ROW_COLUMNS,
    GatherError,
    HostRanges,
    Marks,
    payload_to_timeline,
    timeline_to_payload,
    unpack,
)

__all__ = [
    "CollectivePoint",
    "Merger",
    "RankBalance",
    "RankDeviceRow",
    "RankInfo",
    "RankRow",
    "RankTimeline",
    "merged_from_payload",
    "merged_to_payload",
]


@final
@dataclass(frozen=True, slots=True)
class RankInfo(Plain):
    """One rank of a gather: where it ran and how its host clock maps to the root's."""

    rank: int  #: in the group's numbering
    host: str
    pid: int
    backend: str  #: the device backend its scope timed (``cuda``, ``host``)
    label: str  #: its scope's label
    devices: tuple[str, ...]  #: its device names as it knows them (``cuda:0``); merged as ``r{rank}/cuda:0``
    activities: int
    offset_ns: int  #: its ``perf_counter_ns`` minus the root's at the same instant (subtracted from its times)
    bound_ns: float  #: ± error bound of ``offset_ns`` (0 for the root)
    rtt_ns: float  #: the shortest ping round trip (0 for the root)
    samples: int  #: pings exchanged
    asyncgpu_version: str
    error: str | None  #: what its scope's body raised, if anything


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


@final
class RankTimeline:
    """The merged result of `asyncgpu.gather` (on the root, or on every rank with ``to_all=True``).

    ``timeline`` holds every rank's activities on the root's host clock, devices named ``r{rank}/{device}``;
    ``ranks`` the ranks' clock offsets; ``marks`` the collective marks. ``balance()`` makes the cross-rank
    report, ``write_trace(path)`` one Perfetto trace, ``rich.print(result)`` the report."""

    def __init__(
        self,
        records: Timeline,
        host_ranges: HostRanges,
        ranks: Sequence[RankInfo],
        marks: Marks,
        root: int,
        row_bounds: np.ndarray,
        device_bounds: np.ndarray,
    ) -> None:
        self._records = records  # the merged timeline without its host ranges: what the summaries read
        self._hr = host_ranges  # columns; `HostRange` objects only when ``timeline`` is read
        self._timeline: Timeline | None = None
        self.ranks = tuple(ranks)
        self.marks = marks
        self.root = root
        self._rows = row_bounds
        self._devs = device_bounds
        self._summary: DeviceSummary | None = None

    @property
    def timeline(self) -> Timeline:
        """The merged `Timeline`, its host ranges included (made on first use: about 150 bytes per host range;
        the summaries and the balance never need them)."""
        if self._timeline is None:
            self._timeline = dataclasses.replace(self._records, host_ranges=self._hr.ranges())
        return self._timeline

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def label(self) -> str:
        """The scope label (the ranks' labels joined by `` + `` when they differ, with ``strict=False``)."""
        return self._records.label

    def rank(self, r: int) -> Timeline:
        """Rank ``r``'s activities (views into the merged columns; times on the root's clock; the merged tables;
        no host ranges)."""
        if not 0 <= r < self.world:
            raise IndexError(f"rank {r} is not in this gather (ranks 0..{self.world - 1})")
        tl, s = self._records, slice(int(self._rows[r]), int(self._rows[r + 1]))
        return dataclasses.replace(
            tl,
            device=tl.device[s],
            stream=tl.stream[s],
            name=tl.name[s],
            kind=tl.kind[s],
            start_ns=tl.start_ns[s],
            end_ns=tl.end_ns[s],
            duration_ns=tl.duration_ns[s],
            issued_ns=tl.issued_ns[s],
        )

    def device_summary(self) -> DeviceSummary:
        """`asyncgpu.device_summary` of the merged timeline: one row per (rank, device), over the merged window."""
        if self._summary is None:
            self._summary = device_summary(self._records)
        return self._summary

    def balance(self, work_units: Any = None) -> RankBalance:
        """The cross-rank balance. ``work_units``: per rank (a sequence in rank order, or ``{rank: units}``) the
        whole units of work it got; default one each (the suggestion is then in fractions only)."""
        return _balance(self, work_units)

    def write_trace(self, path: str | os.PathLike) -> None:
        """One Perfetto trace: a process per (rank, device), host tracks ``r{rank}/<thread>`` (in a Perfetto
        trace, a host process per rank), collective marks as zero-length host ranges. As `asyncgpu.write_trace`:
        ``.pftrace`` for Perfetto's native format, JSON otherwise (`asyncgpu.read_trace` reads both)."""
        from asyncgpu._trace.export import write_trace

        write_trace(self.timeline, path)

    def report(self, limit: int = 64, work_units: Any = None) -> Any:
        """The report as a rich renderable: the ranks and their clocks, then the balance (at most ``limit``
        device rows)."""
        from asyncgpu.ranks.report import rank_report

        return rank_report(self, self.balance(work_units), limit)

    def to_dict(self) -> dict[str, Any]:
        """The ranks and the balance as plain types (the records stay in ``timeline``: export them with
        `asyncgpu.to_json` or `write_trace`)."""
        return {
            "label": self._records.label,
            "root": self.root,
            "world": self.world,
            "activities": len(self._records),
            "ranks": [r.to_dict() for r in self.ranks],
            "balance": self.balance().to_dict(),
        }

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield self.report()

    def __str__(self) -> str:
        from asyncgpu._analysis.report import render

        return render(self.report())

    def __repr__(self) -> str:
        tl = self._records
        return (
            f"<asyncgpu.RankTimeline {tl.label!r}: {self.world} ranks, {len(tl)} activities on "
            f"{len(tl.devices)} devices>"
        )


def merged_to_payload(rt: RankTimeline) -> np.ndarray:
    """The merged result as one payload (the root sends it to every rank with ``to_all``)."""
    info = {
        "kind": "merged",
        "root": rt.root,
        "ranks": [r.to_dict() for r in rt.ranks],
        "row_bounds": rt._rows.tolist(),
        "device_bounds": rt._devs.tolist(),
        "scopes": [dataclasses.asdict(sc) for sc in rt._records.scopes],
    }
    return timeline_to_payload(rt._records, rt.marks, info, rt._hr)


def merged_from_payload(buf: Any) -> RankTimeline:
    """`merged_to_payload` read back on a rank."""
    header, cols = unpack(buf, "the merged result from the root")
    tl, hr, marks = payload_to_timeline(header, cols)
    try:
        ranks = [RankInfo(**{**r, "devices": tuple(r["devices"])}) for r in header["ranks"]]
        return RankTimeline(
            tl,
            hr,
            ranks,
            marks,
            int(header["root"]),
            np.array(header["row_bounds"], np.int64),
            np.array(header["device_bounds"], np.int64),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GatherError(f"the merged result from the root is corrupt ({type(exc).__name__}: {exc})") from None


class Merger:
    """Builds a `RankTimeline` rank by rank: `add` copies one rank's payload into its slice of the merged columns
    (the payload can be dropped right after), `result` finishes. Ranks are added in rank order."""

    def __init__(self, rows: Sequence[int], root: int) -> None:
        self.bounds = np.concatenate(([0], np.cumsum(np.asarray(rows, np.int64))))
        n = int(self.bounds[-1])
        self.cols = {name: np.empty(n, dt) for name, dt in ROW_COLUMNS}
        self.root = root
        self.devices: list[str] = []
        self.dev_bounds = [0]
        self.clocks: list[DeviceClock] = []
        self.descriptions: list[str] = []
        self.streams: list[tuple[int, str]] = []
        self.names: dict[str, int] = {}
        # names, kinds, threads
        self.hr_tables: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {"collective": 0}, {})
        self.hr_parts: list[tuple[np.ndarray, ...]] = []
        self.scopes: list[ScopeInfo] = []
        self.infos: list[RankInfo] = []
        self.mark_names: dict[str, int] = {}
        self.mark_threads: dict[str, int] = {}
        self.mark_parts: list[tuple[np.ndarray, ...]] = []
        self.labels: list[str] = []
        self.errors: list[str] = []
        self.cancelled = False
        self.scope_start: int | None = None
        self.scope_end: int | None = None

    def add(self, payload: Any, offset: tuple[int, float, float, int]) -> None:
        """Rank ``len(self.infos)``'s payload, with its ``(offset_ns, bound_ns, rtt_ns, samples)``."""
        rank = len(self.infos)
        header, cols = unpack(payload, f"rank {rank}'s payload")
        tl, hr, marks = payload_to_timeline(header, cols)
        lo, hi = int(self.bounds[rank]), int(self.bounds[rank + 1])
        if len(tl) != hi - lo or header.get("rank") != rank:
            raise GatherError(
                f"rank {rank}'s payload holds {len(tl)} activities of rank {header.get('rank')}, its "
                f"check-in announced {hi - lo} of rank {rank}: the ranks are out of step (call gather "
                "in the same order on every rank)"
            )
        off, bound, rtt, samples = offset
        dbase, sbase = len(self.devices), len(self.streams)
        if dbase + len(tl.devices) > np.iinfo(np.int16).max:
            raise GatherError(f"more than {np.iinfo(np.int16).max} devices in all: gather fewer ranks at a time")
        self.devices += [f"r{rank}/{d}" for d in tl.devices]
        self.dev_bounds.append(len(self.devices))
        for c in tl.clocks:
            self.clocks.append(
                DeviceClock(
                    f"r{rank}/{c.device}",
                    c.aligned,
                    c.bound_ns + bound,
                    c.offset_ns,
                    c.drift_ppm,
                    c.reason,
                    c.overhead_ns,
                    c.overhead_source,
                )
            )
        where = f"{header.get('host', '?')}, " + (
            "root clock" if rank == self.root else f"rank clock ±{bound / 1e3:,.1f} µs"
        )
        self.descriptions += [f"{d} ({where})".strip() for d in tl.descriptions]
        self.streams += [(dbase + d, s) for d, s in tl.streams]
        out = self.cols
        out["device"][lo:hi] = tl.device + np.int16(dbase)
        out["stream"][lo:hi] = tl.stream + np.int32(sbase)
        out["name"][lo:hi] = _codes(self.names, tl.names)[tl.name]
        out["kind"][lo:hi] = tl.kind
        np.subtract(tl.start_ns, off, out=out["start_ns"][lo:hi])
        np.subtract(tl.end_ns, off, out=out["end_ns"][lo:hi])
        out["duration_ns"][lo:hi] = tl.duration_ns
        np.subtract(tl.issued_ns, off, out=out["issued_ns"][lo:hi])  # (NaN where the rank sent none)
        names, kinds, threads = self.hr_tables
        hr_name, mk_name = _codes(names, hr.names), _codes(names, marks.names)
        hr_thread = _codes(threads, [f"r{rank}/{t}" for t in hr.threads])
        mk_thread = _codes(threads, [f"r{rank}/{t}" for t in marks.threads])
        self.hr_parts.append(
            (
                hr_name[hr.name],
                _codes(kinds, hr.kinds)[hr.kind],
                hr_thread[hr.thread],
                hr.start_ns - off,
                hr.end_ns - off,
            )
        )
        self.hr_parts.append(
            (
                mk_name[marks.name],
                np.zeros(len(marks), np.int32),
                mk_thread[marks.thread],
                marks.ns - off,
                marks.ns - off,
            )
        )  # marks: zero-length ranges of kind "collective"
        mk_names = _codes(self.mark_names, marks.names)
        mk_threads = _codes(self.mark_threads, [f"r{rank}/{t}" for t in marks.threads])
        self.mark_parts.append(
            (
                mk_names[marks.name],
                mk_threads[marks.thread],
                marks.ns - off,
                marks.row + lo,
                np.full(len(marks), rank, np.int32),
            )
        )
        start, end = tl.scope_start_ns - off, tl.scope_end_ns - off
        self.scope_start = start if self.scope_start is None else min(self.scope_start, start)
        self.scope_end = end if self.scope_end is None else max(self.scope_end, end)
        self.scopes.append(ScopeInfo(f"r{rank}: {tl.label}", int(start), int(end), len(tl), tl.error, tl.cancelled))
        self.labels.append(tl.label)
        if tl.error:
            self.errors.append(f"r{rank}: {tl.error}")
        self.cancelled |= bool(tl.cancelled)
        self.infos.append(
            RankInfo(
                rank,
                str(header.get("host", "?")),
                int(header.get("pid", 0)),
                str(header.get("backend", "?")),
                tl.label,
                tuple(tl.devices),
                len(tl),
                int(off),
                float(bound),
                float(rtt),
                int(samples),
                str(header.get("asyncgpu_version", "?")),
                tl.error,
            )
        )

    def result(self) -> RankTimeline:
        marks = Marks(tuple(self.mark_names), tuple(self.mark_threads), *_concat(self.mark_parts, 5))
        hr = HostRanges(*self.hr_tables, *_concat(self.hr_parts, 5))
        self.hr_parts = self.mark_parts = []
        c = self.cols
        tl = Timeline(
            " + ".join(dict.fromkeys(self.labels)),
            tuple(self.devices),
            tuple(self.streams),
            tuple(self.names),
            c["device"],
            c["stream"],
            c["name"],
            c["kind"],
            c["start_ns"],
            c["end_ns"],
            c["duration_ns"],
            int(self.scope_start or 0),
            int(self.scope_end or 0),
            tuple(self.clocks),
            (),
            tuple(self.descriptions),
            "; ".join(self.errors) or None,
            self.cancelled,
            scopes=tuple(self.scopes),
            issued_ns=c["issued_ns"],
        )
        return RankTimeline(tl, hr, self.infos, marks, self.root, self.bounds, np.array(self.dev_bounds, np.int64))


def _codes(table: dict[str, int], names: Sequence[str]) -> np.ndarray:
    """Merged codes of ``names`` (added to ``table`` as needed), as an int32 map indexable by the local codes."""
    return np.array([table.setdefault(n, len(table)) for n in names] or [0], np.int32)


def _concat(parts: list[tuple[np.ndarray, ...]], k: int) -> list[np.ndarray]:
    return [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in range(k)]


# -- balance --------------------------------------------------------------------------------------------------
def _balance(rt: RankTimeline, work_units: Any) -> RankBalance:
    tl, ds = rt._records, rt.device_summary()
    world = rt.world
    dev_rank = np.repeat(np.arange(world), np.diff(rt._devs))
    busy = np.array([r.busy_ms for r in ds.rows])
    rank_busy = np.zeros(world)
    busiest: list[str | None] = [None] * world
    for r in range(world):
        lo, hi = int(rt._devs[r]), int(rt._devs[r + 1])
        if hi > lo and busy[lo:hi].max() > 0:
            k = lo + int(busy[lo:hi].argmax())
            rank_busy[r], busiest[r] = busy[k], tl.devices[k]
    arrivals, point_notes = _arrivals(rt, dev_rank)
    points, dev_wait, last_at = _points(rt, arrivals, dev_rank)
    units = _rank_units(world, work_units)
    throughput, measured, share, amount, predicted = busy_split(units, rank_busy, integral=work_units is not None)
    straggler = int(rank_busy.argmax()) if rank_busy.any() else None
    have_points = bool(points)
    rank_wait = _rank_waits(rt, arrivals) if have_points else None
    rows = tuple(
        RankRow(
            r,
            rt.ranks[r].host,
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
                + ([f"scope raised {rt.ranks[r].error}"] if rt.ranks[r].error else [])
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
            _dev_note(s, i == (int(busy.argmax()) if busy.any() else -1)),
            s.launch_bound_ms,
            s.dependency_ms,
        )
        for i, s in enumerate(ds.rows)
    )
    mean = float(rank_busy.mean()) if world else 0.0
    dmean = float(busy.mean()) if busy.size else 0.0
    bound_ms = max((r.bound_ns for r in rt.ranks), default=0.0) / 1e6
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
        tl.label,
        rows,
        drow,
        points,
        mean,
        float(rank_busy.max()) / mean if mean > 0 else None,
        float(busy.max()) / dmean if dmean > 0 else None,
        straggler,
        tl.devices[int(busy.argmax())] if busy.any() else None,
        work_units is not None,
        int(units.sum()),
        float(rank_busy.max()) if world else 0.0,
        predicted,
        bound_ms,
        tuple(notes),
    )


def _arrivals(rt: RankTimeline, dev_rank: np.ndarray) -> tuple[dict[str, np.ndarray], list[str]]:
    """Per mark name, arrivals ``[k, device]`` (root ns; NaN for a device left out) at its first ``K`` points,
    ``K`` = the fewest times any rank made that mark; and the notes on what was left out."""
    tl, mk = rt._records, rt.marks
    assert mk.rank is not None  # merged marks carry their rank
    nd, world = len(tl.devices), rt.world
    aligned = np.array([c.aligned for c in tl.clocks])
    counts = np.zeros((len(mk.names), world), np.int64)
    np.add.at(counts, (mk.name, mk.rank), 1)
    out: dict[str, np.ndarray] = {}
    notes = []
    prefix: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for d in range(nd):  # per device: its rows (issue order) and the running max of their ends
        r = int(dev_rank[d])
        lo, hi = int(rt._rows[r]), int(rt._rows[r + 1])
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
    rt: RankTimeline, arrivals: dict[str, np.ndarray], dev_rank: np.ndarray
) -> tuple[tuple[CollectivePoint, ...], np.ndarray, np.ndarray]:
    """The collective points, and per device its summed wait (ms) and how often it arrived last."""
    nd = len(rt._records.devices)
    wait = np.zeros(nd)
    last_at = np.zeros(nd, np.int64)
    points = []
    t0 = rt._records.scope_start_ns
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
                    rt._records.devices[s],
                    int(dev_rank[s]),
                    float(latest[k] - t0) / 1e6,
                    float(spread[k]) / 1e6,
                    float(w[k].sum()) / 1e6,
                )
            )
    return tuple(points), wait / 1e6, last_at


def _rank_waits(rt: RankTimeline, arrivals: dict[str, np.ndarray]) -> np.ndarray:
    """Per rank, summed over the points: the latest arrival minus the rank's own (its last device's), ms."""
    out = np.zeros(rt.world)
    for arr in arrivals.values():
        per_rank = np.full((arr.shape[0], rt.world), np.nan)
        for r in range(rt.world):
            cols = arr[:, int(rt._devs[r]) : int(rt._devs[r + 1])]
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


def _dev_note(s: Any, straggler: bool) -> str:
    parts = ["busiest"] if straggler else []
    if s.busy_ms == 0:
        parts.append("no activity")
    if not s.aligned:
        parts.append("clock not aligned")
    return ", ".join(parts)
