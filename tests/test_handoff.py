"""Thread-to-thread GPU work handoff (`asyncgpu.Channel`): real threads, asyncio/uvloop/trio, host and CUDA."""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import time

import anyio
import numpy as np
import pytest

import asyncgpu
from asyncgpu import Channel, ClosedError, DeviceMismatchError, ReleasedError
from asyncgpu.errors import NotRecordedError

pytestmark = pytest.mark.anyio


def _in_thread(fn, *args):
    """Run ``fn`` in a thread; returns a join function that re-raises what it raised."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()

    def join(timeout=30):
        t.join(timeout)
        assert not t.is_alive(), "thread did not finish"
        if "error" in box:
            raise box["error"]
        return box.get("value")

    return join


def _in_use(dev):
    return dev.pool_stats().in_use


# -- plain threads ------------------------------------------------------------------------------------------
def test_thread_to_thread_in_order_after_the_work(two_devs):
    d0, d1 = two_devs
    ch = Channel(2, name="batches")
    n = 30
    a = d0.alloc(4096)
    d0.stream.memset(a, 0)

    def produce():
        with ch:
            for i in range(n):
                d0.stream.inc_loop(a, 3)
                ch.put_sync(i, stream=d0.stream)

    seen = []

    def consume():
        for h in ch:
            with h:
                assert h.event.query()  # the GPU had passed the producer's event before get() returned
                seen.append(h.payload)

    jp, jc = _in_thread(produce), _in_thread(consume)
    jp(), jc()
    assert seen == list(range(n))
    assert len(ch.records()) == n
    d0.synchronize()
    assert float(a.to_numpy()[0]) == 3 * n


def test_each_item_is_taken_exactly_once_by_many_consumers(backend):
    dev = asyncgpu.device(0, backend=backend)
    ch = Channel(4, name="work")
    n = 300

    def produce():
        with ch:
            for i in range(n):
                dev.stream.spin_us(5)
                ch.put_sync(i, stream=dev.stream)

    got = [[] for _ in range(4)]

    def consume(k):
        for h in ch:
            got[k].append(h.payload)
            h.done()

    joins = [_in_thread(consume, k) for k in range(4)] + [_in_thread(produce)]
    for j in joins:
        j()
    flat = sorted(x for g in got for x in g)
    assert flat == list(range(n))
    assert _in_use(dev) == 0  # every producer event went back to the pool


def test_backpressure_blocks_a_full_channel_and_times_out(dev):
    ch = Channel(2)
    before = _in_use(dev)
    ch.put_sync("a", stream=dev.stream)
    ch.put_sync("b", stream=dev.stream)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="full"):
        ch.put_sync("c", stream=dev.stream, timeout_s=0.05)
    assert time.perf_counter() - t0 >= 0.045
    assert ch.qsize() == 2
    dev.synchronize()
    assert _in_use(dev) - before == 2  # the failed put gave its event back
    # a get makes room for a blocked producer
    join = _in_thread(lambda: ch.put_sync("c", stream=dev.stream, timeout_s=5))
    time.sleep(0.02)
    assert [ch.get_sync().payload for _ in range(3)] == ["a", "b", "c"]
    join()
    ch.drop()


def test_get_waits_for_the_gpu_and_a_timeout_puts_the_item_back(dev):
    ch = Channel(1)
    dev.stream.spin_us(300_000)
    ch.put_sync("slow", stream=dev.stream)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="back in the channel"):
        ch.get_sync(timeout_s=0.05)
    assert 0.045 <= time.perf_counter() - t0 < 0.25
    assert ch.qsize() == 1
    with ch.get_sync(timeout_s=5) as h:
        assert h.payload == "slow"
        assert h.event.query()


def test_get_on_an_empty_channel_times_out_and_loses_nothing(dev):
    ch = Channel(1)
    with pytest.raises(TimeoutError, match="nothing came"):
        ch.get_sync(timeout_s=0.02)
    ch.put_sync(1, stream=dev.stream)
    assert ch.get_sync(timeout_s=5).payload == 1


def test_close_semantics(dev):
    ch = Channel(2, name="c")
    ch.put_sync(1, stream=dev.stream)
    ch.close()
    with pytest.raises(ClosedError, match="closed"):
        ch.put_sync(2, stream=dev.stream)
    assert ch.get_sync().payload == 1  # items already in stay available
    with pytest.raises(ClosedError, match="closed and empty"):
        ch.get_sync()
    assert list(ch) == []


def test_close_wakes_blocked_getters_and_putters(dev):
    ch = Channel(1)
    getter = _in_thread(lambda: ch.get_sync(timeout_s=5))
    time.sleep(0.02)
    ch.close()
    with pytest.raises(ClosedError):
        getter()
    ch2 = Channel(1)
    ch2.put_sync(0, stream=dev.stream)
    before = _in_use(dev)
    putter = _in_thread(lambda: ch2.put_sync(1, stream=dev.stream, timeout_s=5))
    time.sleep(0.02)
    ch2.close()
    with pytest.raises(ClosedError):
        putter()
    dev.synchronize()
    assert _in_use(dev) == before  # the refused put's event went back
    assert ch2.drop() == [0]


def test_a_producer_that_dies_closes_with_its_error(dev):
    ch = Channel(4, name="p")

    def produce():
        with ch:
            ch.put_sync(1, stream=dev.stream)
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        _in_thread(produce)()
    assert ch.get_sync().payload == 1  # what it put before dying still arrives
    with pytest.raises(ClosedError, match="producer that failed") as info:
        ch.get_sync()
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(ClosedError):
        list(ch)  # iteration does not hide the failure


def test_lifetime_the_event_is_held_until_done(dev):
    ch = Channel(2)
    before = _in_use(dev)
    ph = ch.put_sync("x", stream=dev.stream)
    with pytest.raises(ReleasedError, match="not been taken"):
        ph.done()
    h = ch.get_sync()
    assert h is ph
    dev.synchronize()
    assert _in_use(dev) == before + 1  # the consumer still holds it
    h.done()
    assert _in_use(dev) == before
    with pytest.raises(ReleasedError, match="done"):
        h.event  # noqa: B018
    with pytest.raises(ReleasedError, match="already marked done"):
        h.done()


def test_wait_done_protects_the_producers_buffer(two_devs):
    d0, d1 = two_devs
    ch = Channel(1)
    src = d0.alloc(1 << 16)
    dst = d1.alloc(1 << 16)
    d0.stream.memset(src, 1)
    h = ch.put_sync(src, stream=d0.stream)

    def consume():
        g = ch.get_sync(stream=d1.stream)
        d1.stream.spin_us(30_000)  # the consumer's use takes a while...
        d1.stream.copy(dst, g.payload)
        g.done(stream=d1.stream)

    _in_thread(consume)()
    h.wait_done_sync(stream=d0.stream)  # ...so the producer's stream waits for it before overwriting
    d0.stream.memset(src, 2)
    d0.synchronize()
    d1.synchronize()
    assert set(np.unique(dst.to_numpy().view(np.uint8)).tolist()) == {1}
    with pytest.raises(TimeoutError, match="not done"):
        ch.put_sync(src, stream=d0.stream).wait_done_sync(timeout_s=0.02)
    ch.drop()


def test_gpu_side_take_orders_the_consumer_stream(two_devs):
    d0, d1 = two_devs
    ch = Channel(2, name="gpu")
    n = 1 << 14
    a = d0.alloc(n)
    b = d1.alloc(n)
    d0.stream.memset(a, 0)
    d1.stream.memset(b, 0)
    d0.synchronize()
    d0.stream.spin_us(200_000)  # the producer's work is still running when the consumer enqueues
    d0.stream.inc_loop(a, 7)
    ch.put_sync(a, stream=d0.stream)
    t0 = time.perf_counter()
    h = ch.get_sync(stream=d1.stream)
    assert time.perf_counter() - t0 < 0.1  # returns at once: no host wait for the 200 ms of GPU work
    d1.stream.copy(b, h.payload)
    h.done(stream=d1.stream)
    d1.synchronize()
    assert np.all(b.to_numpy() == 7.0)
    d0.synchronize()
    deadline = time.perf_counter() + 2
    while not ch.records() and time.perf_counter() < deadline:
        time.sleep(0.005)
    (rec,) = ch.records()
    assert rec.gpu_side and rec.consumer == d1.name and rec.consumer_stream == d1.stream.label
    assert rec.wait_start_ns <= rec.wait_end_ns
    assert rec.ready_ns > rec.put_ns  # the producer's work took 20 ms after the put
    assert -5_000 < rec.latency_ns < 5e6


def test_bad_input(dev):
    ch = Channel(2, name="bad")
    with pytest.raises(TypeError, match="stream= .* or event="):
        ch.put_sync(1)
    with pytest.raises(TypeError, match="not both"):
        ch.put_sync(1, stream=dev.stream, event=dev.record())
    ev = dev.create_event()
    with pytest.raises(NotRecordedError):
        ch.put_sync(1, event=ev)
    ev.release()
    with pytest.raises(TypeError, match="asyncgpu Stream"):
        ch.get_sync(stream="s0")
    with pytest.raises(ValueError, match="maxsize"):
        Channel(0)
    with pytest.raises(TypeError, match="Event"):
        ch.put_sync(1, event=object())
    assert ch.qsize() == 0


def test_drop_reports_what_nobody_took(dev):
    ch = Channel(4, name="left")
    before = _in_use(dev)
    for i in range(3):
        ch.put_sync(i, stream=dev.stream)
    assert ch.drop() == [0, 1, 2]
    dev.synchronize()
    deadline = time.perf_counter() + 5  # the waiter thread hands the passed events back to the pool
    while _in_use(dev) != before and time.perf_counter() < deadline:
        time.sleep(0.001)
    assert _in_use(dev) == before
    assert ch.closed

    ch2 = Channel(4, name="forgotten")
    ch2.put_sync(0, stream=dev.stream)
    with pytest.warns(ResourceWarning, match="1 item"):
        del ch2
        gc.collect()


def test_handoffs_appear_on_the_timeline_with_flow_arrows(two_devs, tmp_path):
    d0, d1 = two_devs
    ch = Channel(2, name="flow")
    with asyncgpu.gpu_timer([d0, d1], all_threads=True) as t:

        def produce():
            with ch:
                for i in range(4):
                    d0.stream.spin_us(500)
                    ch.put_sync(i, stream=d0.stream)

        def consume():
            for h in ch:
                h.done()

        jp, jc = _in_thread(produce), _in_thread(consume)
        jp(), jc()
        ch2 = Channel(2, name="gpuflow")
        d0.stream.spin_us(500)
        ch2.put_sync(0, stream=d0.stream)
        ch2.get_sync(stream=d1.stream).done(stream=d1.stream)
    (layer1, layer2) = t.timeline.layers
    assert len(layer1.records()) == 4 and len(layer2.records()) == 1
    path = tmp_path / "h.json"
    asyncgpu.write_trace(t, path)
    import json

    events = json.loads(path.read_text())["traceEvents"]
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e["cat"] != "issue"}  # (not the issue arrows)
    ends = {e["id"]: e for e in events if e.get("ph") == "f" and e["cat"] != "issue"}
    assert set(starts) == set(ends) and len(starts) == 5
    slices = [e for e in events if e.get("ph") == "X" and e.get("cat", "").startswith("handoff")]
    assert len(slices) == 10
    d0_pid = 2 + t.timeline.devices.index(d0.name)
    d1_pid = 2 + t.timeline.devices.index(d1.name)
    assert {starts[k]["pid"] for k in starts} == {d0_pid}
    assert {ends[k]["pid"] for k in ends} == {1, d1_pid}  # host-side takes on the host, GPU-side on cuda:1
    for k, f in ends.items():
        assert f["ts"] >= starts[k]["ts"]


# -- event loops --------------------------------------------------------------------------------------------
async def test_await_get_from_a_loop_with_a_thread_producer(dev):
    ch = Channel(2, name="loop")

    def produce():
        with ch:
            for i in range(20):
                dev.stream.spin_us(200)
                ch.put_sync(i, stream=dev.stream)

    join = _in_thread(produce)
    got = []
    async for h in ch:
        with h:
            assert h.event.query()
            got.append(h.payload)
    join()
    assert got == list(range(20))


async def test_await_put_from_a_loop_to_a_thread_consumer(dev):
    ch = Channel(1, name="loop-put")
    got = []

    def consume():
        for h in ch:
            got.append(h.payload)
            h.done()

    join = _in_thread(consume)
    with ch:
        for i in range(10):
            dev.stream.spin_us(100)
            h = await ch.put(i, stream=dev.stream)
            assert h.seq == i
    join()
    assert got == list(range(10))


async def test_producer_on_another_loop_in_another_thread(dev):
    ch = Channel(1, name="cross-loop")

    async def produce():
        with ch:
            for i in range(10):
                dev.stream.spin_us(100)
                await ch.put(i, stream=dev.stream)
                await asyncio.sleep(0)

    join = _in_thread(asyncio.run, produce())
    got = [h.payload async for h in ch]
    join()
    assert got == list(range(10))


async def test_cancelled_consumer_loses_no_item(dev):
    ch = Channel(2, name="cancel")
    dev.stream.spin_us(200_000)
    await ch.put("slow", stream=dev.stream)
    with anyio.move_on_after(0.03) as scope:
        await ch.get()  # cancelled while waiting for the GPU
    assert scope.cancelled_caught
    assert ch.qsize() == 1
    h = await ch.get(timeout_s=5)
    assert h.payload == "slow"
    h.done()
    # cancelled while parked on an empty channel: the next item goes to the next getter
    with anyio.move_on_after(0.02) as scope:
        await ch.get()
    assert scope.cancelled_caught
    await ch.put("next", stream=dev.stream)
    assert (await ch.get(timeout_s=5)).payload == "next"


async def test_async_timeouts(dev):
    ch = Channel(1)
    with pytest.raises(TimeoutError):
        await ch.get(timeout_s=0.02)
    await ch.put(0, stream=dev.stream)
    with pytest.raises(TimeoutError):
        await ch.put(1, stream=dev.stream, timeout_s=0.02)
    h = await ch.get()
    with pytest.raises(TimeoutError):
        await h.wait_done(timeout_s=0.02)
    h.done()
    await h.wait_done(timeout_s=1)


async def test_async_gpu_side_take_and_wait_done(two_devs):
    d0, d1 = two_devs
    ch = Channel(1)
    a, b = d0.alloc(256), d1.alloc(256)
    d0.stream.memset(a, 0)
    d0.stream.inc_loop(a, 5)
    h = await ch.put(a, stream=d0.stream)
    g = await ch.get(stream=d1.stream)
    d1.stream.copy(b, g.payload)
    g.done(stream=d1.stream)
    await h.wait_done()  # host-side: the consumer's copy has run
    assert np.all(b.to_numpy() == 5.0)


# -- CUDA only ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_events_of_two_backends_are_refused():
    cuda = asyncgpu.device(0)
    host = asyncgpu.device(0, backend="host")
    ch = Channel(2, name="mixed")
    ch.put_sync(1, stream=host.stream)
    with pytest.raises(DeviceMismatchError, match="one channel per backend"):
        ch.put_sync(2, stream=cuda.stream)
    with pytest.raises(DeviceMismatchError, match="take it on the host"):
        ch.get_sync(stream=cuda.stream)
    assert ch.qsize() == 1  # nothing lost
    ch.get_sync().done()


@pytest.mark.gpu
def test_cuda_handoff_latency_is_measured():
    dev = asyncgpu.device(0)
    ch = Channel(1, name="lat")
    for i in range(20):
        dev.stream.spin_us(200)
        ch.put_sync(i, stream=dev.stream)
        ch.get_sync().done()
    lat = ch.latencies_ns()
    assert lat.shape == (20,) and np.all(np.isfinite(lat))
    assert np.median(lat) < 1e6  # GPU ready to consumer running: well under a millisecond
    assert all(math.isfinite(r.ready_ns) for r in ch.records())


async def test_a_task_that_puts_never_calibrates_a_clock_on_its_loops_thread(monkeypatch):
    """A stale clock is re-measured for the handoffs' times on the device's worker thread when a task puts or
    takes (a calibration holds a thread ~0.35 ms on a GPU), in a plain thread where it is called."""
    dev = asyncgpu.device("host:0")
    measured_on: list[str] = []
    real = dev._internal.calibration

    def calibration(*args, **kwargs):
        measured_on.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(dev._internal, "calibration", calibration)
    monkeypatch.setattr(dev._internal, "clock_stale", lambda *a, **k: True)
    ch = asyncgpu.Channel(4)
    await ch.put(1, stream=dev.stream)
    h = await ch.get()
    h.done()
    for _ in range(200):
        if measured_on:
            break
        await anyio.sleep(0.005)
    assert measured_on and set(measured_on) == {f"asyncgpu-{dev.name}-worker"}
    await anyio.to_thread.run_sync(lambda: ch.put_sync(2, stream=dev.stream))
    assert measured_on[-1] != "MainThread"
    with await ch.get():
        pass
