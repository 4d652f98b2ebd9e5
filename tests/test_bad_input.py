"""Bad input and faults (issue 15): each gets a clear error naming the fix, at the call that is wrong, and leaves
nothing behind (events back in their pools, threads ended, buffers freed)."""

from __future__ import annotations

import math
import time

import anyio
import numpy as np
import pytest

import asyncgpu
from asyncgpu import Channel, ClosedError, ScopeError, gpu_timer, kernel
from asyncgpu._backends.cuda import compiler as _cuda  # (its `_nvrtc_probe`)
from asyncgpu._runtime.select import DEFAULT_MAX_EVENTS
from asyncgpu.errors import NoDeviceError, PoolExhaustedError, UnknownDeviceError

pytestmark = pytest.mark.anyio


def _in_use(dev) -> int:
    return dev.pool_stats(True).in_use + dev.pool_stats(False).in_use


async def _settled(dev, timeout_s: float = 5.0) -> int:
    """Events in use once the deferred releases have landed (the waiter thread hands them back)."""
    deadline = time.monotonic() + timeout_s
    while _in_use(dev) and time.monotonic() < deadline:
        await anyio.sleep(0.005)
    return _in_use(dev)


def _settled_sync(dev, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while _in_use(dev) and time.monotonic() < deadline:
        time.sleep(0.005)
    return _in_use(dev)


# -- an exhausted pool inside a scope ---------------------------------------------------------------------------------
async def test_an_exhausted_pool_in_a_scope_keeps_its_records_and_gives_every_event_back(backend):
    dev = asyncgpu.device(0, backend=backend, max_events=8)  # the scope's mark, then two events per launch
    t = gpu_timer(dev)
    with pytest.raises(PoolExhaustedError, match="max_events"):  # the error still reaches the caller
        async with t:
            for _ in range(10):
                dev.stream.spin_us(2_000)
    durations = [r.duration_ms for r in t.records]
    assert len(durations) == 4 and durations[-1] is None  # the launch whose end event found no room
    assert all(d is not None and d > 1.5 for d in durations[:3])  # the finished ones are kept, timed
    assert "PoolExhaustedError" in t.timeline.error
    assert await _settled(dev) == 0


def test_an_exhausted_pool_in_a_blocking_scope_keeps_its_records(backend):
    dev = asyncgpu.device(0, backend=backend, max_events=8)
    with pytest.raises(PoolExhaustedError):
        with gpu_timer(dev) as t:
            for _ in range(10):
                dev.stream.spin_us(2_000)
    assert [r.duration_ms is not None for r in t.records] == [True, True, True, False]
    assert _settled_sync(dev) == 0


def test_a_scope_that_cannot_wait_at_its_exit_finishes_then_raises(backend):
    dev = asyncgpu.device(0, backend=backend, max_events=8)
    held = [dev.record(timing=False) for _ in range(8)]  # no room left for the exit's fence
    with pytest.raises(PoolExhaustedError, match="non-timing"):
        with gpu_timer(dev) as t:
            dev.stream.spin_us(1_000)
    assert len(t.records) == 1 and "at the scope's exit" in t.timeline.error
    for ev in held:
        ev.release()
    assert _settled_sync(dev) == 0


# -- the latest record of an event counts, on every backend ---------------------------------------------------------
@pytest.mark.parametrize("where", ["same stream", "other stream"])
async def test_the_latest_record_of_an_event_counts(dev, where):
    first = dev.streams[0]
    second = first if where == "same stream" else dev.streams[1]
    probe_stream = dev.create_stream()
    start = dev.record(probe_stream)
    first.spin_us(50_000)
    ev = dev.record(first)  # passed after 50 ms...
    second.spin_us(300_000 if where == "other stream" else 250_000)
    ev.record(second)  # ...re-recorded before that: now it stands 300 ms in
    probe_stream.spin_us(150_000)
    with dev.record(probe_stream) as probe:
        await probe.wait()
    assert not ev.query()  # the first record has passed; it no longer counts
    await ev.wait()
    assert ev - start > 280
    start.release()
    ev.release()


# -- a put that is never awaited --------------------------------------------------------------------------------------
async def test_a_put_never_awaited_does_nothing(dev):
    ch = Channel(2)
    async with gpu_timer(dev) as t:
        before = dev.pool_stats().taken
        put = ch.put("payload", stream=dev.stream)
        assert dev.pool_stats().taken == before and ch.qsize() == 0  # no event recorded, nothing queued
        put.close()  # what the garbage collector does with it (with a "never awaited" warning)
        with pytest.raises(TypeError, match="stream= takes the asyncgpu Stream"):
            ch.put("payload", stream="s0")  # the arguments are still checked at the call
        h = await ch.put("payload", stream=dev.stream)
        assert dev.pool_stats().taken == before + 1 and h.seq == 0
        with await ch.get() as got:
            assert got.payload == "payload"
    assert t.timeline.layers and len(t.timeline.layers[0].records()) == 1  # the one real handoff
    assert await _settled(dev) == 0


# -- arguments --------------------------------------------------------------------------------------------------------
def test_device_options_are_checked_before_a_device_opens():
    for bad in (0, -1):
        with pytest.raises(ValueError, match=r"max_events must be a whole number >= 1 \(the bound"):
            asyncgpu.device("host:3", max_events=bad)
    with pytest.raises(TypeError, match="max_events"):
        asyncgpu.device("host:3", max_events="8")
    with pytest.raises(TypeError, match="streams"):
        asyncgpu.device("host:3", streams=True)
    assert asyncgpu.device("host:3").options == {"streams": 2, "max_events": DEFAULT_MAX_EVENTS}  # none opened
    with pytest.raises(ValueError, match="count must be a whole number >= 1"):
        asyncgpu.devices("host", count=0)
    with pytest.raises(TypeError, match="count"):
        asyncgpu.devices("host", count=1.5)
    with pytest.raises(UnknownDeviceError, match="this machine has 64"):
        asyncgpu.devices("host", count=65)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda d, a: d.stream.inc_loop(a, -1), ValueError, "iterations must be a whole number in 0 .. 2147483647"),
        (lambda d, a: d.stream.inc_loop(a, 2.5), TypeError, "iterations must be a whole number"),
        (lambda d, a: d.stream.inc_loop(a, "3"), TypeError, r"not '3' \(str\)"),
        (lambda d, a: d.stream.inc_loop(a, 1 << 31), ValueError, "2147483647"),
        (lambda d, a: d.stream.spin_us(math.nan), ValueError, "duration_us is in microseconds"),
        (lambda d, a: d.stream.spin_us(math.inf), ValueError, "duration_us is in microseconds"),
        (lambda d, a: d.stream.spin_us("5"), TypeError, r"not '5' \(str\)"),
        (lambda d, a: d.stream.spin_us(True), TypeError, "duration_us"),
        (lambda d, a: d.stream.memset(a, 1.5), TypeError, "byte must be a whole number in 0 .. 255"),
        (lambda d, a: d.stream.launch(lambda: None, None, name=5), TypeError, "name is the kernel activity's name"),
        (lambda d, a: d.stream.record(5), TypeError, "records an asyncgpu Event"),
        (lambda d, a: d.alloc("10"), TypeError, "n must be a whole number >= 0"),
        (lambda d, a: d.alloc(-1), ValueError, "n must be a whole number >= 0"),
        (lambda d, a: d.alloc(10, object), TypeError, "plain numbers, not object: use a numeric dtype"),
        (lambda d, a: d.alloc(10, str), TypeError, "plain numbers"),
        (lambda d, a: d.alloc_pinned(4, object), TypeError, "plain numbers"),
        (lambda d, a: d.alloc(1 << 62), ValueError, "more than the .* bytes of memory host:0 allocates from"),
        (lambda d, a: d.alloc_pinned(1 << 62), ValueError, "more than the .* bytes of host RAM"),
        (lambda d, a: d.record(stream="s0"), TypeError, r"takes one of its own streams \(device.stream"),
        (lambda d, a: d.clock(samples="3"), TypeError, "samples must be a whole number >= 1"),
        (lambda d, a: d.clock(max_age_s=-1), ValueError, "max_age_s is in seconds"),
        (lambda d, a: _wait_sync(d.record(), timeout_s=-1), ValueError, "timeout_s is in seconds: a number >= 0"),
        (lambda d, a: _wait_sync(d.record(), timeout_s="1"), TypeError, "timeout_s is in seconds"),
    ],
)
def test_workload_and_memory_arguments(call, error, match):
    dev = asyncgpu.device("host:0")
    a = dev.alloc(16)
    taken = dev.pool_stats().taken
    with pytest.raises(error, match=match):
        call(dev, a)
    assert dev.pool_stats().taken <= taken + 1  # nothing was enqueued or timed (one record at most: wait_sync's)
    assert _settled_sync(dev) == 0


def _wait_sync(ev, **kwargs):
    with ev:
        ev.wait_sync(**kwargs)


def test_channel_arguments():
    dev = asyncgpu.device("host:0")
    with pytest.raises(TypeError, match="maxsize must be a whole number >= 1"):
        Channel(True)
    with pytest.raises(ValueError, match="maxsize"):
        Channel(0)
    with pytest.raises(ValueError, match="keep_records"):
        Channel(keep_records=-1)
    with pytest.raises(TypeError, match="name is the channel's name"):
        Channel(name=5)
    ch = Channel(1)
    with pytest.raises(TypeError, match=r"stream= takes the asyncgpu Stream .* not 's0'"):
        ch.put_sync(1, stream="s0")
    with pytest.raises(TypeError, match="not <asyncgpu.Device host:0"):
        ch.put_sync(1, stream=dev)
    for bad, error in ((-1, ValueError), (math.nan, ValueError), ("1", TypeError)):
        with pytest.raises(error, match="timeout_s is in seconds"):
            ch.get_sync(timeout_s=bad)
        with pytest.raises(error, match="timeout_s is in seconds"):
            ch.put_sync(1, stream=dev.stream, timeout_s=bad)
    with pytest.raises(TypeError, match="timeout"):
        ch.get_sync(timeout=-1)  # (timeout_s's old name, removed in 0.3)
    assert ch.qsize() == 0 and dev.pool_stats().taken == 0  # no put happened
    h = ch.put_sync(1, stream=dev.stream)
    got = ch.get_sync()
    with pytest.raises(TypeError, match="done"):
        got.done(stream="s0")
    with pytest.raises(TypeError, match="wait_done"):
        h.wait_done_sync(stream="s0")
    got.done()
    h.wait_done_sync(timeout_s=math.inf)  # inf: wait for ever
    with pytest.raises(TypeError, match="gpu_side is True, False or None"):
        ch.latencies_ns(gpu_side="yes")
    assert _settled_sync(dev) == 0


async def test_async_timeouts_say_what_did_not_happen(dev):
    ch = Channel(1)
    with pytest.raises(TimeoutError, match="nothing came through channel 'channel' in 0.01 s"):
        await ch.get(timeout_s=0.01)
    with pytest.raises(ValueError, match="timeout_s"):
        await ch.get(timeout_s=-1)
    dev.stream.spin_us(300_000)
    h = await ch.put(1, stream=dev.stream)
    with pytest.raises(TimeoutError, match=r"stayed full for 0.01 s"):
        await ch.put(2, stream=dev.stream, timeout_s=0.01)
    with pytest.raises(TimeoutError, match=r"handoff #0 .* had not finished its work after 0.01 s \(the item is back"):
        await ch.get(timeout_s=0.01)
    with pytest.raises(TimeoutError, match="the consumer of handoff #0 .* was not done after 0.01 s"):
        await h.wait_done(timeout_s=0.01)
    assert ch.qsize() == 1
    with await ch.get() as got:
        assert got.payload == 1
    await h.wait_done()
    assert await _settled(dev) == 0


def test_kernel_records_and_profiler_arguments():
    dev = asyncgpu.device("host:0")
    with pytest.raises(TypeError, match="a record buffer is an array of integer words .* not NoneType"):
        kernel.KernelRecords.decode(None)
    with pytest.raises(TypeError, match="not ndarray of float64"):
        kernel.decode(np.zeros(8))
    with pytest.raises(TypeError, match="integer words"):
        kernel.decode_tirx("abc")
    with pytest.raises(TypeError, match="stages is a sequence of names"):
        kernel.decode(np.zeros(8, np.uint64), stages="load")
    with pytest.raises(ValueError, match="stages=\\(\\) names no stage: leave it out"):
        kernel.KernelProfiler(dev, stages=())
    with pytest.raises(ValueError, match="'load' is stage 0 and stage 2"):
        kernel.KernelProfiler(dev, stages=("load", "add", "load"))
    with pytest.raises(ValueError, match="stage names must differ"):
        kernel.decode(np.zeros(8, np.uint64), stages=("a", "a"))
    with pytest.raises(TypeError, match="stage names are strings: stage 1 is 2"):
        kernel.KernelProfiler(dev, stages=("a", 2))
    with pytest.raises(TypeError, match="capacity must be a whole number"):
        kernel.KernelProfiler(dev, capacity=2.5)
    with pytest.raises(TypeError, match="a device is an index"):
        kernel.KernelProfiler(None)
    prof = kernel.KernelProfiler("host:0")  # a device spec, as gpu_timer takes
    assert prof.device is dev and prof.stages == ()
    for grid in ("4", 2.5, (2, 0), (1, 1, 1, 1)):
        with pytest.raises((TypeError, ValueError), match="grid must be a block count"):
            prof.arm(grid)
    with pytest.raises(ValueError, match="iterations"):
        prof.inc_loop(dev.alloc(4), -1)
    prof.close()


def test_balance_work_units():
    tl = asyncgpu.Timeline.from_arrays(devices=["a", "b"], device=[0, 1], start_ns=[0, 0], end_ns=[10, 20])
    for units in ({"a": "5", "b": 1}, {"a": 1e30, "b": 1}, [True, 1], [1, -1]):
        with pytest.raises(ValueError, match=r"whole numbers from 0 to 2\*\*53"):
            asyncgpu.balance(tl, work_units=units)
    for units in (5, "ab"):
        with pytest.raises(TypeError, match=r"work_units is a dict \{device: units\}"):
            asyncgpu.balance(tl, work_units=units)
    assert asyncgpu.balance(tl, work_units={"a": 2**53, "b": 0}).total_units == 2**53
    for fn in (asyncgpu.balance, asyncgpu.device_summary, asyncgpu.activity_summary):
        with pytest.raises(TypeError, match=r"takes a Timeline \(t.timeline\) or a finished Timer"):
            fn("timeline")


def test_gpu_timer_arguments_are_checked_before_any_work():
    dev = asyncgpu.device("host:0")
    for kwargs, error, match in (
        ({"report_func": 5}, TypeError, r"report_func is called as report_func\(records, indent\)"),
        ({"max_clock_age_s": math.nan}, ValueError, "max_clock_age_s is in seconds"),
        ({"max_clock_age_s": "1"}, TypeError, "max_clock_age_s"),
        ({"label": None}, TypeError, "label is the scope's name"),
        ({"kinds": 5}, TypeError, "kinds is a list of activity kinds"),
    ):
        with pytest.raises(error, match=match):
            gpu_timer(dev, **kwargs)
    assert dev.pool_stats().taken == 0  # nothing ran: not even the scope's start mark
    with gpu_timer(dev, max_clock_age_s=math.inf) as t:  # inf: never re-measure
        dev.stream.spin_us(10)
        with pytest.raises(TypeError, match="stream= takes an asyncgpu Stream"):
            t.activity("x", stream="s0")
        with pytest.raises(TypeError, match="device= takes one of the scope's devices"):
            t.activity("x", device="host:0")
    with pytest.raises(ValueError, match="totals_by\\(\\) groups by one of"):
        t.totals_by("colour")
    with pytest.raises(ValueError, match="limit"):
        t.report(limit=-1)
    with pytest.raises(TypeError, match="timing_print\\(\\) prints ActivityRecords"):
        asyncgpu.timing_print([1, 2])


async def test_results_read_inside_the_scope_raise_the_same_error(dev):
    async with gpu_timer(dev) as t:
        dev.stream.spin_us(100)
        for read in (lambda: t.records, lambda: t.timeline, lambda: t.totals_by("kind")):
            with pytest.raises(ScopeError, match="no results yet: read them after the scope has ended"):
                read()
    assert len(t.records) == len(t.timeline) == 1 and t.records() == t.timeline.records()


def test_other_arguments_name_the_fix():
    dev = asyncgpu.device("host:0")
    with pytest.raises(TypeError, match="name is the benchmark's name"):
        asyncgpu.benchmark(lambda s: None, n_repeat=1, devices=dev, name=5)
    with pytest.raises(TypeError, match="progress is True, False or None"):
        asyncgpu.benchmark(lambda s: None, n_repeat=1, devices=dev, progress="yes")
    with pytest.raises(TypeError, match="kernel_history.enabled is True or False"):
        asyncgpu.kernel_history.enabled = "yes"
    assert not asyncgpu.kernel_history.enabled
    with pytest.raises(NoDeviceError, match="two or more CUDA GPUs"):
        asyncgpu.check_alignment([dev, asyncgpu.device("host:1")])
    with pytest.raises(TypeError, match="takes a list of Devices"):
        asyncgpu.check_alignment([0, 1])
    with pytest.raises(ValueError, match="trials"):
        asyncgpu.check_alignment([dev], trials=0)
    with gpu_timer(dev) as t:
        pass
    with pytest.raises(TypeError, match="timeout_s is in seconds"):
        asyncgpu.ranks.gather(t, timeout_s="60")
    with pytest.raises(ValueError, match="timeout_s"):
        asyncgpu.ranks.gather(t, timeout_s=math.nan)
    with pytest.raises(ValueError, match="clock_samples"):
        asyncgpu.ranks.gather(t, clock_samples=0)
    with pytest.raises(TypeError, match="timer= takes an open gpu_timer scope"):
        asyncgpu.ranks.mark_collective("allreduce", timer=5)
    with pytest.raises(TypeError, match="wait is True"):
        asyncgpu.kernel_history(wait="no")
    with pytest.raises(TypeError, match=r"devices is a sequence of names \(devices=\['ab'\] for one\)"):
        asyncgpu.Timeline.from_arrays(devices="ab", device=[0], start_ns=[0], end_ns=[1])
    words = np.zeros(64, np.uint64)
    with pytest.raises(ValueError, match="block must be a whole number >= 0"):
        kernel.HostLane(words, -1, blocks=1)  # (it would have written before its lane)
    with pytest.raises(ValueError, match="blocks must be a whole number >= 1"):
        kernel.HostLane(words, 0, blocks=0)
    a = dev.alloc(4)
    with dev.stream.capture() as graph:
        with pytest.raises(TypeError, match="a part's name is a str"):
            graph.part(5)
        dev.stream.inc_loop(a, 1)
    with pytest.raises(TypeError, match="name is the replay's activity name"):
        graph.launch(name=5)
    graph.close()


# -- a closed worker --------------------------------------------------------------------------------------------------
async def test_events_streams_and_graphs_of_a_closed_worker_raise(backend):
    dev = asyncgpu.device(0, backend=backend)
    a = dev.alloc(16)
    s = dev.streams[1]
    with dev.stream.capture() as graph:
        dev.stream.inc_loop(a, 1)
    done, pending = dev.record(), dev.create_event()
    await done.wait()
    dev.close()
    fix = rf"{dev.name}'s worker, which is closed \(device.close\(\) was called\): open the device again"
    for use in (
        done.query,
        done.wait_sync,
        lambda: done.elapsed_ms(done),
        lambda: pending.record(),
        lambda: s.spin_us(10),
        lambda: s.inc_loop(a, 1),
        lambda: s.memset(a, 0),
        lambda: s.launch(lambda: None, None),
        lambda: s.wait(done),
        s.sync,
        s.capture,
    ):
        with pytest.raises(ClosedError, match=fix):
            use()
    with pytest.raises(ClosedError, match=fix):
        await done.wait()
    with pytest.raises(ClosedError, match="this graph is closed"):
        graph.launch()
    done.release()  # giving back is always fine
    pending.release()
    assert asyncgpu.device(0, backend=backend) is not dev


def test_an_array_of_a_closed_worker_raises_as_its_other_objects(backend):
    dev = asyncgpu.device(0, backend=backend)
    a = dev.alloc(4)
    dev.stream.memset(a, 0)
    dev.synchronize()
    assert np.all(a.to_numpy() == 0)
    asyncgpu.close_all()
    fix = rf"this array belongs to {dev.name}'s worker, which is closed \(device.close\(\) was called\): open"
    for use in (a.to_numpy, lambda: np.asarray(a), lambda: a.ptr):
        with pytest.raises(ClosedError, match=fix):
            use()


# -- NVRTC ------------------------------------------------------------------------------------------------------------
def test_a_missing_nvrtc_is_reported_with_the_extra_that_brings_it(monkeypatch):
    from cuda.bindings import nvrtc

    def missing():
        raise RuntimeError('Failure finding "libnvrtc.so.13"\n  listdir(...)')

    monkeypatch.setattr(nvrtc, "nvrtcVersion", missing)
    monkeypatch.setattr(_cuda, "_nvrtc_probe", None)
    ok, why = _cuda.nvrtc_available()
    assert not ok
    assert why == (
        'NVRTC is missing (Failure finding "libnvrtc.so.13"): install asyncgpu[cu13] (CUDA 13 driver) or '
        "asyncgpu[cu12] (CUDA 12 driver), which bring it"
    )
