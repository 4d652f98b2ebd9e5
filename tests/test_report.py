"""Reports rendered as text: golden outputs of fixed timelines, and a real host-backend scope."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import io
import json
import re
import sys
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
from rich.console import Console
from rich.segment import Segment

import asyncgpu
from asyncgpu import gpu_timer
from asyncgpu._analysis import report as _report
from asyncgpu._analysis import table as _table
from asyncgpu._analysis.balance import balance
from asyncgpu._analysis.report import balance_renderable, records_report, render, timeline_report, timeline_table
from asyncgpu._base.records import DeviceClock, Timeline

from .conftest import collector_off

MS = 1_000_000
T0 = 7_000_000_000


def plain(text: str) -> str:
    """Rendered text without the trailing spaces that table cells pad with."""
    return "\n".join(line.rstrip() for line in text.splitlines())


def fake_timer(tl: Timeline, host_ms=1.25, wait_ms=7.75, cpu_ms=3.5) -> Timeline:
    """A finished scope's timeline: the report reads the host times from it, never from a live Timer."""
    return dataclasses.replace(tl, host_ms=host_ms, wait_ms=wait_ms, cpu_ms=cpu_ms)


def step_timeline() -> Timeline:
    """Two GPUs, two streams each, a copy, two GEMMs and an all-reduce overlapping them (ms from T0).
    cuda:0: busy [0.1, 6.6] = 6.5, sum 9.5; cuda:1: busy [0.2, 4.7] + [5.0, 8.0] = 7.5, sum 7.5. Window 9."""
    rows = [  # device, stream, name, kind, start, end
        (0, 0, 0, "memcpy", 0.1, 0.6),
        (1, 2, 0, "memcpy", 0.2, 0.7),
        (0, 0, 1, "kernel", 0.6, 3.6),
        (1, 2, 1, "kernel", 0.7, 2.7),
        (0, 1, 2, "kernel", 2.0, 5.0),
        (0, 0, 1, "kernel", 3.6, 6.6),
        (1, 2, 1, "kernel", 2.7, 4.7),
        (1, 3, 2, "kernel", 5.0, 8.0),
    ]
    d, s, n, k, lo, hi = zip(*rows)
    return Timeline.from_arrays(
        label="step",
        devices=["cuda:0", "cuda:1"],
        device=d,
        streams=[(0, "s0"), (0, "s1"), (1, "s0"), (1, "s1")],
        stream=s,
        names=["h2d batch", "gemm", "allreduce"],
        name=n,
        kind=k,
        start_ns=T0 + np.array(lo) * MS,
        end_ns=T0 + np.array(hi) * MS,
        scope_start_ns=T0,
        scope_end_ns=T0 + 9 * MS,
        descriptions=("NVIDIA H200 (sm_90)",) * 2,
    )


def step_timer():
    return fake_timer(step_timeline())


def hard_timer():
    """An error, an unaligned clock, an unfinished activity and an idle device in one scope."""
    clocks = [
        DeviceClock("host:0", True, 0.0),
        DeviceClock("host:1", False, float("nan"), reason="no calibration"),
        DeviceClock("host:2", True, 0.0),
    ]
    tl = Timeline.from_arrays(
        label="bad",
        devices=["host:0", "host:1", "host:2"],
        device=[0, 0, 0, 1, 1],
        names=["gemm", "copy"],
        name=[0, 0, 1, 0, 1],
        kind=["kernel", "kernel", "memcpy", "kernel", "memcpy"],
        streams=[(0, "s0"), (0, "s1"), (1, "s0")],
        stream=[0, 1, 0, 2, 2],
        start_ns=T0 + np.array([1, 2, 6, 0, np.nan]) * MS,
        end_ns=T0 + np.array([4, 3, 7, 2, np.nan]) * MS,
        scope_start_ns=T0,
        scope_end_ns=T0 + 5 * MS,
        clocks=clocks,
        error="RuntimeError: boom",
    )
    return fake_timer(tl)


def empty_timer():
    tl = Timeline.from_arrays(
        label="idle",
        devices=["cuda:0"],
        device=[],
        start_ns=[],
        end_ns=[],
        scope_start_ns=T0,
        scope_end_ns=T0 + MS // 2,
    )
    return fake_timer(tl, 0.5, 0.0, 0.25)


STEP_REPORT = """\
gpu_timer 'step': activities in issue order
 start (ms) ┃ duration (ms) ┃ device ┃ stream ┃ kind   ┃ activity
━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━
      0.100 │         0.500 │ cuda:0 │ s0     │ memcpy │ h2d batch
      0.200 │         0.500 │ cuda:1 │ s0     │ memcpy │ h2d batch
      0.600 │         3.000 │ cuda:0 │ s0     │ kernel │ gemm
      0.700 │         2.000 │ cuda:1 │ s0     │ kernel │ gemm
      2.000 │         3.000 │ cuda:0 │ s1     │ kernel │ allreduce
      3.600 │         3.000 │ cuda:0 │ s0     │ kernel │ gemm
      2.700 │         2.000 │ cuda:1 │ s0     │ kernel │ gemm
      5.000 │         3.000 │ cuda:1 │ s1     │ kernel │ allreduce

totals per kind and activity
 activity  ┃ kind   ┃ count ┃ total (ms) ┃ mean (ms) ┃ min (ms) ┃ max (ms)
━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━
 gemm      │ kernel │     4 │     10.000 │     2.500 │    2.000 │    3.000
 allreduce │ kernel │     2 │      6.000 │     3.000 │    3.000 │    3.000
 h2d batch │ memcpy │     2 │      1.000 │     0.500 │    0.500 │    0.500
───────────┼────────┼───────┼────────────┼───────────┼──────────┼──────────
 all       │        │     8 │     17.000 │           │          │

totals per device, in ms, over a window of 9.000 ms from the scope's start
 device ┃ count ┃  busy ┃   sum ┃  idle ┃ max gap ┃ util. ┃ first start ┃ last end
━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━
 cuda:0 │     4 │ 6.500 │ 9.500 │ 2.500 │   2.400 │ 72.2% │       0.100 │    6.600
 cuda:1 │     4 │ 7.500 │ 7.500 │ 1.500 │   1.000 │ 83.3% │       0.200 │    8.000
busy: time with an activity running (overlaps once); sum: durations added up; max
gap: before the first, between, or after the last activity

balance: busy time per device
        ┃       ┃                      ┃       ┃       ┃       ┃       ┃ predicted ┃
 device ┃  busy ┃                      ┃ start ┃   end ┃  wait ┃ share ┃       end ┃
━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━
 cuda:0 │ 6.500 │ █████████████████▍   │ 0.100 │ 6.600 │ 1.400 │ 54.9% │     7.236 │
 cuda:1 │ 7.500 │ ████████████████████ │ 0.200 │ 8.000 │ 0.000 │ 45.1% │     7.236 │ straggler
times in ms from the scope's start; wait: until the last device's end; predicted end: with the
suggested split
verdict: cuda:1 bounds the makespan: busy 7.50 ms of its 8.00 ms; the suggested split predicts 7.24
ms.
critical path over the 8.000 ms makespan (cuda:1): cuda:1 7.500 ms (94%), unknown 0.500 ms (6%)
imbalance 1.071 = max busy 7.500 ms / mean busy 7.000 ms; straggler cuda:1
makespan (wall): 8.000 ms now, 7.236 ms predicted with the suggested shares (one unit of work per
device assumed); busy 7.500 ms now, 7.136 ms predicted
note: no issue times (Timeline.issued_ns is NaN: synthetic data, or a trace of an older asyncgpu):
idle time is not split into launch-bound and dependency, and the model keeps each device's start as
measured

scope 'step': host 1.250 ms in the scope's body + 7.750 ms waiting for the devices at its exit, CPU
3.500 ms; durations from held CUDA event pairs
"""

STEP_BALANCE_WITH_UNITS = """\
balance: busy time per device
        ┃       ┃                      ┃       ┃       ┃       ┃           ┃ predicted ┃
 device ┃  busy ┃                      ┃ start ┃   end ┃ units ┃ suggested ┃       end ┃
━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━
 cuda:0 │ 6.500 │ █████████████████▍   │ 0.100 │ 6.600 │    64 │        70 │     7.209 │
 cuda:1 │ 7.500 │ ████████████████████ │ 0.200 │ 8.000 │    64 │        58 │     7.269 │ straggler
times in ms from the scope's start; predicted end: with the suggested split; left out at this width
(100 columns): wait
verdict: cuda:1 bounds the makespan: busy 7.50 ms of its 8.00 ms; the suggested split predicts 7.27
ms.
critical path over the 8.000 ms makespan (cuda:1): cuda:1 7.500 ms (94%), unknown 0.500 ms (6%)
imbalance 1.071 = max busy 7.500 ms / mean busy 7.000 ms; straggler cuda:1
makespan (wall): 8.000 ms now, 7.269 ms predicted with the suggested split; busy 7.500 ms now, 7.109
ms predicted
note: no issue times (Timeline.issued_ns is NaN: synthetic data, or a trace of an older asyncgpu):
idle time is not split into launch-bound and dependency, and the model keeps each device's start as
measured
"""

HARD_REPORT = """\
gpu_timer 'bad': activities in issue order
 start (ms) ┃ duration (ms) ┃ device   ┃ stream ┃ kind   ┃ activity
━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━
      1.000 │         3.000 │ host:0   │ s0     │ kernel │ gemm
      2.000 │         1.000 │ host:0   │ s1     │ kernel │ gemm
      6.000 │         1.000 │ host:0   │ s0     │ memcpy │ copy
      0.000 │         2.000 │ host:1 * │ s0     │ kernel │ gemm
          — │             — │ host:1 * │ s0     │ memcpy │ copy
* clock not aligned: times from the device's own start mark

totals per kind and activity
 activity ┃ kind   ┃ count ┃ total (ms) ┃ mean (ms) ┃ min (ms) ┃ max (ms) ┃ unfinished
━━━━━━━━━━╇━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━
 gemm     │ kernel │     3 │      6.000 │     2.000 │    1.000 │    3.000 │          0
 copy     │ memcpy │     1 │      1.000 │     1.000 │    1.000 │    1.000 │          1
──────────┼────────┼───────┼────────────┼───────────┼──────────┼──────────┼────────────
 all      │        │     4 │      7.000 │           │          │          │          1

totals per device, in ms, over a window of 7.000 ms from the scope's start
 device   ┃ count ┃  busy ┃   sum ┃  idle ┃ max gap ┃ util. ┃ first start ┃ last end
━━━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━
 host:0   │     3 │ 4.000 │ 5.000 │ 3.000 │   2.000 │ 57.1% │       1.000 │    7.000
 host:1 * │     1 │ 2.000 │ 2.000 │ 5.000 │   5.000 │ 28.6% │       0.000 │    2.000
 host:2   │     0 │ 0.000 │ 0.000 │ 7.000 │   7.000 │  0.0% │           — │        —
busy: time with an activity running (overlaps once); sum: durations added up; max
gap: before the first, between, or after the last activity
* host:1: clock not aligned (no calibration): times from its own start mark

balance: busy time per device
 device ┃  busy ┃                      ┃ start ┃   end ┃  wait ┃ share ┃
━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━
 host:0 │ 4.000 │ ████████████████████ │ 1.000 │ 7.000 │ 0.000 │ 22.2% │ straggler
 host:1 │ 2.000 │ ██████████           │ 0.000 │ 2.000 │     — │ 44.4% │ clock not aligned
 host:2 │ 0.000 │                      │     — │     — │     — │ 33.3% │ no activity
times in ms from the scope's start; wait: until the last device's end
verdict: host:0 has the most busy time (4.00 ms); the clocks are not all aligned to the host, so
wall times are not compared and the split is by busy time
imbalance 2.000 = max busy 4.000 ms / mean busy 2.000 ms; straggler host:0
makespan (busy): 4.000 ms now, 2.667 ms predicted with the suggested shares (one unit of work per
device assumed)
note: not aligned to the host clock: host:1 (no calibration); wait times across devices are not
comparable (busy times are)
note: no finished activity on host:2: throughput unknown, the split leaves their units as they are
note: 1 unfinished activity is not counted
note: the scope raised RuntimeError: boom (the figures cover the work enqueued before it)

scope 'bad': host 1.250 ms in the scope's body + 7.750 ms waiting for the devices at its exit, CPU
3.500 ms; 1 activity unfinished when the scope ended; the scope raised RuntimeError: boom; durations
from host events; not aligned to the host clock: host:1 (no calibration)
"""

TIME_ORDER_LIMITED = """\
gpu_timer 'step': activities in time order
 start (ms) ┃ duration (ms) ┃ device ┃ stream ┃ kind   ┃ activity
━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━
      0.100 │         0.500 │ cuda:0 │ s0     │ memcpy │ h2d batch
      0.200 │         0.500 │ cuda:1 │ s0     │ memcpy │ h2d batch
      0.600 │         3.000 │ cuda:0 │ s0     │ kernel │ gemm
… 5 more activities
"""

RECORDS_INDENTED = """\
    activities
     start (ms) ┃ duration (ms) ┃ device ┃ stream ┃ kind   ┃ activity
    ━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━
          0.100 │         0.500 │ cuda:0 │ s0     │ memcpy │ h2d batch
          0.200 │         0.500 │ cuda:1 │ s0     │ memcpy │ h2d batch
          0.600 │         3.000 │ cuda:0 │ s0     │ kernel │ gemm
    3 activities, 4.000 ms in all
"""

EMPTY_REPORT = """\
gpu_timer 'idle': activities in issue order
 start (ms) ┃ duration (ms) ┃ device ┃ stream ┃ kind ┃ activity
━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━╇━━━━━━━━━━
no activities

totals per kind and activity
 activity ┃ kind ┃ count ┃ total (ms) ┃ mean (ms) ┃ min (ms) ┃ max (ms)
━━━━━━━━━━╇━━━━━━╇━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━
 all      │      │     0 │      0.000 │           │          │

totals per device, in ms, over a window of 0.500 ms from the scope's start
 device ┃ count ┃  busy ┃   sum ┃  idle ┃ max gap ┃ util. ┃ first start ┃ last end
━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━
 cuda:0 │     0 │ 0.000 │ 0.000 │ 0.500 │   0.500 │  0.0% │           — │        —
busy: time with an activity running (overlaps once); sum: durations added up; max
gap: before the first, between, or after the last activity

balance: busy time per device
 device ┃  busy ┃                      ┃  share ┃
━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━━━
 cuda:0 │ 0.000 │                      │ 100.0% │ no activity
times in ms from the scope's start
verdict: no device has busy time
note: no device has both busy time and work units: no split to suggest

scope 'idle': host 0.500 ms in the scope's body + 0.000 ms waiting for the devices at its exit, CPU
0.250 ms; durations from held CUDA event pairs
"""


def render_text_of(tl: Timeline) -> str:
    return render(timeline_report(tl))


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: render_text_of(step_timer()), STEP_REPORT),
        (
            lambda: render(balance_renderable(balance(step_timeline(), {"cuda:0": 64, "cuda:1": 64}))),
            STEP_BALANCE_WITH_UNITS,
        ),
        (lambda: render_text_of(hard_timer()), HARD_REPORT),
        (lambda: render(timeline_table(step_timeline(), order="time", limit=3)), TIME_ORDER_LIMITED),
        (lambda: render(records_report(step_timeline().records()[:3], "    ")), RECORDS_INDENTED),
        (lambda: render_text_of(empty_timer()), EMPTY_REPORT),
    ],
    ids=["step", "balance-units", "hard", "time-limited", "records", "empty"],
)
def test_golden(make, expected):
    assert plain(make()) == expected.rstrip("\n")


def test_render_is_plain_text_of_the_given_width():
    text = render(timeline_report(step_timer()), width=60)
    assert "\x1b[" not in text
    assert max(len(line) for line in text.splitlines()) <= 60


def test_timeline_table_limits_a_large_timeline_cheaply():
    n = 1_000_000
    tl = Timeline.from_arrays(
        devices=["a", "b"], device=np.arange(n) % 2, start_ns=np.arange(n) * 1e3, end_ns=np.arange(n) * 1e3 + 500
    )
    t = time.perf_counter()
    text = render(timeline_table(tl, order="time", limit=5))
    assert time.perf_counter() - t < 2
    assert "… 999,995 more activities" in text and text.count(" work") == 5


def test_timeline_table_order_is_checked():
    with pytest.raises(ValueError, match="'issue' or 'time'"):
        timeline_table(step_timeline(), order="start")


def test_report_before_the_scope_ends(dev):
    t = gpu_timer(dev, label="early")
    assert "no results yet" in str(t)


@pytest.mark.anyio
async def test_host_scope_renders_every_section(two_devs):
    a, b = two_devs
    for d in two_devs:  # (a first launch that loads or pins on the loop's thread would make the host the straggler)
        await d.prepare()
    async with gpu_timer(two_devs, label="real") as t:
        for d, us in ((a, 2_000), (b, 4_000)):
            d.stream.spin_us(us)
            with t.activity("block", device=d):
                d.stream.spin_us(1_000)
    text = str(t)
    for needle in (
        "gpu_timer 'real': activities in issue order",
        "totals per kind and activity",
        "totals per device",
        "balance: busy time per device",
        "scope 'real': host",
        "waiting for the",
        "spin",
        "block",
        a.name,
        b.name,
        f"straggler {b.name}",
    ):
        assert needle in text, needle
    rep = t.balance({a: 10, b: 10})
    assert rep.straggler == b.name and sum(r.suggested_units for r in rep.rows) == 20
    assert rep.rows[0].suggested_units > rep.rows[1].suggested_units
    assert t.device_summary().rows[1].busy_ms >= 4.9
    assert [r.name for r in t.activity_summary().rows][:1] == ["spin"]


@pytest.mark.anyio
async def test_every_activity_carries_when_the_host_issued_it(two_devs):
    a, b = two_devs
    async with gpu_timer(two_devs, label="issued") as t:
        a.stream.spin_us(500)
        async with t.activity("block", device=b):
            b.stream.spin_us(500)
    tl = t.timeline
    assert np.isfinite(tl.issued_ns).all()
    assert (tl.issued_ns >= tl.scope_start_ns).all() and (tl.issued_ns <= tl.scope_end_ns).all()
    assert (tl.issued_ns <= tl.end_ns).all()  # (a launch is issued once its call returned: it may have started)
    block = [r for r in tl.records() if r.name == "block"][0]
    (host_block,) = [r for r in tl.host_ranges if r.name == "block"]
    assert block.issued_ns == host_block.start_ns  # a block is issued when it is entered
    assert tl.nbytes == 43 * len(tl)


@pytest.mark.anyio
async def test_a_host_bound_scope_is_reported_host_bound(two_devs):
    """The host spends 2 ms (a sleep: the GIL is free for the host devices' threads) between steps of 0.1 ms of
    work per device: the devices wait for launches. That holds while each device's own time (its work, and its
    work's wait between issue and start) stays below half the host's 20 ms of gaps; on an overloaded machine a host
    device's worker thread may not run for 100 ms and more, or a 0.1 ms spin may take 0.35 (seen with a CPU-bound
    process beside the suite on 2 CPUs), and then the devices are the bound, as the report says. Such a run is
    measured again, up to three in all."""
    for _ in range(3):
        async with gpu_timer(two_devs, label="host-bound") as t:
            for _ in range(10):
                for d in two_devs:
                    d.stream.spin_us(100)
                time.sleep(0.002)
        tl = t.timeline
        own_ms = max(  # per device: its work, and its work issued but not started
            float(np.nansum(tl.duration_ns[tl.device == i]) + np.nansum((tl.start_ns - tl.issued_ns)[tl.device == i]))
            / MS
            for i in range(len(two_devs))
        )
        if own_ms < 0.5 * 10 * 2:  # host-bound by construction
            break
    else:
        pytest.fail(f"a device's own time was {own_ms:.1f} ms of the host's 20 ms in all three runs: too loaded")
    rep = t.balance(work_units=[10, 10])
    assert rep.straggler == "host", rep.verdict
    assert rep.critical_path["host"] > 0.5 * rep.makespan_ms
    assert "launch-bound" in rep.verdict and "A re-split would not help" in rep.verdict
    for r in rep.rows:  # each device waited for the host's launches longer than it worked or waited for anything else
        assert r.launch_bound_ms > r.busy_ms + r.dependency_ms and r.suggested_units == 10
    assert "straggler host" in str(t)


@pytest.mark.anyio
async def test_staggered_starts_name_the_hosts_stagger_not_the_late_device(two_devs):
    """Both devices get the same work; the task of the second sleeps 20 ms before issuing its own. The stagger the
    report gives is the one between the devices' first starts, each after its own issue on the host's clock; the
    host's own gap between the two issues is measured, not assumed (a pause of the loop's thread may shorten it,
    and a device may start its first work late: a worker's wake-up on a loaded host)."""
    a, b = two_devs
    issued_ns: dict[str, int] = {}  # device: host time just before its first launch

    async def task(d, delay_s):
        await anyio.sleep(delay_s)
        issued_ns[d.name] = time.perf_counter_ns()
        for _ in range(6):
            d.stream.spin_us(5_000)

    with collector_off():  # (a collection while b's task issues would make b launch-bound: the host's stall)
        async with gpu_timer(two_devs, label="stagger") as t:
            async with anyio.create_task_group() as tg:
                tg.start_soon(task, a, 0)
                tg.start_soon(task, b, 0.02)
    rep = t.balance(work_units=[6, 6])
    assert rep.critical_device == b.name and rep.straggler == "host", rep.verdict
    assert f"{b.name} bounds" not in rep.verdict and rep.verdict.startswith("the host's stagger bounds the makespan")
    tl = t.timeline
    first_ns = [float(np.nanmin(tl.start_ns[tl.device == tl.devices.index(d.name)])) for d in (a, b)]
    for d, start_ns in zip((a, b), first_ns):  # (on a GPU within its clock calibration's few µs)
        assert start_ns >= issued_ns[d.name] - 0.05 * MS, f"{d.name} placed before its issue"
    offset = rep.rows[1].start_offset_ms
    assert offset == pytest.approx((first_ns[1] - first_ns[0]) / MS, abs=1e-6)
    host_gap_ms = (issued_ns[b.name] - issued_ns[a.name]) / MS
    assert offset >= 0.5 * host_gap_ms  # the host's gap, not the devices'
    assert f"started 0, {offset:.1f} ms apart" in rep.verdict
    # b idled for the host that long (a late start of its own beyond the host's gap is another cause)
    assert rep.rows[1].launch_bound_ms >= 0.9 * host_gap_ms and rep.rows[1].note == "ends last"


@pytest.mark.anyio
async def test_rich_print_of_a_balance_draws_the_table_and_report_takes_work_units(two_devs):
    a, b = two_devs
    with collector_off():  # (a collection here is host time that bounds the makespan, rightly)
        async with gpu_timer(two_devs, label="drawn") as t:  # (a loaded host that stalls 5 ms between the launches
            a.stream.spin_us(10_000)  # would make the host the makespan's bound with 1 and 3 ms: seen on 4x H100)
            b.stream.spin_us(30_000)
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None).print(t.balance(work_units=[30, 30]))
    text = buf.getvalue()
    assert "balance: busy time per device" in text and "BalanceReport(" not in text
    # (4x H100, run 43, trio: once "the host bounds the makespan": each device's issue and start times say why)
    times = [
        f"{r.device}: first issued {r.first_issued_ms} ms, first start {r.first_start_ms} ms, launch-bound "
        f"{r.launch_bound_ms} ms, busy {r.busy_ms} ms"
        for r in t.device_summary().rows
    ]
    for needle in ("device", "busy", "launch-bound", "units", "suggested", "verdict: ", f"{b.name} bounds"):
        assert needle in text, "\n".join([f"{needle!r} not in:", text, *times])
    assert max(len(line) for line in text.splitlines()) <= 100
    report = render(t.report(work_units=[30, 30]))
    assert "suggested" in report and "makespan (wall)" in report
    assert balance_renderable(t.timeline, [30, 30]) == t.balance(work_units=[30, 30])
    for bad, match in (([1, 2, 3], "3 values for 2 devices"), ({"nope": 1}, "names nope, not in this timeline")):
        with pytest.raises(ValueError, match=match):
            t.balance(work_units=bad)
        with pytest.raises(ValueError, match=match):
            t.report(work_units=bad)


@pytest.mark.anyio
async def test_a_collection_in_a_scope_is_a_host_range_and_a_host_bound_verdict_names_it(two_devs, tmp_path):
    """A full collection (of a heap made for it) between two launches per device: the timeline holds it as a host
    range on the collector's own track, its device summary counts it, on GPUs the host bounds the makespan and the
    verdict says what the collector took; the range survives a trace's round trip. The automatic collector is off,
    so that the one collection is the test's."""
    from asyncgpu._base.records import GC_KIND, GC_THREAD

    junk = [[i] for i in range(400_000)]
    with collector_off():
        async with gpu_timer(two_devs, label="collected") as t:
            for d in two_devs:
                d.stream.spin_us(100)
            t0 = time.perf_counter_ns()
            gc.collect()
            took_ms = (time.perf_counter_ns() - t0) / MS
            for d in two_devs:
                d.stream.spin_us(100)
    del junk
    tl = t.timeline
    (gcr,) = [r for r in tl.host_ranges if r.kind == GC_KIND]
    assert gcr.name == "garbage collection (generation 2)" and gcr.thread == GC_THREAD
    assert 0.8 * took_ms <= (gcr.end_ns - gcr.start_ns) / MS <= took_ms
    assert t.device_summary().collector_ms == pytest.approx((gcr.end_ns - gcr.start_ns) / MS)
    if two_devs[0].backend == "cuda":  # a GPU runs its first spins during the collection, then waits for the host
        rep = t.balance()
        assert rep.straggler == "host" and "Python's garbage collection took" in rep.verdict, rep.verdict
    # (host devices are Python threads, which the collection stops too: there it is their wait, not the host's
    # alone; the synthetic test below checks the verdict's rule)
    path = tmp_path / "gc.pftrace"
    asyncgpu.write_trace(t, path)
    assert [r for r in asyncgpu.read_trace(path).host_ranges if r.kind == GC_KIND] == [gcr]


def test_a_host_bound_verdict_names_the_collector_from_a_twentieth_of_the_makespan():
    """Synthetic: one device idle 9 ms for the host, then busy 1 ms; the collector took 0.4 ms (not named) or
    0.6 ms (named: ≥ 5 % of the 10 ms makespan) of the scope."""
    from asyncgpu._base.records import GC_KIND, GC_THREAD, HostRange

    def verdict(collected_ms: float) -> str:
        tl = Timeline.from_arrays(
            devices=["cuda:0"],
            device=[0],
            start_ns=[T0 + 9 * MS],
            end_ns=[T0 + 10 * MS],
            issued_ns=[T0 + 9 * MS],
            scope_start_ns=T0,
            host_ranges=(
                HostRange("garbage collection (generation 2)", GC_KIND, T0, T0 + int(collected_ms * MS), GC_THREAD),
            ),
        )
        rep = balance(tl)
        assert rep.straggler == "host", rep.verdict
        return rep.verdict

    assert "garbage collection" not in verdict(0.4)
    assert "Python's garbage collection took 0.60 ms of the host's time in the scope" in verdict(0.6)


@pytest.mark.parametrize("width", [50, 60, 80, 100, 140])
def test_the_balance_table_leaves_columns_out_and_never_cuts_a_number(width):
    rows = [(d, 3 * k + 2, 3 * k + 2.5, 3 * k + 1.5) for k in range(5) for d in (0, 1)]
    tl = Timeline.from_arrays(
        devices=["cuda:0", "cuda:1"],
        device=[r[0] for r in rows],
        start_ns=[T0 + r[1] * MS for r in rows],
        end_ns=[T0 + r[2] * MS for r in rows],
        issued_ns=[T0 + r[3] * MS for r in rows],
        scope_start_ns=T0,
    )
    text = render(balance(tl, [1234, 5678]), width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    for number in ("1,234", "5,678", "2.500"):  # units, and the busy time of each device (5 x 0.5 ms)
        assert number in text, number
    if width < 100:
        assert "left out at this width" in " ".join(text.split())


# -- tables that fit the console; plain lines for long tables ----------------------------------------------------
def _no_rich_table(*args, **kwargs):
    raise AssertionError("a long table must not be laid out by rich.table.Table")


@pytest.mark.parametrize("make", [step_timer, hard_timer, empty_timer], ids=["step", "hard", "empty"])
def test_long_tables_are_plain_lines_identical_to_the_rich_table(monkeypatch, make):
    expected = plain(render_text_of(make()))
    monkeypatch.setattr(_table, "PLAIN_ROWS", -1)  # every table counts as long
    monkeypatch.setattr(_table, "Table", _no_rich_table)
    assert timeline_table(make()).plain
    assert plain(render_text_of(make())) == expected


def test_plain_lines_show_every_row_of_a_full_report_in_time_order():
    n = 2 * _table.PLAIN_ROWS
    tl = Timeline.from_arrays(
        devices=["a", "b"],
        device=np.arange(n) % 2,
        start_ns=T0 + (n - np.arange(n)) * 1e6,  # issued in reverse time order
        end_ns=T0 + (n - np.arange(n)) * 1e6 + 5e5,
        scope_start_ns=T0,
        scope_end_ns=T0 + (n + 1) * 1e6,
    )
    table = timeline_table(tl, order="time", limit=None)
    assert table.plain
    rows = [line for line in render(table).splitlines() if " │ " in line]
    assert len(rows) == n
    assert [float(r.split("│")[0].replace(",", "")) for r in rows] == [float(k) for k in range(1, n + 1)]
    assert rows[-1].split("│")[0].strip() == f"{n:,}.000"


@pytest.mark.parametrize("width", [80, 60, 50, 44])
def test_tables_fit_narrow_consoles_without_cutting_a_number(width):
    text = render(timeline_report(hard_timer()), width=width)
    assert "…" not in text and max(len(line.rstrip()) for line in text.splitlines()) <= width
    words = " ".join(text.split())
    for number in ("3.000", "57.1%", "28.6%", "7.000", "4.000"):  # durations, utilisation, window, busy
        assert number in words
    if width < 80:
        assert "left out at this width" in words


def test_a_plain_row_wider_than_the_console_goes_on_the_next_line():
    n = _table.PLAIN_ROWS + 1
    tl = Timeline.from_arrays(
        devices=["cuda:0"],
        device=np.zeros(n, dtype=int),
        names=["a very long activity name that cannot fit"],
        name=np.zeros(n, dtype=int),
        start_ns=T0 + np.arange(n) * 1e6,
        end_ns=T0 + np.arange(n) * 1e6 + 5e5,
        scope_start_ns=T0,
        scope_end_ns=T0 + (n + 1) * 1e6,
    )
    lines = render(timeline_table(tl, limit=None), width=60).splitlines()
    assert max(len(line) for line in lines) <= 60 and len(lines) == 3 + 2 * n + 1  # title, head, rule, caption
    assert lines[3].startswith("      0.000 │         0.500 │ cuda:0 │ a very long") and lines[4].endswith(" fit")
    assert lines[-1] == "left out at this width (60 columns): stream, kind"


def test_str_of_a_report_is_its_plain_text():
    report = timeline_report(step_timer())
    assert str(report) == render(report) and plain(str(report)) == STEP_REPORT.rstrip("\n")


# -- rich.print of a long report: the same lines as render, in every console mode ----------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def long_timeline(n: int) -> Timeline:
    """``n`` activities on two devices, more than one chunk of plain rows, with a name too long for narrow consoles."""
    return Timeline.from_arrays(
        devices=["cuda:0", "cuda:1"],
        device=np.arange(n) % 2,
        names=["gemm", "an activity with a rather long name"],
        name=(np.arange(n) // 3) % 2,
        start_ns=T0 + np.arange(n) * 1.5e6 + 0.0005e6,
        end_ns=T0 + np.arange(n) * 1.5e6 + 1e6,
        scope_start_ns=T0,
        scope_end_ns=T0 + (n + 1) * 1.5e6,
    )


def printed(console_kwargs: dict, *objects: object, capture: bool = False) -> str:
    """What a rich console (made with ``console_kwargs``) shows for ``objects`` printed one after another, colour
    codes removed: exported from its record, or from ``console.capture()``."""
    console = Console(file=io.StringIO(), **console_kwargs)
    if capture:
        with console.capture() as cap:
            for obj in objects:
                console.print(obj)
        return _ANSI.sub("", cap.get())
    with console:  # held in rich's buffer until the end, as in a live display or a nested print
        for obj in objects:
            console.print(obj)
    return _ANSI.sub("", console.export_text(styles=False)) if console.record else console.file.getvalue()


@pytest.mark.parametrize("width", [100, 80, 60, 50, 44])
@pytest.mark.parametrize(
    "mode",
    [
        {"color_system": None},
        {"record": True},
        {"record": True, "force_terminal": True, "color_system": "truecolor"},
        {"force_terminal": True, "no_color": True, "capture": True},
        {"force_jupyter": True, "record": True},
    ],
    ids=["file", "record", "terminal", "capture", "jupyter"],
)
def test_rich_print_of_a_long_report_shows_the_plain_lines_in_order(width, mode):
    mode = dict(mode)
    capture = mode.pop("capture", False)
    n = _table._CHUNK_ROWS + 7
    report = timeline_report(fake_timer(long_timeline(n)), limit=None)
    assert report.renderables[0].plain
    expected = render(report, width=width).splitlines()
    assert max(map(len, expected)) <= width and sum(" │ " in line for line in expected) > n
    text = printed({"width": width, **mode}, "before", report, "after", capture=capture)
    assert text.splitlines() == ["before", *expected, "after"]


def test_a_console_that_prints_with_soft_wrap_gets_rows_by_chunks_not_by_lines():
    """``soft_wrap=True`` turns rich's cropping pass off (a full report of 1 M rows prints in 0.7 s instead of 4):
    the plain table then hands over a segment per chunk of rows, as to `render`'s console."""
    n = 3 * _table._CHUNK_ROWS
    table = timeline_report(fake_timer(long_timeline(n)), limit=None).renderables[0]
    console = Console(file=io.StringIO(), width=100)
    soft = console.options.update(no_wrap=True, overflow="ignore")  # what print(..., soft_wrap=True) passes
    chunks = [x for x in table.__rich_console__(console, soft) if isinstance(x, Segment)]
    lines = [x for x in table.__rich_console__(console, console.options) if isinstance(x, Segment)]
    assert len(chunks) < 10 < n < len(lines)
    assert "".join(x.text for x in chunks) == "".join(x.text for x in lines)
    for width in (100, 44):  # printed: the rows of a cropping console's print; the rest unwrapped (soft wrap)
        cropped = printed({"width": width, "color_system": None}, table)
        soft_wrapped = printed({"width": width, "color_system": None, "soft_wrap": True}, table)
        rows = [line for line in cropped.splitlines() if " │ " in line]
        assert [line for line in soft_wrapped.splitlines() if " │ " in line] == rows and len(rows) >= n
        assert soft_wrapped.split() == cropped.split()


@pytest.mark.parametrize("width", [80, 44])
def test_rich_print_of_plain_tables_with_sections_and_captions_equals_render(monkeypatch, width):
    monkeypatch.setattr(_table, "PLAIN_ROWS", -1)  # every table plain: sections, captions, bars, folded rows
    report = timeline_report(hard_timer())
    assert printed({"width": width, "color_system": None}, report) == render(report, width=width)


def test_ms_strings_are_pythons_formatting():
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            rng.uniform(-50_000, 50_000, 20_000),
            np.round(rng.uniform(-1000, 1000, 20_000), 3) + 0.0005,  # ties, as near as a float gets
            rng.integers(-(10**13), 10**13, 20_000) / 1e6,  # ns as ms
            10.0 ** rng.uniform(-7, 15, 20_000) * rng.choice([-1, 1], 20_000),
            [0.0, -0.0, -0.0004, 0.0005, 0.0015, 999.9995, 999_999.9995, 1e9, 1e9 - 5e-4, np.nan, np.inf, -np.inf],
        ]
    )
    assert _report.ms_strings(values) == [_report.ms(v) for v in values.tolist()]
    assert _report.ms_strings(np.array([])) == [] and _report.ms_strings(np.full(2, np.nan)) == ["—", "—"]


def _bench_balance():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_balance.py"
    spec = importlib.util.spec_from_file_location("bench_balance", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_balance_benchmark_runs_on_the_host_backend(capsys, tmp_path, monkeypatch):
    bench = _bench_balance()
    out = tmp_path / "b.json"
    argv = ["--backend", "host", "--devices", "2", "--units", "6", "--repeat", "1", "--tiny", "5", "--size", "64"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "balance: busy time per device" in text and "re-split" in text and "target: the re-split's" in text
    data = json.loads(out.read_text())
    assert data["uneven"]["units"] == [2, 4] and sum(data["resplit"]["units"]) == 6
    assert data["resplit"]["units"] == data["uneven"]["suggested"] and data["host_bound"]["straggler"] == "host"
    monkeypatch.setitem(sys.modules, "torch", None)
    assert bench.main(["--devices", "2"]) == 2
    assert "needs torch" in capsys.readouterr().out
