"""Kernel history: one record per launch while on, cleared on read, durations and starts from event pairs."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import asyncgpu
from asyncgpu._timing import history as _history
from asyncgpu._timing.history import kernel_history
from asyncgpu.types import LaunchRecord


@pytest.fixture(autouse=True)
def _history_off():
    """Every test starts and ends with the history off and empty."""
    kernel_history.enabled = False
    kernel_history.clear()
    yield
    kernel_history.enabled = False
    kernel_history.clear()


def test_off_by_default_and_records_nothing(dev):
    assert not kernel_history.enabled and _history.ON is False
    dev.stream.spin_us(100)
    dev.synchronize()
    assert kernel_history() == []
    assert dev.pool_stats().in_use == 0


def test_records_each_launch_with_duration_and_absolute_start(dev):
    a = dev.alloc(1000)
    out = dev.alloc_pinned(1000)
    with kernel_history.recording():
        before_ns = time.perf_counter_ns()
        dev.stream.memset(a, 0)
        dev.stream.spin_us(3_000)
        dev.stream.inc_loop(a, 2)
        dev.stream.copy_to_host(a, out)
    recs = kernel_history()
    assert [r.name for r in recs] == ["memset", "spin", "inc_loop", "copy_to_host"]
    assert [r.kind for r in recs] == ["memset", "kernel", "kernel", "memcpy"]
    assert all(isinstance(r, LaunchRecord) and r.device == dev.name and r.stream == "s0" for r in recs)
    assert [r.seq for r in recs] == sorted(r.seq for r in recs)
    spin = recs[1]
    assert 2.9 < spin.duration_ms < 30
    starts = [r.start_ns for r in recs]
    assert all(s is not None for s in starts) and starts == sorted(starts)  # one stream: in order
    assert starts[0] >= before_ns - 1_000_000  # on the host time base (within the clock's bound)
    assert spin.end_ns - spin.start_ns == pytest.approx(spin.duration_ms * 1e6, abs=1)
    assert recs[2].start_ns >= spin.end_ns - 5_000  # the next launch starts after the spin ends
    assert all(r.issue_ns <= r.start_ns + 1_000_000 for r in recs)
    np.testing.assert_array_equal(out, np.full(1000, 2.0, np.float32))
    assert kernel_history() == []  # cleared on read
    assert dev.pool_stats().in_use == 0  # every event went back


def test_user_launch_name_and_shape_on_host(dev):
    if dev.backend != "host":
        pytest.skip("host launches take a callable")
    hits = []
    kernel_history.enabled = True
    dev.stream.launch(lambda: hits.append(1), None, name="mine")
    dev.stream.launch(hits.append, None, 2)
    kernel_history.enabled = False
    dev.stream.launch(hits.append, None, 3)  # off again: not recorded
    recs = kernel_history()
    assert [r.name for r in recs] == ["mine", "append"] and hits == [1, 2, 3]
    assert all(r.grid is None and r.block is None for r in recs)


@pytest.mark.gpu
def test_cuda_launch_shapes():
    dev = asyncgpu.device(0, backend="cuda")
    a = dev.alloc(1000)
    with kernel_history.recording():
        dev.stream.spin_us(50)
        dev.stream.inc_loop(a, 1)
    spin, inc = kernel_history()
    assert spin.grid == (1, 1, 1) and spin.block == (1, 1, 1)
    assert inc.block == (256, 1, 1) and inc.grid == ((1000 + 255) // 256, 1, 1)
    assert 45e-3 < spin.duration_ms < 0.5  # the event pair's overhead is taken out, as gpu_timer does


def test_agrees_with_gpu_timer(dev):
    with kernel_history.recording():
        with asyncgpu.gpu_timer(dev) as t:
            dev.stream.spin_us(2_000)
            dev.stream.spin_us(1_000)
    recs = kernel_history()
    assert [r.name for r in recs] == [r.name for r in t.records]
    for h, s in zip(recs, t.records):  # separate event pairs around the same launch: same durations
        assert h.duration_ms == pytest.approx(s.duration_ms, abs=0.3)
        assert h.start_ns == pytest.approx(s.start_ns, abs=300_000)


def test_recording_blocks_nest_and_the_flag_outlives_them():
    assert not kernel_history.enabled
    with kernel_history.recording():
        with kernel_history.recording():
            assert kernel_history.enabled
        assert kernel_history.enabled
    assert not kernel_history.enabled
    kernel_history.enabled = True
    with kernel_history.recording():
        pass
    assert kernel_history.enabled  # the flag is still set


def test_recording_block_restores_on_error():
    with pytest.raises(RuntimeError):
        with kernel_history.recording():
            raise RuntimeError("x")
    assert not kernel_history.enabled


def test_launches_from_several_threads_are_all_recorded(two_devs):
    def work(d):
        for _ in range(20):
            d.stream.spin_us(10)

    with kernel_history.recording():
        threads = [threading.Thread(target=work, args=(d,)) for d in two_devs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    recs = kernel_history()
    assert len(recs) == 40
    assert {r.device for r in recs} == {d.name for d in two_devs}
    assert all(r.duration_ms is not None and r.start_ns is not None for r in recs)


def test_read_without_waiting_keeps_unfinished_launches(dev):
    with kernel_history.recording():
        dev.stream.spin_us(1_000)
        dev.stream.spin_us(300_000)
    first = kernel_history(wait=False)
    assert len(first) <= 1  # the long spin is still running: it stays for the next read
    rest = kernel_history()
    assert [r.name for r in first + rest] == ["spin", "spin"]
    assert rest[-1].duration_ms > 290
    assert dev.pool_stats().in_use == 0


def test_failed_launch_is_not_recorded_and_gives_its_event_back(dev):
    with kernel_history.recording():
        with pytest.raises(ValueError):
            dev.stream.spin_us(-1)  # refused before anything is launched
        if dev.backend == "host":
            with pytest.raises(TypeError):
                dev.stream.launch(lambda: None, object())  # the backend refuses it
    assert kernel_history() == []
    dev.synchronize()
    deadline = time.monotonic() + 2
    while dev.pool_stats().in_use and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dev.pool_stats().in_use == 0


def test_compaction_bounds_the_events_held(dev, monkeypatch):
    monkeypatch.setattr(_history, "COMPACT_AT", 16)
    with kernel_history.recording():
        for _ in range(100):
            dev.stream.spin_us(1)
        dev.synchronize()
        dev.stream.spin_us(1)  # this launch's compaction resolves the finished ones
    assert len(_history._pending) < 16
    assert dev.pool_stats().in_use <= 2 * 16
    recs = kernel_history()
    assert len(recs) == 101 and [r.seq for r in recs] == sorted(r.seq for r in recs)


def test_records_of_a_closed_device_come_back_without_times():
    dev = asyncgpu.device(0, backend="host")
    with kernel_history.recording():
        dev.stream.spin_us(10)
    dev.synchronize()
    dev.close()
    (rec,) = kernel_history()
    assert rec.name == "spin" and rec.duration_ms is None and rec.start_ns is None and rec.end_ns is None


def test_clear_and_repr(dev):
    with kernel_history.recording():
        dev.stream.spin_us(10)
    assert "pending=1" in repr(kernel_history)
    kernel_history.clear()
    assert kernel_history() == []
    dev.synchronize()
