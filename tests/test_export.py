"""Exports: the Perfetto trace (structure, nesting, round trip through read_trace), CSV, JSON, errors."""

from __future__ import annotations

import csv
import dataclasses
import errno
import io
import json
import os

import anyio
import numpy as np
import pytest

from asyncgpu import ScopeError, gpu_timer
from asyncgpu._base.records import DeviceClock, HostRange, Timeline
from asyncgpu._trace.export import read_trace, to_csv, to_json, trace_dict, write_trace

pytestmark = pytest.mark.anyio


def check_trace(doc: dict) -> dict:
    """Assert that ``doc`` is valid Trace Event Format as Perfetto reads it; returns {pid: process name}."""
    assert doc["displayTimeUnit"] == "ns" and isinstance(doc["traceEvents"], list)
    procs, threads, tracks, last = {}, {}, {}, {}
    for ev in doc["traceEvents"]:
        assert {"ph", "pid", "tid", "ts"} <= ev.keys(), ev
        if ev["ph"] == "M":
            if ev["name"] == "process_name":
                procs[ev["pid"]] = ev["args"]["name"]
            elif ev["name"] == "thread_name":
                assert ev["tid"] not in threads, "tids are unique in the trace"
                threads[ev["tid"]] = (ev["pid"], ev["args"]["name"])
        elif ev["ph"] == "C":  # a counter of the process: one numeric value
            assert ev["ts"] >= 0 and ev["name"] and len(ev["args"]) == 1, ev
            assert all(isinstance(v, (int, float)) for v in ev["args"].values()), ev
        elif ev["ph"] in ("i", "s", "f"):  # instants and flow ends, on named tracks
            assert ev["ts"] >= 0 and ev["cat"], ev
            tracks.setdefault((ev["pid"], ev["tid"]), [])
        else:
            assert ev["ph"] == "X" and ev["dur"] >= 0 and ev["ts"] >= 0 and ev["name"] and ev["cat"], ev
            track = (ev["pid"], ev["tid"])
            tracks.setdefault(track, []).append((ev["ts"], ev["ts"] + ev["dur"]))
            key = (ev["ts"], -ev["dur"])  # in time order, parents before children that start with them
            assert key >= last.get(track, key), f"{ev} comes out of order on its track"
            last[track] = key
    assert "host" in procs.values()
    for pid, tid in tracks:
        assert pid in procs and threads[tid][0] == pid, f"track {(pid, tid)} is not named"
    for spans in tracks.values():  # complete events must nest on a track
        open_ends: list[float] = []
        for s, e in sorted(spans, key=lambda se: (se[0], -se[1])):
            while open_ends and open_ends[-1] <= s:
                open_ends.pop()
            assert not open_ends or e <= open_ends[-1], f"[{s}, {e}] overlaps its parent without nesting"
            open_ends.append(e)
    return procs


def assert_same(a: Timeline, b: Timeline) -> None:
    """Same rows (decoded values), same times within 1 ns, same tables, clocks and host ranges."""
    assert len(a) == len(b) and a.label == b.label and a.devices == b.devices and a.streams == b.streams
    for col in ("device", "stream", "kind"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
    assert [a.names[i] for i in a.name] == [b.names[i] for i in b.name]
    for col in ("start_ns", "end_ns", "duration_ns", "issued_ns"):
        np.testing.assert_allclose(getattr(a, col), getattr(b, col), rtol=0, atol=1.0, err_msg=col)
    assert (a.scope_start_ns, a.scope_end_ns, a.error, a.cancelled) == (
        b.scope_start_ns,
        b.scope_end_ns,
        b.error,
        b.cancelled,
    )
    assert a.descriptions == b.descriptions and a.host_ranges == b.host_ranges
    assert [(c.aligned, c.reason, c.offset_ns, c.drift_ppm) for c in a.clocks] == [
        (c.aligned, c.reason, c.offset_ns, c.drift_ppm) for c in b.clocks
    ]


def synthetic() -> Timeline:
    """Two devices, the second not aligned; two streams on the first; a name that needs escaping; an unfinished
    row (5). On cuda:0 s0, block 0 holds block 2, which starts with its kernel 1 but was issued after it; block 6
    overlaps block 0 without nesting (so does the second host block with the first)."""
    t0 = 5_000_000_000_000
    return Timeline.from_arrays(
        label="synthetic",
        devices=["cuda:0", "cuda:1"],
        streams=[(0, "s0"), (0, "s1"), (1, "s0")],
        device=[0, 0, 0, 0, 1, 0, 0],
        stream=[0, 0, 0, 1, 2, 1, 0],
        names=["k", 'quote " comma, µs', "block"],
        name=[2, 0, 2, 1, 0, 0, 2],
        kind=["user", "kernel", "user", "memcpy", "kernel", "kernel", "user"],
        start_ns=[t0 + 100.25, t0 + 200, t0 + 200, t0 - 40, t0 + 1000.25, np.nan, t0 + 800],
        end_ns=[t0 + 900.25, t0 + 700, t0 + 800, t0 + 60, t0 + 3000.25, np.nan, t0 + 1500],
        duration_ns=[800, 499.75, 600, 100, 2000, np.nan, 700],
        scope_start_ns=t0,
        scope_end_ns=t0 + 2000,
        clocks=[
            DeviceClock("cuda:0", True, 350.0, 12, 0.02),
            DeviceClock("cuda:1", False, float("nan"), reason="clock calibration failed (busy)"),
        ],
        host_ranges=(
            HostRange("synthetic", "scope", t0, t0 + 2000, "MainThread"),
            HostRange("block", "user", t0 + 10, t0 + 500, "MainThread"),
            HostRange("block", "user", t0 + 300, t0 + 800, "MainThread"),
        ),
        descriptions=("NVIDIA H200 (sm_90)", "NVIDIA H200 (sm_90)"),
        error="RuntimeError: boom",
    )


def test_trace_structure_labels_and_round_trip(tmp_path):
    tl = synthetic()
    doc = trace_dict(tl)
    procs = check_trace(doc)
    assert procs == {
        1: "host",
        2: "cuda:0 NVIDIA H200 (sm_90)",
        3: "cuda:1 NVIDIA H200 (sm_90) (NOT aligned: relative time)",
    }
    meta = doc["otherData"]
    assert meta["asyncgpu_trace_version"] == 1 and meta["label"] == "synthetic"
    assert meta["origin_ns"] == 5_000_000_000_000 - 40  # the earliest start: every ts is >= 0
    assert meta["unfinished_rows"] == 1 and meta["rows"] == 7
    assert meta["devices"][0] == {
        "name": "cuda:0",
        "description": "NVIDIA H200 (sm_90)",
        "aligned": True,
        "bound_ns": 350.0,
        "offset_ns": 12,
        "drift_ppm": 0.02,
        "reason": "",
        "overhead_ns": 0.0,
        "overhead_source": "",
        "pid": 2,
    }
    assert meta["devices"][1]["aligned"] is False and meta["devices"][1]["bound_ns"] is None
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] != 1]
    assert len(xs) == 6 and sorted(e["args"]["row"] for e in xs) == [0, 1, 2, 3, 4, 6]
    kernel = next(e for e in xs if e["args"]["row"] == 1)
    assert kernel["ts"] == pytest.approx(0.240) and kernel["dur"] == pytest.approx(0.5)
    block, outer, late = (next(e for e in xs if e["args"]["row"] == i) for i in (2, 0, 6))
    assert block["tid"] == kernel["tid"] == outer["tid"] != late["tid"]
    assert kernel["cat"] == kernel["args"]["kind"] == "kernel" and kernel["args"]["duration_ms"] == 0.0005
    thread_names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(thread_names.values()) == ["MainThread", "MainThread (2)", "s0", "s0", "s0 (2)", "s1"]
    path = tmp_path / "trace.json"
    write_trace(tl, path)
    assert json.loads(path.read_text()) == doc
    assert_same(read_trace(path), tl)


async def test_trace_of_host_scopes(two_devs, tmp_path):
    async def task(t, d, i):
        async with t.activity(f"step {i}", device=d):
            d.stream.spin_us(300)
            await anyio.sleep(0.001)

    async with gpu_timer(two_devs, label="host scope") as t:
        async with anyio.create_task_group() as tg:
            for i, d in enumerate(two_devs * 2):  # concurrent blocks on one thread: host ranges overlap
                tg.start_soon(task, t, d, i)
    async with gpu_timer(two_devs[0], label="second") as t2:
        two_devs[0].streams[1].spin_us(100)
    path = tmp_path / "t.json"
    write_trace(t, path)
    doc = json.loads(path.read_text())
    procs = check_trace(doc)
    assert sorted(procs.values()) == sorted(["host"] + [f"{d.name} {d.description}" for d in two_devs])
    names = sorted(e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] not in ("issue", "gc"))
    assert names == sorted([f"step {i}" for i in range(4)] * 2 + ["spin"] * 4 + ["host scope"])
    issued = sorted(e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "issue")
    assert issued == sorted([f"step {i}" for i in range(4)] + ["spin"] * 4)  # each activity's issue, once
    assert_same(read_trace(path), t.timeline)
    write_trace([t, t2], path)  # several scopes in one trace
    doc = json.loads(path.read_text())
    check_trace(doc)
    assert [s["label"] for s in doc["otherData"]["scopes"]] == ["host scope", "second"]
    back = read_trace(path)
    assert back.label == "host scope + second" and len(back) == len(t.timeline) + 1
    assert back.devices == tuple(d.name for d in two_devs) and back.streams[-1] == (0, "s1")
    assert [s.rows for s in back.scopes] == [len(t.timeline), 1]
    assert [r.name for r in back.host_ranges if r.kind == "scope"] == ["host scope", "second"]


def test_merged_devices_keep_their_worst_clock():
    def one(label, names, clocks):
        return Timeline.from_arrays(
            label=label,
            devices=names,
            device=range(len(names)),
            start_ns=[1e6] * len(names),
            end_ns=[2e6] * len(names),
            clocks=clocks,
        )

    a = one("a", ["cuda:0"], [DeviceClock("cuda:0", True, 100.0)])
    b = one(
        "b",
        ["cuda:1", "cuda:0"],
        [DeviceClock("cuda:1", False, float("nan"), reason="busy"), DeviceClock("cuda:0", True, 300.0)],
    )
    c = one("a", ["cuda:1"], [DeviceClock("cuda:1", True, 5.0)])
    meta = trace_dict([a, b, c])["otherData"]
    assert meta["label"] == "a + b"
    assert [(d["name"], d["aligned"], d["bound_ns"], d["reason"]) for d in meta["devices"]] == [
        ("cuda:0", True, 300.0, ""),
        ("cuda:1", False, None, "busy"),
    ]
    assert meta["streams"] == [[0, "s0"], [1, "s0"]] and meta["rows"] == 4


def test_a_timeline_without_clocks_is_not_called_aligned():
    tl = Timeline(
        "bare",
        ("cuda:0",),
        ((0, "s0"),),
        ("k",),
        np.zeros(1, np.int16),
        np.zeros(1, np.int32),
        np.zeros(1, np.int32),
        np.zeros(1, np.int8),
        np.array([1e6]),
        np.array([2e6]),
        np.array([1e6]),
        0,
        3_000_000,
    )
    doc = trace_dict(tl)
    assert check_trace(doc)[2] == "cuda:0 (NOT aligned: relative time)"
    assert doc["otherData"]["devices"][0]["reason"] == "the timeline has no clock information"


def test_csv_and_json_records():
    tl = synthetic()
    rows = list(csv.DictReader(io.StringIO(to_csv(tl))))
    assert len(rows) == 7 and rows[3]["name"] == 'quote " comma, µs' and rows[3]["stream"] == "s1"
    assert rows[1] == {
        "device": "cuda:0",
        "stream": "s0",
        "name": "k",
        "kind": "kernel",
        "start_ns": "5000000000200",
        "end_ns": "5000000000700",
        "duration_ns": "500",
        "start_ms": "0.000200",
        "issued_ns": "",  # (synthetic: not known)
    }
    assert rows[5]["start_ns"] == rows[5]["duration_ns"] == rows[5]["start_ms"] == ""
    doc = json.loads(to_json(tl))
    assert doc["label"] == "synthetic" and doc["error"] == "RuntimeError: boom" and len(doc["host_ranges"]) == 3
    assert doc["devices"][1]["aligned"] is False
    recs = doc["records"]
    assert [r["name"] for r in recs] == [tl.names[i] for i in tl.name]
    assert recs[4] == {
        "device": "cuda:1",
        "stream": "s0",
        "name": "k",
        "kind": "kernel",
        "start_ns": 5000000001000,
        "end_ns": 5000000003000,
        "duration_ns": 2000,
        "start_ms": 0.001,
        "issued_ns": None,  # (synthetic: not known)
    }
    assert recs[5]["start_ns"] is None and recs[5]["duration_ns"] is None
    issued = with_issue_times(tl)
    assert [r["issued_ns"] for r in csv.DictReader(io.StringIO(to_csv(issued)))][4:6] == [
        "5000000000950",
        "5000000001234",
    ]
    assert json.loads(to_json(issued))["records"][3]["issued_ns"] is None


def test_files_and_text_agree(tmp_path):
    tl = synthetic()
    assert to_csv(tl, tmp_path / "r.csv") is None and to_json(tl, tmp_path / "r.json") is None
    assert (tmp_path / "r.csv").read_text(encoding="utf-8") == to_csv(tl)
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == to_json(tl)


def test_empty_timeline(tmp_path):
    tl = Timeline.from_arrays(
        label="empty",
        devices=["host:0"],
        device=[],
        start_ns=[],
        end_ns=[],
        scope_start_ns=10,
        scope_end_ns=20,
        descriptions=("host worker threads",),
    )
    doc = trace_dict(tl)
    assert check_trace(doc) == {1: "host", 2: "host:0 host worker threads"}
    assert [e for e in doc["traceEvents"] if e["ph"] == "X"] == []
    write_trace(tl, tmp_path / "e.json")
    assert_same(read_trace(tmp_path / "e.json"), tl)
    assert to_csv(tl) == "device,stream,name,kind,start_ns,end_ns,duration_ns,start_ms,issued_ns\n"
    assert json.loads(to_json(tl))["records"] == []


async def test_sources(dev):
    t = gpu_timer(dev)
    with pytest.raises(ScopeError, match="after the scope"):
        trace_dict(t)
    async with t:
        dev.stream.spin_us(10)
    assert trace_dict(t) == trace_dict(t.timeline) == trace_dict([t])
    for bad in ([], "t", None):
        with pytest.raises(TypeError, match="Timeline, a Timer"):
            to_csv(bad)


def test_unwritable_paths_name_the_fix(tmp_path):
    tl = synthetic()
    with pytest.raises(FileNotFoundError, match=r"cannot write the trace to .*missing.*create it first"):
        write_trace(tl, tmp_path / "missing" / "t.json")
    with pytest.raises(IsADirectoryError, match="give a file name"):
        to_csv(tl, tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(PermissionError, match="choose a writable path"):
            to_json(tl, tmp_path / "ro" / "r.json")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_directory_that_refuses_the_file_is_not_called_missing():
    with pytest.raises(FileNotFoundError) as info:  # /proc exists: the system refuses a new file in it
        write_trace(synthetic(), "/proc/x.json")
    message = str(info.value)
    assert "cannot write the trace to /proc/x.json: No such file or directory" in message
    assert "/proc exists" in message and "choose a writable path" in message and "create it first" not in message


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that is always full)")
@pytest.mark.parametrize("write", [write_trace, to_json, to_csv])
def test_a_write_that_fails_midway_names_the_path(write):
    with pytest.raises(OSError) as info:  # opening works; writing fails
        write(synthetic(), "/dev/full")
    assert info.value.errno == errno.ENOSPC
    assert "to /dev/full: No space left on device: free space there" in str(info.value)


@pytest.mark.parametrize("bad", [b"t.json", 3, 2.5, None])
def test_a_path_that_is_not_a_path_is_a_type_error_naming_it(tmp_path, bad):
    tl = synthetic()
    calls = [lambda: write_trace(tl, bad), lambda: read_trace(bad)]
    if bad is not None:  # (None: to_json and to_csv return the text)
        calls += [lambda: to_json(tl, bad), lambda: to_csv(tl, bad)]
    for call in calls:
        with pytest.raises(TypeError, match=r"^path must be a file path, a str or a pathlib.Path, not "):
            call()
    assert not os.path.exists("t.json") and not os.path.exists(tmp_path / "t.json")


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"traceEvents": [], "displayTimeUnit": "ns"}', "was not written by asyncgpu"),
        ('[{"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]', "was not written by asyncgpu"),
        ('{"traceEvents": [', "not valid JSON"),
        ('{"otherData": {"asyncgpu_trace_version": 99}, "traceEvents": []}', "version 99"),
        ('{"otherData": {"asyncgpu_trace_version": 1}, "traceEvents": []}', "corrupt"),
    ],
)
def test_read_trace_rejects_other_files(tmp_path, text, why):
    path = tmp_path / "other.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"not an asyncgpu trace.*{why}"):
        read_trace(path)


def test_read_trace_rejects_a_trace_missing_rows(tmp_path):
    doc = trace_dict(synthetic())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("args", {}).get("row") != 2]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"corrupt.*rows \[2\]"):
        read_trace(path)


def test_a_timeline_from_arrays_without_clocks_gives_one_answer_everywhere():
    """Regression (issue 12): with ``clocks=()``, ``Timeline.aligned`` and ``device_summary`` said aligned while
    the trace named the process NOT aligned. A device without clock information is not aligned, everywhere."""
    from asyncgpu import device_summary

    tl = Timeline.from_arrays(devices=["cuda:0"], device=[0], start_ns=[1e6], end_ns=[2e6], clocks=())
    assert not tl.aligned
    assert not tl.clocks[0].aligned and tl.clocks[0].reason == "the timeline has no clock information"
    assert [r.aligned for r in device_summary(tl).rows] == [False]
    assert check_trace(trace_dict(tl))[2] == "cuda:0 (NOT aligned: relative time)"


async def test_host_times_and_collective_marks_survive_a_trace_round_trip(dev, tmp_path):
    """The report needs no live scope: what it reads (host times, marks) is in the timeline and in the trace."""
    from asyncgpu import ranks
    from asyncgpu._analysis.report import render, timeline_report

    async with gpu_timer(dev, label="step") as t:
        dev.stream.spin_us(100)
        ranks.mark_collective("allreduce")
        dev.stream.spin_us(100)
        ranks.mark_collective("allreduce")
    tl = t.timeline
    assert tl.host_ms == t.host_ms and tl.wait_ms == t.wait_ms and tl.cpu_ms == t.cpu_ms
    assert [(m.name, m.row) for m in tl.marks] == [("allreduce", 1), ("allreduce", 2)]
    path = tmp_path / "t.json"
    write_trace(t, path)
    back = read_trace(path)
    assert (back.host_ms, back.wait_ms, back.cpu_ms) == (tl.host_ms, tl.wait_ms, tl.cpu_ms)
    assert back.marks == tl.marks
    assert render(timeline_report(back)).splitlines()[-1] == render(timeline_report(tl)).splitlines()[-1]


def test_json_keeps_whole_ns_far_from_zero(tmp_path):
    """Times count from otherData.origin_ns: 1 ns steps survive at 2**52 ns (52 days of uptime), where an
    absolute µs double would round them."""
    t0 = 2**52
    tl = Timeline.from_arrays(
        devices=["host:0"],
        device=[0, 0, 0],
        start_ns=[t0 + 1, t0 + 2, t0 + 3],
        end_ns=[t0 + 2, t0 + 3, t0 + 5],
        scope_start_ns=t0,
    )
    doc = trace_dict(tl)
    assert doc["otherData"]["origin_ns"] == t0
    xs = sorted((e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "user")
    assert xs == [(0.001, 0.001), (0.002, 0.001), (0.003, 0.002)]
    write_trace(tl, tmp_path / "p.json")
    back = read_trace(tmp_path / "p.json")
    assert back.start_ns.tolist() == tl.start_ns.tolist() and back.end_ns.tolist() == tl.end_ns.tolist()


def test_the_json_metadata_holds_the_clocks_the_origin_and_the_layers():
    meta = trace_dict(synthetic())["otherData"]
    assert [d["aligned"] for d in meta["devices"]] == [True, False] and meta["devices"][0]["offset_ns"] == 12
    assert meta["layers"] == [] and meta["origin_ns"] == 5_000_000_000_000 - 40


def test_json_counters_per_device():
    doc = trace_dict(synthetic())
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert {(e["pid"], e["name"]) for e in counters} == {
        (pid, name) for pid in (2, 3) for name in ("utilisation", "activities in flight")
    }
    util = [e["args"]["%"] for e in counters if e["pid"] == 3 and e["name"] == "utilisation"]
    assert util == [0.0, 95.975, 100.0, 4.025, 0.0]  # cuda:1: one activity over 2 µs, in 1 µs buckets


# -- issue times: arrows from the host, and back ---------------------------------------------------------------
def with_issue_times(tl: Timeline) -> Timeline:
    """``synthetic()`` with issue times: every row but row 3 (no arrow), the unfinished row 5 included."""
    issued = tl.start_ns - 50.5
    issued[3] = np.nan
    issued[5] = tl.scope_start_ns + 1234
    return dataclasses.replace(tl, issued_ns=issued)


def test_json_trace_draws_an_arrow_from_the_host_issue_track_to_each_issued_slice(tmp_path):
    tl = with_issue_times(synthetic())
    doc = trace_dict(tl)
    check_trace(doc)
    events = doc["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    issues = [e for e in events if e["ph"] == "X" and e["cat"] == "issue"]
    starts = {e["id"]: e for e in events if e["ph"] == "s" and e["cat"] == "issue"}
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == "issue"}
    arrows = [0, 1, 2, 4, 6]  # drawn rows with an issue time (3 has none, 5 is unfinished)
    assert sorted(starts) == sorted(ends) == [r + 1 for r in arrows] and len(issues) == len(arrows)
    assert {threads[e["tid"]] for e in issues} == {"host issue"} and all(e["dur"] == 0 for e in issues)
    slices = {e["args"]["row"]: e for e in events if e["ph"] == "X" and e["pid"] != 1 and "row" in e["args"]}
    origin = doc["otherData"]["origin_ns"]
    for r in arrows:
        s, f = starts[r + 1], ends[r + 1]
        assert s["tid"] == issues[0]["tid"] and s["ts"] == pytest.approx((tl.issued_ns[r] - origin) / 1e3, abs=1e-3)
        assert f["bp"] == "e" and (f["pid"], f["tid"], f["ts"]) == (slices[r]["pid"], slices[r]["tid"], slices[r]["ts"])
    back = read_trace_via(tmp_path, tl, ".json")
    assert_same(back, tl)
    assert back.issued_ns[5] == tl.issued_ns[5] and np.isnan(back.issued_ns[3])  # unfinished: via the metadata
    assert back.records()[0].issued_ns == round(tl.issued_ns[0])


def read_trace_via(tmp_path, tl: Timeline, suffix: str) -> Timeline:
    write_trace(tl, tmp_path / f"issued{suffix}")
    return read_trace(tmp_path / f"issued{suffix}")


def test_a_trace_without_issue_times_has_no_arrows_and_reads_back_unknown(tmp_path):
    doc = trace_dict(synthetic())
    assert not [e for e in doc["traceEvents"] if e.get("cat") == "issue"]
    assert np.isnan(read_trace_via(tmp_path, synthetic(), ".json").issued_ns).all()


def test_issue_times_travel_through_the_rank_payload_and_the_merge():
    import asyncgpu
    from asyncgpu.ranks.merge import Merger, merged_from_payload, merged_to_payload
    from asyncgpu.ranks.wire import Marks, payload_to_timeline, timeline_to_payload, unpack

    start = 1e12 + np.arange(20) * 1e4
    issued = start - 3e3
    issued[7] = np.nan
    tl = Timeline.from_arrays(
        label="s", devices=["host:0", "host:1"], device=np.arange(20) % 2, start_ns=start, end_ns=start + 5e3
    )
    marks = Marks.from_tuples([])
    info = {"host": "h", "pid": 1, "backend": "host", "asyncgpu_version": asyncgpu.__version__}
    bare = timeline_to_payload(tl, marks, {**info, "rank": 0})  # no issue times: no column (35 bytes a row)
    assert "issued_ns" not in unpack(bare)[1]
    assert np.isnan(payload_to_timeline(*unpack(bare))[0].issued_ns).all()
    tl = dataclasses.replace(tl, issued_ns=issued)
    payload = timeline_to_payload(tl, marks, {**info, "rank": 1})
    assert payload.size - bare.size >= 8 * len(tl)
    back = payload_to_timeline(*unpack(payload))[0]
    np.testing.assert_array_equal(back.issued_ns, issued)
    merger = Merger([20, 20], root=0)
    merger.add(bare, (0, 0.0, 0.0, 0))
    merger.add(payload, (7_000, 10.0, 20.0, 4))
    rt = merger.result()
    merged = rt.timeline.issued_ns
    assert np.isnan(merged[:20]).all()
    np.testing.assert_array_equal(merged[20:], issued - 7_000)  # moved onto the root's clock, as every time
    np.testing.assert_array_equal(rt.rank(1).issued_ns, issued - 7_000)
    again = merged_from_payload(merged_to_payload(rt))
    np.testing.assert_array_equal(again.timeline.issued_ns, merged)
    rows = rt.balance().devices
    assert [r.launch_bound_ms for r in rows[:2]] == [None, None]  # rank 0 sent no issue times
    # rank 1 (its scope starts first, 7 µs before rank 0's): each device's activities are 20 µs apart, 5 µs long,
    # issued 3 µs before they start: of each 15 µs gap, 12 µs launch-bound and 3 µs dependency. host:0: 9 gaps;
    # host:1: 9 gaps and the leading 10 µs (7 + 3), less the gap before row 7, which has no issue time
    assert [(r.launch_bound_ms, r.dependency_ms) for r in rows[2:]] == [
        (pytest.approx(0.108), pytest.approx(0.027)),
        (pytest.approx(0.103), pytest.approx(0.027)),
    ]


@pytest.mark.parametrize("suffix", [".trace.json", ".pftrace"])
def test_how_the_pair_overhead_was_measured_travels_with_the_timeline(tmp_path, suffix):
    """Each device's clock says what was taken out of its brackets and how it was measured: traces bring it back,
    a rank payload carries it, and the report's footer says it."""
    pytest.importorskip("perfetto") if suffix == ".pftrace" else None
    from asyncgpu._analysis.report import durations_from
    from asyncgpu.ranks import wire

    how = "against CUPTI (21 kernels)"
    tl = dataclasses.replace(
        synthetic(), clocks=(dataclasses.replace(synthetic().clocks[0], overhead_ns=2431.0, overhead_source=how),)
    )
    assert tl.clocks[0].overhead_source == how
    path = tmp_path / f"t{suffix}"
    write_trace(tl, str(path))
    assert read_trace(str(path)).clocks[0].overhead_source == how
    header, cols = wire.unpack(wire.timeline_to_payload(tl, wire.Marks.from_tuples([]), {}))
    assert wire.payload_to_timeline(header, cols)[0].clocks[0].overhead_source == how
    assert f"cuda:0 2.43 µs ({how})" in durations_from(tl)
