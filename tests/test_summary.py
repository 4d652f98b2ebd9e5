"""Summaries of a Timeline: per activity, per device (busy = union of intervals), balance and its re-split."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asyncgpu._records import DeviceClock, Timeline
from asyncgpu._summary import activity_summary, balance, device_summary

MS = 1_000_000  # ns
T0 = 5_000_000_000  # an absolute scope start, in host ns


class Named:
    """Stands for a Device: hashable, with a ``name``."""

    def __init__(self, name):
        self.name = name


def timeline(devices, rows, *, scope_ms=None, clocks=None, error=None, names=("work",)):
    """``rows``: (device code, start ms, end ms[, name code]) relative to T0; None times for unfinished rows."""
    dev = [r[0] for r in rows]
    start = [np.nan if r[1] is None else T0 + r[1] * MS for r in rows]
    end = [np.nan if r[2] is None else T0 + r[2] * MS for r in rows]
    name = [r[3] if len(r) > 3 else 0 for r in rows]
    return Timeline.from_arrays(
        label="t",
        devices=devices,
        device=dev,
        start_ns=start,
        end_ns=end,
        names=names,
        name=name,
        scope_start_ns=T0,
        scope_end_ns=T0 + int((scope_ms or 0) * MS),
        clocks=clocks,
        error=error,
    )


def brute_union_ms(intervals):
    """Busy time by walking the merged intervals in plain Python."""
    busy, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(intervals):
        lo = max(lo, 0.0)
        hi = max(hi, lo)
        if cur_hi is None or lo > cur_hi:
            busy += 0.0 if cur_hi is None else cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    return busy + (0.0 if cur_hi is None else cur_hi - cur_lo)


def test_busy_is_the_union_with_overlap_nesting_duplicates_and_zero_length():
    rows = [(0, 0, 10), (0, 2, 5), (0, 2, 5), (0, 8, 12), (0, 20, 20), (0, 25, 30)]
    s = device_summary(timeline(["a"], rows, scope_ms=40)).rows[0]
    assert s.count == 6 and s.unfinished == 0
    assert s.busy_ms == pytest.approx(17)  # [0, 12] + [20, 20] + [25, 30]
    assert s.sum_ms == pytest.approx(25)
    assert s.idle_ms == pytest.approx(23)
    assert s.largest_gap_ms == pytest.approx(10)  # 30 -> the window's end at 40 (inner gaps: 8, 5)
    assert s.utilisation == pytest.approx(17 / 40)
    assert (s.first_start_ms, s.last_end_ms, s.window_ms) == (0.0, 30.0, 40.0)


def test_leading_gap_and_touching_intervals():
    rows = [(0, 15, 20), (0, 20, 22), (0, 22.5, 23)]  # touching intervals merge
    s = device_summary(timeline(["a"], rows, scope_ms=25)).rows[0]
    assert s.busy_ms == pytest.approx(7.5)
    assert s.largest_gap_ms == pytest.approx(15)  # scope start -> first activity
    assert s.idle_ms == pytest.approx(25 - 7.5)


@pytest.mark.parametrize("seed", range(5))
def test_busy_matches_a_brute_force_union(seed):
    rng = np.random.default_rng(seed)
    start = rng.uniform(-1, 100, 300)
    end = start + rng.exponential(3, 300) * (rng.random(300) > 0.1)  # some zero-length
    rows = [(int(d), float(s), float(e)) for d, s, e in zip(rng.integers(0, 3, 300), start, end)]
    ds = device_summary(timeline(["a", "b", "c"], rows, scope_ms=50))
    for code, r in enumerate(ds.rows):
        mine = [(s, e) for d, s, e in rows if d == code]
        assert r.busy_ms == pytest.approx(brute_union_ms(mine), abs=1e-9)
        assert r.idle_ms == pytest.approx(r.window_ms - r.busy_ms)
        assert 0 <= r.largest_gap_ms <= r.idle_ms + 1e-9
    assert ds.window_ms == pytest.approx(max(e for _, _, e in rows))


def test_window_runs_to_the_last_end_of_any_device_and_empty_devices_are_listed():
    ds = device_summary(timeline(["a", "b", "idle"], [(0, 1, 3), (1, 2, 9)], scope_ms=5))
    assert ds.window_ms == 9.0
    assert [r.device for r in ds.rows] == ["a", "b", "idle"]
    a, _, idle = ds.rows
    assert a.largest_gap_ms == 6.0 and a.idle_ms == 7.0  # waits from 3 to 9 for b
    assert (idle.count, idle.busy_ms, idle.idle_ms, idle.largest_gap_ms) == (0, 0.0, 9.0, 9.0)
    assert idle.first_start_ms is None and idle.last_end_ms is None and idle.utilisation == 0.0


def test_starts_before_the_scope_count_from_its_start():
    s = device_summary(timeline(["a"], [(0, -2, 3)], scope_ms=4)).rows[0]
    assert s.busy_ms == 3.0 and s.sum_ms == 5.0 and s.largest_gap_ms == 1.0


def test_empty_timeline():
    tl = timeline(["a", "b"], [], scope_ms=0)
    ds = device_summary(tl)
    assert ds.window_ms == 0.0
    assert all(r.busy_ms == 0 and r.utilisation is None and r.largest_gap_ms == 0 for r in ds.rows)
    acts = activity_summary(tl)
    assert acts.rows == () and acts.count == 0 and acts.total_ms == 0.0
    b = balance(tl)
    assert (b.imbalance, b.straggler, b.predicted_makespan_ms, b.makespan_ms) == (None, None, None, 0.0)
    assert [r.share for r in b.rows] == [0.5, 0.5]
    assert any("no split" in n for n in b.notes)
    json.loads(b.to_json())


def test_unfinished_rows_are_counted_apart():
    tl = timeline(["a"], [(0, 0, 2, 0), (0, None, None, 0), (0, None, None, 1)], scope_ms=3, names=("k", "late"))
    acts = activity_summary(tl)
    assert (acts.count, acts.unfinished, acts.total_ms) == (1, 2, 2.0)
    k, late = acts.rows
    assert (k.name, k.count, k.unfinished, k.mean_ms) == ("k", 1, 1, 2.0)
    assert (late.name, late.count, late.unfinished, late.total_ms, late.mean_ms, late.min_ms) == (
        "late",
        0,
        1,
        0.0,
        None,
        None,
    )
    s = device_summary(tl).rows[0]
    assert (s.count, s.unfinished, s.busy_ms) == (1, 2, 2.0)
    assert any("2 unfinished activities" in n for n in balance(tl).notes)


def test_activity_summary_groups_by_name_and_kind_longest_total_first():
    tl = Timeline.from_arrays(
        devices=["a", "b"],
        device=[0, 1, 0, 1, 0],
        names=["gemm", "copy"],
        name=[0, 0, 1, 1, 0],
        kind=["kernel", "kernel", "memcpy", "memcpy", "user"],
        start_ns=np.array([0, 0, 1, 2, 5]) * MS,
        end_ns=np.array([1, 3, 6, 4, 5.5]) * MS,
    )
    rows = [(r.name, r.kind, r.count, r.total_ms, r.mean_ms, r.min_ms, r.max_ms) for r in activity_summary(tl).rows]
    assert rows == [
        ("copy", "memcpy", 2, 7.0, 3.5, 2.0, 5.0),
        ("gemm", "kernel", 2, 4.0, 2.0, 1.0, 3.0),
        ("gemm", "user", 1, 0.5, 0.5, 0.5, 0.5),
    ]


def test_unaligned_device_keeps_its_own_window_and_makes_waits_incomparable():
    clocks = [
        DeviceClock("a", True, 0.0),
        DeviceClock("b", True, 0.0),
        DeviceClock("x", False, float("nan"), reason="calibration failed"),
    ]
    tl = timeline(["a", "b", "x"], [(0, 0, 10), (1, 0, 4), (2, 0, 30)], scope_ms=5, clocks=clocks)
    ds = device_summary(tl)
    assert ds.window_ms == 10.0  # x's times do not stretch it
    a, b, x = ds.rows
    assert a.utilisation == 1.0 and b.idle_ms == 6.0
    assert (x.aligned, x.window_ms, x.busy_ms, x.note) == (False, 30.0, 30.0, "calibration failed")
    rep = balance(tl)
    assert not rep.comparable and rep.straggler == "x"
    assert [r.wait_ms for r in rep.rows] == [None, None, 0.0]
    assert "clock not aligned" in rep.rows[2].note
    assert any("x (calibration failed)" in n and "not comparable" in n for n in rep.notes)
    # the straggler aligned: aligned devices still get waits, the unaligned one does not
    rep = balance(timeline(["a", "b", "x"], [(0, 0, 10), (1, 0, 4), (2, 0, 3)], scope_ms=5, clocks=clocks))
    assert rep.straggler == "a" and [r.wait_ms for r in rep.rows] == [0.0, 6.0, None]


def test_error_scope_still_summarises():
    tl = timeline(["a"], [(0, 0, 1)], scope_ms=1, error="RuntimeError: boom")
    assert device_summary(tl).error == "RuntimeError: boom"
    assert any("raised RuntimeError: boom" in n for n in balance(tl).notes)


def test_balance_without_units_suggests_shares_by_throughput():
    tl = timeline(["a", "b", "c"], [(0, 0, 8), (1, 0, 4), (1, 4, 6)], scope_ms=8)  # busy 8, 6, 0
    rep = balance(tl)
    assert (rep.straggler, rep.mean_busy_ms, rep.units_given, rep.total_units) == ("a", 14 / 3, False, 3)
    assert rep.imbalance == pytest.approx(8 / (14 / 3))
    a, b, c = rep.rows
    assert [r.wait_ms for r in rep.rows] == [0.0, 2.0, None]
    assert (a.throughput, b.throughput, c.throughput) == (1 / 8, 1 / 6, None)
    assert c.share == pytest.approx(1 / 3) and "no activity" in c.note  # keeps its unit
    assert a.share == pytest.approx(2 / 3 * 6 / 14) and b.share == pytest.approx(2 / 3 * 8 / 14)
    assert a.suggested_units is None
    assert rep.makespan_ms == 8.0
    assert rep.predicted_makespan_ms == pytest.approx(2 / (1 / 8 + 1 / 6))  # both finish together


def test_balance_with_work_units_resplits_whole_units_in_proportion_to_throughput():
    tl = timeline(["a", "b", "c"], [(0, 0, 10), (1, 0, 5), (2, 0, 4)], scope_ms=10)
    rep = balance(tl, {"a": 100, Named("b"): 100, "c": 40})  # throughput 10, 20, 10 / ms
    assert [r.throughput for r in rep.rows] == [10.0, 20.0, 10.0]
    assert [r.suggested_units for r in rep.rows] == [60, 120, 60]
    assert sum(r.suggested_units for r in rep.rows) == rep.total_units == 240
    assert rep.makespan_ms == 10.0 and rep.predicted_makespan_ms == pytest.approx(6.0)
    assert [r.share for r in rep.rows] == [0.25, 0.5, 0.25]


def test_largest_remainder_rounding_sums_to_the_total():
    tl = timeline(["a", "b", "c"], [(0, 0, 3), (1, 0, 3), (2, 0, 3)], scope_ms=3)
    rep = balance(tl, [3, 3, 4])  # throughputs 1, 1, 4/3: quotas 3, 3, 4 exactly
    assert [r.suggested_units for r in rep.rows] == [3, 3, 4]
    rep = balance(tl, [1, 1, 0])  # c measured nothing useful: units 0, keeps 0; a and b split 2 evenly
    assert [r.suggested_units for r in rep.rows] == [1, 1, 0]
    rep = balance(timeline(["a", "b", "c"], [(0, 0, 1), (1, 0, 2), (2, 0, 4)], scope_ms=4), [1, 1, 1])
    # throughputs 1, 1/2, 1/4 per ms: quotas 1.714, 0.857, 0.429 -> floors 1, 0, 0, two left for b then a
    assert [r.suggested_units for r in rep.rows] == [2, 1, 0] and rep.total_units == 3
    assert rep.makespan_ms == 4.0 and rep.predicted_makespan_ms == 2.0


def test_devices_without_activity_keep_their_units():
    rep = balance(timeline(["a", "b", "idle"], [(0, 0, 2), (1, 0, 6)], scope_ms=6), [30, 30, 7])
    assert [r.suggested_units for r in rep.rows] == [45, 15, 7]
    assert rep.predicted_makespan_ms == pytest.approx(3.0)


def test_balance_accepts_a_device_summary():
    tl = timeline(["a", "b"], [(0, 0, 2), (1, 0, 6)], scope_ms=6)
    assert balance(device_summary(tl), [1, 1]) == balance(tl, [1, 1])


@pytest.mark.parametrize(
    "units, match",
    [
        ({"a": 1, "b": 1, "z": 2}, "names z, not in this timeline: use some of a, b"),
        ({"a": 1}, "no entry for b: give every device"),
        ([1, 2, 3], "3 values for 2 devices"),
        ([1, -1], "whole numbers from 0 to 2\\*\\*53"),
        ([1, 2.5], "whole numbers from 0 to 2\\*\\*53"),
        ([1, float("nan")], "whole numbers from 0 to 2\\*\\*53"),
    ],
)
def test_bad_work_units_name_the_fix(units, match):
    tl = timeline(["a", "b"], [(0, 0, 2), (1, 0, 6)], scope_ms=6)
    with pytest.raises(ValueError, match=match):
        balance(tl, units)


def test_reports_are_plain_json():
    tl = timeline(["a", "b"], [(0, 0, 2), (1, 0, None)], scope_ms=6, error="E: x")
    for report in (activity_summary(tl), device_summary(tl), balance(tl, [2, 2])):
        d = report.to_dict()
        assert json.loads(report.to_json()) == d
        assert isinstance(d["rows"], list) and isinstance(d["rows"][0], dict)
    row = device_summary(tl).to_dict()["rows"][1]
    assert row["first_start_ms"] is None and row["unfinished"] == 1
