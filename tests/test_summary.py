"""Summaries of a Timeline: per activity, per device (busy = union of intervals), balance and its re-split."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asyncgpu._analysis.balance import balance
from asyncgpu._analysis.summary import activity_summary, device_summary
from asyncgpu._base.records import DeviceClock, Timeline

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


# -- what the devices waited for, the critical path, the wall model ------------------------------------------
def issued_timeline(devices, rows, *, scope_ms, names=("work",)):
    """``rows``: (device code, start ms, end ms, issued ms) relative to T0; issued None: not known."""
    dev = [r[0] for r in rows]
    return Timeline.from_arrays(
        label="t",
        devices=devices,
        device=dev,
        start_ns=[T0 + r[1] * MS for r in rows],
        end_ns=[T0 + r[2] * MS for r in rows],
        issued_ns=[np.nan if r[3] is None else T0 + r[3] * MS for r in rows],
        names=names,
        scope_start_ns=T0,
        scope_end_ns=T0 + int(scope_ms * MS),
    )


def test_idle_time_splits_at_each_blocks_issue_time():
    # a: blocks [2, 4] (issued at 1) and [6, 9] (its first activity issued at 7, after the gap; [8, 9] at 3)
    # b: one activity with no issue time; c: issued at 0, started at 0
    tl = issued_timeline(
        ["a", "b", "c"],
        [(0, 2, 4, 1), (0, 6, 8, 7), (0, 8, 9, 3), (1, 5, 6, None), (2, 0, 1, 0)],
        scope_ms=10,
    )
    a, b, c = device_summary(tl).rows
    # leading gap [0, 2]: 1 launch-bound, 1 dependency; gap [4, 6]: launch-bound all of it (issued at 7 > 6)
    assert (a.busy_ms, a.launch_bound_ms, a.dependency_ms) == (5.0, 3.0, 1.0)
    assert (a.first_issued_ms, a.last_issued_ms, a.issued) == (1.0, 7.0, 3)
    assert (b.launch_bound_ms, b.dependency_ms, b.first_issued_ms, b.issued) == (None, None, None, 0)
    assert (c.launch_bound_ms, c.dependency_ms) == (0.0, 0.0)
    rep = balance(tl)
    # a ends last (9): its path is busy 5 + host 3 + dependency 1
    assert rep.critical_device == "a" and rep.critical_path == {"a": 5.0, "host": 3.0, "dependency": 1.0}
    assert rep.makespan_ms == 9.0 and rep.busy_makespan_ms == 5.0
    assert [r.issue_rate for r in rep.rows] == [pytest.approx(2 / 6), None, None]  # 3 issued over 6 ms


def test_an_unaligned_device_has_no_launch_bound_split():
    clocks = [DeviceClock("a", True, 0.0), DeviceClock("x", False, float("nan"), reason="no calibration")]
    tl = Timeline.from_arrays(
        devices=["a", "x"],
        device=[0, 1],
        start_ns=[T0 + MS, T0 + MS],
        end_ns=[T0 + 2 * MS, T0 + 2 * MS],
        issued_ns=[T0, T0],
        scope_start_ns=T0,
        clocks=clocks,
    )
    a, x = device_summary(tl).rows
    assert (a.launch_bound_ms, a.dependency_ms) == (0.0, 1.0)  # issued at the scope's start, started 1 ms later
    assert (x.launch_bound_ms, x.dependency_ms, x.first_issued_ms) == (None, None, None)  # not host times


def test_the_resplit_models_start_offsets_and_predicts_the_wall_makespan():
    # a: 10 units from 0 to 10 ms; b: 10 units from 4 to 14 ms (a late start, no issue times): 1 unit per ms each.
    # Ending together from starts 0 and 4: 20 = (T - 0) + (T - 4) -> T = 12, a gets 12 units, b 8.
    tl = timeline(["a", "b"], [(0, 0, 10), (1, 4, 14)], scope_ms=14)
    rep = balance(tl, [10, 10])
    assert (rep.straggler, rep.critical_device, rep.makespan_ms) == ("b", "b", 14.0)
    assert [r.suggested_units for r in rep.rows] == [12, 8]
    assert rep.predicted_makespan_ms == pytest.approx(12.0)  # the busy-only model would say 10 (10 + 10 as now)
    assert rep.predicted_busy_ms == pytest.approx(12.0)  # a: 12 units at 1 per busy ms
    assert [r.predicted_end_ms for r in rep.rows] == [pytest.approx(12.0), pytest.approx(12.0)]
    assert [r.start_offset_ms for r in rep.rows] == [0.0, 4.0]
    assert [r.wait_ms for r in rep.rows] == [4.0, 0.0]


def test_a_device_that_starts_after_the_others_would_end_gets_no_work():
    tl = timeline(["a", "b"], [(0, 0, 10), (1, 15, 16)], scope_ms=16)  # 1 unit per ms each
    rep = balance(tl, [10, 1])
    assert [r.suggested_units for r in rep.rows] == [11, 0] and rep.predicted_makespan_ms == pytest.approx(11.0)
    assert rep.rows[1].predicted_end_ms is None
    assert any("gives b no work" in n for n in rep.notes)


def test_a_host_that_issued_the_devices_one_after_another_shifts_the_later_starts():
    # a: 10 activities of 1 ms from 0, issued 0.0 .. 0.9 (0.1 ms of host time per unit);
    # b: 10 activities of 2 ms from 2, issued 1.0 .. 1.9: after a's, so a's extra units delay b's start.
    rows = [(0, k, k + 1, 0.1 * k) for k in range(10)] + [(1, 2 + 2 * k, 4 + 2 * k, 1 + 0.1 * k) for k in range(10)]
    tl = issued_timeline(["a", "b"], rows, scope_ms=22)
    rep = balance(tl, [10, 10])
    assert rep.straggler == "b" and rep.critical_path == {
        "b": pytest.approx(20.0),
        "host": pytest.approx(1.0),
        "dependency": pytest.approx(1.0),
    }
    # a ends at u_a (1 unit per ms); b at 2 + 0.1 (u_a - 10) + u_b / 0.5: together when u_a = 41 / 2.9 = 14.14;
    # in whole units 14 and 6: a ends at 14, b at 2 + 0.4 + 12 = 14.4
    assert [r.suggested_units for r in rep.rows] == [14, 6]
    assert [r.predicted_end_ms for r in rep.rows] == [pytest.approx(14.0), pytest.approx(14.4)]
    assert rep.predicted_makespan_ms == pytest.approx(14.4)
    assert "b bounds the makespan" in rep.verdict and "one after another" in rep.verdict


def test_a_launch_bound_critical_path_makes_the_host_the_straggler():
    # each activity issued at its start after a host gap: the devices wait for the host most of the time
    rows = [(d, 3 * k + 2, 3 * k + 2.5, 3 * k + 2) for k in range(5) for d in (0, 1)]
    rep = balance(issued_timeline(["cuda:0", "cuda:1"], rows, scope_ms=15), [5, 5])
    assert rep.straggler == "host" and rep.critical_path["host"] == pytest.approx(12.0)
    assert rep.verdict.startswith("the host bounds the makespan") and "launch-bound" in rep.verdict
    assert "await device.run(step)" in rep.verdict and "CUDA graphs" in rep.verdict
    assert "fewer and larger kernels" in rep.verdict
    assert [r.suggested_units for r in rep.rows] == [5, 5]  # not re-split
    assert rep.predicted_makespan_ms == rep.makespan_ms and any("not re-split" in n for n in rep.notes)


def test_a_device_that_ends_last_because_its_work_came_later_is_the_hosts_stagger():
    # four devices with the same work (30 ms), each issued 10 ms after the previous one by the host
    rows = [(d, 10 * d + 0.1, 10 * d + 30.1, 10 * d) for d in range(4)]
    rep = balance(issued_timeline([f"cuda:{d}" for d in range(4)], rows, scope_ms=60), [1, 1, 1, 1])
    assert rep.straggler == "host" and rep.critical_device == "cuda:3"
    assert rep.verdict.startswith("the host's stagger bounds the makespan")
    assert "the host issued work for cuda:0..3 one after another" in rep.verdict
    assert "started 0, 10.0, 20.0, 30.0 ms apart" in rep.verdict
    assert "not because it had more" in rep.verdict
    assert rep.rows[3].note == "ends last" and "straggler" not in rep.rows[3].note


def test_zero_length_activities_and_devices_without_units_leave_nothing_to_split():
    tl = issued_timeline(["a", "b"], [(0, 1, 1, 0.5), (1, 2, 2, None)], scope_ms=3)
    rep = balance(tl, [4, 0])
    assert rep.straggler == "b" and rep.critical_device == "b" and rep.makespan_ms == 2.0
    assert [r.suggested_units for r in rep.rows] == [4, 0] and rep.predicted_makespan_ms == 2.0
    assert any("no split to suggest" in n for n in rep.notes)
    assert balance(timeline(["a", "b"], [(0, 0, 2), (1, 0, 3)], scope_ms=3), [0, 0]).predicted_makespan_ms == 3.0


@pytest.mark.parametrize("seed", range(20))
def test_the_suggestion_adds_up_and_never_predicts_worse_than_now(seed):
    rng = np.random.default_rng(seed)
    n_dev = int(rng.integers(1, 5))
    rows = []
    for d in range(n_dev):
        t = float(rng.uniform(0, 5))
        for _ in range(int(rng.integers(0, 6))):
            t_issue = t + float(rng.normal(0, 1))
            t += float(rng.exponential(1))
            dur = float(rng.exponential(2)) * (rng.random() > 0.1)
            rows.append((d, t, t + dur, None if rng.random() < 0.2 else t_issue))
            t += dur
    tl = issued_timeline([f"d{d}" for d in range(n_dev)], rows, scope_ms=1)
    units = [int(u) for u in rng.integers(0, 50, n_dev)]
    rep = balance(tl, units)
    json.loads(rep.to_json())
    assert sum(r.suggested_units for r in rep.rows) == sum(units)
    if rep.predicted_makespan_ms is not None and rep.critical_device is not None:
        assert rep.predicted_makespan_ms <= rep.makespan_ms + 1e-9
    assert sum(rep.critical_path.values()) == pytest.approx(rep.makespan_ms)
