"""What `asyncgpu.gather` returns: the scopes of several ranks merged into one `Timeline` on the root's host clock,
the ranks' clock offsets, and the balance across ranks (`asyncgpu.ranks.balance`).

Merge: rank ``r``'s device ``cuda:0`` becomes ``r{r}/cuda:0`` (a process of its own in the trace); its host
ranges go to host threads named ``r{r}/<thread>``; every time is moved onto the root's ``perf_counter_ns`` by
subtracting the rank's measured offset, and each device's clock bound grows by the offset's bound. Collective
marks become zero-length host ranges of kind ``collective``. Columns are filled rank by rank, so the root holds
one received payload at a time besides the merged columns (43 bytes per activity).

Not gathered: a timeline's layers (in-kernel records, handoffs between threads) stay on their rank.

Threads: any thread; nothing here talks to other ranks.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Sequence, final

import numpy as np

from asyncgpu._analysis.summary import DeviceSummary, Plain, device_summary
from asyncgpu._base.records import DeviceClock, ScopeInfo, Timeline
from asyncgpu.ranks.balance import RankBalance, rank_balance
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
    "Merger",
    "RankInfo",
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
        return rank_balance(
            self._records, self.device_summary(), self.ranks, self.marks, self._rows, self._devs, work_units
        )

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
