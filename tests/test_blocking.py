"""Blocking calls made from an event loop's thread say so (`BlockingCallWarning`, naming the async form), and
`await device.aclose()` closes a worker without stalling the loop."""

from __future__ import annotations

import threading
import time
import warnings

import anyio
import anyio.to_thread
import pytest

import asyncgpu
from asyncgpu import gpu_timer, kernel
from asyncgpu.errors import BlockingCallWarning

from .conftest import collector_off

pytestmark = pytest.mark.anyio


def _pending(dev, ms: float = 50):
    dev.stream.spin_us(ms * 1000)
    return dev.record()


async def test_blocking_calls_in_a_task_warn_and_name_the_async_form(dev):
    cases = [
        (lambda: _pending(dev).wait_sync(), r"event.wait_sync\(\) blocks .* In a task, `await event.wait\(\)`"),
        (dev.synchronize, r"synchronize\(\) blocks .*anyio.to_thread.run_sync\(device.synchronize\)"),
        (dev.stream.sync, r"stream.sync\(\) blocks .*await ev.wait\(\)"),
        (
            lambda: asyncgpu.benchmark(lambda s: s.spin_us(10), n_repeat=1, n_warmup=0, devices=dev),
            r"benchmark\(\) blocks .*anyio.to_thread.run_sync",
        ),
    ]
    for call, match in cases:
        with pytest.warns(BlockingCallWarning, match=match) as caught:
            call()
        assert caught[0].filename == __file__  # the warning points at the caller's line
    with pytest.warns(BlockingCallWarning, match=r"`with gpu_timer\(...\)` .* `async with gpu_timer\(...\)`"):
        with gpu_timer(dev) as t:  # it still works
            dev.stream.spin_us(1_000)
    assert len(t.records) == 1 and t.records[0].duration_ms > 0.5
    with dev.record() as done:
        await done.wait()
        done.wait_sync()  # complete: nothing blocks, nothing to say (a warning fails this test)


async def test_collect_sync_and_kernel_history_warn_in_a_task():
    dev = asyncgpu.device("host:0")
    prof = kernel.KernelProfiler(dev)
    prof.inc_loop(dev.alloc(1024), 10)
    with pytest.warns(BlockingCallWarning, match=r"await prof.collect\(\)"):
        assert len(prof.collect_sync()) == 3
    prof.close()
    with asyncgpu.kernel_history.recording():
        dev.stream.spin_us(50_000)  # still running when kernel_history() is called: it would block
    with pytest.warns(BlockingCallWarning, match=r"kernel_history\(wait=False\)"):
        assert len(asyncgpu.kernel_history()) == 1


def test_the_same_calls_in_a_plain_thread_say_nothing(dev):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _pending(dev).wait_sync()
        dev.synchronize()
        dev.stream.sync()
        with gpu_timer(dev):
            dev.stream.spin_us(100)
        _pending(dev, 20)
        dev.close()  # work queued, but a plain thread may block


async def test_blocking_calls_in_a_worker_thread_of_the_loop_say_nothing(dev):
    def blocking():
        _pending(dev).wait_sync()
        dev.synchronize()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await anyio.to_thread.run_sync(blocking)


async def test_close_warns_only_with_work_queued(backend):
    dev = asyncgpu.device(0, backend=backend)
    with dev.record() as ev:
        await ev.wait()
    dev.close()  # nothing queued: nothing to say
    dev = asyncgpu.device(0, backend=backend)
    dev.stream.spin_us(100_000)
    with pytest.warns(BlockingCallWarning, match=r"close\(\) with work queued .* `await device.aclose\(\)`"):
        dev.close()
    assert dev.closed


async def test_aclose_waits_for_the_work_without_stalling_the_loop(backend):
    dev = asyncgpu.device(0, backend=backend)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.002)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        dev.stream.spin_us(150_000)
        dev.streams[1].spin_us(100_000)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await dev.aclose()  # nothing blocks: no warning
        waited = time.perf_counter() - t0
        tg.cancel_scope.cancel()
    assert dev.closed and waited > 0.14
    assert ticks >= 20  # the loop ran its other tasks meanwhile
    await dev.aclose()  # idempotent, and still a checkpoint
    with anyio.CancelScope() as scope:
        scope.cancel()
        await dev.aclose()
    assert scope.cancelled_caught


async def test_a_cancelled_aclose_leaves_the_worker_open_and_nothing_behind(backend):
    dev = asyncgpu.device(0, backend=backend)
    dev.stream.spin_us(300_000)
    with anyio.move_on_after(0.02):
        await dev.aclose()
    assert not dev.closed  # open, and usable
    with dev.record() as after:
        await after.wait()
    deadline = time.monotonic() + 3  # the fences it took went back (once the device passed them)
    while dev.pool_stats(False).in_use and time.monotonic() < deadline:
        await anyio.sleep(0.005)
    assert dev.pool_stats(False).in_use == 0 and dev._internal.engine.pending == 0
    await dev.aclose()
    assert dev.closed


async def test_a_jupyter_kernel_runs_cells_in_its_loop_and_is_not_warned(dev, monkeypatch):
    """ipykernel runs each cell's plain code inside its event loop: blocking there is how a cell works."""
    import sys
    import types

    kernel_shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: kernel_shell))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dev.synchronize()
        _pending(dev).wait_sync()
    monkeypatch.setattr(kernel_shell, "kernel", None)  # a terminal IPython: no kernel
    with pytest.warns(BlockingCallWarning):
        dev.synchronize()


async def test_an_events_scopes_entry_sets_up_its_launches_on_the_workers_not_the_loop(two_devs, monkeypatch):
    """What a device's first timed launch would set up (on CUDA: the holds' page and the engine primers, whose
    kernel is compiled once per process) is set up at an ``async with gpu_timer`` entry, on each device's worker
    thread, all devices at once, while the loop keeps ticking; a scope entered later finds nothing to do. Here a
    stand-in setup that blocks its thread ``setup_s`` makes any device need it."""
    from asyncgpu._runtime.internal import DeviceInternal

    setup_s = 0.05
    done: dict[int, str] = {}  # id of a device's internals: the thread that set it up

    def unprepared(self):
        return () if id(self) in done else ("hold",)

    def prepare(self):
        time.sleep(setup_s)
        done[id(self)] = threading.current_thread().name

    monkeypatch.setattr(DeviceInternal, "timing_unprepared", unprepared)
    monkeypatch.setattr(DeviceInternal, "prepare_timing", prepare)
    ticks: list[float] = []

    async def ticker():
        while True:
            ticks.append(time.perf_counter())
            await anyio.sleep(setup_s / 10)

    with collector_off():  # (a full collection late in the suite held the loop 0.2-0.26 s: not the library's stall)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.sleep(setup_s / 5)
            t0 = time.perf_counter()
            async with gpu_timer(two_devs):
                entry_s = time.perf_counter() - t0
                two_devs[0].stream.spin_us(10)
            tg.cancel_scope.cancel()
    assert sorted(done.values()) == sorted(f"asyncgpu-{d.name}-worker" for d in two_devs)
    assert entry_s < 1.8 * setup_s, f"the devices were set up one after the other: {entry_s * 1e3:.0f} ms"
    during = [b - a for a, b in zip(ticks, ticks[1:]) if b > t0 and a < t0 + entry_s]
    assert during and max(during) < 0.8 * setup_s, "the loop stalled while the devices were set up"
    t1 = time.perf_counter()
    async with gpu_timer(two_devs):  # nothing left to set up
        assert time.perf_counter() - t1 < 0.5 * setup_s


def test_turning_the_history_on_sets_up_open_devices_on_their_workers(two_devs, monkeypatch):
    """The kernel history times launches on every device. Turning it on returns at once and queues what each open
    device's held launches need on that device's worker thread, so that no first recorded launch sets it up on
    its own thread (a loop's); a CUPTI-only block needs no hold and queues nothing."""
    from asyncgpu import kernel_history
    from asyncgpu._runtime.internal import DeviceInternal

    setup_s = 0.05
    done: dict[int, str] = {}
    finished = threading.Semaphore(0)

    def prepare(self):
        time.sleep(setup_s)
        done[id(self)] = threading.current_thread().name
        finished.release()

    monkeypatch.setattr(DeviceInternal, "timing_unprepared", lambda self: () if id(self) in done else ("hold",))
    monkeypatch.setattr(DeviceInternal, "prepare_timing", prepare)
    t0 = time.perf_counter()
    kernel_history.enabled = True
    try:
        on_s = time.perf_counter() - t0
        assert all(finished.acquire(timeout=10) for _ in two_devs), "a device's worker never set it up"
        assert on_s < 0.5 * setup_s, f"turning the history on waited {on_s * 1e3:.0f} ms for the set-up"
        assert sorted(done.values()) == sorted(f"asyncgpu-{d.name}-worker" for d in two_devs)
    finally:
        kernel_history.enabled = False
        kernel_history.clear()
    done.clear()
    with kernel_history.recording(source="auto") as rec:
        pass
    if rec.source == "cupti":
        assert not finished.acquire(timeout=4 * setup_s) and not done


def test_a_device_opened_while_the_history_times_sets_up_on_its_worker(monkeypatch):
    """A device opened while the kernel history holds launches queues its set-up on its own worker thread at once
    (opening does not wait for it); opened with the history off, it queues nothing."""
    from asyncgpu import kernel_history
    from asyncgpu._runtime.internal import DeviceInternal

    done: dict[int, str] = {}
    finished = threading.Semaphore(0)

    def prepare(self):
        done[id(self)] = threading.current_thread().name
        finished.release()

    monkeypatch.setattr(DeviceInternal, "timing_unprepared", lambda self: () if id(self) in done else ("hold",))
    monkeypatch.setattr(DeviceInternal, "prepare_timing", prepare)
    off = asyncgpu.device("host:0")
    kernel_history.enabled = True
    try:
        assert finished.acquire(timeout=10)  # (host:0, open when the history came on)
        on = asyncgpu.device("host:1")
        assert finished.acquire(timeout=10), "the device opened under the history never set up"
        assert sorted(done.values()) == sorted(f"asyncgpu-{d.name}-worker" for d in (off, on))
    finally:
        kernel_history.enabled = False
        kernel_history.clear()
    done.clear()
    asyncgpu.device("host:2")
    assert not finished.acquire(timeout=0.2) and not done


async def test_a_scope_holds_and_primes_only_the_launches_on_its_devices(two_devs, monkeypatch):
    """Holds and engine primers serve event brackets: a scope asks for them on its own devices, and a launch on a
    device no events scope covers pays neither. The kernel history, which times every device, holds all."""
    from asyncgpu import kernel_history

    a, b = two_devs
    cls = type(a._internal.bd)
    held: list[str] = []
    primed: list[str] = []
    names = {id(d._internal.bd): d.name for d in two_devs}
    hold, prime = cls.hold, cls.prime

    def holding(self, raw, watched=False):
        held.append(names[id(self)])
        return hold(self, raw, watched)

    def priming(self, raw, engine):
        primed.append(names[id(self)])
        return prime(self, raw, engine)

    monkeypatch.setattr(cls, "hold", holding)
    monkeypatch.setattr(cls, "prime", priming)

    def launch_both():
        held.clear()
        primed.clear()
        for d in two_devs:
            for s in d.streams:
                s._internal.last_kind = "memcpy"  # the next kernel switches engines: a bracket would be primed
                s.spin_us(20)
        return sorted(set(held)), sorted(set(primed))

    async with gpu_timer(a) as t:
        assert launch_both() == ([a.name], [a.name])
        async with gpu_timer(b):
            assert launch_both() == ([a.name, b.name], [a.name, b.name])
        assert launch_both() == ([a.name], [a.name])
    assert {r.device for r in t.records} == {a.name}
    assert launch_both() == ([], [])
    with kernel_history.recording():
        assert launch_both() == ([a.name, b.name], [a.name, b.name])
    kernel_history.clear()
    await a.asynchronize()
    await b.asynchronize()


def test_a_blocking_scopes_entry_sets_up_its_launches_in_its_own_thread(two_devs, monkeypatch):
    """``with gpu_timer`` (a plain thread) sets up what its first timed launches need in that thread, at entry."""
    from asyncgpu._runtime.internal import DeviceInternal

    done: dict[int, str] = {}
    monkeypatch.setattr(DeviceInternal, "timing_unprepared", lambda self: () if id(self) in done else ("hold",))
    monkeypatch.setattr(
        DeviceInternal, "prepare_timing", lambda self: done.setdefault(id(self), threading.current_thread().name)
    )
    with gpu_timer(two_devs):
        assert sorted(done.values()) == [threading.current_thread().name] * 2
