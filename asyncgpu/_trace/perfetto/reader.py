"""`read_perfetto`: the `Timeline` of a Perfetto trace that `write_perfetto` wrote, layers included; and
`packet_bounds`, where each packet of a trace ends. Numpy only: reading needs no ``perfetto`` package.

The whole file is decoded column-wise (`asyncgpu._trace.perfetto.protowire.decode`): the fields of every packet at
once, then of every track event, every debug annotation and so on, one field number per pass; the field numbers
are those of `asyncgpu._trace.perfetto.schema`. The timeline is rebuilt from the metadata that the "asyncgpu
trace" instant holds (`asyncgpu._trace.common.trace_meta`: names, devices, clocks, layers' data, and which track
is which stream or host thread) and from the slices: each slice's begin and end events are paired per sequence,
timestamps summed per sequence from its clock snapshot.

Threads: any thread; nothing here touches a device.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from asyncgpu._base.records import KIND_CODES, HostRange, Timeline
from asyncgpu._trace.common import TRACE_VERSION, timeline_from
from asyncgpu._trace.perfetto.protowire import NO_FIELD, Field, decode, strings
from asyncgpu._trace.perfetto.schema import BEGIN, DELTAS, END, INSTANT, METADATA

__all__ = ["packet_bounds", "read_perfetto"]


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


def _interned(data: bytes, buf: np.ndarray, entries: Field, owner: np.ndarray) -> dict[int, str]:
    """Interned entries (``iid`` 1, ``name`` 2) by `_key` (owner sequence, iid); ``owner`` per entry."""
    f = decode(buf, *entries.sub())
    iids = f.get(1, NO_FIELD).per_message(len(entries.msg)).astype(np.int64)
    names = [""] * len(entries.msg)
    if 2 in f:
        for i, text in zip(f[2].msg.tolist(), strings(data, f[2])):
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
    """`read_perfetto`'s work; the numbers are field numbers (`asyncgpu._trace.perfetto.schema`)."""
    if not data:
        raise _NotOurs("is empty")
    buf = np.frombuffer(data + bytes(16), np.uint8)  # padded: a varint read past a cut end reads zeros
    start, end = _frames(data)
    n = len(start)
    top = decode(buf, start, end)
    seq = top.get(10, NO_FIELD).per_message(n).astype(np.int64)  # trusted_packet_sequence_id
    n_seq = int(seq.max(initial=0)) + 1
    # per sequence: its default track and clock, and its incremental clock's value at the snapshot
    seq_track, seq_clock, seq_base = (np.zeros(n_seq, np.int64) for _ in range(3))
    defaults = top.get(59, NO_FIELD)  # trace_packet_defaults: timestamp_clock_id 58, track_event_defaults 11
    d = decode(buf, *defaults.sub())
    if 58 in d:
        seq_clock[seq[defaults.msg[d[58].msg]]] = d[58].value
    if 11 in d:
        event_defaults = decode(buf, *d[11].sub())
        if 11 in event_defaults:
            seq_track[seq[defaults.msg[d[11].msg[event_defaults[11].msg]]]] = event_defaults[11].value
    snaps = top.get(6, NO_FIELD)  # clock_snapshot: clocks 1 {clock_id 1, timestamp 2}
    clocks = decode(buf, *snaps.sub()).get(1, NO_FIELD)
    c = decode(buf, *clocks.sub())
    k = np.flatnonzero(c.get(1, NO_FIELD).per_message(len(clocks.msg)) == DELTAS)
    seq_base[seq[snaps.msg[clocks.msg[k]]]] = c.get(2, NO_FIELD).per_message(len(clocks.msg))[k]
    interned = top.get(12, NO_FIELD)  # interned_data: event_categories 1, event_names 2, debug_annotation_names 3
    idata = decode(buf, *interned.sub())
    owner = seq[interned.msg]
    categories, event_names, arg_names = (
        _interned(data, buf, idata[f], owner[idata[f].msg]) if f in idata else {} for f in (1, 2, 3)
    )
    # times: each sequence's packets count deltas of its incremental clock from its snapshot, in file order
    stamped = top.get(8, NO_FIELD)  # timestamp; with timestamp_clock_id (58) set, an absolute time
    ts = stamped.per_message(n).astype(np.int64)
    has_ts = np.zeros(n, bool)
    has_ts[stamped.msg] = True
    explicit = np.zeros(n, bool)
    explicit[top.get(58, NO_FIELD).msg] = True
    delta = has_ts & ~explicit & (seq_clock[seq] == DELTAS)
    rows = np.flatnonzero(delta)
    order = rows[np.argsort(seq[rows], kind="stable")]
    sums = np.cumsum(ts[order])
    first = np.flatnonzero(np.diff(seq[order], prepend=-1))
    before = np.repeat(sums[first] - ts[order][first], np.diff(np.append(first, len(order))))
    when = np.where(has_ts, ts, -1)
    when[order] = seq_base[seq[order]] + sums - before
    # track events: type, name, category, track, and the "row" and "duration_ns" annotations
    events = top.get(11, NO_FIELD)  # track_event: type 9, name_iid 10, category_iids 3, track_uuid 11, annotations 4
    packet = events.msg
    m = len(packet)
    te = decode(buf, *events.sub())
    typ = te.get(9, NO_FIELD).per_message(m).astype(np.int64)
    name_iid = te.get(10, NO_FIELD).per_message(m).astype(np.int64)
    cat_iid = te.get(3, NO_FIELD).per_message(m).astype(np.int64)
    track = seq_track[seq[packet]]
    explicit_track = te.get(11, NO_FIELD)
    track[explicit_track.msg] = explicit_track.value.astype(np.int64)
    ann = te.get(4, NO_FIELD)
    a = decode(buf, *ann.sub())  # name_iid 1 or name 10; int_value 4, double_value 5, string_value 6
    iid = a.get(1, NO_FIELD).per_message(len(ann.msg)).astype(np.int64)
    ann_name = _lookup(_key(seq[packet[ann.msg]], iid), {**arg_names, **_unnamed(seq)})
    if 10 in a:
        ann_name[a[10].msg] = strings(data, a[10])
    meta = _metadata(data, a, ann_name)
    row, duration = np.full(m, -1, np.int64), np.full(m, np.nan)
    k = np.flatnonzero(ann_name == "row")
    row[ann.msg[k]] = a.get(4, NO_FIELD).per_message(len(ann.msg)).view(np.int64)[k]
    k = np.flatnonzero(ann_name == "duration_ns")
    duration[ann.msg[k]] = a.get(5, NO_FIELD).per_message(len(ann.msg)).view(np.float64)[k]
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
    meta: Mapping[str, Any], te: dict[int, Field], typ: np.ndarray, track: np.ndarray, when: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, issue times)`` from the instants of the "host issue" tracks: each one's flow id is its row + 1."""
    issue = np.array([u for u, _ in meta["tracks"].get("issue", ())], np.int64)
    flows = te.get(47, NO_FIELD)  # flow_ids
    on = np.isin(track[flows.msg], issue) & (typ[flows.msg] == INSTANT)
    return flows.value[on].astype(np.int64) - 1, when[flows.msg[on]].astype(np.float64)


def _unnamed(seq: np.ndarray) -> dict[int, str]:
    """Annotations named by a string, not an interned id (iid 0), look up as "" (their names come after)."""
    sequences = np.unique(seq)
    return dict.fromkeys(_key(sequences, np.zeros_like(sequences)).tolist(), "")


def _metadata(data: bytes, a: dict[int, Field], ann_name: np.ndarray) -> dict:
    """The metadata of `asyncgpu._trace.common` from the debug annotation that holds it; `_NotOurs` without one,
    `ValueError` for a version this reader does not read."""
    values = a.get(6, NO_FIELD)
    for k, text in zip(values.msg.tolist(), strings(data, values)):
        if ann_name[k] == METADATA:
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
    spans = np.flatnonzero((typ == BEGIN) | (typ == END))
    order = spans[np.argsort(seq[spans], kind="stable")]
    step = np.where(typ[order] == BEGIN, 1, -1)
    first = np.flatnonzero(np.diff(seq[order], prepend=-1))
    depth = np.cumsum(step)
    depth -= np.repeat(depth[first] - step[first], np.diff(np.append(first, len(order))))
    level = np.where(step > 0, depth - 1, depth)
    grouped = order[np.lexsort((np.arange(len(order)), level, seq[order]))]
    begins, ends = grouped[0::2], grouped[1::2]
    if len(begins) != len(ends) or (typ[begins] != BEGIN).any() or (typ[ends] != END).any():
        raise ValueError("slice begins and ends do not pair up")
    if (seq[begins] != seq[ends]).any():
        raise ValueError("a slice ends on another sequence")
    return begins, ends


def packet_bounds(data: bytes) -> np.ndarray:
    """The offsets where each ``Trace.packet`` of ``data`` ends (a file cut at any of them is a whole trace);
    `ValueError` when the data is not a sequence of packets or its last one is cut short."""
    try:
        return _frames(data)[1]
    except (_NotOurs, IndexError) as exc:
        raise ValueError(f"not a whole Perfetto trace: {exc}") from None
