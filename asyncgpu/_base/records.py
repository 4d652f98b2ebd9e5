"""Finished timing records, columnar: a `Timeline` holds one numpy array per field and one row per activity.

Time base: every absolute time (``*_ns``) is host time in nanoseconds from ``time.perf_counter_ns()``
(CLOCK_MONOTONIC on Linux), the same clock for every device of the process. A device whose clock could not be
aligned to the host keeps times relative to its own scope start instead; its `DeviceClock` says so
(``aligned=False``) and every report and export marks it: time bases are never mixed silently. One rule for a
device of which a timeline has no clock information: it is NOT aligned (`Timeline` fills its `DeviceClock` in).

A timeline is plain data: everything reports, exports and `gather` need is a typed field (the host times of
the scope, collective marks, the scopes merged into it, the layers drawn on its trace), so none of them needs
the live scope that made it. This module is the bottom layer: it imports nothing of asyncgpu.

A row costs 43 bytes (codes: int16 device, int32 stream, int32 name, int8 kind; float64 start, end, duration,
issued). Unfinished activities have NaN start, end and duration; an activity whose issue time is not known (a
trace written before asyncgpu recorded it, rows added by CUPTI for work launched by others) has a NaN issue
time. Names, streams and devices are stored once, in the tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

__all__ = ["KINDS", "ActivityRecord", "CollectiveMark", "DeviceClock", "HostRange", "ScopeInfo", "Timeline", "no_clock"]

KINDS = ("kernel", "memcpy", "memset", "graph", "user")
KIND_CODES = {k: i for i, k in enumerate(KINDS)}
GC_KIND = "gc"  #: `HostRange.kind` of a garbage collection of Python's inside a scope's body
GC_THREAD = "Python's garbage collector"  #: the `HostRange.thread` of those ranges (their own track)


@dataclass(frozen=True, slots=True)
class ActivityRecord:
    """One timed activity, as a plain object (`Timeline` holds them as columns)."""

    device: str  #: ``"cuda:0"``, ``"host:1"``
    stream: str  #: the stream's label (``s0``, ``s1``… worker streams; ``x0``… adopted streams)
    name: str
    kind: str  #: kernel, memcpy, memset, graph or user
    start_ms: float | None  #: from the scope's start (ms); None if the device had not finished it
    duration_ms: float | None  #: None if the device had not finished it when the scope ended
    start_ns: int | None = None  #: absolute start, host time base (see `DeviceClock.aligned`)
    end_ns: int | None = None  #: absolute end, host time base
    issued_ns: int | None = None  #: when the host had issued it (host ``perf_counter_ns``); None if not known

    @property
    def complete(self) -> bool:
        return self.duration_ms is not None


@dataclass(frozen=True, slots=True)
class DeviceClock:
    """How one device's times were placed on the host time base for one scope."""

    device: str
    aligned: bool  #: True: times are host time; False: relative to this device's scope start (see ``reason``)
    bound_ns: float  #: error bound of the placement (± ns); 0 on the host backend
    offset_ns: int | None = None  #: the device's ``%globaltimer`` minus host time (CUDA), if measured
    drift_ppm: float | None = None  #: device clock rate minus host clock rate, if measurable
    reason: str = ""  #: why the device is not aligned
    overhead_ns: float = 0.0  #: subtracted from each kernel, graph, memset and memcpy (what the event pair adds)
    overhead_source: str = ""  #: how ``overhead_ns`` was measured on this device ("" when nothing is subtracted)


def no_clock(device: str) -> DeviceClock:
    """The clock of a device a timeline has no clock information for: not aligned."""
    return DeviceClock(device, False, float("nan"), reason="the timeline has no clock information")


@dataclass(frozen=True, slots=True)
class CollectiveMark:
    """A collective point marked in a scope (`asyncgpu.ranks.mark_collective`): ``gather`` matches the k-th mark
    of one name across ranks."""

    name: str
    host_ns: int  #: when it was marked, host time base
    row: int  #: how many activities the scope had recorded by then
    thread: str  #: the marking thread's name


@dataclass(frozen=True, slots=True)
class ScopeInfo:
    """One scope of a timeline (a timeline merged from several scopes has several)."""

    label: str
    start_ns: int
    end_ns: int
    rows: int
    error: str | None = None
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class HostRange:
    """A range on the host track: the scope itself, a ``t.activity()`` block as the host issued it, or a garbage
    collection of Python's during the scope's body (`GC_KIND`, on the thread `GC_THREAD`: it stops every thread)."""

    name: str
    kind: str  #: ``"scope"``, an activity kind, or `GC_KIND`
    start_ns: int
    end_ns: int
    thread: str


@dataclass(eq=False)
class Timeline:
    """The records of one scope (or several merged), columnar. Build one with `Timeline.from_arrays` or get it
    from ``timer.timeline``. Rows are in issue order (the order the host enqueued the activities)."""

    label: str
    devices: tuple[str, ...]  #: device names; the ``device`` column indexes this
    streams: tuple[tuple[int, str], ...]  #: ``(device code, stream label)``; the ``stream`` column indexes this
    names: tuple[str, ...]  #: activity names; the ``name`` column indexes this
    device: np.ndarray  #: int16 device code per row
    stream: np.ndarray  #: int32 stream code per row
    name: np.ndarray  #: int32 name code per row
    kind: np.ndarray  #: int8 index into `KINDS` per row
    start_ns: np.ndarray  #: float64 absolute start (host time base), NaN if unfinished
    end_ns: np.ndarray  #: float64 absolute end, NaN if unfinished
    duration_ns: np.ndarray  #: float64 duration measured between the activity's own events, NaN if unfinished
    scope_start_ns: int  #: host time when the scope was entered
    scope_end_ns: int  #: host time when the scope's body ended
    clocks: tuple[DeviceClock, ...] = ()  #: per device, in ``devices`` order
    host_ranges: tuple[HostRange, ...] = ()
    descriptions: tuple[str, ...] = ()  #: per device, e.g. ``"NVIDIA H200 (sm_90)"``
    error: str | None = None  #: what the scope's body raised, if anything
    cancelled: bool = False
    host_ms: float | None = None  #: host wall time in the scope's body (enqueueing, and any awaits there), ms
    wait_ms: float | None = None  #: host wall time the scope's exit then waited for the devices, ms
    cpu_ms: float | None = None  #: CPU time of the process during the scope (all threads), ms
    marks: tuple[CollectiveMark, ...] = ()  #: collective points, in marking order
    scopes: tuple[ScopeInfo, ...] = ()  #: the scopes merged into this timeline (empty: just this one)
    layers: tuple[Any, ...] = ()  #: finished trace layers (in-kernel records, handoffs): see `asyncgpu._base.layers`
    source: str = "events"  #: where the durations come from: ``"events"`` (held event pairs) or ``"cupti"``
    source_note: str = ""  #: why ``source="auto"`` fell back to events, or what CUPTI could not attribute
    #: float64 per row: host time (``perf_counter_ns``, the clock of ``start_ns``) when the host had issued the
    #: activity: a launch once its call returned, a ``t.activity()`` block at its entry, a graph's part when the
    #: replay was launched. NaN where not known. Empty (the default) means NaN for every row.
    issued_ns: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        rows = len(self.start_ns)
        if len(self.issued_ns) != rows:
            if len(self.issued_ns):
                raise ValueError(f"column issued_ns has {len(self.issued_ns)} rows, start_ns has {rows}")
            self.issued_ns = np.full(rows, np.nan)
        n = len(self.devices)
        if len(self.clocks) < n:  # the one rule for a device without clock information
            self.clocks = tuple(self.clocks) + tuple(no_clock(d) for d in self.devices[len(self.clocks) :])
        if len(self.descriptions) < n:
            self.descriptions = tuple(self.descriptions) + ("",) * (n - len(self.descriptions))

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        *,
        label: str = "scope",
        devices: Sequence[str],
        device: Any,
        start_ns: Any,
        end_ns: Any,
        names: Sequence[str] = ("work",),
        name: Any = None,
        kind: Any = None,
        streams: Sequence[tuple[int, str]] | None = None,
        stream: Any = None,
        duration_ns: Any = None,
        scope_start_ns: int | None = None,
        scope_end_ns: int | None = None,
        clocks: Sequence[DeviceClock] | None = None,
        issued_ns: Any = None,
        **kw: Any,
    ) -> Timeline:
        """A timeline from plain arrays (synthetic data, traces read back, other tools). ``kind`` may hold kind
        names or codes; missing columns default to name 0, kind ``user``, one stream ``s0`` per device, issue
        times unknown (NaN)."""
        for what, seq in (("devices", devices), ("names", names)):
            if isinstance(seq, (str, bytes)):
                raise TypeError(f"{what} is a sequence of names ({what}=[{seq!r}] for one), not the string {seq!r}")
        n = len(start_ns)
        dev = np.asarray(device, dtype=np.int16)
        start = np.asarray(start_ns, dtype=np.float64)
        end = np.asarray(end_ns, dtype=np.float64)
        if streams is None:
            streams = tuple((i, "s0") for i in range(len(devices)))
            st = dev.astype(np.int32)
        else:
            st = np.asarray(stream if stream is not None else np.zeros(n), dtype=np.int32)
        if kind is None:
            kd = np.full(n, KIND_CODES["user"], dtype=np.int8)
        else:
            kind = np.asarray(kind)
            kd = (
                np.array([KIND_CODES[k] for k in kind], dtype=np.int8)
                if kind.dtype.kind in "US"
                else kind.astype(np.int8)
            )
        nm = np.zeros(n, dtype=np.int32) if name is None else np.asarray(name, dtype=np.int32)
        dur = end - start if duration_ns is None else np.asarray(duration_ns, dtype=np.float64)
        issued = np.full(n, np.nan) if issued_ns is None else np.asarray(issued_ns, dtype=np.float64)
        for col, arr in (
            ("device", dev),
            ("end_ns", end),
            ("stream", st),
            ("kind", kd),
            ("name", nm),
            ("duration_ns", dur),
            ("issued_ns", issued),
        ):
            if len(arr) != n:
                raise ValueError(f"column {col} has {len(arr)} rows, start_ns has {n}")
        if n and (dev.min() < 0 or dev.max() >= len(devices)):
            raise ValueError(f"device codes must be in 0..{len(devices) - 1}")
        finite = start[np.isfinite(start)]
        s0 = int(finite.min()) if scope_start_ns is None and finite.size else (scope_start_ns or 0)
        fin_end = end[np.isfinite(end)]
        s1 = int(fin_end.max()) if scope_end_ns is None and fin_end.size else (scope_end_ns or s0)
        if clocks is None:
            clocks = tuple(DeviceClock(d, True, 0.0) for d in devices)
        return cls(
            label,
            tuple(devices),
            tuple(streams),
            tuple(names),
            dev,
            st,
            nm,
            kd,
            start,
            end,
            dur,
            s0,
            s1,
            tuple(clocks),
            issued_ns=issued,
            **kw,
        )

    # -- access ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.start_ns)

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns."""
        return sum(
            a.nbytes
            for a in (
                self.device,
                self.stream,
                self.name,
                self.kind,
                self.start_ns,
                self.end_ns,
                self.duration_ns,
                self.issued_ns,
            )
        )

    @property
    def complete(self) -> np.ndarray:
        """Boolean mask of the rows the devices finished."""
        return np.isfinite(self.duration_ns) & np.isfinite(self.start_ns)

    @property
    def aligned(self) -> bool:
        """True when every device's times are on the host time base."""
        return all(c.aligned for c in self.clocks)

    def clock(self, device: str) -> DeviceClock:
        return self.clocks[self.devices.index(device)]

    def start_ms(self) -> np.ndarray:
        """Starts in ms from the scope's start (float64, NaN if unfinished)."""
        return (self.start_ns - self.scope_start_ns) / 1e6

    def row(self, i: int) -> ActivityRecord:
        s, d, e, issued = self.start_ns[i], self.duration_ns[i], self.end_ns[i], self.issued_ns[i]
        done = np.isfinite(s) and np.isfinite(d)
        return ActivityRecord(
            self.devices[self.device[i]],
            self.streams[self.stream[i]][1],
            self.names[self.name[i]],
            KINDS[self.kind[i]],
            (s - self.scope_start_ns) / 1e6 if done else None,
            d / 1e6 if done else None,
            int(s) if done else None,
            int(e) if done else None,
            int(issued) if np.isfinite(issued) else None,
        )

    def __iter__(self) -> Iterator[ActivityRecord]:
        return (self.row(i) for i in range(len(self)))

    def records(self) -> list[ActivityRecord]:
        """The rows as `ActivityRecord` objects, in issue order."""
        return list(self)

    def scope_infos(self) -> tuple[ScopeInfo, ...]:
        """The scopes of this timeline: `scopes` when it was merged from several, else this one."""
        return self.scopes or (
            ScopeInfo(self.label, self.scope_start_ns, self.scope_end_ns, len(self), self.error, self.cancelled),
        )

    def select(self, mask: Any) -> Timeline:
        """The rows where ``mask`` is true (tables and scope data are kept)."""
        m = np.asarray(mask)
        return Timeline(
            self.label,
            self.devices,
            self.streams,
            self.names,
            self.device[m],
            self.stream[m],
            self.name[m],
            self.kind[m],
            self.start_ns[m],
            self.end_ns[m],
            self.duration_ns[m],
            self.scope_start_ns,
            self.scope_end_ns,
            self.clocks,
            self.host_ranges,
            self.descriptions,
            self.error,
            self.cancelled,
            self.host_ms,
            self.wait_ms,
            self.cpu_ms,
            self.marks,
            self.scopes,
            self.layers,
            self.source,
            self.source_note,
            self.issued_ns[m],
        )

    def time_order(self) -> np.ndarray:
        """Row indices sorted by start (unfinished rows last), stable for equal starts."""
        key = np.where(np.isfinite(self.start_ns), self.start_ns, np.inf)
        return np.argsort(key, kind="stable")

    def __repr__(self) -> str:
        return (
            f"<asyncgpu.Timeline {self.label!r}: {len(self)} activities on {len(self.devices)} device(s)"
            f"{'' if self.aligned else ', NOT aligned'}>"
        )
