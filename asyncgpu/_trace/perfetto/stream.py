"""Packets for a trace that is written while it grows: the step timer's trace file
(`asyncgpu._timing.step_trace.TraceStream`).

A trace file is the fields of one top-level ``Trace`` message, each a ``TracePacket`` (field 1): appending packets
keeps the file a valid trace at every packet boundary, so a file being written can be opened (or copied) at any
time and holds every packet flushed so far (`asyncgpu._trace.perfetto.reader.packet_bounds` finds those
boundaries). Every packet stands alone: timestamps are absolute, on CLOCK_MONOTONIC (``perf_counter_ns``), and
nothing is interned, so no packet depends on one before it but the track descriptors. Field numbers:
`asyncgpu._trace.perfetto.schema`.

Threads: any thread (the step timer's writer thread calls these); pure functions of their arguments.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from asyncgpu._trace.perfetto.protowire import Columns, length_field, varint_field
from asyncgpu._trace.perfetto.schema import BEGIN, END, MONOTONIC

__all__ = ["stream_header", "stream_slices"]


def stream_header(seq: int, at_ns: int, tracks: Sequence[tuple[int, int, str]]) -> bytes:
    """The packets that open a streamed trace: a ``ClockSnapshot`` that makes CLOCK_MONOTONIC the trace's clock
    (at ``at_ns``), then a ``TrackDescriptor`` per ``(uuid, parent uuid or 0, name)``."""
    # ClockSnapshot: clocks (1) {clock_id (1), timestamp (2)}, primary_trace_clock (2)
    clock = length_field(1, varint_field(1, MONOTONIC) + varint_field(2, at_ns)) + varint_field(2, MONOTONIC)
    # TracePacket: timestamp (8), timestamp_clock_id (58), trusted_packet_sequence_id (10), clock_snapshot (6)
    stamp = varint_field(8, at_ns) + varint_field(58, MONOTONIC) + varint_field(10, seq)
    out = [length_field(1, stamp + length_field(6, clock))]
    for uuid, parent, name in tracks:
        # TrackDescriptor: uuid (1), name (2), parent_uuid (5); in TracePacket.track_descriptor (60)
        desc = varint_field(1, uuid) + length_field(2, name.encode()) + (varint_field(5, parent) if parent else b"")
        out.append(length_field(1, varint_field(10, seq) + length_field(60, desc)))
    return b"".join(out)


def stream_slices(seq: int, track: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray, step: np.ndarray) -> bytes:
    """A slice per row on track uuid ``track``: a ``TYPE_SLICE_BEGIN`` (name "step", debug annotation ``step``)
    and a ``TYPE_SLICE_END`` packet, absolute CLOCK_MONOTONIC timestamps (ns), encoded column-wise (`Columns`).
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
    te = Columns(n)
    te.varint(b"\x48", np.where(begin, BEGIN, END))  # type (9)
    te.varint(b"\x58", np.repeat(track, 2))  # track_uuid (11)
    te.const(length_field(23, b"step"), begin)  # name (23)
    ann = Columns(n)
    ann.const(length_field(10, b"step"))  # DebugAnnotation.name (10)
    ann.varint(b"\x20", np.repeat(step, 2).view(np.uint64))  # int_value (4)
    te.message(b"\x22", ann, begin)  # debug_annotations (4)
    packet = Columns(n)
    packet.varint(b"\x40", ts.view(np.uint64))  # timestamp (8)
    packet.const(varint_field(58, MONOTONIC) + varint_field(10, seq))  # timestamp_clock_id (58), sequence id (10)
    packet.message(b"\x5a", te)  # track_event (11)
    out = Columns(n)
    out.message(b"\x0a", packet)  # Trace.packet (1)
    return out.tobytes()
