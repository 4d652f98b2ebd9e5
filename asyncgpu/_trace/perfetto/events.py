"""A track's events as Perfetto packets: the order a track must see its slices' begins and ends, the debug
annotations of slices and instants joined into columns, and the packets encoded column-wise (a chunk of events
per numpy pass, `asyncgpu._trace.perfetto.protowire.Columns`). Field numbers: `asyncgpu._trace.perfetto.schema`.

Threads: any thread; pure functions of their arguments.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from asyncgpu._base.layers import in_order
from asyncgpu._trace.perfetto.protowire import Columns, varint
from asyncgpu._trace.perfetto.schema import BEGIN, END

__all__ = ["join_args", "slice_events", "track_event_packets"]


def join_args(
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


def slice_events(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Begin and end events of nesting slices in the order a track must see them: (slice index, time, type).
    Disjoint slices (the common case) alternate begin, end; otherwise, at one time, ends come first (innermost
    first), then begins (outermost first), a zero-length slice's end right after its begin."""
    n = len(start_ns)
    # by start, the longer first (parents first); no sort for slices that follow one another already
    order = np.arange(n) if in_order(start_ns, end_ns) else np.lexsort((start_ns - end_ns, start_ns))
    s, e = start_ns[order], end_ns[order]
    if n < 2 or bool(np.all(e[:-1] <= s[1:])):
        return np.repeat(order, 2), np.column_stack((s, e)).ravel(), np.tile(np.array([BEGIN, END], np.uint8), n)
    rank = np.arange(n)
    t = np.concatenate([s, e])
    key = np.concatenate([rank, np.where(e == s, rank, -1 - rank)])  # at one time: ends (innermost first), begins
    sub = np.repeat(np.array([0, 1], np.int8), n)  # a zero-length slice: its begin, then its end
    perm = np.lexsort((sub, key, t))
    typ = np.repeat(np.array([BEGIN, END], np.uint8), n)
    return np.concatenate([order, order])[perm], t[perm], typ[perm]


def track_event_packets(
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
    te = Columns(n)
    te.varint(b"\x48", typ)  # type (9)
    if name.any():
        te.varint(b"\x50", name, name > 0)  # name_iid (10)
    if category.any():
        te.varint(b"\x18", category, category > 0)  # category_iids (3)
    for iid, values, present in args:
        if not present.any():
            continue
        a = Columns(n)
        a.const(b"\x08" + varint(iid))  # DebugAnnotation.name_iid (1)
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
    packet = Columns(n)
    packet.varint(b"\x40", dt)  # timestamp (8)
    packet.const(b"\x50" + varint(seq))  # trusted_packet_sequence_id (10)
    packet.message(b"\x5a", te)  # track_event (11)
    out = Columns(n)
    out.message(b"\x0a", packet)  # Trace.packet (1)
    return out.tobytes()
