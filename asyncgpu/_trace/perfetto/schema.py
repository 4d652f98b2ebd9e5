"""The numbers of Perfetto's trace schema that asyncgpu writes and reads (``protos/perfetto/trace/``), beside the
fields they belong to. The writer builds its descriptors and headers with the ``perfetto`` package's generated
protos; the hot packets (`asyncgpu._trace.perfetto.events`, `asyncgpu._trace.perfetto.stream`) and the reader
(`asyncgpu._trace.perfetto.reader`) use the field numbers below directly::

    Trace
      packet 1: TracePacket
        timestamp 8                         host ns; a delta of the sequence's incremental clock unless
        timestamp_clock_id 58                 this names another clock (MONOTONIC: absolute)
        trusted_packet_sequence_id 10       the packet's sequence (each track of ours has its own)
        sequence_flags 13                   SEQ_INCREMENTAL_STATE_CLEARED on a sequence's first packet
        clock_snapshot 6: ClockSnapshot
          clocks 1: Clock {clock_id 1, timestamp 2, is_incremental 3}
          primary_trace_clock 2
        trace_packet_defaults 59: {timestamp_clock_id 58, track_event_defaults 11: {track_uuid 11}}
        interned_data 12: {event_categories 1, event_names 2, debug_annotation_names 3: {iid 1, name 2}}
        track_descriptor 60: TrackDescriptor {uuid 1, name 2, parent_uuid 5, ...}
        track_event 11: TrackEvent
          type 9                            BEGIN, END, INSTANT, COUNTER below
          track_uuid 11                     (else the sequence's default track)
          name_iid 10 | name 23
          category_iids 3
          debug_annotations 4: DebugAnnotation
            name_iid 1 | name 10
            int_value 4 | double_value 5 | string_value 6
          flow_ids 47, terminating_flow_ids 48   fixed64
          double_counter_value 44                double

Threads: any thread; constants only.
"""

from __future__ import annotations

__all__ = ["BEGIN", "COUNTER", "DELTAS", "END", "INSTANT", "METADATA", "META_SEQ", "MONOTONIC", "NATIVE_SUFFIXES"]

NATIVE_SUFFIXES = (".pftrace", ".perfetto-trace", ".pb")  # paths `write_trace` writes in this format
MONOTONIC = 3  # BuiltinClock.BUILTIN_CLOCK_MONOTONIC: time.perf_counter_ns() on Linux
DELTAS = 64  # the sequence-scoped incremental clock every sequence of ours counts in
META_SEQ = 1  # descriptors and metadata; each track's events have a sequence of their own from 2 on
BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4  # TrackEvent.Type
METADATA = "asyncgpu_trace"  # the debug annotation holding the metadata
