"""Perfetto's native trace format: `write_perfetto` writes a `Timeline` as protobuf ``TracePacket``s (the
``perfetto`` package's `StreamingTraceProtoBuilder` and generated protos: ``pip install "asyncgpu[perfetto]"``),
streaming; `read_perfetto` reads one back (numpy only: no package needed to read).

Tracks (``TrackDescriptor``)::

    process "host" (pid 1)          a track per host thread (scopes, activity blocks; "MainThread (2)" where
                                    blocks overlap without nesting); "asyncgpu": the metadata instants; "host
                                    issue": an instant where each activity was issued, with a flow arrow to
                                    its slice (`asyncgpu._trace.common`)
    process "r<k> host"             the same per rank, for a timeline merged by `asyncgpu.ranks.gather`
    process "<device> <descr>"      a track per stream (and lane); its description says how the device's clock
                                    was placed; counters "utilisation" (%) and "activities in flight"
    layers                          in-kernel records: a track per kernel holding a track per (block, group);
                                    handoffs: tracks per channel, flow arrows producer -> consumer, a counter

Time: every timestamp is host ``time.perf_counter_ns()``, which is ``CLOCK_MONOTONIC`` on Linux: the trace
declares it its clock (``ClockSnapshot.primary_trace_clock``), so it lines up with other Perfetto traces of the
same machine. Each track is a packet sequence of its own, with the track as its default, names and categories
interned, and timestamps as deltas of a sequence-scoped incremental clock (id 64): a slice costs about 36 bytes.
Per device, an instant "clock <device>" on the "asyncgpu" track holds the calibration (aligned, bound, offset,
drift, overhead, reason) as debug annotations; an instant "asyncgpu trace" holds the timing source (events or
CUPTI), the label, and the metadata of `asyncgpu._trace.common` (JSON) that `read_perfetto` rebuilds the timeline
from, layers' data included.

Slices (``TYPE_SLICE_BEGIN`` / ``TYPE_SLICE_END``): name, category (the kind), debug annotation ``row`` (the row
in the timeline, or the index of the host range) and, only where it differs from the slice's length by more
than 1 ns, ``duration_ns`` (the duration between the activity's own events). The hot packets are encoded with
numpy, column-wise, a chunk of events at a time (`_Columns`); the protos stay the reference: the tests parse every
trace with ``perfetto_trace_pb2.Trace``.

Memory stays flat as traces grow: the writer never holds the trace, and takes the timeline's rows a window at a
time (`asyncgpu._trace.common.ROW_WINDOW`): a stream whose rows follow one another (a stream runs its work in
order) is written window by window, unsorted; only a stream whose rows nest or overlap (activity blocks around
launches) is sorted whole. Counters take a window of time at a time.

Threads: any thread; nothing here touches a device.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
from typing import IO, Any, Iterator, Mapping, Sequence

import numpy as np

from asyncgpu._base.layers import HOST_PID, device_pid, in_order
from asyncgpu._base.layers import lanes as nesting_lanes
from asyncgpu._base.records import KIND_CODES, KINDS, HostRange, Timeline
from asyncgpu._trace.common import (
    ISSUE_TRACK,
    draw_counters,
    drawn,
    host_key,
    issue_flow,
    issued_rows,
    open_for_writing,
    origin_ns,
    row_windows,
    timeline_from,
    trace_meta,
)

__all__ = [
    "NATIVE_SUFFIXES",
    "packet_bounds",
    "read_perfetto",
    "stream_header",
    "stream_slices",
    "write_perfetto",
]

NATIVE_SUFFIXES = (".pftrace", ".perfetto-trace", ".pb")
_MONOTONIC = 3  # BuiltinClock.BUILTIN_CLOCK_MONOTONIC: time.perf_counter_ns() on Linux
_DELTAS = 64  # the sequence-scoped incremental clock every sequence of ours counts in
_META_SEQ = 1  # descriptors and metadata; each track's events have a sequence of their own from 2 on
_CHUNK_EVENTS = 1 << 13  # events encoded per numpy pass: bounds the writer's memory
_BEGIN, _END, _INSTANT, _COUNTER = 1, 2, 3, 4  # TrackEvent.Type
_RANK_THREAD = re.compile(r"^(r\d+)/(.*)$")
_METADATA = "asyncgpu_trace"  # the debug annotation holding the metadata


def _protos() -> tuple[Any, Any]:
    """The ``perfetto`` package's generated protos and streaming builder (imported on first use only)."""
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
    except ImportError as exc:
        raise ImportError(
            'writing a Perfetto trace (.pftrace) needs the perfetto package: pip install "asyncgpu[perfetto]" '
            "(or write to a .json path for Chrome trace JSON, which needs nothing)"
        ) from exc
    return perfetto_trace_pb2, StreamingTraceProtoBuilder


# -- writing -------------------------------------------------------------------------------------------------------
def write_perfetto(tl: Timeline, path: str | os.PathLike) -> None:
    """Write ``tl`` to ``path`` as a Perfetto trace (see the module docstring). Raises `ImportError` naming the
    extra without the ``perfetto`` package, `OSError` naming the path and the fix when it cannot be written,
    `ValueError` for times before 0 (a synthetic timeline: host clocks start at 0)."""
    pb, builder = _protos()
    origin = origin_ns(tl)
    if origin < 0:
        raise ValueError(f"a Perfetto trace holds times from 0 ns on; this timeline starts at {origin} ns")
    with open_for_writing(path, "the trace", binary=True) as f:
        _Writer(tl, origin, f, pb, builder).write()


class _Stream:
    """What the scan learnt of one stream: whether its drawn rows follow one another in row order (each starts
    once the previous one has ended: then they are written a window of rows at a time, unsorted), the names and
    kinds it uses; and, while it is written, its sequence and the time of its last event."""

    __slots__ = ("in_order", "last_end", "names", "kinds", "seq", "before")

    def __init__(self) -> None:
        self.in_order, self.last_end = True, -math.inf
        self.names: set[int] = set()
        self.kinds: set[int] = set()
        self.seq, self.before = 0, 0


class _Writer:
    """One trace being written: a scan of the rows, the plan (processes, tracks), then the packets."""

    def __init__(self, tl: Timeline, origin: int, f: IO[bytes], pb: Any, builder: Any) -> None:
        self.tl, self.origin, self.f, self.pb = tl, origin, f, pb
        self.builder = builder(f)
        self._uuids = itertools.count(1)
        self._seqs = itertools.count(_META_SEQ + 1)
        self._ranks = itertools.count(1 << 20)  # the UI's order of sibling tracks: streams first, in order
        self.descriptors: list[Any] = []
        self.processes: dict[str, int] = {}  # host process key ("" or "r<k>") -> uuid
        self.device_uuids = [next(self._uuids) for _ in tl.devices]
        self.stream_uuids: list[list[int]] = []  # per stream, a track per lane
        self.meta_uuid = 0
        self.device_key = [host_key(d) for d in tl.devices]  # the host process each device's work came from
        self.issue: dict[str, tuple[int, bool]] = {}  # host process -> its "host issue" track, rows in time order

    # the plan
    def _child(self, parent: int, name: str, rank: int | None = None) -> int:
        """A named track under ``parent`` (in the UI, ordered by ``rank``, else after its older siblings, and
        never merged with them)."""
        t = self.pb.TrackDescriptor(uuid=next(self._uuids), parent_uuid=parent, name=name)
        t.sibling_order_rank = next(self._ranks) if rank is None else rank
        t.sibling_merge_behavior = self.pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
        self.descriptors.append(t)
        return int(t.uuid)

    def _process(self, uuid: int, pid: int, name: str, description: str = "") -> None:
        t = self.pb.TrackDescriptor(uuid=uuid, description=description)
        t.process.pid, t.process.process_name = pid, name
        t.child_ordering = self.pb.TrackDescriptor.EXPLICIT
        self.descriptors.append(t)

    def _host_process(self, thread: str) -> tuple[int, str]:
        """The host process of a thread (a rank's, for ``r<k>/`` threads of a merged gather) and the thread's
        name in it."""
        m = _RANK_THREAD.match(thread)
        key, short = "", thread
        if m and any(d.startswith(m.group(1) + "/") for d in self.tl.devices):
            key, short = m.group(1), m.group(2)
        if key not in self.processes:
            uuid = self.processes[key] = next(self._uuids)
            pid = HOST_PID if not key else device_pid(len(self.tl.devices)) + len(self.processes) - 1
            self._process(uuid, pid, f"{key} host" if key else "host")
        return self.processes[key], short

    def _stream_track(self, st: int, lane: int) -> int:
        """The track of lane ``lane`` of stream ``st`` ("s0", "s0 (2)"), made on first use."""
        uuids = self.stream_uuids[st]
        while len(uuids) <= lane:
            d, label = self.tl.streams[st]
            k = len(uuids)
            uuids.append(self._child(self.device_uuids[d], label if k == 0 else f"{label} ({k + 1})", st * 1024 + k))
        return uuids[lane]

    def write(self) -> None:
        tl = self.tl
        self._host_process("")
        for d, name in enumerate(tl.devices):
            label = f"{name} {tl.descriptions[d]}".strip()
            if not tl.clocks[d].aligned:
                label += " (NOT aligned: relative time)"
            self._process(self.device_uuids[d], device_pid(d), label, _clock_text(tl, d))
        streams = self._scan()
        self.stream_uuids = [[] for _ in tl.streams]
        for st, stream in enumerate(streams):
            self._stream_track(st, 0)
            if not stream.in_order:  # its lanes, now: the metadata names every track
                s, e, _ = self._stream_rows(st)
                self._stream_track(st, int(nesting_lanes(s, e).max(initial=0)))
        host = self._host_plan()
        self._issue_plan()
        canvas = _ProtoCanvas(self)
        for layer in tl.layers:
            layer.draw(tl, canvas)
        draw_counters(tl, canvas)
        canvas.plan()
        self.meta_uuid = self._child(self.processes[""], "asyncgpu")
        self._header(_META_SEQ, None, self.origin, primary=True)
        self._descriptors()
        self._metadata(host)
        for w in row_windows(tl):  # streams whose rows follow one another: a window of rows at a time
            for st, rows in self._by_stream(w):
                if streams[st].in_order:
                    self._in_order(streams[st], st, rows)
        for st, stream in enumerate(streams):
            if not stream.in_order:
                self._stream(st, stream)
        for uuids, rows in host.values():
            self._host_thread(uuids, rows)
        self._issue_tracks()
        canvas.write()

    def _descriptors(self) -> None:
        for t in self.descriptors:
            p = self.pb.TracePacket(trusted_packet_sequence_id=_META_SEQ)
            p.track_descriptor.CopyFrom(t)
            self.builder.write_packet(p)
        self.descriptors = []

    def _by_stream(self, w: slice) -> Iterator[tuple[int, np.ndarray]]:
        """The drawn rows of window ``w``, stream by stream (row order kept)."""
        rows = w.start + np.flatnonzero(drawn(self.tl, w))
        st = self.tl.stream[rows]
        order = np.argsort(st, kind="stable")
        rows, st = rows[order], st[order]
        cuts = np.flatnonzero(np.diff(st)) + 1
        for part in np.split(rows, cuts) if rows.size else ():
            yield int(self.tl.stream[part[0]]), part

    def _times(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and end of ``rows``, whole ns, end >= start."""
        s = np.rint(self.tl.start_ns[rows]).astype(np.int64)
        return s, np.maximum(np.rint(self.tl.end_ns[rows]).astype(np.int64), s)

    def _scan(self) -> list[_Stream]:
        """One pass over the rows, a window at a time: what each stream holds."""
        streams = [_Stream() for _ in self.tl.streams]
        for w in row_windows(self.tl):
            for st, rows in self._by_stream(w):
                stream = streams[st]
                s, e = self._times(rows)
                stream.in_order &= bool(s[0] >= stream.last_end) and in_order(s, e)
                stream.last_end = int(e[-1])
                stream.names.update(np.unique(self.tl.name[rows]).tolist())
                stream.kinds.update(np.unique(self.tl.kind[rows]).tolist())
        return streams

    def _host_plan(self) -> dict[str, tuple[list[int], np.ndarray]]:
        """Per host thread, its track uuids (lanes) and its host ranges' indices."""
        ranges = self.tl.host_ranges
        threads: dict[str, list[int]] = {}
        for i, r in enumerate(ranges):
            threads.setdefault(r.thread, []).append(i)
        plan = {}
        for thread, idx in threads.items():
            process, short = self._host_process(thread)
            rows = np.array(idx, np.int64)
            s = np.array([ranges[i].start_ns for i in idx], np.int64)
            e = np.maximum(np.array([ranges[i].end_ns for i in idx], np.int64), s)
            n = int(nesting_lanes(s, e).max(initial=0)) + 1
            uuids = [self._child(process, short if j == 0 else f"{short} ({j + 1})") for j in range(n)]
            plan[thread] = (uuids, rows)
        return plan

    # the packets
    def _header(self, seq: int, track: int | None, base_ns: int, interned: Any = None, primary: bool = False) -> None:
        """A sequence's first packet: state cleared, its default track and clock, the clock's snapshot at
        ``base_ns`` (host ns), its interned names."""
        pb = self.pb
        p = pb.TracePacket(trusted_packet_sequence_id=seq, timestamp=base_ns, timestamp_clock_id=_MONOTONIC)
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.trace_packet_defaults.timestamp_clock_id = _DELTAS
        if track is not None:
            p.trace_packet_defaults.track_event_defaults.track_uuid = track
        p.clock_snapshot.clocks.add(clock_id=_MONOTONIC, timestamp=base_ns)
        p.clock_snapshot.clocks.add(clock_id=_DELTAS, timestamp=base_ns, is_incremental=True)
        if primary:
            p.clock_snapshot.primary_trace_clock = _MONOTONIC
        if interned is not None:
            p.interned_data.CopyFrom(interned)
        self.builder.write_packet(p)

    def _interned(self, names: Mapping[int, str], categories: Mapping[int, str], args: Mapping[int, str]) -> Any:
        i = self.pb.InternedData()
        for iid, name in names.items():
            i.event_names.add(iid=iid, name=name)
        for iid, name in categories.items():
            i.event_categories.add(iid=iid, name=name)
        for iid, name in args.items():
            i.debug_annotation_names.add(iid=iid, name=name)
        return i

    def _metadata(self, host: Mapping[str, tuple[list[int], np.ndarray]]) -> None:
        """The instants of the "asyncgpu" track: the metadata (with the tracks of the streams' lanes and the
        host threads), and each device's clock."""
        tl = self.tl
        meta = trace_meta(tl, self.origin, HOST_PID, [device_pid(d) for d in range(len(tl.devices))])
        meta["time_base"] = "timestamps: host time.perf_counter_ns() (CLOCK_MONOTONIC on Linux), ns"
        meta["tracks"] = {
            "streams": [[u, st] for st, uuids in enumerate(self.stream_uuids) for u in uuids],
            "threads": [[u, thread] for thread, (uuids, _) in host.items() for u in uuids],
            "issue": [[u, key] for key, (u, _) in self.issue.items()],
        }

        def instant(name: str, annotations: Mapping[str, Any]) -> None:
            p = self.pb.TracePacket(trusted_packet_sequence_id=_META_SEQ, timestamp=0)  # a delta: at the origin
            p.track_event.type = _INSTANT
            p.track_event.track_uuid = self.meta_uuid
            p.track_event.name = name
            for key, value in annotations.items():
                a = p.track_event.debug_annotations.add(name=key)
                if isinstance(value, bool):
                    a.bool_value = value
                elif isinstance(value, int):
                    a.int_value = value
                elif isinstance(value, float):
                    a.double_value = value
                else:
                    a.string_value = str(value)
            self.builder.write_packet(p)

        source = {"source": tl.source, "source_note": tl.source_note}  # where durations come from: events, CUPTI
        instant("asyncgpu trace", {**source, "label": tl.label, _METADATA: json.dumps(meta, allow_nan=False)})
        for c in tl.clocks:
            known = {"bound_ns": c.bound_ns, "offset_ns": c.offset_ns, "drift_ppm": c.drift_ppm}
            values = {k: v for k, v in known.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
            instant(
                f"clock {c.device}",
                {
                    "device": c.device,
                    "aligned": c.aligned,
                    **values,
                    "overhead_ns": c.overhead_ns,
                    "overhead_source": c.overhead_source,
                    "reason": c.reason,
                },
            )

    def _stream_rows(self, st: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All the drawn rows of stream ``st``: start and end (whole ns, end >= start) and the row indices."""
        rows = np.flatnonzero(self.tl.stream == st)
        rows = rows[drawn(self.tl, rows)]
        return (*self._times(rows), rows)

    def _stream_interned(self, stream: _Stream) -> Any:
        tl = self.tl
        names = {k + 1: tl.names[k] for k in sorted(stream.names)}
        return self._interned(names, {k + 1: KINDS[k] for k in sorted(stream.kinds)}, {1: "row", 2: "duration_ns"})

    def _args(self, rows: np.ndarray, s: np.ndarray, e: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray | None]]:
        """The annotations of activity slices: the row; the duration where it differs from the slice by over
        1 ns."""
        dur = self.tl.duration_ns[rows]
        return [(1, rows, None), (2, dur, np.abs(dur - (e - s)) > 1.0)]

    def _in_order(self, stream: _Stream, st: int, rows: np.ndarray) -> None:
        """A window's rows of a stream whose rows follow one another: begin, end, begin, end… on one track."""
        tl = self.tl
        s, e = self._times(rows)
        if not stream.seq:
            stream.seq = next(self._seqs)
            self._header(stream.seq, self._stream_track(st, 0), int(s[0]), self._stream_interned(stream))
            stream.before = int(s[0])
        n = len(rows)
        stream.before = self._events(
            stream.seq,
            np.column_stack((s, e)).ravel(),
            np.tile(np.array([_BEGIN, _END], np.uint8), n),
            np.repeat(np.arange(n), 2),
            tl.name[rows] + 1,
            tl.kind[rows] + 1,
            self._args(rows, s, e),
            None,
            self._flow_in(rows),
            before=stream.before,
        )

    def _stream(self, st: int, stream: _Stream) -> None:
        """All the activities of a stream whose rows nest or overlap, sorted: a sequence per lane."""
        tl = self.tl
        s, e, rows = self._stream_rows(st)
        lanes = nesting_lanes(s, e)
        interned = self._stream_interned(stream)
        for lane, uuid in enumerate(self.stream_uuids[st]):
            sel = np.flatnonzero(lanes == lane)
            r, ls, le = rows[sel], s[sel], e[sel]
            args = self._args(r, ls, le)
            self._sequence(uuid, interned, ls, le, tl.name[r] + 1, tl.kind[r] + 1, args, None, self._flow_in(r))

    def _flow_in(self, rows: np.ndarray) -> np.ndarray:
        """The issue arrow each of ``rows`` (drawn) ends, by flow id (0: none, no issue time)."""
        return np.where(np.isfinite(self.tl.issued_ns[rows]), issue_flow(rows), np.uint64(0))

    def _issue_windows(self) -> Iterator[dict[str, np.ndarray]]:
        """Per window of rows, the rows that get an issue arrow, by host process (in row order)."""
        keys = list(dict.fromkeys(self.device_key))
        code = np.array([keys.index(k) for k in self.device_key] or [0], np.int64)
        for w in row_windows(self.tl):
            rows = issued_rows(self.tl, w)
            of = code[self.tl.device[rows]]
            yield {key: rows[of == k] for k, key in enumerate(keys) if (of == k).any()}

    def _issue_plan(self) -> None:
        """A "host issue" track per host process whose rows have issue times, and whether those rows come in
        time order (then they are written a window at a time, unsorted): one pass over the rows."""
        last: dict[str, float] = {}
        ordered: dict[str, bool] = {}
        for parts in self._issue_windows():
            for key, rows in parts.items():
                at = self.tl.issued_ns[rows]
                ordered[key] = ordered.get(key, True) and bool(at[0] >= last.get(key, -math.inf))
                ordered[key] &= bool(np.all(np.diff(at) >= 0))
                last[key] = float(at[-1])
        for key in dict.fromkeys(self.device_key):
            if key in ordered:
                process, short = self._host_process(f"{key}/{ISSUE_TRACK}" if key else ISSUE_TRACK)
                self.issue[key] = (self._child(process, short), ordered[key])

    def _issue_tracks(self) -> None:
        """The instants of the "host issue" tracks, each with its arrow's flow id: a sequence per track, written
        a window at a time where its rows come in time order, else sorted whole at the end (one pass)."""
        state: dict[str, tuple[int, int]] = {}  # host process -> (sequence, time of its last event)
        unordered: dict[str, list[np.ndarray]] = {key: [] for key, (_, ok) in self.issue.items() if not ok}
        for parts in self._issue_windows():
            for key, rows in parts.items():
                if key in unordered:
                    unordered[key].append(rows)
                else:
                    state[key] = self._issue_events(key, rows, state.get(key))
        for key, chunks in unordered.items():
            rows = np.concatenate(chunks)
            self._issue_events(key, rows[np.argsort(self.tl.issued_ns[rows], kind="stable")], None)

    def _issue_events(self, key: str, rows: np.ndarray, seq: tuple[int, int] | None) -> tuple[int, int]:
        """Instants where ``rows`` (in time order) were issued, on ``key``'s track: its sequence is started when
        ``seq`` is None. Returns the sequence and the time of its last event."""
        tl = self.tl
        at = np.rint(tl.issued_ns[rows]).astype(np.int64)
        if seq is None:
            seq = (next(self._seqs), int(at[0]))
            names = {k + 1: tl.names[k] for k in range(len(tl.names))}
            self._header(seq[0], self.issue[key][0], seq[1], self._interned(names, {1: "issue"}, {}))
        n = len(rows)
        flows = issue_flow(rows)
        kinds = np.full(n, _INSTANT, np.uint8)
        last = self._events(
            seq[0], at, kinds, np.arange(n), tl.name[rows] + 1, np.ones(n, np.int64), [], flows, None, before=seq[1]
        )
        return seq[0], last

    def _host_thread(self, uuids: list[int], idx: np.ndarray) -> None:
        """The host ranges of one thread (``idx``: their indices), a sequence per lane."""
        ranges = [self.tl.host_ranges[i] for i in idx.tolist()]
        s = np.array([r.start_ns for r in ranges], np.int64)
        e = np.maximum(np.array([r.end_ns for r in ranges], np.int64), s)
        lanes = nesting_lanes(s, e)
        names = {n: k + 1 for k, n in enumerate(dict.fromkeys(r.name for r in ranges))}
        kinds = {n: k + 1 for k, n in enumerate(dict.fromkeys(r.kind for r in ranges))}
        name = np.array([names[r.name] for r in ranges], np.uint64)
        kind = np.array([kinds[r.kind] for r in ranges], np.uint64)
        for lane, uuid in enumerate(uuids):
            sel = np.flatnonzero(lanes == lane)
            interned = self._interned({v: k for k, v in names.items()}, {v: k for k, v in kinds.items()}, {1: "row"})
            self._sequence(uuid, interned, s[sel], e[sel], name[sel], kind[sel], [(1, idx[sel], None)])

    def _sequence(
        self,
        track: int,
        interned: Any,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
        name: np.ndarray,
        category: np.ndarray,
        args: Sequence[tuple[int, np.ndarray, np.ndarray | None]],
        flow_out: np.ndarray | None = None,
        flow_in: np.ndarray | None = None,
        instants: tuple[np.ndarray, np.ndarray, np.ndarray, Sequence[tuple[int, np.ndarray, np.ndarray | None]]]
        | None = None,
    ) -> None:
        """A packet sequence for one track: slices from ``start_ns`` to ``end_ns`` (int64 host ns, nesting) with
        interned ``name`` and ``category`` iids and ``args`` (annotation iid, values per slice, where present or
        None for every slice); flows per slice (0: none); ``instants``: (at_ns, name, category, args)."""
        idx, t, typ = _slice_events(start_ns, end_ns)
        n = len(start_ns)
        if instants is not None and len(instants[0]):
            at, i_name, i_cat, i_args = instants
            order = np.argsort(np.concatenate([t, at]), kind="stable")  # slice events keep their order
            idx = np.concatenate([idx, n + np.arange(len(at))])[order]
            t = np.concatenate([t, at])[order]
            typ = np.concatenate([typ, np.full(len(at), _INSTANT, np.uint8)])[order]
            name, category = np.concatenate([name, i_name]), np.concatenate([category, i_cat])
            args = _join_args(args, n, i_args, len(at))
            none = np.zeros(len(at), np.uint64)
            flow_out = None if flow_out is None else np.concatenate([flow_out, none])
            flow_in = None if flow_in is None else np.concatenate([flow_in, none])
        if len(t) == 0:
            return
        seq = next(self._seqs)
        self._header(seq, track, int(t[0]), interned)
        self._events(seq, t, typ, idx, name, category, args, flow_out, flow_in)

    def counter_sequence(self, track: int, at_ns: np.ndarray, values: np.ndarray) -> None:
        """A packet sequence for one counter track."""
        if len(at_ns) == 0:
            return
        seq = next(self._seqs)
        self._header(seq, track, int(at_ns[0]))
        n = len(at_ns)
        none = np.zeros(n, np.uint64)
        self._events(seq, at_ns, np.full(n, _COUNTER, np.uint8), np.arange(n), none, none, [], None, None, values)

    def _events(
        self,
        seq: int,
        t: np.ndarray,
        typ: np.ndarray,
        idx: np.ndarray,
        name: np.ndarray,
        category: np.ndarray,
        args: Sequence[tuple[int, np.ndarray, np.ndarray | None]],
        flow_out: np.ndarray | None,
        flow_in: np.ndarray | None,
        value: np.ndarray | None = None,
        before: int | None = None,
    ) -> int:
        """The events of a sequence, encoded a chunk at a time: event ``k`` at ``t[k]`` (host ns,
        non-decreasing), of type ``typ[k]``, of item ``idx[k]`` (the other arrays are per item; begins and
        instants carry its name, category, args and flows). ``before``: the time of the sequence's previous
        event (default: its snapshot, at ``t[0]``). Returns the time of the last event."""
        before = int(t[0]) if before is None else before
        for lo in range(0, len(t), _CHUNK_EVENTS):
            c = slice(lo, lo + _CHUNK_EVENTS)
            at, i, kinds = t[c], idx[c], typ[c]
            dt = np.diff(at, prepend=before).astype(np.uint64)
            before = at[-1]
            opens = kinds != _END
            item = functools.partial(_opening, opens, i)
            picked = [(iid, v[i], opens if p is None else opens & p[i]) for iid, v, p in args]
            self.f.write(
                _packets(
                    seq,
                    dt,
                    kinds,
                    item(name),
                    item(category),
                    picked,
                    item(flow_out),
                    item(flow_in),
                    None if value is None else value[i],
                )
            )
        return int(before)


def _opening(opens: np.ndarray, i: np.ndarray, values: np.ndarray | None) -> Any:
    """``values[i]`` (as uint64) where ``opens``, else 0; None for None."""
    return None if values is None else np.where(opens, values[i], 0).astype(np.uint64)


def _clock_text(tl: Timeline, d: int) -> str:
    """How device ``d``'s times were placed, in words (a process description)."""
    c = tl.clocks[d]
    if not c.aligned:
        return f"clock NOT aligned to the host ({c.reason}): times relative to its own scope start"
    parts = [f"clock aligned to the host within ±{c.bound_ns:.0f} ns"]
    if c.offset_ns is not None:
        parts.append(f"%globaltimer offset {c.offset_ns} ns")
    if c.drift_ppm is not None and math.isfinite(c.drift_ppm):
        parts.append(f"drift {c.drift_ppm:.3f} ppm")
    parts.append(
        f"event-pair overhead taken out {c.overhead_ns:.0f} ns"
        + (f" (measured {c.overhead_source})" if c.overhead_source else "")
    )
    return ", ".join(parts) + f"; durations from {tl.source}"


def _join_args(
    a: Sequence[tuple[int, np.ndarray, np.ndarray | None]],
    n: int,
    b: Sequence[tuple[int, np.ndarray, np.ndarray | None]],
    m: int,
) -> list[tuple[int, np.ndarray, np.ndarray | None]]:
    """The args of ``n`` slices followed by those of ``m`` instants (by annotation iid)."""
    out: list[tuple[int, np.ndarray, np.ndarray | None]] = []
    for iid in dict.fromkeys([i for i, _, _ in a] + [i for i, _, _ in b]):
        parts = []
        for items, k in ((a, n), (b, m)):
            hit = [(v, p) for i, v, p in items if i == iid]
            v, p = hit[0] if hit else (np.zeros(k), np.zeros(k, bool))
            parts.append((v, np.ones(k, bool) if p is None else p))
        dtype = np.result_type(parts[0][0], parts[1][0])
        out.append((iid, np.concatenate([v.astype(dtype) for v, _ in parts]), np.concatenate([p for _, p in parts])))
    return out


def _slice_events(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Begin and end events of nesting slices in the order a track must see them: (slice index, time, type).
    Disjoint slices (the common case) alternate begin, end; otherwise, at one time, ends come first (innermost
    first), then begins (outermost first), a zero-length slice's end right after its begin."""
    n = len(start_ns)
    # by start, the longer first (parents first); no sort for slices that follow one another already
    order = np.arange(n) if in_order(start_ns, end_ns) else np.lexsort((start_ns - end_ns, start_ns))
    s, e = start_ns[order], end_ns[order]
    if n < 2 or bool(np.all(e[:-1] <= s[1:])):
        return np.repeat(order, 2), np.column_stack((s, e)).ravel(), np.tile(np.array([_BEGIN, _END], np.uint8), n)
    rank = np.arange(n)
    t = np.concatenate([s, e])
    key = np.concatenate([rank, np.where(e == s, rank, -1 - rank)])  # at one time: ends (innermost first), begins
    sub = np.repeat(np.array([0, 1], np.int8), n)  # a zero-length slice: its begin, then its end
    perm = np.lexsort((sub, key, t))
    typ = np.repeat(np.array([_BEGIN, _END], np.uint8), n)
    return np.concatenate([order, order])[perm], t[perm], typ[perm]


class _ProtoCanvas:
    """The `asyncgpu._base.layers.Canvas` of a Perfetto trace: tracks and items are kept (layers and counters are
    small) until `plan` makes their descriptors and `write` their sequences."""

    def __init__(self, writer: _Writer) -> None:
        self.w = writer
        self.tracks: list[tuple[int | None, str, int | None]] = []  # (device, name, parent handle)
        self.items: list[list[tuple]] = []
        self.counters: list[tuple[int | None, str, np.ndarray, np.ndarray, str]] = []
        self.uuids: list[list[int]] = []  # per track: a uuid per lane
        self.counter_uuids: list[int] = []
        self._flows = len(writer.tl)  # (the issue arrows' ids come first)

    def track(self, name: str, device: int | None, parent: int | None = None) -> int:
        self.tracks.append((device, name, parent))
        self.items.append([])
        return len(self.tracks) - 1

    def slices(
        self,
        track: int,
        names: Sequence[str],
        name: np.ndarray,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
        category: str,
        args: Mapping[str, np.ndarray] | None = None,
        flow_out: np.ndarray | None = None,
        flow_in: np.ndarray | None = None,
    ) -> None:
        n = len(start_ns)
        s = np.rint(np.asarray(start_ns, np.float64)).astype(np.int64)
        e = np.maximum(np.rint(np.asarray(end_ns, np.float64)).astype(np.int64), s)
        none = np.zeros(n, np.uint64)
        out = none if flow_out is None else np.asarray(flow_out, np.uint64)
        into = none if flow_in is None else np.asarray(flow_in, np.uint64)
        self.items[track].append((list(names), np.asarray(name), s, e, category, dict(args or {}), out, into))

    def instants(
        self,
        track: int,
        names: Sequence[str],
        name: np.ndarray,
        at_ns: np.ndarray,
        category: str,
        args: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        t = np.rint(np.asarray(at_ns, np.float64)).astype(np.int64)
        self.items[track].append((list(names), np.asarray(name), t, None, category, dict(args or {}), None, None))

    def counter(self, name: str, device: int | None, at_ns: np.ndarray, values: np.ndarray, unit: str) -> None:
        t = np.rint(np.asarray(at_ns, np.float64)).astype(np.int64)
        self.counters.append((device, name, t, np.asarray(values, np.float64), unit))

    def flow(self) -> int:
        self._flows += 1
        return self._flows

    def _parent(self, device: int | None) -> int:
        return self.w.processes[""] if device is None else self.w.device_uuids[device]

    def plan(self) -> None:
        """The descriptors: a track per lane of each track (slices that overlap without nesting), counters."""
        pb, w = self.w.pb, self.w
        for (device, name, parent), items in zip(self.tracks, self.items):
            spans = [it for it in items if it[3] is not None]
            s = np.concatenate([np.zeros(0, np.int64)] + [it[2] for it in spans])
            e = np.concatenate([np.zeros(0, np.int64)] + [it[3] for it in spans])
            n = int(nesting_lanes(s, e).max(initial=0)) + 1
            up = self.uuids[parent][0] if parent is not None else self._parent(device)
            self.uuids.append([w._child(up, name if j == 0 else f"{name} ({j + 1})") for j in range(n)])
        for device, name, _, _, unit in self.counters:
            t = pb.TrackDescriptor(uuid=next(w._uuids), parent_uuid=self._parent(device), name=name)
            t.sibling_order_rank = next(w._ranks)
            if unit == "count":
                t.counter.unit = pb.CounterDescriptor.UNIT_COUNT
            else:
                t.counter.unit_name = unit
            w.descriptors.append(t)
            self.counter_uuids.append(int(t.uuid))

    def write(self) -> None:
        """The sequences: slices and instants of each track (a sequence per lane), then the counters."""
        for uuids, items in zip(self.uuids, self.items):
            if items:
                self._track(uuids, items)
        for uuid, (_, _, t, values, _) in zip(self.counter_uuids, self.counters):
            self.w.counter_sequence(uuid, t, values)

    def _track(self, uuids: list[int], items: list[tuple]) -> None:
        """One track's slices (a sequence per lane) and instants (on the first lane), names interned."""
        names: dict[str, int] = {}
        cats: dict[str, int] = {}
        arg_iids: dict[str, int] = {}
        for it in items:
            for key in it[5]:
                arg_iids.setdefault(key, len(arg_iids) + 1)
        spans = [it for it in items if it[3] is not None]
        points = [it for it in items if it[3] is None]

        def iids(group: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
            name = [np.array([names.setdefault(x, len(names) + 1) for x in it[0]], np.uint64)[it[1]] for it in group]
            cat = [np.full(len(it[2]), cats.setdefault(it[4], len(cats) + 1), np.uint64) for it in group]
            return _cat(name, np.uint64), _cat(cat, np.uint64)

        s_name, s_cat = iids(spans)
        i_name, i_cat = iids(points)
        s, e = _cat([it[2] for it in spans], np.int64), _cat([it[3] for it in spans], np.int64)
        out, into = _cat([it[6] for it in spans], np.uint64), _cat([it[7] for it in spans], np.uint64)
        slice_args, instant_args = _ArgColumns(arg_iids, spans), _ArgColumns(arg_iids, points)
        interned = self.w._interned(
            {v: k for k, v in names.items()}, {v: k for k, v in cats.items()}, {v: k for k, v in arg_iids.items()}
        )
        lanes = nesting_lanes(s, e)
        instants = (_cat([it[2] for it in points], np.int64), i_name, i_cat, instant_args.select(slice(None)))
        for lane, uuid in enumerate(uuids):
            sel = np.flatnonzero(lanes == lane)
            self.w._sequence(
                uuid,
                interned,
                s[sel],
                e[sel],
                s_name[sel],
                s_cat[sel],
                slice_args.select(sel),
                out[sel],
                into[sel],
                instants if lane == 0 else None,
            )


class _ArgColumns:
    """The args of several items of one track as one column per annotation (NaN or absent: not present)."""

    def __init__(self, iids: Mapping[str, int], items: list[tuple]) -> None:
        sizes = [len(it[2]) for it in items]
        self.columns: list[tuple[int, np.ndarray, np.ndarray]] = []
        for key, iid in iids.items():
            values, present = [], []
            for it, n in zip(items, sizes):
                v = it[5].get(key)
                if v is None:
                    values.append(np.zeros(n, np.int64))
                    present.append(np.zeros(n, bool))
                else:
                    v = np.asarray(v)
                    values.append(v)
                    present.append(~np.isnan(v) if v.dtype.kind == "f" else np.ones(n, bool))
            if values:
                kinds = {v.dtype.kind for v, p in zip(values, present) if p.any()}
                dtype = np.float64 if "f" in kinds else np.int64
                self.columns.append((iid, _cat(values, dtype), _cat(present, bool)))

    def select(self, sel: Any) -> list[tuple[int, np.ndarray, np.ndarray | None]]:
        return [(iid, v[sel], p[sel]) for iid, v, p in self.columns]


def _cat(parts: list, dtype: Any) -> np.ndarray:
    return np.concatenate([np.zeros(0, dtype)] + [np.asarray(p).astype(dtype) for p in parts])


# -- the wire format, column-wise ----------------------------------------------------------------------------------
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Protobuf varints of uint64 ``values``: their bytes (one row each, as wide as the longest) and lengths
    (None: one byte each, the common case of small ids)."""
    v = np.asarray(values, np.uint64)
    if not v.size or int(v.max()) < 0x80:
        return v.astype(np.uint8).reshape(-1, 1), None
    lengths = (np.searchsorted(_VARINT_LIMITS, v, side="right") + 1).astype(np.int32)
    width = int(lengths.max())
    out = np.empty((len(v), width), np.uint8)
    for k in range(width):
        out[:, k] = (v >> np.uint64(7 * k)).astype(np.uint8) | 0x80
    out[np.arange(len(v)), lengths - 1] &= 0x7F
    return out, lengths


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class _Columns:
    """Many protobuf messages of one shape, built field by field as columns of bytes: piece ``k`` of message
    ``i`` is the first ``lengths[k][i]`` bytes of row ``i`` of ``pieces[k]`` (all of it where ``lengths[k]`` is
    None); a message is its pieces in order. A piece is a field's tag and value together."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pieces: list[np.ndarray] = []  # (n, width) uint8, or (width,): the same bytes in every message
        self.lengths: list[np.ndarray | None] = []

    def _add(self, piece: np.ndarray, lengths: np.ndarray | None, present: np.ndarray | None) -> None:
        if present is not None:
            lengths = (np.full(self.n, piece.shape[-1], np.int32) if lengths is None else lengths) * present
        self.pieces.append(piece)
        self.lengths.append(lengths)

    def const(self, data: bytes, present: np.ndarray | None = None) -> None:
        """The same bytes in every message (where ``present``)."""
        self._add(np.frombuffer(data, np.uint8), None, present)

    def varint(self, tag: bytes, values: np.ndarray, present: np.ndarray | None = None) -> None:
        """A varint field: its ``tag`` and one value per message (where ``present``)."""
        piece, lengths = _varints(values)
        head = np.broadcast_to(np.frombuffer(tag, np.uint8), (self.n, len(tag)))
        self._add(np.hstack((head, piece)), None if lengths is None else lengths + len(tag), present)

    def fixed64(self, tag: bytes, values: np.ndarray, present: np.ndarray | None = None) -> None:
        """A fixed64 field: its ``tag`` and doubles or uint64s, 8 bytes little-endian."""
        v = np.ascontiguousarray(values, "<f8" if values.dtype.kind == "f" else "<u8")
        head = np.broadcast_to(np.frombuffer(tag, np.uint8), (self.n, len(tag)))
        self._add(np.hstack((head, v.view(np.uint8).reshape(self.n, 8))), None, present)

    def message(self, tag: bytes, inner: _Columns, present: np.ndarray | None = None) -> None:
        """A length-delimited field holding ``inner``."""
        self.varint(tag, inner.size(), present)
        self.pieces += inner.pieces
        self.lengths += inner.lengths if present is None else [_lengths_where(n, p, present) for p, n in inner._sized()]

    def _sized(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        return zip(self.pieces, self.lengths)

    def size(self) -> np.ndarray:
        """Each message's length in bytes."""
        total = np.zeros(self.n, np.int64)
        for piece, lengths in self._sized():
            total += piece.shape[-1] if lengths is None else lengths
        return total

    def tobytes(self) -> bytes:
        """The messages, one after another."""
        width = sum(p.shape[-1] for p in self.pieces)
        matrix = np.empty((self.n, width), np.uint8)
        keep = np.empty((self.n, width), bool)
        at = 0
        for piece, lengths in self._sized():
            w = piece.shape[-1]
            matrix[:, at : at + w] = piece
            keep[:, at : at + w] = True if lengths is None else np.arange(w) < lengths[:, None]
            at += w
        return matrix[keep].tobytes()


def _lengths_where(lengths: np.ndarray | None, piece: np.ndarray, present: np.ndarray) -> np.ndarray:
    """A piece's lengths where ``present``, 0 elsewhere."""
    return (np.full(len(present), piece.shape[-1], np.int32) if lengths is None else lengths) * present


def _packets(
    seq: int,
    dt: np.ndarray,
    typ: np.ndarray,
    name: np.ndarray,
    category: np.ndarray,
    args: Sequence[tuple[int, np.ndarray, np.ndarray]],
    flow_out: np.ndarray | None,
    flow_in: np.ndarray | None,
    value: np.ndarray | None,
) -> bytes:
    """``Trace.packet`` fields (tag 1), one per event: ``TracePacket{timestamp: dt, trusted_packet_sequence_id:
    seq, track_event: TrackEvent{type, name_iid, category_iids, debug_annotations, flow_ids,
    terminating_flow_ids, double_counter_value}}``; zero iids, ids and absent args are left out."""
    n = len(dt)
    te = _Columns(n)
    te.varint(b"\x48", typ)  # type (9)
    if name.any():
        te.varint(b"\x50", name, name > 0)  # name_iid (10)
    if category.any():
        te.varint(b"\x18", category, category > 0)  # category_iids (3)
    for iid, values, present in args:
        if not present.any():
            continue
        a = _Columns(n)
        a.const(b"\x08" + _varint(iid))  # DebugAnnotation.name_iid (1)
        if values.dtype.kind == "f":
            a.fixed64(b"\x29", values)  # double_value (5)
        else:
            a.varint(b"\x20", np.asarray(values, np.int64).view(np.uint64))  # int_value (4)
        te.message(b"\x22", a, present)  # debug_annotations (4)
    for tag, ids in ((b"\xf9\x02", flow_out), (b"\x81\x03", flow_in)):  # flow_ids (47), terminating_flow_ids (48)
        if ids is not None and ids.any():
            te.fixed64(tag, ids, ids > 0)
    if value is not None:
        te.fixed64(b"\xe1\x02", np.asarray(value, np.float64))  # double_counter_value (44)
    packet = _Columns(n)
    packet.varint(b"\x40", dt)  # timestamp (8)
    packet.const(b"\x50" + _varint(seq))  # trusted_packet_sequence_id (10)
    packet.message(b"\x5a", te)  # track_event (11)
    out = _Columns(n)
    out.message(b"\x0a", packet)  # Trace.packet (1)
    return out.tobytes()


# -- reading -------------------------------------------------------------------------------------------------------
def read_perfetto(data: bytes, path: str | os.PathLike) -> Timeline:
    """The `Timeline` of a Perfetto trace `write_perfetto` wrote (``data``: the file's bytes), layers included.
    Raises `ValueError` ("not an asyncgpu trace: ...") for other or corrupt files."""
    try:
        return _read(data)
    except _NotOurs as exc:
        raise ValueError(f"not an asyncgpu trace: {path} {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ValueError(f"not an asyncgpu trace: {path} is corrupt ({type(exc).__name__}: {exc})") from None


class _NotOurs(Exception):
    """A file that is not a trace written by asyncgpu (the message says why)."""


class _Field:
    """One field number's occurrences in many messages: ``msg``, the message of each; ``value``, a varint or
    fixed value, or where a length-delimited one starts; ``end``, where that one ends (-1 for the others)."""

    __slots__ = ("msg", "value", "end")

    def __init__(self, msg: np.ndarray, value: np.ndarray, end: np.ndarray) -> None:
        self.msg, self.value, self.end = msg, value, end

    def sub(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each length-delimited occurrence lies: (start, end)."""
        return self.value.astype(np.int64), self.end

    def per_message(self, n: int, default: int = 0) -> np.ndarray:
        """The value per message (the last occurrence wins, as protobuf's), ``default`` where absent."""
        out = np.full(n, default, np.uint64)
        out[self.msg] = self.value
        return out


_NO_FIELD = _Field(np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64))


def _read_varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints at ``pos``: (values, lengths in bytes)."""
    first = buf[pos]
    value = first.astype(np.uint64)
    length = np.ones(len(pos), np.int64)
    more = np.flatnonzero(first >= 0x80)
    k = 1
    while more.size:
        if k == 10:
            raise ValueError("a varint longer than 10 bytes")
        value[more] &= ~np.uint64(0x80 << (7 * (k - 1)))  # drop the continuation bit just read
        b = buf[pos[more] + k]
        value[more] |= b.astype(np.uint64) << np.uint64(7 * k)
        length[more] += 1
        more = more[b >= 0x80]
        k += 1
    return value, length


def _decode(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[int, _Field]:
    """The fields of the messages at ``[start, end)`` of ``buf``, all messages at once, one field per pass."""
    stop = np.asarray(end, np.int64)
    msg, cur = np.arange(len(stop)), np.asarray(start, np.int64)
    first = np.flatnonzero(cur < stop)
    msg, cur = msg[first], cur[first]
    found: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    while msg.size:
        tag, k = _read_varints(buf, cur)
        field, wire, pos = (tag >> np.uint64(3)).astype(np.int64), (tag & np.uint64(7)).astype(np.int8), cur + k
        if ((wire == 3) | (wire == 4) | (wire > 5)).any():
            raise ValueError("a field of an unknown wire type")
        value, until, nxt = np.zeros(len(msg), np.uint64), np.full(len(msg), -1, np.int64), pos.copy()
        for kind, size in ((0, 0), (2, 0), (1, 8), (5, 4)):
            m = np.flatnonzero(wire == kind)
            if not m.size:
                continue
            at = pos[m]
            if kind == 0:
                value[m], k = _read_varints(buf, at)
                nxt[m] += k
            elif kind == 2:
                length, k = _read_varints(buf, at)
                value[m] = at + k
                until[m] = nxt[m] = at + k + length.astype(np.int64)
            else:
                raw = np.ascontiguousarray(buf[at[:, None] + np.arange(size)])
                value[m] = raw.view("<u8" if size == 8 else "<u4").ravel()
                nxt[m] += size
        if (nxt > stop[msg]).any():
            raise ValueError("a field runs past the end of its message")
        for f in np.flatnonzero(np.bincount(field)).tolist():
            sel = np.flatnonzero(field == f)
            found.setdefault(f, []).append((msg[sel], value[sel], until[sel]))
        live = np.flatnonzero(nxt < stop[msg])
        msg, cur = msg[live], nxt[live]
    return {f: _Field(*(np.concatenate(c) for c in zip(*parts))) for f, parts in found.items()}


def _frames(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Where the ``Trace.packet`` fields of ``data`` lie: (start, end) of each packet's bytes."""
    starts, ends = [], []
    pos, n = 0, len(data)
    while pos < n:
        if data[pos] != 0x0A:
            raise _NotOurs(f"is not a Perfetto trace (byte {pos} starts no packet)")
        length = data[pos + 1]
        pos += 2
        if length >= 0x80:  # a length of more than one byte
            length, shift = length & 0x7F, 7
            while data[pos - 1] >= 0x80:
                length |= (data[pos] & 0x7F) << shift
                shift += 7
                pos += 1
        starts.append(pos)
        pos += length
        ends.append(pos)
    if pos != n:
        raise ValueError("the last packet is cut short")
    return np.array(starts, np.int64), np.array(ends, np.int64)


def _strings(data: bytes, field: _Field) -> list[str]:
    start, end = field.sub()
    return [data[a:b].decode("utf-8") for a, b in zip(start.tolist(), end.tolist())]


def _interned(data: bytes, buf: np.ndarray, entries: _Field, owner: np.ndarray) -> dict[int, str]:
    """Interned entries (``iid`` 1, ``name`` 2) by `_key` (owner sequence, iid); ``owner`` per entry."""
    f = _decode(buf, *entries.sub())
    iids = f.get(1, _NO_FIELD).per_message(len(entries.msg)).astype(np.int64)
    names = [""] * len(entries.msg)
    if 2 in f:
        for i, text in zip(f[2].msg.tolist(), _strings(data, f[2])):
            names[i] = text
    return dict(zip(_key(owner, iids).tolist(), names))


def _key(seq: np.ndarray, iid: np.ndarray) -> np.ndarray:
    """One int64 per (sequence, interned id)."""
    return (np.asarray(seq, np.int64) << 32) | np.asarray(iid, np.int64)


def _lookup(keys: np.ndarray, table: Mapping[int, Any], dtype: Any = object) -> np.ndarray:
    """``table[k]`` for each of ``keys`` (looked up once per distinct key); `KeyError` for one it lacks."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    values = np.empty(len(distinct), dtype)
    values[:] = [table[k] for k in distinct.tolist()]
    return values[inverse.reshape(-1)]


def _read(data: bytes) -> Timeline:
    if not data:
        raise _NotOurs("is empty")
    buf = np.frombuffer(data + bytes(16), np.uint8)  # padded: a varint read past a cut end reads zeros
    start, end = _frames(data)
    n = len(start)
    top = _decode(buf, start, end)
    seq = top.get(10, _NO_FIELD).per_message(n).astype(np.int64)
    n_seq = int(seq.max(initial=0)) + 1
    # per sequence: its default track and clock, and its incremental clock's value at the snapshot
    seq_track, seq_clock, seq_base = (np.zeros(n_seq, np.int64) for _ in range(3))
    defaults = top.get(59, _NO_FIELD)
    d = _decode(buf, *defaults.sub())
    if 58 in d:
        seq_clock[seq[defaults.msg[d[58].msg]]] = d[58].value
    if 11 in d:
        event_defaults = _decode(buf, *d[11].sub())
        if 11 in event_defaults:
            seq_track[seq[defaults.msg[d[11].msg[event_defaults[11].msg]]]] = event_defaults[11].value
    snaps = top.get(6, _NO_FIELD)
    clocks = _decode(buf, *snaps.sub()).get(1, _NO_FIELD)
    c = _decode(buf, *clocks.sub())
    k = np.flatnonzero(c.get(1, _NO_FIELD).per_message(len(clocks.msg)) == _DELTAS)
    seq_base[seq[snaps.msg[clocks.msg[k]]]] = c.get(2, _NO_FIELD).per_message(len(clocks.msg))[k]
    interned = top.get(12, _NO_FIELD)
    idata = _decode(buf, *interned.sub())
    owner = seq[interned.msg]
    categories, event_names, arg_names = (
        _interned(data, buf, idata[f], owner[idata[f].msg]) if f in idata else {} for f in (1, 2, 3)
    )
    # times: each sequence's packets count deltas of its incremental clock from its snapshot, in file order
    stamped = top.get(8, _NO_FIELD)
    ts = stamped.per_message(n).astype(np.int64)
    has_ts = np.zeros(n, bool)
    has_ts[stamped.msg] = True
    explicit = np.zeros(n, bool)
    explicit[top.get(58, _NO_FIELD).msg] = True
    delta = has_ts & ~explicit & (seq_clock[seq] == _DELTAS)
    rows = np.flatnonzero(delta)
    order = rows[np.argsort(seq[rows], kind="stable")]
    sums = np.cumsum(ts[order])
    first = np.flatnonzero(np.diff(seq[order], prepend=-1))
    before = np.repeat(sums[first] - ts[order][first], np.diff(np.append(first, len(order))))
    when = np.where(has_ts, ts, -1)
    when[order] = seq_base[seq[order]] + sums - before
    # track events: type, name, category, track, and the "row" and "duration_ns" annotations
    events = top.get(11, _NO_FIELD)
    packet = events.msg
    m = len(packet)
    te = _decode(buf, *events.sub())
    typ = te.get(9, _NO_FIELD).per_message(m).astype(np.int64)
    name_iid = te.get(10, _NO_FIELD).per_message(m).astype(np.int64)
    cat_iid = te.get(3, _NO_FIELD).per_message(m).astype(np.int64)
    track = seq_track[seq[packet]]
    explicit_track = te.get(11, _NO_FIELD)
    track[explicit_track.msg] = explicit_track.value.astype(np.int64)
    ann = te.get(4, _NO_FIELD)
    a = _decode(buf, *ann.sub())
    iid = a.get(1, _NO_FIELD).per_message(len(ann.msg)).astype(np.int64)
    ann_name = _lookup(_key(seq[packet[ann.msg]], iid), {**arg_names, **_unnamed(seq)})
    if 10 in a:
        ann_name[a[10].msg] = _strings(data, a[10])
    meta = _metadata(data, a, ann_name)
    row, duration = np.full(m, -1, np.int64), np.full(m, np.nan)
    k = np.flatnonzero(ann_name == "row")
    row[ann.msg[k]] = a.get(4, _NO_FIELD).per_message(len(ann.msg)).view(np.int64)[k]
    k = np.flatnonzero(ann_name == "duration_ns")
    duration[ann.msg[k]] = a.get(5, _NO_FIELD).per_message(len(ann.msg)).view(np.float64)[k]
    # slices: begins and ends paired per sequence (each track of ours is a sequence of its own)
    b, e = _pairs(seq[packet], typ)
    s_ns, e_ns = when[packet[b]], when[packet[e]]
    slice_track, slice_seq = track[b], seq[packet[b]]
    uuids = int(track.max(initial=0)) + 1
    stream_of, thread_of = np.full(uuids, -1, np.int64), np.full(uuids, -1, np.int64)
    stream_uuids = np.array([u for u, _ in meta["tracks"]["streams"]], np.int64).reshape(-1)
    stream_of[stream_uuids] = [st for _, st in meta["tracks"]["streams"]]
    threads = [th for _, th in meta["tracks"]["threads"]]
    thread_of[np.array([u for u, _ in meta["tracks"]["threads"]], np.int64).reshape(-1)] = np.arange(len(threads))
    on = np.flatnonzero(stream_of[slice_track] >= 0)
    name_code = {nm: i for i, nm in enumerate(meta["names"])}
    keys = _key(slice_seq[on], name_iid[b][on])
    dur = np.where(np.isnan(duration[b][on]), (e_ns - s_ns)[on], duration[b][on])
    host = np.flatnonzero(thread_of[slice_track] >= 0)
    host_names = _lookup(_key(slice_seq[host], name_iid[b][host]), event_names)
    host_kinds = _lookup(_key(slice_seq[host], cat_iid[b][host]), categories)
    ranges = [
        HostRange(nm, kd, int(s), int(e), threads[t])
        for nm, kd, s, e, t in zip(
            host_names.tolist(),
            host_kinds.tolist(),
            s_ns[host].tolist(),
            e_ns[host].tolist(),
            thread_of[slice_track[host]].tolist(),
        )
    ]
    return timeline_from(
        meta,
        row[b][on],
        stream_of[slice_track[on]].astype(np.int32),
        np.array(_lookup(keys, {k: name_code[v] for k, v in event_names.items() if v in name_code}), np.int32),
        np.array(
            _lookup(_key(slice_seq[on], cat_iid[b][on]), {k: KIND_CODES.get(v, -1) for k, v in categories.items()}),
            np.int8,
        ),
        s_ns[on].astype(np.float64),
        e_ns[on].astype(np.float64),
        dur,
        [ranges[i] for i in np.argsort(row[b][host], kind="stable").tolist()],
        _issued(meta, te, typ, track, when[packet]),
    )


def _issued(
    meta: Mapping[str, Any], te: dict[int, _Field], typ: np.ndarray, track: np.ndarray, when: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, issue times)`` from the instants of the "host issue" tracks: each one's flow id is its row + 1."""
    issue = np.array([u for u, _ in meta["tracks"].get("issue", ())], np.int64)
    flows = te.get(47, _NO_FIELD)  # flow_ids
    on = np.isin(track[flows.msg], issue) & (typ[flows.msg] == _INSTANT)
    return flows.value[on].astype(np.int64) - 1, when[flows.msg[on]].astype(np.float64)


def _unnamed(seq: np.ndarray) -> dict[int, str]:
    """Annotations named by a string, not an interned id (iid 0), look up as "" (their names come after)."""
    sequences = np.unique(seq)
    return dict.fromkeys(_key(sequences, np.zeros_like(sequences)).tolist(), "")


def _metadata(data: bytes, a: dict[int, _Field], ann_name: np.ndarray) -> dict:
    """The metadata of `asyncgpu._trace.common` from the debug annotation that holds it; `_NotOurs` without one,
    `ValueError` for a version this reader does not read."""
    from asyncgpu._trace.common import TRACE_VERSION

    values = a.get(6, _NO_FIELD)
    for k, text in zip(values.msg.tolist(), _strings(data, values)):
        if ann_name[k] == _METADATA:
            meta = json.loads(text)
            break
    else:
        raise _NotOurs("has no asyncgpu metadata (it was not written by asyncgpu.write_trace)")
    version = meta.get("asyncgpu_trace_version")
    if version != TRACE_VERSION:
        raise _NotOurs(
            f"is trace version {version}, this asyncgpu reads version {TRACE_VERSION}: use the asyncgpu that wrote it"
        )
    return meta


def _pairs(seq: np.ndarray, typ: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each slice's begin and end event (indices), matched per sequence by nesting depth: at one depth of one
    sequence, begins and ends alternate. Raises `ValueError` when they do not (a corrupt track)."""
    spans = np.flatnonzero((typ == _BEGIN) | (typ == _END))
    order = spans[np.argsort(seq[spans], kind="stable")]
    step = np.where(typ[order] == _BEGIN, 1, -1)
    first = np.flatnonzero(np.diff(seq[order], prepend=-1))
    depth = np.cumsum(step)
    depth -= np.repeat(depth[first] - step[first], np.diff(np.append(first, len(order))))
    level = np.where(step > 0, depth - 1, depth)
    grouped = order[np.lexsort((np.arange(len(order)), level, seq[order]))]
    begins, ends = grouped[0::2], grouped[1::2]
    if len(begins) != len(ends) or (typ[begins] != _BEGIN).any() or (typ[ends] != _END).any():
        raise ValueError("slice begins and ends do not pair up")
    if (seq[begins] != seq[ends]).any():
        raise ValueError("a slice ends on another sequence")
    return begins, ends


# -- streamed packets (`asyncgpu._timing.step_trace`) -------------------------------------------------------------
# A trace file is the fields of a top-level ``Trace`` message, each a ``TracePacket`` (tag 1): appending packets
# keeps the file a valid trace at every packet boundary, so a file being written can be opened (or copied) at any
# time and holds every packet flushed so far. Timestamps are absolute, on CLOCK_MONOTONIC (`_MONOTONIC`).
def _field(tag: int, data: bytes) -> bytes:
    return _varint(tag << 3 | 2) + _varint(len(data)) + data


def _vfield(tag: int, value: int) -> bytes:
    return _varint(tag << 3) + _varint(value)


def stream_header(seq: int, at_ns: int, tracks: Sequence[tuple[int, int, str]]) -> bytes:
    """The packets that open a streamed trace: a ``ClockSnapshot`` that makes CLOCK_MONOTONIC the trace's clock
    (at ``at_ns``), then a ``TrackDescriptor`` per ``(uuid, parent uuid or 0, name)``."""
    clock = _field(1, _vfield(1, _MONOTONIC) + _vfield(2, at_ns)) + _vfield(2, _MONOTONIC)  # clocks, primary
    out = [_field(1, _vfield(8, at_ns) + _vfield(58, _MONOTONIC) + _vfield(10, seq) + _field(6, clock))]
    for uuid, parent, name in tracks:
        desc = _vfield(1, uuid) + _field(2, name.encode()) + (_vfield(5, parent) if parent else b"")
        out.append(_field(1, _vfield(10, seq) + _field(60, desc)))
    return b"".join(out)


def stream_slices(seq: int, track: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray, step: np.ndarray) -> bytes:
    """A slice per row on track uuid ``track``: a ``TYPE_SLICE_BEGIN`` (name "step", debug annotation ``step``)
    and a ``TYPE_SLICE_END`` packet, absolute CLOCK_MONOTONIC timestamps (ns), encoded column-wise (`_Columns`).
    Rows whose times are not finite are left out."""
    ok = np.isfinite(start_ns) & np.isfinite(end_ns)
    track, step = np.asarray(track, np.uint64)[ok], np.asarray(step, np.int64)[ok]
    s = np.rint(start_ns[ok]).astype(np.int64)
    e = np.maximum(np.rint(end_ns[ok]).astype(np.int64), s)
    n = 2 * len(s)
    if not n:
        return b""
    begin = np.arange(n) % 2 == 0
    ts = np.empty(n, np.int64)
    ts[0::2], ts[1::2] = s, e
    te = _Columns(n)
    te.varint(b"\x48", np.where(begin, 1, 2))  # type (9): SLICE_BEGIN 1, SLICE_END 2
    te.varint(b"\x58", np.repeat(track, 2))  # track_uuid (11)
    te.const(_field(23, b"step"), begin)  # name (23)
    ann = _Columns(n)
    ann.const(_field(10, b"step"))  # DebugAnnotation.name (10)
    ann.varint(b"\x20", np.repeat(step, 2).view(np.uint64))  # int_value (4)
    te.message(b"\x22", ann, begin)  # debug_annotations (4)
    packet = _Columns(n)
    packet.varint(b"\x40", ts.view(np.uint64))  # timestamp (8)
    packet.const(_vfield(58, _MONOTONIC) + _vfield(10, seq))  # timestamp_clock_id (58), sequence id (10)
    packet.message(b"\x5a", te)  # track_event (11)
    out = _Columns(n)
    out.message(b"\x0a", packet)  # Trace.packet (1)
    return out.tobytes()


def packet_bounds(data: bytes) -> np.ndarray:
    """The offsets where each ``Trace.packet`` of ``data`` ends (a file cut at any of them is a whole trace);
    `ValueError` when the data is not a sequence of packets or its last one is cut short."""
    try:
        return _frames(data)[1]
    except (_NotOurs, IndexError) as exc:
        raise ValueError(f"not a whole Perfetto trace: {exc}") from None
