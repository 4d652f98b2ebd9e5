"""Native Perfetto traces (.pftrace): every trace parsed with Perfetto's own schema (``perfetto_trace_pb2``) and
read the way trace processor reads it (sequences, interned names, incremental clocks, slice stacks per track,
flows, counters); every track kind; round trips through read_trace for both formats; errors; memory; and, where
``ASYNCGPU_TRACE_PROCESSOR`` names a ``trace_processor_shell``, the trace loaded there and counted with SQL."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
import tracemalloc
from collections import defaultdict
from dataclasses import astuple, dataclass, field
from pathlib import Path

import numpy as np
import pytest

import asyncgpu
from asyncgpu import Channel, gpu_timer
from asyncgpu._base.layers import layer_from_data
from asyncgpu._base.records import HostRange, Timeline
from asyncgpu._trace.export import read_trace, write_trace
from asyncgpu.kernel import KernelProfiler

from .test_export import assert_same, synthetic, with_issue_times

HAVE_PERFETTO = importlib.util.find_spec("perfetto") is not None
needs_perfetto = pytest.mark.skipif(
    not HAVE_PERFETTO, reason='needs the perfetto package (pip install "asyncgpu[perfetto]")'
)
TRACE_PROCESSOR = os.environ.get("ASYNCGPU_TRACE_PROCESSOR")


# -- a reader with Perfetto's schema and trace processor's rules -------------------------------------------------------
@dataclass
class Slice:
    track: int
    name: str
    category: str
    start_ns: int
    end_ns: int = -1
    depth: int = 0
    parent: Slice | None = None
    args: dict = field(default_factory=dict)
    flow_out: list = field(default_factory=list)
    flow_in: list = field(default_factory=list)


@dataclass
class Parsed:
    tracks: dict  # uuid -> TrackDescriptor
    slices: list
    instants: list
    counters: dict  # uuid -> [(ns, value)]

    def path(self, uuid: int) -> str:
        """ "process / track / child" names of a track."""
        parts = []
        while uuid:
            t = self.tracks[uuid]
            parts.append(t.process.process_name if t.HasField("process") else t.name)
            uuid = t.parent_uuid
        return " / ".join(reversed(parts))

    def on(self, path: str) -> list[Slice]:
        return [s for s in self.slices if self.path(s.track) == path]

    def processes(self) -> dict[int, str]:
        return {t.process.pid: t.process.process_name for t in self.tracks.values() if t.HasField("process")}

    def counter(self, path: str) -> list[tuple[int, float]]:
        (uuid,) = [u for u in self.counters if self.path(u) == path]
        return self.counters[uuid]


def parse(path: Path) -> Parsed:
    """The trace as trace processor imports it: each sequence's defaults, interned names and incremental clock;
    events sorted by (time, file order); per track a stack of open slices that every END must close."""
    pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    trace = pb.Trace.FromString(path.read_bytes())
    first = trace.packet[0]
    assert first.clock_snapshot.primary_trace_clock == pb.BUILTIN_CLOCK_MONOTONIC, "the first packet sets the clock"
    seqs: dict = defaultdict(dict)
    tracks, events = {}, []
    for i, p in enumerate(trace.packet):
        assert p.trusted_packet_sequence_id, "every packet is on a sequence"
        st = seqs[p.trusted_packet_sequence_id]
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            st.update(names={}, cats={}, args={})
        if p.HasField("trace_packet_defaults"):
            d = p.trace_packet_defaults
            st["clock"] = d.timestamp_clock_id
            st["track"] = d.track_event_defaults.track_uuid if d.HasField("track_event_defaults") else 0
        if p.HasField("interned_data"):
            st["names"].update({e.iid: e.name for e in p.interned_data.event_names})
            st["cats"].update({e.iid: e.name for e in p.interned_data.event_categories})
            st["args"].update({e.iid: e.name for e in p.interned_data.debug_annotation_names})
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            assert set(clocks) == {pb.BUILTIN_CLOCK_MONOTONIC, 64} and clocks[64].is_incremental
            assert clocks[64].timestamp == clocks[pb.BUILTIN_CLOCK_MONOTONIC].timestamp
            st["now"] = clocks[64].timestamp
            continue  # trace processor reads nothing else of a snapshot's packet
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        if p.HasField("track_event"):
            assert p.HasField("timestamp") and not p.HasField("timestamp_clock_id") and st["clock"] == 64
            st["now"] += p.timestamp
            te = p.track_event
            args = {}
            for a in te.debug_annotations:
                kind = a.WhichOneof("value")
                args[a.name or st["args"][a.name_iid]] = getattr(a, kind)
            events.append(
                (
                    st["now"],
                    i,
                    te.track_uuid if te.HasField("track_uuid") else st["track"],
                    te.type,
                    te.name or st["names"].get(te.name_iid, ""),
                    ",".join([st["cats"][c] for c in te.category_iids]),
                    args,
                    list(te.flow_ids),
                    list(te.terminating_flow_ids),
                    te.double_counter_value,
                )
            )
    for t in tracks.values():
        assert not t.parent_uuid or t.parent_uuid in tracks, f"track {t.name} has no parent"
    stacks: dict = defaultdict(list)
    slices, instants, counters = [], [], defaultdict(list)
    for ns, _, track, typ, name, cat, args, out, into, value in sorted(events, key=lambda e: (e[0], e[1])):
        assert track in tracks, f"an event on track {track}, which no descriptor makes"
        assert ns >= 0
        stack = stacks[track]
        if typ == pb.TrackEvent.TYPE_SLICE_BEGIN:
            s = Slice(track, name, cat, ns, depth=len(stack), parent=stack[-1] if stack else None, args=args)
            s.flow_out, s.flow_in = out, into
            stack.append(s)
            slices.append(s)
        elif typ == pb.TrackEvent.TYPE_SLICE_END:
            assert stack, f"an END with no open slice on {track}"
            stack.pop().end_ns = ns
        elif typ == pb.TrackEvent.TYPE_INSTANT:
            instants.append(Slice(track, name, cat, ns, ns, len(stack), stack[-1] if stack else None, args, out, into))
        else:
            assert typ == pb.TrackEvent.TYPE_COUNTER and tracks[track].HasField("counter")
            counters[track].append((ns, value))
    assert not any(stacks.values()), "every slice ends"
    return Parsed(tracks, slices, instants, dict(counters))


# -- the synthetic timeline: every track, nesting, lanes, clocks, round trip -------------------------------------------
@needs_perfetto
def test_tracks_nesting_lanes_clocks_and_round_trip(tmp_path):
    tl = synthetic()
    path = tmp_path / "s.pftrace"
    write_trace(tl, path)
    p = parse(path)
    assert p.processes() == {
        1: "host",
        2: "cuda:0 NVIDIA H200 (sm_90)",
        3: "cuda:1 NVIDIA H200 (sm_90) (NOT aligned: relative time)",
    }
    desc = {t.process.pid: t.description for t in p.tracks.values() if t.HasField("process")}
    assert "±350 ns" in desc[2] and "offset 12 ns" in desc[2] and "drift 0.020 ppm" in desc[2]
    assert desc[3].startswith("clock NOT aligned to the host (clock calibration failed (busy))")
    t0 = 5_000_000_000_000
    device = {s.args["row"]: s for s in p.slices if p.path(s.track).startswith("cuda")}
    assert sorted(device) == [0, 1, 2, 3, 4, 6]  # row 5 is unfinished: not drawn
    block, kernel, late = device[0], device[1], device[6]
    assert p.path(kernel.track) == "cuda:0 NVIDIA H200 (sm_90) / s0" and kernel.category == "kernel"
    assert kernel.parent is device[2] and device[2].parent is block and kernel.depth == 2  # nesting
    assert p.path(late.track).endswith("/ s0 (2)")  # overlaps block 0 without nesting: a lane of its own
    assert (kernel.start_ns, kernel.end_ns, kernel.name) == (t0 + 200, t0 + 700, "k")
    assert device[3].name == 'quote " comma, µs' and p.path(device[3].track).endswith("/ s1")
    assert p.path(device[4].track).startswith("cuda:1") and device[4].start_ns == t0 + 1000
    host = [(p.path(s.track), s.name, s.category, s.depth) for s in p.slices if p.path(s.track).startswith("host /")]
    assert sorted(host) == [
        ("host / MainThread", "block", "user", 1),  # inside the scope
        ("host / MainThread", "synthetic", "scope", 0),
        ("host / MainThread (2)", "block", "user", 0),  # overlaps the first block without nesting
    ]
    for d in ("cuda:0 NVIDIA H200 (sm_90)", "cuda:1 NVIDIA H200 (sm_90) (NOT aligned: relative time)"):
        util = p.counter(f"{d} / utilisation")
        assert all(0 <= v <= 100 for _, v in util) and util[-1][1] == 0 and max(v for _, v in util) > 50
        assert p.counter(f"{d} / activities in flight")[-1][1] == 0
    clocks = {s.name: s.args for s in p.instants if p.path(s.track) == "host / asyncgpu"}
    assert clocks["clock cuda:0"] == {
        "device": "cuda:0",
        "aligned": True,
        "bound_ns": 350.0,
        "offset_ns": 12,
        "drift_ppm": 0.02,
        "overhead_ns": 0.0,
        "overhead_source": "",
        "reason": "",
    }
    assert clocks["clock cuda:1"]["aligned"] is False and "busy" in clocks["clock cuda:1"]["reason"]
    assert {k: clocks["asyncgpu trace"][k] for k in ("source", "source_note", "label")} == {
        "source": "events",
        "source_note": "",
        "label": "synthetic",
    }
    assert json.loads(clocks["asyncgpu trace"]["asyncgpu_trace"])["origin_ns"] == t0 - 40
    back = read_trace(path)
    assert_same(back, tl)
    assert back.error == "RuntimeError: boom" and back.label == "synthetic"


@needs_perfetto
def test_the_event_duration_is_written_only_where_it_differs_from_the_slice(tmp_path):
    t0 = 10**12
    tl = Timeline.from_arrays(
        devices=["host:0"],
        device=[0, 0],
        start_ns=[t0, t0 + 1000],
        end_ns=[t0 + 500, t0 + 1500],
        duration_ns=[500.25, 300.0],  # the second was measured shorter than its placed slice
    )
    write_trace(tl, tmp_path / "d.pftrace")
    p = parse(tmp_path / "d.pftrace")
    args = {s.args["row"]: s.args for s in p.slices if s.category == "user"}
    assert args == {0: {"row": 0}, 1: {"row": 1, "duration_ns": 300.0}}
    assert read_trace(tmp_path / "d.pftrace").duration_ns.tolist() == [500.0, 300.0]


@needs_perfetto
def test_slices_that_touch_nest_or_take_no_time(tmp_path):
    """One stream: A holds B and C, which touch; Z1 and Z2 take no time where C ends; D starts as A ends."""
    t0 = 10**12
    spans = {"A": (0, 10), "B": (0, 5), "C": (5, 8), "Z1": (8, 8), "Z2": (8, 8), "D": (10, 12)}
    tl = Timeline.from_arrays(
        devices=["host:0"],
        device=[0] * len(spans),
        names=list(spans),
        name=range(len(spans)),
        start_ns=[t0 + a for a, _ in spans.values()],
        end_ns=[t0 + b for _, b in spans.values()],
        kind=["user", "kernel", "kernel", "kernel", "kernel", "user"],
    )
    write_trace(tl, tmp_path / "n.pftrace")
    p = parse(tmp_path / "n.pftrace")
    got = {s.name: (s.start_ns - t0, s.end_ns - t0, s.parent.name if s.parent else None) for s in p.on("host:0 / s0")}
    assert got == {
        "A": (0, 10, None),
        "B": (0, 5, "A"),
        "C": (5, 8, "A"),
        "Z1": (8, 8, "A"),
        "Z2": (8, 8, "A"),
        "D": (10, 12, None),
    }
    assert_same(read_trace(tmp_path / "n.pftrace"), tl)


@pytest.mark.parametrize("suffix", [".json", ".pftrace"])
def test_json_and_native_read_back_the_same(tmp_path, suffix):
    if suffix == ".pftrace" and not HAVE_PERFETTO:
        pytest.skip('needs the perfetto package (pip install "asyncgpu[perfetto]")')
    tl = synthetic()
    write_trace(tl, tmp_path / f"t{suffix}")
    assert_same(read_trace(tmp_path / f"t{suffix}"), tl)


@needs_perfetto
@pytest.mark.parametrize("suffix", [".pftrace", ".perfetto-trace", ".pb", ".PFTRACE"])
def test_the_suffix_chooses_the_format(tmp_path, suffix):
    write_trace(synthetic(), tmp_path / f"t{suffix}")
    assert (tmp_path / f"t{suffix}").read_bytes()[:1] == b"\x0a"  # Trace.packet
    for other in ("t.json", "t.trace"):  # JSON otherwise, as before
        write_trace(synthetic(), tmp_path / other)
        assert (tmp_path / other).read_bytes()[:1] == b"{"


@needs_perfetto
def test_an_empty_timeline(tmp_path):
    tl = Timeline.from_arrays(
        label="empty", devices=["host:0"], device=[], start_ns=[], end_ns=[], scope_start_ns=10, scope_end_ns=20
    )
    write_trace(tl, tmp_path / "e.pftrace")
    assert parse(tmp_path / "e.pftrace").processes() == {1: "host", 2: "host:0"}
    assert_same(read_trace(tmp_path / "e.pftrace"), tl)


# -- real scopes on the host backend: host tracks, in-kernel records, handoffs -----------------------------------------
@needs_perfetto
@pytest.mark.anyio
async def test_host_scopes_with_overlapping_blocks_round_trip(tmp_path):
    import anyio

    devs = asyncgpu.devices("host", count=2)

    async def task(t, d, i):
        async with t.activity(f"step {i}", device=d):
            d.stream.spin_us(300)
            await anyio.sleep(0.001)

    async with gpu_timer(devs, label="host scope") as t:
        async with anyio.create_task_group() as tg:
            for i, d in enumerate(devs * 2):
                tg.start_soon(task, t, d, i)
    async with gpu_timer(devs[0], label="second") as t2:
        devs[0].streams[1].spin_us(100)
    for source in ([t], [t, t2]):
        path = tmp_path / "h.pftrace"
        write_trace(source, path)
        p = parse(path)
        on_devices = [s for s in p.slices if p.path(s.track).startswith("host:")]
        on_host = [s for s in p.slices if p.path(s.track).startswith("host /")]
        assert len(on_devices) == sum(len(x.timeline) for x in source)
        assert sorted(s.name for s in on_host) == sorted(r.name for x in source for r in x.timeline.host_ranges)
    assert len([s for s in on_host if s.name.startswith("step")]) == 4
    assert_same(read_trace(tmp_path / "h.pftrace"), read_trace_json(tmp_path, [t, t2]))
    assert [sc.label for sc in read_trace(tmp_path / "h.pftrace").scopes] == ["host scope", "second"]


def read_trace_json(tmp_path: Path, source) -> Timeline:
    write_trace(source, tmp_path / "same.json")
    return read_trace(tmp_path / "same.json")


@pytest.mark.anyio
@pytest.mark.parametrize("suffix", [".json", ".pftrace"])
async def test_in_kernel_records_nest_under_their_kernel_and_come_back(tmp_path, suffix):
    if suffix == ".pftrace" and not HAVE_PERFETTO:
        pytest.skip('needs the perfetto package (pip install "asyncgpu[perfetto]")')
    dev = asyncgpu.device("host:0")
    a = dev.alloc(200_000, np.float32)
    async with gpu_timer(dev, label="k") as t:
        dev.stream.memset(a, 0)
        with KernelProfiler(dev, max_tracks=2) as prof:
            prof.inc_loop(a, 5)
            recs = await prof.collect()
    path = tmp_path / f"k{suffix}"
    write_trace(t, path)
    back = read_trace(path)
    (layer,) = back.layers
    for col in ("block", "group", "stage", "start_ns", "end_ns", "duration_ns", "instant_ns", "dropped"):
        np.testing.assert_array_equal(getattr(layer.records, col), getattr(recs, col), err_msg=col)
    assert (layer.records.stages, layer.records.aligned, layer.max_tracks) == (recs.stages, True, 2)
    assert_same(back, t.timeline)
    if suffix == ".pftrace":
        p = parse(path)
        dev_proc = p.processes()[2]
        blocks = recs.lanes_started
        lanes = [f"inc_loop b0 g0 [first 2 of {blocks} lanes]", "inc_loop b1 g0"]
        stages = [s for s in p.slices if s.category == "kernel_stage"]
        assert {p.path(s.track) for s in stages} == {f"{dev_proc} / inc_loop / {lane}" for lane in lanes}
        assert len(stages) == 2 * 3 and {s.name for s in stages} == {"load", "add", "store"}
        assert {(s.args["block"], s.args["group"]) for s in stages} == {(0, 0), (1, 0)}
        assert all(s.end_ns - s.start_ns == round(s.args["duration_ns"]) for s in stages)
        kernel = next(s for s in p.slices if s.category == "kernel")
        assert all(kernel.start_ns <= s.start_ns and s.end_ns <= kernel.end_ns for s in stages)


def _in_thread(fn):
    box: dict = {}

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    th = threading.Thread(target=run)
    th.start()

    def join():
        th.join()
        if "error" in box:
            raise box["error"]

    return join


@pytest.mark.parametrize("suffix", [".json", ".pftrace"])
def test_handoffs_flow_from_producer_to_consumer_and_come_back(tmp_path, suffix):
    if suffix == ".pftrace" and not HAVE_PERFETTO:
        pytest.skip('needs the perfetto package (pip install "asyncgpu[perfetto]")')
    d0, d1 = asyncgpu.devices("host", count=2)
    ch = Channel(2, name="flow")
    with gpu_timer([d0, d1], all_threads=True) as t:

        def produce():
            with ch:
                for i in range(4):
                    d0.stream.spin_us(300)
                    ch.put_sync(i, stream=d0.stream)

        def consume():
            for h in ch:
                h.done()

        jp, jc = _in_thread(produce), _in_thread(consume)
        jp(), jc()
        ch2 = Channel(2, name="gpuflow")
        d0.stream.spin_us(300)
        ch2.put_sync(0, stream=d0.stream)
        ch2.get_sync(stream=d1.stream).done(stream=d1.stream)
    path = tmp_path / f"h{suffix}"
    write_trace(t, path)
    back = read_trace(path)
    for mine, theirs in zip(back.layers, t.timeline.layers):
        assert mine.name == theirs.name
        assert [_nan_free(r) for r in mine.records()] == [_nan_free(r) for r in theirs.records()]
    assert_same(back, t.timeline)
    if suffix == ".json":
        return
    p = parse(path)
    starts = {f: s for s in p.slices for f in s.flow_out}
    ends = {f: s for s in p.slices for f in s.flow_in if f > len(t.timeline)}  # (ids up to len: issue arrows)
    assert len(starts) == 5 and set(starts) == set(ends)
    procs = p.processes()
    for f, s in starts.items():
        assert p.path(s.track).startswith(procs[2] + " / handoff ") and s.name.endswith("in flight")
        assert ends[f].start_ns >= s.start_ns
    consumers = {p.path(ends[f].track) for f in ends}  # host-side takes on the host, GPU-side on host:1
    assert {c.split(" / ")[0] for c in consumers} == {"host", procs[3]}
    assert f"{procs[3]} / handoff gpuflow → s0" in consumers
    in_flight = p.counter("host / handoffs in flight (flow)")
    assert max(v for _, v in in_flight) >= 1 and in_flight[-1][1] == 0


def _nan_free(record) -> tuple:
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in astuple(record))


@needs_perfetto
def test_a_merged_gather_has_a_host_process_per_rank(tmp_path):
    from asyncgpu.ranks.merge import Merger
    from asyncgpu.ranks.wire import Marks, timeline_to_payload

    merger = Merger([20, 20], root=0)
    for rank in range(2):
        start = 1e12 + np.arange(20) * 1e4
        tl = Timeline.from_arrays(
            label="s", devices=["host:0", "host:1"], device=np.arange(20) % 2, start_ns=start, end_ns=start + 5e3
        )
        marks = Marks.from_tuples([("ar", int(1e12 + 1e5 * k), 5 * k, "main") for k in range(1, 3)])
        info = {"rank": rank, "host": "h", "pid": 1, "backend": "host", "asyncgpu_version": asyncgpu.__version__}
        merger.add(timeline_to_payload(tl, marks, info), (0, 0.0, 0.0, 0))
    result = merger.result()
    path = tmp_path / "ranks.pftrace"
    result.write_trace(path)
    p = parse(path)
    procs = sorted(name.split(" (")[0] for name in p.processes().values())  # (less the device descriptions)
    assert procs == ["host", "r0 host", "r0/host:0", "r0/host:1", "r1 host", "r1/host:0", "r1/host:1"]
    marks = [s for s in p.slices if s.category == "collective"]
    assert len(marks) == 4 and {p.path(s.track) for s in marks} == {"r0 host / main", "r1 host / main"}
    assert_same(read_trace(path), result.timeline)


@needs_perfetto
def test_issue_arrows_start_on_the_host_issue_track_and_end_on_their_slices(tmp_path):
    tl = with_issue_times(synthetic())
    write_trace(tl, tmp_path / "i.pftrace")
    p = parse(tmp_path / "i.pftrace")
    issues = [i for i in p.instants if p.path(i.track) == "host / host issue"]
    arrows = [0, 1, 2, 4, 6]  # drawn rows with an issue time (3 has none, 5 is unfinished)
    assert sorted(f for i in issues for f in i.flow_out) == [r + 1 for r in arrows]
    assert [i.start_ns for i in issues] == sorted(round(tl.issued_ns[r]) for r in arrows)  # in time order
    assert {i.category for i in issues} == {"issue"} and issues[0].name in tl.names
    ends = {f: s for s in p.slices for f in s.flow_in}
    assert sorted(ends) == [r + 1 for r in arrows]
    for r in arrows:
        assert ends[r + 1].args["row"] == r and ends[r + 1].start_ns == round(tl.start_ns[r])
    back = read_trace(tmp_path / "i.pftrace")
    assert_same(back, tl)
    assert back.issued_ns[5] == tl.issued_ns[5] and np.isnan(back.issued_ns[3])
    assert_same(back, read_trace_json(tmp_path, tl))


@needs_perfetto
def test_issue_arrows_of_a_merged_gather_start_in_each_ranks_host_process(tmp_path):
    from asyncgpu.ranks.merge import Merger
    from asyncgpu.ranks.wire import Marks, timeline_to_payload

    merger = Merger([6, 6], root=0)
    for rank in range(2):
        start = 1e12 + np.arange(6) * 1e4
        tl = Timeline.from_arrays(
            label="s",
            devices=["host:0", "host:1"],
            device=np.arange(6) % 2,
            start_ns=start,
            end_ns=start + 5e3,
            issued_ns=start - 1e3 * (1 + rank),
        )
        info = {"rank": rank, "host": "h", "pid": 1, "backend": "host", "asyncgpu_version": asyncgpu.__version__}
        merger.add(timeline_to_payload(tl, Marks.from_tuples([]), info), (0, 0.0, 0.0, 0))
    result = merger.result()
    result.write_trace(tmp_path / "r.pftrace")
    p = parse(tmp_path / "r.pftrace")
    tracks = {p.path(i.track): len([j for j in p.instants if j.track == i.track]) for i in p.instants if i.flow_out}
    assert tracks == {"r0 host / host issue": 6, "r1 host / host issue": 6}
    assert_same(read_trace(tmp_path / "r.pftrace"), result.timeline)


# -- what the file costs -----------------------------------------------------------------------------------------------
def _big(n_devices: int, per_device: int) -> Timeline:
    """Back-to-back activities on two streams per device, rows in issue order."""
    rng = np.random.default_rng(0)
    n = n_devices * per_device
    device = np.repeat(np.arange(n_devices), per_device)
    stream = device * 2 + rng.integers(0, 2, n)
    dur = rng.lognormal(np.log(20e3), 0.5, n)
    start = np.empty(n)
    for st in range(2 * n_devices):
        rows = np.flatnonzero(stream == st)
        step = dur[rows] + rng.exponential(5e3, rows.size)
        start[rows] = 1e12 + np.cumsum(step) - step
    return Timeline.from_arrays(
        devices=[f"cuda:{d}" for d in range(n_devices)],
        device=device,
        start_ns=start,
        end_ns=start + dur,
        names=["gemm", "copy"],
        name=rng.integers(0, 2, n),
        kind=rng.choice(["kernel", "memcpy"], n),
        streams=[(d, f"s{k}") for d in range(n_devices) for k in range(2)],
        stream=stream,
    )


@needs_perfetto
def test_bytes_per_activity_and_flat_memory_while_writing(tmp_path):
    """The issue's budget is 40 bytes per activity; the writer streams: twice the activities take about the same
    memory, far less than the file."""
    peaks_mb = []
    for per_device in (100_000, 200_000):
        tl = _big(4, per_device)
        tracemalloc.start()
        try:
            write_trace(tl, tmp_path / "big.pftrace")
            peaks_mb.append(tracemalloc.get_traced_memory()[1] / 1e6)
        finally:
            tracemalloc.stop()
        size = (tmp_path / "big.pftrace").stat().st_size
        assert size / len(tl) <= 40, size / len(tl)
    assert peaks_mb[1] < 1.3 * peaks_mb[0] and peaks_mb[1] < 0.5 * size / 1e6, (peaks_mb, size)
    assert_same(read_trace(tmp_path / "big.pftrace"), tl)


# -- errors ------------------------------------------------------------------------------------------------------------
def test_without_the_perfetto_package(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "perfetto" or m.startswith("perfetto.")] + ["perfetto"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r'pip install "asyncgpu\[perfetto\]".*\.json path'):
        write_trace(synthetic(), tmp_path / "t.pftrace")
    write_trace(synthetic(), tmp_path / "t.json")  # JSON needs nothing
    assert_same(read_trace(tmp_path / "t.json"), synthetic())


@needs_perfetto
def test_reading_needs_no_package(tmp_path, monkeypatch):
    write_trace(synthetic(), tmp_path / "t.pftrace")
    for name in [m for m in sys.modules if m == "perfetto" or m.startswith("perfetto.")] + ["perfetto"]:
        monkeypatch.setitem(sys.modules, name, None)
    assert_same(read_trace(tmp_path / "t.pftrace"), synthetic())


@needs_perfetto
def test_files_that_are_not_asyncgpu_traces(tmp_path):
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    builder = TraceProtoBuilder()
    packet = builder.add_packet()
    packet.timestamp, packet.trusted_packet_sequence_id = 1000, 1
    packet.track_event.type, packet.track_event.name, packet.track_event.track_uuid = 3, "theirs", 1
    (tmp_path / "theirs.pftrace").write_bytes(builder.serialize())
    write_trace(synthetic(), tmp_path / "ours.pftrace")
    data = (tmp_path / "ours.pftrace").read_bytes()
    (tmp_path / "cut.pftrace").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.pftrace").write_bytes(b"")
    (tmp_path / "noise.pftrace").write_bytes(bytes(range(256)))
    for name, why in (
        ("theirs", "has no asyncgpu metadata"),
        ("cut", "is corrupt"),
        ("empty", "is empty"),
        ("noise", "is not a Perfetto trace"),
    ):
        with pytest.raises(ValueError, match=f"not an asyncgpu trace: .*{name}.pftrace {why}"):
            read_trace(tmp_path / f"{name}.pftrace")


def test_a_layer_kind_nobody_registered():
    with pytest.raises(ValueError, match="kind 'mystery'.*known: .*'handoffs'.*'kernel'"):
        layer_from_data({"kind": "mystery"})


def test_import_asyncgpu_does_not_import_perfetto():
    code = "import sys, asyncgpu; print([m for m in sys.modules if m.startswith(('perfetto', 'google.protobuf'))])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@needs_perfetto
def test_cli_report_reads_a_native_trace(tmp_path, capsys):
    from asyncgpu._cli.main import main

    devs = asyncgpu.devices("host")
    with gpu_timer(devs, label="saved") as t:
        for i, d in enumerate(devs):  # (long enough that a loaded host's stall in issuing them is not the story)
            d.stream.spin_us(20_000 * (i + 1))
    write_trace(t, tmp_path / "t.pftrace")
    assert main(["report", str(tmp_path / "t.pftrace")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # (long lines wrap at the console's width)
    assert out.startswith(f"trace {tmp_path / 't.pftrace'}: scope 'saved', 2 activities on host:0")
    assert "straggler host:1" in out


# -- trace processor ---------------------------------------------------------------------------------------------------
def _sql(trace: Path, query: str) -> int:
    out = subprocess.run(
        [TRACE_PROCESSOR, "-q", "/dev/stdin", str(trace)], input=query, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return int([line for line in out.stdout.splitlines() if line.strip()][-1].strip().strip('"'))


@pytest.mark.skipif(
    not TRACE_PROCESSOR,
    reason="set ASYNCGPU_TRACE_PROCESSOR to a trace_processor_shell binary to load the traces in trace processor",
)
@needs_perfetto
def test_trace_processor_loads_the_trace(tmp_path):
    tl = synthetic()
    dev = asyncgpu.device("host:0")
    with gpu_timer(dev) as t:
        ch = Channel(1, name="tp")
        dev.stream.spin_us(100)
        ch.put_sync(0, stream=dev.stream)
        ch.get_sync(stream=dev.stream).done(stream=dev.stream)
    for source in (tl, t):
        path = tmp_path / "tp.pftrace"
        write_trace(source, path)
        p = parse(path)
        assert _sql(path, "select count(*) from stats where severity in ('error', 'data_loss') and value > 0;") == 0
        assert _sql(path, "select count(*) from slice;") == len(p.slices) + len(p.instants)
        assert _sql(path, "select count(*) from slice where dur > 0 and category = 'kernel';") == sum(
            s.category == "kernel" and s.end_ns > s.start_ns for s in p.slices
        )
        assert _sql(path, "select count(*) from flow;") == sum(len(s.flow_out) for s in p.slices)
        assert _sql(path, "select count(*) from counter;") == sum(len(v) for v in p.counters.values())
        assert _sql(path, "select count(*) from process where name = 'host';") == 1
        first = min(s.start_ns for s in p.slices + p.instants)
        assert _sql(path, "select min(ts) from slice;") == first  # CLOCK_MONOTONIC is the trace's clock


@pytest.mark.parametrize("suffix", [".json", ".pftrace"])
def test_host_ranges_come_back_in_order(tmp_path, suffix):
    if suffix == ".pftrace" and not HAVE_PERFETTO:
        pytest.skip('needs the perfetto package (pip install "asyncgpu[perfetto]")')
    t0 = 10**12
    ranges = tuple(HostRange(f"b{i}", "user", t0 + 10 * (5 - i), t0 + 10 * (5 - i) + 5, "T") for i in range(5))
    tl = Timeline.from_arrays(devices=["host:0"], device=[0], start_ns=[t0], end_ns=[t0 + 1], host_ranges=ranges)
    write_trace(tl, tmp_path / f"t{suffix}")
    assert read_trace(tmp_path / f"t{suffix}").host_ranges == ranges


@needs_perfetto
def test_times_before_zero_have_no_place_in_a_perfetto_trace(tmp_path):
    tl = Timeline.from_arrays(devices=["host:0"], device=[0], start_ns=[-50], end_ns=[10])
    with pytest.raises(ValueError, match="from 0 ns on; this timeline starts at -50 ns"):
        write_trace(tl, tmp_path / "t.pftrace")
    write_trace(tl, tmp_path / "t.json")  # JSON counts from the origin: any time goes
    assert read_trace(tmp_path / "t.json").start_ns.tolist() == [-50.0]
