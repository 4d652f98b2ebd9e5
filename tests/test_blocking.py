"""Blocking calls made from an event loop's thread say so (`BlockingCallWarning`, naming the async form), and
`await device.aclose()` closes a worker without stalling the loop."""

from __future__ import annotations

import time
import warnings

import anyio
import anyio.to_thread
import pytest

import asyncgpu
from asyncgpu import gpu_timer, kernel
from asyncgpu.errors import BlockingCallWarning

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
