"""`write_perfetto`: a `Timeline` as a Perfetto trace, streamed to its file (the trace's layout: the docstring of
`asyncgpu._trace.perfetto`).

The descriptors, sequence headers and metadata are built with the ``perfetto`` package's generated protos and
written with its `StreamingTraceProtoBuilder` (``pip install "asyncgpu[perfetto]"``, imported on first use). The
hot packets, slices and instants, are encoded with numpy, column-wise, a chunk of events at a time
(`asyncgpu._trace.perfetto.events`).

The writer runs in passes over the timeline's rows, a window of rows at a time
(`asyncgpu._trace.common.ROW_WINDOW`), and never holds the trace: a scan learns what each stream holds and whether
its rows follow one another; the plan makes the processes and tracks; then each stream's rows are written,
window by window where they follow one another (a stream runs its work in order), sorted whole where they nest
or overlap (activity blocks around launches). The layers and counters draw on a `ProtoCanvas`
(`asyncgpu._trace.perfetto.canvas`), which keeps their items (they are small) until the end.

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
from asyncgpu._base.records import KINDS, Timeline
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
    trace_meta,
)
from asyncgpu._trace.perfetto.canvas import ProtoCanvas
from asyncgpu._trace.perfetto.events import join_args, slice_events, track_event_packets
from asyncgpu._trace.perfetto.schema import BEGIN, COUNTER, DELTAS, END, INSTANT, META_SEQ, METADATA, MONOTONIC

__all__ = ["write_perfetto"]

_CHUNK_EVENTS = 1 << 13  # events encoded per numpy pass: bounds the writer's memory
_RANK_THREAD = re.compile(r"^(r\d+)/(.*)$")  # a rank's thread in a timeline merged by `asyncgpu.ranks.gather`


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


def write_perfetto(tl: Timeline, path: str | os.PathLike) -> None:
    """Write ``tl`` to ``path`` as a Perfetto trace (its layout: the docstring of `asyncgpu._trace.perfetto`).
    Raises `ImportError` naming the extra without the ``perfetto`` package, `OSError` naming the path and the fix
    when it cannot be written, `ValueError` for times before 0 (a synthetic timeline: host clocks start at 0)."""
    pb, builder = _protos()
    origin = origin_ns(tl)
    if origin < 0:
        raise ValueError(f"a Perfetto trace holds times from 0 ns on; this timeline starts at {origin} ns")
    with open_for_writing(path, "the trace", binary=True) as f:
        Writer(tl, origin, f, pb, builder).write()


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


class Writer:
    """One trace being written: a scan of the rows, the plan (processes, tracks), then the packets. The
    `ProtoCanvas` of its layers and counters makes tracks with `child` and `new_uuids`, and writes them with
    `interned`, `sequence` and `counter_sequence`."""

    def __init__(self, tl: Timeline, origin: int, f: IO[bytes], pb: Any, builder: Any) -> None:
        self.tl, self.origin, self.f, self.pb = tl, origin, f, pb
        self.builder = builder(f)
        self.new_uuids = itertools.count(1)  # track uuids, handed out in the order tracks are made
        self._seqs = itertools.count(META_SEQ + 1)  # packet sequence ids, one per track written
        self.new_ranks = itertools.count(1 << 20)  # the UI's order of sibling tracks: streams first, in order
        self.descriptors: list[Any] = []
        self.processes: dict[str, int] = {}  # host process key ("" or "r<k>") -> uuid
        self.device_uuids = [next(self.new_uuids) for _ in tl.devices]
        self.stream_uuids: list[list[int]] = []  # per stream, a track per lane
        self.meta_uuid = 0
        self.device_key = [host_key(d) for d in tl.devices]  # the host process each device's work came from
        self.issue: dict[str, tuple[int, bool]] = {}  # host process -> its "host issue" track, rows in time order

    # the plan
    def child(self, parent: int, name: str, rank: int | None = None) -> int:
        """A named track under ``parent`` (in the UI, ordered by ``rank``, else after its older siblings, and
        never merged with them)."""
        t = self.pb.TrackDescriptor(uuid=next(self.new_uuids), parent_uuid=parent, name=name)
        t.sibling_order_rank = next(self.new_ranks) if rank is None else rank
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
            uuid = self.processes[key] = next(self.new_uuids)
            pid = HOST_PID if not key else device_pid(len(self.tl.devices)) + len(self.processes) - 1
            self._process(uuid, pid, f"{key} host" if key else "host")
        return self.processes[key], short

    def _stream_track(self, st: int, lane: int) -> int:
        """The track of lane ``lane`` of stream ``st`` ("s0", "s0 (2)"), made on first use."""
        uuids = self.stream_uuids[st]
        while len(uuids) <= lane:
            d, label = self.tl.streams[st]
            k = len(uuids)
            uuids.append(self.child(self.device_uuids[d], label if k == 0 else f"{label} ({k + 1})", st * 1024 + k))
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
        canvas = ProtoCanvas(self)
        for layer in tl.layers:
            layer.draw(tl, canvas)
        draw_counters(tl, canvas)
        canvas.plan()
        self.meta_uuid = self.child(self.processes[""], "asyncgpu")
        self._header(META_SEQ, None, self.origin, primary=True)
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
            p = self.pb.TracePacket(trusted_packet_sequence_id=META_SEQ)
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
            uuids = [self.child(process, short if j == 0 else f"{short} ({j + 1})") for j in range(n)]
            plan[thread] = (uuids, rows)
        return plan

    # the packets
    def _header(self, seq: int, track: int | None, base_ns: int, interned: Any = None, primary: bool = False) -> None:
        """A sequence's first packet: state cleared, its default track and clock, the clock's snapshot at
        ``base_ns`` (host ns), its interned names."""
        pb = self.pb
        p = pb.TracePacket(trusted_packet_sequence_id=seq, timestamp=base_ns, timestamp_clock_id=MONOTONIC)
        p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.trace_packet_defaults.timestamp_clock_id = DELTAS
        if track is not None:
            p.trace_packet_defaults.track_event_defaults.track_uuid = track
        p.clock_snapshot.clocks.add(clock_id=MONOTONIC, timestamp=base_ns)
        p.clock_snapshot.clocks.add(clock_id=DELTAS, timestamp=base_ns, is_incremental=True)
        if primary:
            p.clock_snapshot.primary_trace_clock = MONOTONIC
        if interned is not None:
            p.interned_data.CopyFrom(interned)
        self.builder.write_packet(p)

    def interned(self, names: Mapping[int, str], categories: Mapping[int, str], args: Mapping[int, str]) -> Any:
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
            p = self.pb.TracePacket(trusted_packet_sequence_id=META_SEQ, timestamp=0)  # a delta: at the origin
            p.track_event.type = INSTANT
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
        instant("asyncgpu trace", {**source, "label": tl.label, METADATA: json.dumps(meta, allow_nan=False)})
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
        return self.interned(names, {k + 1: KINDS[k] for k in sorted(stream.kinds)}, {1: "row", 2: "duration_ns"})

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
            np.tile(np.array([BEGIN, END], np.uint8), n),
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
            self.sequence(uuid, interned, ls, le, tl.name[r] + 1, tl.kind[r] + 1, args, None, self._flow_in(r))

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
                self.issue[key] = (self.child(process, short), ordered[key])

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
            self._header(seq[0], self.issue[key][0], seq[1], self.interned(names, {1: "issue"}, {}))
        n = len(rows)
        flows = issue_flow(rows)
        kinds = np.full(n, INSTANT, np.uint8)
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
            interned = self.interned({v: k for k, v in names.items()}, {v: k for k, v in kinds.items()}, {1: "row"})
            self.sequence(uuid, interned, s[sel], e[sel], name[sel], kind[sel], [(1, idx[sel], None)])

    def sequence(
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
        idx, t, typ = slice_events(start_ns, end_ns)
        n = len(start_ns)
        if instants is not None and len(instants[0]):
            at, i_name, i_cat, i_args = instants
            order = np.argsort(np.concatenate([t, at]), kind="stable")  # slice events keep their order
            idx = np.concatenate([idx, n + np.arange(len(at))])[order]
            t = np.concatenate([t, at])[order]
            typ = np.concatenate([typ, np.full(len(at), INSTANT, np.uint8)])[order]
            name, category = np.concatenate([name, i_name]), np.concatenate([category, i_cat])
            args = join_args(args, n, i_args, len(at))
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
        self._events(seq, at_ns, np.full(n, COUNTER, np.uint8), np.arange(n), none, none, [], None, None, values)

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
            opens = kinds != END
            item = functools.partial(_opening, opens, i)
            picked = [(iid, v[i], opens if p is None else opens & p[i]) for iid, v, p in args]
            self.f.write(
                track_event_packets(
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
