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
numpy, column-wise, a chunk of events at a time (`events`); the protos stay the reference: the tests parse every
trace with ``perfetto_trace_pb2.Trace``.

Memory stays flat as traces grow: the writer never holds the trace, and takes the timeline's rows a window at a
time (`asyncgpu._trace.common.ROW_WINDOW`): a stream whose rows follow one another (a stream runs its work in
order) is written window by window, unsorted; only a stream whose rows nest or overlap (activity blocks around
launches) is sorted whole. Counters take a window of time at a time.

The modules, by job::

    schema      Perfetto's field numbers and constants that the others share, with the messages drawn
    protowire   protobuf's wire format: varints and fields, encoded and decoded column-wise with numpy
    events      a track's events as packets: begin/end order, annotations, the column-wise encoder
    writer      write_perfetto: the scan, the plan (processes, tracks), the sequences
    canvas      the Canvas that layers and counters draw on while a trace is written
    reader      read_perfetto and packet_bounds (numpy only)
    stream      the self-contained packets of a trace written while it grows (the step timer's)

Threads: any thread; nothing here touches a device.
"""

from asyncgpu._trace.perfetto.reader import packet_bounds, read_perfetto
from asyncgpu._trace.perfetto.schema import NATIVE_SUFFIXES
from asyncgpu._trace.perfetto.stream import stream_header, stream_slices
from asyncgpu._trace.perfetto.writer import write_perfetto

__all__ = [
    "NATIVE_SUFFIXES",
    "packet_bounds",
    "read_perfetto",
    "stream_header",
    "stream_slices",
    "write_perfetto",
]
