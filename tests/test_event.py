"""Pooled events and awaitable completion, on every loop and backend."""

from __future__ import annotations

import gc
import inspect
import threading
import time

import anyio
import numpy as np
import pytest

import asyncgpu
from asyncgpu import BackendError, ClosedError, DeviceMismatchError, ReleasedError, TimingDisabledError
from asyncgpu._runtime import engine as engine_mod
from asyncgpu._runtime.stream import SEQ_BITS
from asyncgpu.errors import BlockingCallWarning, NotReadyError, NotRecordedError, PoolExhaustedError

from .conftest import collector_off

pytestmark = pytest.mark.anyio


async def test_wait_resumes_after_the_work(dev):
    dev.stream.spin_us(0)  # compile and load the kernel first: its first launch would otherwise sit in the pair
    start = dev.record()
    dev.stream.spin_us(20_000)
    end = dev.record()
    assert not end.query()
    t0 = time.perf_counter()
    await end.wait()
    waited_ms = (time.perf_counter() - t0) * 1e3
    assert end.query()
    assert 19.0 < end - start < 40.0
    assert waited_ms > 15.0
    start.release()
    end.release()


async def test_loop_keeps_running_while_waiting(dev):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        dev.stream.spin_us(50_000)
        with dev.record() as ev:
            await ev.wait()
        tg.cancel_scope.cancel()
    assert ticks >= 10


async def test_wait_on_a_done_event_is_a_checkpoint(dev):
    with dev.record() as ev:
        await ev.wait()
        with anyio.CancelScope() as scope:
            scope.cancel()
            await ev.wait()  # already complete, but a checkpoint: the cancellation is delivered
        assert scope.cancelled_caught


async def test_cancelled_wait_returns_promptly_and_leaks_nothing(dev):
    dev.stream.spin_us(300_000)
    ev = dev.record()
    with collector_off():  # (late in one full GPU suite, trio, cuda: the window read 158 ms)
        t0 = time.perf_counter()
        with anyio.move_on_after(0.02):
            await ev.wait()
        took_s = time.perf_counter() - t0
    assert took_s < 0.15
    assert dev._internal.engine.pending == 0
    assert not ev.query()
    ev.release()  # deferred: the device has not passed it yet
    assert dev.pool_stats().in_use == 1
    await anyio.to_thread.run_sync(dev.synchronize)
    with dev.record() as probe:  # the engine hands the released event back once the device passed it
        await probe.wait()
    for _ in range(200):
        if dev.pool_stats().in_use == 0:
            break
        await anyio.sleep(0.005)
    assert dev.pool_stats().in_use == 0


async def test_many_concurrent_waits_all_resume(dev):
    gc.collect()  # a collection in the window below may free device memory of earlier tests, which synchronizes
    for stream in dev.streams:  # keeps the waits below pending when the tasks register them
        stream.spin_us(100_000)
    events = []
    for i in range(200):
        stream = dev.streams[i % len(dev.streams)]
        stream.spin_us(50)
        events.append(stream.record())
    done = []

    async def waiter(ev):
        await ev.wait()
        done.append(ev)

    async with anyio.create_task_group() as tg:
        for ev in events:
            tg.start_soon(waiter, ev)
    assert len(done) == 200 and all(ev.query() for ev in events)
    assert dev._internal.engine.pending == 0
    waiter_threads = [t for t in threading.enumerate() if t.name == f"asyncgpu-{dev.name}-waiter"]
    assert len(waiter_threads) == 1
    for ev in events:
        ev.release()


async def test_several_tasks_wait_on_one_event(dev):
    dev.stream.spin_us(10_000)
    ev = dev.record()
    hits = []

    async def waiter():
        await ev.wait()
        hits.append(1)

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(waiter)
    assert len(hits) == 5
    ev.release()


async def test_wait_from_another_thread_and_loop(dev, anyio_backend):
    dev.stream.spin_us(30_000)
    ev = dev.record()
    other = "trio" if anyio_backend[0] == "asyncio" else "asyncio"
    seen = {}

    def in_thread():
        async def main():
            await ev.wait()
            seen["done"] = ev.query()

        anyio.run(main, backend=other)

    t = threading.Thread(target=in_thread)
    t.start()
    await ev.wait()
    await anyio.to_thread.run_sync(t.join)
    assert seen == {"done": True}
    ev.release()


async def test_repeated_waits_learn_and_stay_correct(dev):
    """Early wakes (after the engine learned the duration) must never resume a task before completion."""
    for _ in range(30):
        dev.stream.spin_us(2_000)
        with dev.record() as ev:
            await ev.wait()
            assert ev.query()
    assert dev._internal.engine.estimate_ns(dev.stream.handle, "spin") is not None


def test_sync_blocks_until_done(dev):
    dev.stream.spin_us(20_000)
    with dev.record() as ev:
        t0 = time.perf_counter()
        ev.wait_sync()
        assert ev.query()
        assert time.perf_counter() - t0 > 0.01


def test_event_errors_name_the_fix(dev, two_devs):
    fresh = dev.create_event()
    with pytest.raises(NotRecordedError, match="record"):
        fresh.query()
    with pytest.raises(NotRecordedError):
        fresh.wait_sync()
    plain = dev.record(timing=False)
    timed = dev.record()
    plain.wait_sync()
    with pytest.raises(TimingDisabledError, match="timing=True"):
        plain.elapsed_ms(timed)
    a, b = (d.record() for d in two_devs)
    a.wait_sync()
    b.wait_sync()
    with pytest.raises(DeviceMismatchError, match="own clock"):
        b - a
    with pytest.raises(TypeError):
        timed.elapsed_ms(3.0)
    timed.release()
    with pytest.raises(ReleasedError, match="device.record"):
        timed.query()
    for ev in (fresh, plain, a, b):
        ev.release()


async def test_unrecorded_wait_raises(dev):
    ev = dev.create_event()
    with pytest.raises(NotRecordedError):
        await ev.wait()
    ev.record()
    await ev.wait()
    ev.release()


async def test_wait_checks_at_the_call_and_returns_the_waiting_coroutine(dev):
    # `wait()` is a plain method that returns the coroutine (one frame less at every wake): what it refuses, it
    # refuses at the call, and nothing is left un-awaited; what it returns is awaited, gathered or made a task.
    ev = dev.create_event()
    with pytest.raises(NotRecordedError):
        ev.wait()
    ev.record()
    coro = ev.wait()
    assert inspect.iscoroutine(coro)
    await coro
    dev.stream.spin_us(2_000)
    ev.record()
    assert not ev.query()
    out = []

    async def one():
        out.append(await ev.wait())

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(ev.wait)  # (anyio's and trio's start_soon take the method itself)
    assert out == [None] and ev.query()
    ev.release()
    with pytest.raises(ReleasedError):
        ev.wait()


def test_elapsed_before_completion_raises_not_ready(dev):
    """One pair, and a batch from one start (the harvests' `elapsed_since_ms`): NotReadyError while any end is
    pending, then the pair's figure for each end."""
    bd = dev._internal.bd
    start = dev.record()
    dev.stream.spin_us(100_000)
    end = dev.record()
    with pytest.raises(NotReadyError, match="wait"):
        end - start
    with pytest.raises(NotReadyError, match="wait"):
        bd.elapsed_since_ms(start._raw, [start._raw, end._raw])
    end.wait_sync()
    assert end - start > 90
    batch = bd.elapsed_since_ms(start._raw, [end._raw, start._raw])
    assert batch.dtype == np.float64 and batch.tolist() == [bd.elapsed_ms(start._raw, end._raw), 0.0]
    start.release()
    end.release()


@pytest.mark.gpu
def test_elapsed_through_libcuda_agrees_with_cuda_bindings():
    """The harvests place events through libcuda's entry point (a call that keeps the GIL), one at a time and in a
    batch from one start: the same figures as cuda.bindings' call, and NotReadyError while any is pending."""
    from asyncgpu._backends.cuda.hotpath import CudaDeviceBase

    dev = asyncgpu.device(0, backend="cuda")
    bd = dev._internal.bd
    if bd._drv.elapsed_c is None:
        pytest.skip("libcuda exports no cuEventElapsedTime (ASYNCGPU_HOTPATH=bindings?)")
    assert "elapsed_ms" in vars(bd)  # (the instance's own: libcuda's entry point)
    start = dev.record()
    dev.stream.spin_us(50_000)
    end = dev.record()
    with pytest.raises(NotReadyError, match="wait"):
        bd.elapsed_ms(start._raw, end._raw)
    with pytest.raises(NotReadyError, match="wait"):
        bd.elapsed_since_ms(start._raw, [start._raw, end._raw])
    end.wait_sync()
    ours, theirs = bd.elapsed_ms(start._raw, end._raw), CudaDeviceBase.elapsed_ms(bd, start._raw, end._raw)
    assert ours == theirs and ours > 45
    batch = bd.elapsed_since_ms(start._raw, [end._raw, start._raw, end._raw])
    assert batch.dtype == np.float64 and batch.tolist() == [theirs, 0.0, theirs]
    start.release()
    end.release()


def _settled(dev):
    """The pool's counters once a growth ahead (on the waiter thread) is over."""
    deadline = time.monotonic() + 10
    while (stats := dev.pool_stats()).growing and time.monotonic() < deadline:
        time.sleep(0.001)
    return stats


def test_pool_recycles_in_steady_state(dev):
    for _ in range(50):
        dev.record().release()
    created = _settled(dev).created
    for _ in range(2000):
        ev = dev.record()
        ev.wait_sync()
        ev.release()
    stats = dev.pool_stats()
    assert stats.created == created
    assert stats.in_use == 0
    assert stats.taken >= 2050


def test_reclaiming_queries_about_once_per_stream(dev, monkeypatch):
    """Released events come back to the pool with one query per stream (a stream passes its records in order),
    and log2(n) for a stream still running, also past older releases still pending on another stream."""
    s0, s1 = dev.streams[0], dev.streams[1]
    s0.spin_us(0)
    for ev in [dev.create_event() for _ in range(600)]:  # grow the pool
        ev.release()
    dev.synchronize()
    dev._internal.reclaim(everything=True)  # (what earlier tests of this worker released)
    queries = []
    real = dev._internal.bd.query
    monkeypatch.setattr(dev._internal.bd, "query", lambda raw: queries.append(raw) or real(raw))
    s0.spin_us(300_000)  # stream 0 stays busy: its records stay pending
    for _ in range(200):
        dev.record(s0).release()
        dev.record(s1).release()
    last = dev.record(s1)
    last.wait_sync(timeout_s=5)
    waits, s1_id = len(queries), last._seq >> SEQ_BITS
    last.release()
    dev._internal.reclaim()
    left = [seq >> SEQ_BITS for _, _, seq in dev._internal.returns]
    assert s1_id not in left  # all of stream 1's are back
    assert 0 < len(left) <= 200  # stream 0's, still pending
    # One query per event would be 401 (and were, before); takes that ran out on the way reclaimed too.
    assert len(queries) - waits <= 60, len(queries) - waits
    dev.synchronize()
    queries.clear()
    assert dev.pool_stats().in_use == 0
    assert len(queries) <= 3, len(queries)


def test_pool_bound_raises_and_names_the_fix(backend):
    dev = asyncgpu.device(0, backend=backend, max_events=20)
    held = [dev.record() for _ in range(20)]
    with pytest.raises(PoolExhaustedError, match="max_events"):
        dev.record()
    for _ in range(20):  # released events are usable again as soon as the device has passed them
        for ev in held:
            ev.release()
        dev.synchronize()
        held = [dev.record() for _ in range(20)]
    for ev in held:
        ev.release()


def _released_behind_work(dev, n: int, work_us: int = 100_000) -> None:
    """Fill ``dev``'s pool of timing events with ``n`` records behind ``work_us`` of work, and release them all:
    the device has passed none of them yet."""
    dev.stream.spin_us(work_us)
    for ev in [dev.record() for _ in range(n)]:
        ev.release()


def test_a_full_pool_of_released_events_waits_for_the_device_in_a_plain_thread(backend):
    dev = asyncgpu.device(0, backend=backend, max_events=16)
    _released_behind_work(dev, 16)
    ev = dev.record()  # released events come back once the device has passed them: a plain thread waits for that
    ev.wait_sync(timeout_s=5)
    ev.release()
    assert dev.pool_stats().created <= 16


async def test_a_full_pool_of_released_events_says_so_in_a_task(backend):
    dev = asyncgpu.device(0, backend=backend, max_events=16)
    _released_behind_work(dev, 16)
    with pytest.raises(PoolExhaustedError) as info:  # an event loop's thread does not wait for the device
        dev.record()
    message = str(info.value)
    assert "16 of them are released but still ahead of the device" in message
    assert "Release events you no longer need" not in message and "`await device.asynchronize()`" in message
    await dev.asynchronize()  # the fix it names
    dev.record().release()


def test_pool_stats_after_close_count_every_returned_event_as_gone(backend):
    dev = asyncgpu.device(0, backend=backend)
    held = dev.record()
    dev.record().release()
    dev.synchronize()
    dev.close()
    assert dev.pool_stats(True).in_use == 1 and dev.pool_stats(False).in_use == 0  # ``held`` is still out
    held.release()
    for timing in (True, False):
        stats = dev.pool_stats(timing)
        assert (stats.created, stats.free, stats.in_use) == (0, 0, 0), stats
    dev = asyncgpu.device(0, backend=backend)
    dev.record().release()
    asyncgpu.close_all()
    assert dev.pool_stats().in_use == 0 and dev.pool_stats().created == 0


def test_garbage_collected_events_return_to_the_pool(dev):
    for _ in range(100):
        dev.record()  # dropped at once
    gc.collect()
    dev.synchronize()
    dev.record().release()  # drains what the collector handed back
    deadline = time.monotonic() + 2
    while dev.pool_stats().in_use and time.monotonic() < deadline:  # deferred releases land on the waiter thread
        time.sleep(0.001)
    assert dev.pool_stats().in_use == 0


async def test_closing_the_worker_fails_waiters_and_refuses_work(backend):
    dev = asyncgpu.device(0, backend=backend)
    dev.stream.spin_us(200_000)
    ev = dev.record()
    errors = []

    async def waiter():
        try:
            await ev.wait()
        except ClosedError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.02)
        with pytest.warns(BlockingCallWarning, match=r"close\(\) with work queued.*await device.aclose\(\)"):
            dev.close()  # (on purpose: a close that does not wait for the work first)
    assert len(errors) == 1 and "closed" in str(errors[0])
    with pytest.raises(ClosedError, match="asyncgpu.device"):
        dev.record()
    with pytest.raises(ClosedError):
        dev.alloc(10)
    ev.release()
    assert asyncgpu.device(0, backend=backend) is not dev  # a fresh worker


async def test_failed_host_work_reaches_every_waiter():
    dev = asyncgpu.device("host:0")

    def boom():
        raise ValueError("kernel failed")

    dev.stream.spin_us(20_000)
    dev.stream.launch(boom, None, name="boom")
    events = [dev.record() for _ in range(3)]
    errors = []

    async def waiter(ev):
        try:
            await ev.wait()
        except BackendError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for ev in events:
            tg.start_soon(waiter, ev)
    assert len(errors) == 3
    assert all("kernel failed" in str(e) for e in errors)


async def test_stream_waits_on_another_devices_event(two_devs):
    a, b = two_devs
    a.stream.spin_us(30_000)
    ready = a.record()
    b.stream.wait(ready)  # no host wait
    after = b.record()
    assert not after.query()
    await after.wait()
    assert ready.query()
    ready.release()
    after.release()


def test_stream_wait_rejects_other_backends_and_non_events():
    h = asyncgpu.device("host:0")
    with pytest.raises(TypeError, match="asyncgpu Event"):
        h.stream.wait(object())


async def test_engine_keeps_its_own_schedule_without_progress_kicks():
    """The waiter thread must not rely on host-stream kicks: on CUDA nobody kicks it. Repeated waits on a
    learned duration go through early wakes, finish, and the next wait must wake the sleeping thread."""
    dev = asyncgpu.device("host:0")
    dev._internal.bd.on_progress = None
    for _ in range(40):
        dev.stream.spin_us(2_000)
        with dev.record() as ev:
            t0 = time.perf_counter()
            await ev.wait()
            assert time.perf_counter() - t0 < 0.1  # the safety-net sleep is 0.5 s
    assert dev._internal.engine.estimate_ns(dev.stream.handle, "spin") is not None
    assert dev._internal.engine.pending == 0
    await anyio.sleep(0.01)  # longer than a poller lingers: none stays armed for the device
    assert all(dev._internal.engine not in p.engines for p in engine_mod._POLLERS.values())


def test_a_record_consumes_the_streams_work_tag(dev):
    """Back-to-back records must not teach the engine that the work before them takes no time."""
    dev.stream.spin_us(100)
    a, b = dev.record(), dev.record()
    assert (a._tag, b._tag) == ("spin", None)
    a.release()
    b.release()
