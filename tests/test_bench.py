"""asyncgpu.benchmark: the contract, the times, the stops, concurrency across devices, errors and bad input."""

from __future__ import annotations

import io
import json
import math
import signal
import threading
import time

import numpy as np
import pytest
from rich.console import Console

import asyncgpu
from asyncgpu._analysis.report import render
from asyncgpu._timing import bench as _bench
from asyncgpu._timing.bench import NOISE_MIN_REPEATS, BenchmarkError, BenchmarkResult, benchmark
from asyncgpu._timing.history import kernel_history
from asyncgpu.errors import UnknownDeviceError


def _spin(stream, us):
    stream.spin_us(us)


def _no_events_in_use(devs, timeout_s=2.0):
    """Events go back to their pools once the devices pass them (the waiter thread may lag a little)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(d.pool_stats().in_use == 0 for d in devs):
            return True
        time.sleep(0.01)
    return False


def test_calls_fn_with_each_devices_stream_and_times_it(dev):
    seen = []

    def fn(stream, us, *, tag):
        seen.append((stream, threading.current_thread().name, tag))
        stream.spin_us(us)

    r = benchmark(fn, (2_000,), {"tag": "t"}, n_repeat=5, n_warmup=2, devices=dev)
    assert isinstance(r, BenchmarkResult) and r.n_repeat == 5 and r.stop_reason == "n_repeat"
    assert len(seen) == 7 and all(s is dev.stream and tag == "t" for s, _, tag in seen)
    assert {name for _, name, _ in seen} == {f"asyncgpu-bench-{dev.name}"}
    assert r.devices == (dev.name,) and r.labels == ("CPU", dev.name) and r.streams == ("s0",)
    assert r.times_ms.shape == (2, 5) and r.gpu_times_ms.shape == (1, 5) and r.cpu_times_ms.shape == (5,)
    np.testing.assert_array_equal(r.times_ms[0], r.cpu_times_ms)
    assert np.all(r.gpu_times_ms >= 1.95) and np.all(r.gpu_times_ms < 30)
    assert np.all(r.cpu_times_ms >= 0) and np.all(r.cpu_times_ms < r.gpu_times_ms[0])  # launching is async
    t = r.gpu_times_ms[0]
    assert r.mean_ms[1] == pytest.approx(t.mean()) and r.std_ms[1] == pytest.approx(t.std())
    assert (r.min_ms[1], r.median_ms[1], r.max_ms[1]) == (t.min(), np.median(t), t.max())
    assert r.rsd[1] == pytest.approx(t.std() / t.mean())
    assert 0.005 < r.elapsed_s < 1
    assert _no_events_in_use([dev])


def test_devices_run_concurrently(two_devs):
    r = benchmark(_spin, (50_000,), n_repeat=4, n_warmup=0, devices=two_devs)
    assert r.gpu_times_ms.shape == (2, 4) and np.all(r.gpu_times_ms > 49)
    assert r.elapsed_s < 0.32  # 4 x 50 ms on each device at once; one after the other it would be 0.4 s


def test_a_stream_picks_where_fn_runs(two_devs):
    a, b = two_devs
    seen = set()

    def fn(stream):
        seen.add(stream)
        stream.spin_us(100)

    r = benchmark(fn, n_repeat=3, n_warmup=1, devices=[a.streams[1], b])
    assert seen == {a.streams[1], b.stream} and r.streams == ("s1", "s0") and r.devices == (a.name, b.name)


def test_the_callers_context_follows_into_the_device_threads(dev):
    with asyncgpu.gpu_timer(dev) as t:
        benchmark(_spin, (100,), n_repeat=3, n_warmup=1, devices=dev)
    assert [rec.name for rec in t.records] == ["spin"] * 4
    with kernel_history.recording():
        benchmark(_spin, (100,), n_repeat=2, n_warmup=0, devices=dev)
    assert len(kernel_history()) == 2


def test_one_repeat_stays_queued_so_the_device_never_idles(dev):
    """fn returns before its work runs: with one repeat queued behind the running one, each repeat's start
    event waits for the previous repeat's work, so GPU times are the work's, not host gaps."""
    r = benchmark(_spin, (5_000,), n_repeat=6, n_warmup=0, devices=dev)
    assert r.elapsed_s == pytest.approx(6 * 5e-3, rel=0.5)
    assert np.all(r.gpu_times_ms < 10)


def test_max_duration_stops_early(dev):
    r = benchmark(_spin, (2_000,), n_repeat=10_000, n_warmup=0, max_duration_s=0.05, devices=dev)
    assert r.stop_reason == "max_duration" and 2 <= r.n_repeat <= 40
    r = benchmark(_spin, (100,), n_repeat=10_000, n_warmup=0, max_duration_s=0, devices=dev)
    assert r.stop_reason == "max_duration" and r.n_repeat == 2  # the first repeat, and the one queued behind


def test_max_noise_stops_once_every_device_is_quiet_enough(two_devs):
    r = benchmark(_spin, (1_000,), n_repeat=1_000, n_warmup=1, max_noise=0.5, devices=two_devs)
    assert r.stop_reason == "max_noise" and r.n_repeat == NOISE_MIN_REPEATS + 1
    assert np.all(r.rsd[1:] <= 0.5)
    r = benchmark(_spin, (100,), n_repeat=15, n_warmup=0, max_noise=1e-12, devices=two_devs)
    assert r.stop_reason == "n_repeat" and r.n_repeat == 15  # never that quiet: the repeat count ends it


def test_str_is_one_line_like_cupys_and_the_table_renders(two_devs):
    r = benchmark(_spin, (500,), n_repeat=4, n_warmup=1, devices=two_devs, name="spin500")
    line = str(r)
    assert "\n" not in line and line.startswith("spin500") and "CPU:" in line
    d0, d1 = (d.name for d in two_devs)
    for needle in (f"{d0}:", f"{d1}:", "+/-", "min:", "median:", "max:", " us"):
        assert needle in line
    text = render(r, width=120)
    for needle in (
        "benchmark 'spin500'",
        "4 repeats after 1 warm-up",
        "stopped by n_repeat",
        "mean (µs)",
        "median",
        "rsd",
        "CPU",
        d0,
        d1,
    ):
        assert needle in text
    d = r.to_dict(times=True)
    json.dumps(d)
    assert d["rows"][d1]["median_ms"] == pytest.approx(float(r.median_ms[2]))
    assert np.array(d["times_ms"]).shape == (3, 4) and d["n_repeat"] == 4 and d["stop_reason"] == "n_repeat"
    assert "4 repeats" in repr(r)


def test_fn_raising_in_warm_up_stops_cleanly(two_devs):
    calls = []

    def fn(stream):
        calls.append(stream.device.name)
        if stream.device is two_devs[1]:
            raise ValueError("bad input")
        stream.spin_us(100)

    d1 = two_devs[1].name
    with pytest.raises(BenchmarkError, match=rf"fn raised ValueError: bad input \(on {d1}, in warm-up\)") as info:
        benchmark(fn, n_repeat=100, n_warmup=3, devices=two_devs)
    err = info.value
    assert isinstance(err.__cause__, ValueError) and err.device == d1 and err.phase == "warm-up"
    assert err.result.n_repeat == 0 and err.result.stop_reason == "error"
    assert err.result.gpu_times_ms.shape == (2, 0) and "no complete repeat" in str(err.result)
    assert calls.count(d1) == 1  # it stopped at once
    assert _no_events_in_use(two_devs)


def test_fn_raising_mid_run_keeps_the_complete_repeats(two_devs):
    n = {d.name: 0 for d in two_devs}

    def fn(stream):
        k = n[stream.device.name] = n[stream.device.name] + 1
        if stream.device is two_devs[0] and k == 2 + 7:  # call 9: after 2 warm-up calls and repeats 0..5
            raise RuntimeError("boom")
        stream.spin_us(200)

    with pytest.raises(BenchmarkError, match="in repeat 6") as info:
        benchmark(fn, n_repeat=100, n_warmup=2, devices=two_devs)
    part = info.value.result
    assert part.n_repeat == 6  # every call of repeats 0..5 returned: repeat 5, in flight when 6 failed, is kept
    assert part.gpu_times_ms.shape == (2, 6) and np.all(part.gpu_times_ms > 0.19)
    assert part.cpu_times_ms.shape == (6,) and np.all(part.cpu_times_ms > 0)
    assert _no_events_in_use(two_devs)


def test_a_failure_that_breaks_a_barrier_another_device_passed_keeps_that_devices_repeats(two_devs, monkeypatch):
    """threading.Barrier: a thread woken by a barrier that tripped, but that runs only after a failure elsewhere
    aborted it, raises BrokenBarrierError as if the barrier had never tripped. The late device still times the
    repeat whose calls all returned (seen on a loaded 4-GPU machine: 5 repeats kept instead of 6)."""
    late = two_devs[1].name

    class LateWaker(threading.Barrier):
        def wait(self, timeout=None):
            i = super().wait(timeout)
            if threading.current_thread().name.endswith(late):
                time.sleep(0.02)  # (woken late: the other device has failed and aborted the barrier by now)
                if self.broken:
                    raise threading.BrokenBarrierError
            return i

    monkeypatch.setattr(_bench.threading, "Barrier", LateWaker)
    n = {d.name: 0 for d in two_devs}

    def fn(stream):
        k = n[stream.device.name] = n[stream.device.name] + 1
        if stream.device is two_devs[0] and k == 2 + 7:
            raise RuntimeError("boom")
        stream.spin_us(200)

    with pytest.raises(BenchmarkError, match="in repeat 6") as info:
        benchmark(fn, n_repeat=100, n_warmup=2, devices=two_devs)
    part = info.value.result
    assert part.n_repeat == 6 and part.gpu_times_ms.shape == (2, 6) and np.all(part.gpu_times_ms > 0.19)
    assert _no_events_in_use(two_devs)


@pytest.mark.parametrize("fails_at", [0, 1, 4])
def test_the_partial_result_keeps_a_repeat_for_every_call_that_returned(dev, fails_at):
    returned = []

    def fn(stream):
        if len(returned) == fails_at:
            raise RuntimeError("boom")
        stream.spin_us(100)
        returned.append(1)

    with pytest.raises(BenchmarkError, match=f"in repeat {fails_at}") as info:
        benchmark(fn, n_repeat=100, n_warmup=0, devices=dev)
    part = info.value.result
    assert part.n_repeat == len(returned) == fails_at and part.stop_reason == "error"
    assert part.gpu_times_ms.shape == (1, fails_at) and np.all(part.gpu_times_ms > 0.09)


def test_work_failing_on_the_device_is_an_error_too(dev):
    if dev.backend != "host":
        pytest.skip("a sticky CUDA error would poison the process")

    def fn(stream):
        stream.launch(lambda: 1 / 0, None)

    with pytest.raises(BenchmarkError, match=r"BackendError.*ZeroDivisionError.*warm-up"):
        benchmark(fn, n_repeat=3, n_warmup=1, devices=dev)


def test_ctrl_c_stops_the_devices_then_propagates(dev):
    calls = []
    main = threading.main_thread().ident

    def fn(stream):
        calls.append(1)
        if len(calls) == 5:
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C: KeyboardInterrupt in the caller's thread
        stream.spin_us(1_000)

    with pytest.raises(KeyboardInterrupt):
        benchmark(fn, n_repeat=10_000, n_warmup=1, devices=dev)
    assert len(calls) < 50  # stopped within a repeat or two of the interrupt, not after 10000
    assert _no_events_in_use([dev])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_repeat": 0}, "n_repeat must be a whole number >= 1"),
        ({"n_repeat": -3}, "n_repeat"),
        ({"n_repeat": 2.5}, "n_repeat"),
        ({"n_repeat": True}, "n_repeat"),
        ({"n_warmup": -1}, "n_warmup must be a whole number >= 0"),
        ({"max_duration_s": -1.0}, "max_duration_s is in seconds and must be >= 0"),
        ({"max_duration_s": math.nan}, "max_duration_s"),
        ({"max_noise": 0}, "max_noise is a relative standard deviation"),
        ({"max_noise": -0.1}, "max_noise"),
    ],
)
def test_bad_numbers_are_refused_before_anything_runs(dev, kwargs, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        benchmark(lambda s: calls.append(s), devices=dev, **kwargs)
    assert not calls


def test_bad_arguments_name_the_fix(dev):
    with pytest.raises(TypeError, match="callable"):
        benchmark("not a function", devices=dev)
    with pytest.raises(TypeError, match="args must be a tuple"):
        benchmark(_spin, 5, devices=dev)
    with pytest.raises(TypeError, match="kwargs must be a mapping"):
        benchmark(_spin, (1,), [("us", 1)], devices=dev)
    with pytest.raises(ValueError, match="given twice"):
        benchmark(_spin, (1,), devices=[dev.streams[0], dev.streams[1]])
    with pytest.raises(ValueError, match="at least one device"):
        benchmark(_spin, (1,), devices=[])


def test_devices_that_do_not_exist():
    with pytest.raises(UnknownDeviceError, match="host:99"):
        benchmark(_spin, (1,), devices=["host:99"])
    with pytest.raises(UnknownDeviceError, match="unknown device"):
        benchmark(_spin, (1,), devices=["tpu:0"])
    closed = asyncgpu.device(0, backend="host")
    closed.close()
    with pytest.raises(asyncgpu.ClosedError):
        benchmark(_spin, (1,), devices=[closed])


def test_parse_devices():
    assert [d.name for d in _bench.parse_devices("host:1, host:0")] == ["host:1", "host:0"]
    assert [d.name for d in _bench.parse_devices("0,1", "host")] == ["host:0", "host:1"]
    assert [d.name for d in _bench.parse_devices(None, "host")] == ["host:0", "host:1"]
    with pytest.raises(ValueError, match="no device"):
        _bench.parse_devices(" , ", "host")


def test_progress_bar_on_a_terminal_only(dev, monkeypatch, capsys):
    buf = io.StringIO()
    monkeypatch.setattr(
        _bench, "_progress_console", lambda: Console(file=buf, force_terminal=True, width=100, color_system=None)
    )
    benchmark(_spin, (20_000,), n_repeat=8, n_warmup=0, devices=dev, name="slow", progress=True)
    assert "benchmark slow" in buf.getvalue() and "repeats" in buf.getvalue()
    buf.truncate(0)
    monkeypatch.setattr(_bench, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(_bench, "_progress_console", lambda: Console(file=buf, force_terminal=False))
    benchmark(_spin, (20_000,), n_repeat=8, n_warmup=0, devices=dev, progress=None)  # not a terminal: quiet
    benchmark(_spin, (20_000,), n_repeat=8, n_warmup=0, devices=dev, progress=False)
    assert buf.getvalue() == "" and capsys.readouterr() == ("", "")


@pytest.mark.gpu
def test_cuda_times_match_the_kernel():
    dev = asyncgpu.device(0, backend="cuda")
    dev.stream.spin_us(10)  # compile and load the kernel outside the timing
    r = benchmark(_spin, (100,), n_repeat=200, n_warmup=10, devices=dev)
    med = r.median_ms[1] * 1e3
    # The spin runs >= 100 µs (CUPTI reads ~100.5 µs); the pair's own latency is taken out (subtract_overhead), so
    # the median stays within the 1 µs accuracy target of that.
    assert 99.0 <= med < 115, f"median {med:.2f} µs for a 100 µs spin"
    assert r.cpu_times_ms.max() < 5  # launches do not wait for the GPU


@pytest.mark.multigpu
def test_cuda_devices_overlap():
    devs = asyncgpu.devices("cuda", count=2)
    for d in devs:
        d.stream.spin_us(10)
    r = benchmark(_spin, (2_000,), n_repeat=20, n_warmup=2, devices=devs)
    assert np.all(r.gpu_times_ms > 1.99)
    assert r.elapsed_s < 20 * 2e-3 * 1.5  # one after the other it would take twice as long
