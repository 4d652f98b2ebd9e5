"""Per-device worker threads: `Device.run` (launch-heavy callables on the device's own thread) and the awaitable
forms of the blocking calls (`aalloc`, `aalloc_pinned`, `asynchronize`, `aclock`, `prepare`), over asyncio, uvloop
and trio; the warnings of their blocking forms; large pinned blocks freed on the worker thread."""

from __future__ import annotations

import contextvars
import functools
import gc
import os
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

import anyio
import numpy as np
import pytest

import asyncgpu
from asyncgpu import gpu_timer
from asyncgpu.errors import BlockingCallWarning, ClosedError, DeviceMismatchError

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.anyio

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_workers_var", default="unset")


def _workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith("-worker") and t.is_alive()]


def _blocker(dev):
    """A job that holds ``dev``'s worker until ``release`` is set; ``started`` is set once it runs."""
    started, release = threading.Event(), threading.Event()

    def job(stream):
        started.set()
        assert release.wait(10)
        return "blocker"

    return job, started, release


async def _until(event: threading.Event, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not event.is_set():
        assert time.monotonic() < deadline
        await anyio.sleep(0.001)


# -- run ------------------------------------------------------------------------------------------------------
async def test_run_calls_fn_on_the_devices_thread_with_its_stream_and_returns_its_result(dev):
    def step(stream, x, y=0):
        return threading.current_thread().name, stream, x + y

    name, stream, value = await dev.run(step, 40, 2)
    assert name == f"asyncgpu-{dev.name}-worker" and stream is dev.stream and value == 42
    assert await dev.run(functools.partial(step, y=5), 1) == (name, dev.stream, 6)  # keywords: functools.partial
    _, stream, _ = await dev.run(step, 0, stream=dev.streams[1])
    assert stream is dev.streams[1]
    assert dev._internal.worker.thread is not None and dev._internal.worker.thread.name == name


async def test_jobs_of_one_device_run_in_order_and_devices_run_in_parallel(two_devs):
    order: list[int] = []

    def job(stream, i):
        time.sleep(0.002)  # (releases the GIL, as driver calls and torch's dispatch do)
        order.append(i)
        return threading.current_thread().name

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(functools.partial(two_devs[0].run, job, i))
            await anyio.sleep(0)  # (submitted in this order)
    assert order == list(range(6))

    def nap(stream):
        time.sleep(0.1)
        return threading.current_thread().name

    t0 = time.perf_counter()
    names = {}
    async with anyio.create_task_group() as tg:
        for d in two_devs:

            async def one(d=d):
                names[d.name] = await d.run(nap)

            tg.start_soon(one)
    elapsed_s = time.perf_counter() - t0
    assert names == {d.name: f"asyncgpu-{d.name}-worker" for d in two_devs}
    assert elapsed_s < 0.19, elapsed_s  # two 0.1 s jobs at once, not one after the other


async def test_an_exception_propagates_with_its_traceback_through_the_worker_thread(dev):
    def failing_step(stream):
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch") as info:
        await dev.run(failing_step)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "failing_step" in frames and frames.index("failing_step") > frames.index(
        "test_an_exception_propagates_with_its_traceback_through_the_worker_thread"
    )
    assert await dev.run(lambda s: "still serving") == "still serving"  # the worker goes on


async def test_the_job_runs_in_a_copy_of_the_tasks_context_and_is_timed_by_its_scope(dev):
    _VAR.set("task's")

    def job(stream):
        seen = _VAR.get()
        _VAR.set("job's")  # (a copy: the task's value stays)
        stream.spin_us(200)
        return seen

    async with gpu_timer(dev) as t:
        assert await dev.run(job) == "task's"
    assert _VAR.get() == "task's"
    assert [r.name for r in t.records] == ["spin"] and t.records[0].duration_ms > 0.15


async def test_a_job_cancelled_before_it_starts_never_runs(dev):
    block, started, release = _blocker(dev)
    ran = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(dev.run, block)
        await _until(started)
        with anyio.move_on_after(0.05) as scope:
            await dev.run(lambda s: ran.append(1))
        assert scope.cancelled_caught
        release.set()
    assert await dev.run(lambda s: "next") == "next"
    assert ran == []


async def test_a_running_job_is_waited_for_then_the_cancellation_is_raised(dev):
    finished = []

    def slow(stream):
        time.sleep(0.15)
        finished.append(time.perf_counter())
        return "dropped"

    result = []
    cpu_s = time.thread_time()
    with anyio.move_on_after(0.03) as scope:
        result.append(await dev.run(slow))
    returned = time.perf_counter()
    assert scope.cancelled_caught and result == []
    assert finished and returned >= finished[0]  # the task waited for the job to return
    assert time.thread_time() - cpu_s < 0.06  # parked meanwhile: the loop did not spin through 0.12 s


def test_plain_asyncio_cancellations_wait_for_the_running_job_then_raise():
    import asyncio

    async def main():
        dev = asyncgpu.device("host:0")
        started, finished = threading.Event(), []

        def slow(stream):
            started.set()
            time.sleep(0.1)
            finished.append(time.perf_counter())

        task = asyncio.ensure_future(dev.run(slow))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.sleep(0.01)
        task.cancel()  # again, while it waits for the job
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished and time.perf_counter() >= finished[0]
        block, block_started, release = _blocker(dev)
        blocking = asyncio.ensure_future(dev.run(block))
        while not block_started.is_set():
            await asyncio.sleep(0.001)
        queued = asyncio.ensure_future(dev.run(lambda s: finished.append("never")))
        await asyncio.sleep(0.005)
        assert queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        assert await blocking == "blocker"
        await dev.run(lambda s: None)
        assert len(finished) == 1  # the withdrawn job never ran
        await dev.aclose()

    asyncio.run(main())


async def test_a_running_jobs_exception_becomes_the_cancellations_context(dev):
    def slow_failure(stream):
        time.sleep(0.1)
        raise KeyError("lost step")

    cancels: list[BaseException] = []
    with anyio.CancelScope() as scope:

        async def cancel_soon():
            await anyio.sleep(0.02)
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_soon)
            try:
                await dev.run(slow_failure)
            except BaseException as exc:
                cancels.append(exc)
                raise
    assert scope.cancelled_caught
    assert isinstance(cancels[0].__context__, KeyError)


async def test_abandon_on_cancel_returns_at_once_and_the_job_runs_on(dev):
    block, started, release = _blocker(dev)

    async def cancel_once_running() -> None:  # (not after a fixed time: a loaded host may start the job late)
        await _until(started)
        scope.cancel()

    t0 = time.perf_counter()
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_once_running)
            await dev.run(block, abandon_on_cancel=True)
    assert scope.cancelled_caught and started.is_set() and time.perf_counter() - t0 < 5
    release.set()
    assert await dev.run(lambda s: "after") == "after"  # (queued behind the abandoned job)


async def test_bad_input_names_the_fix_and_starts_no_thread(dev):
    async def async_step(stream):
        pass

    with pytest.raises(TypeError, match=r"pass a function \(a framework's step\), not 42"):
        await dev.run(42)
    with pytest.raises(TypeError, match="is async: await it in the task"):
        await dev.run(async_step)
    with pytest.raises(TypeError, match="abandon_on_cancel is True or False"):
        await dev.run(print, abandon_on_cancel="yes")
    with pytest.raises(ValueError, match="no built-in workload 'spn': prepare\\(\\) takes 'spin'"):
        await dev.prepare("spn")
    other = asyncgpu.device(1, backend=dev.backend) if dev.backend == "host" else None
    if other is not None:
        with pytest.raises(DeviceMismatchError):
            await dev.run(print, stream=other.stream)
    assert dev._internal.worker.thread is None and _workers() == []
    dev.close()
    with pytest.raises(ClosedError, match=r"is closed .*open the device again with asyncgpu.device"):
        await dev.run(print)
    with pytest.raises(ClosedError):
        await dev.aalloc_pinned(10)
    assert dev._internal.worker.thread is None and _workers() == []


async def test_close_fails_the_queued_jobs_and_lets_the_running_one_finish(dev):
    block, started, release = _blocker(dev)
    outcomes: dict[str, object] = {}

    async def submit(name, fn):
        try:
            outcomes[name] = await dev.run(fn)
        except ClosedError as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, "running", block)
        await _until(started)
        tg.start_soon(submit, "queued", lambda s: "ran")
        await anyio.sleep(0.01)
        closer = threading.Thread(target=dev.close)  # (close joins the worker: not on the loop's thread)
        closer.start()
        while not dev._internal.worker._closed:
            await anyio.sleep(0.001)
        release.set()
        await anyio.to_thread.run_sync(closer.join)
    assert outcomes["running"] == "blocker"
    assert isinstance(outcomes["queued"], ClosedError) and "open the device again" in str(outcomes["queued"])
    assert _workers() == []


async def test_aclose_waits_for_the_jobs(dev):
    done = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(dev.run, lambda s: time.sleep(0.05) or done.append(1))
        await anyio.sleep(0.005)
        await dev.aclose()
    assert done == [1] and dev.closed and _workers() == []


def test_run_needs_a_loop(dev):
    async def plain():
        await dev.run(print)

    coro = plain()
    with pytest.raises(RuntimeError, match="needs a running asyncio"):
        coro.send(None)
    assert dev._internal.worker.thread is None


# -- the awaitable forms of blocking calls -------------------------------------------------------------------
async def test_awaitable_forms_allocate_synchronize_calibrate_and_prepare(dev):
    a = await dev.aalloc(1000, np.float32)
    host = await dev.aalloc_pinned(1000, np.float64)
    assert a.size == 1000 and host.shape == (1000,) and host.dtype == np.float64
    dev.stream.memset(a, 0)
    dev.stream.inc_loop(a, 3)
    out = await dev.aalloc_pinned(1000)
    dev.stream.copy_to_host(a, out)
    await dev.asynchronize()
    assert np.all(out == 3)
    cal = await dev.aclock(refresh=True)
    assert cal is dev._internal.last_clock() and await dev.aclock() is cal  # young enough: returned as it is
    await dev.prepare()
    await dev.prepare("spin", "inc_loop")
    with pytest.raises(TypeError, match="n must be a whole number"):
        await dev.aalloc(1.5)
    with pytest.raises(ValueError, match="more than the .* bytes of host RAM"):
        await dev.aalloc_pinned(1 << 62)


async def test_asynchronize_waits_for_every_stream(dev):
    for s in dev.streams:
        s.spin_us(20_000)
    t0 = time.perf_counter()
    await dev.asynchronize()
    assert time.perf_counter() - t0 > 0.015
    assert all(dev._internal.bd.stream_idle(s._internal.raw) for s in dev.streams)


async def test_prepare_starts_the_worker_and_on_the_host_backend_loads_nothing():
    dev = asyncgpu.device("host:0")
    await dev.prepare("inc_loop_profiled", print)
    assert (
        dev._internal.worker.thread is not None and not dev._internal.worker.busy()
    )  # started, ready: no job was queued
    await dev.prepare()


async def test_prepare_grows_the_timing_pool_on_the_worker_before_a_burst():
    dev = asyncgpu.device("host:0", max_events=4096)
    made_by: set[str] = set()
    real = dev._internal.bd.create_event

    def create_event(timing: bool) -> object:
        made_by.add(threading.current_thread().name)
        return real(timing)

    dev._internal.bd.create_event = create_event
    try:
        await dev.prepare(events=1000)
    finally:
        del dev._internal.bd.create_event
    assert dev.pool_stats().free >= 1000
    assert made_by == {f"asyncgpu-{dev.name}-worker"}
    with pytest.raises(ValueError, match="events must be a whole number in 0 .. 4096"):
        await dev.prepare(events=5000)
    with pytest.raises(TypeError):
        await dev.prepare(events=1.5)


async def test_blocking_forms_in_a_task_warn_once_per_call_site_naming_the_async_form(monkeypatch):
    dev = asyncgpu.device("host:0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            dev.alloc_pinned(1 << 20)  # 4 MiB: made resident page by page
        dev.alloc_pinned(1024)  # small: fast, nothing to say
        dev.alloc(1 << 24)  # plain memory on the host backend: fast
        dev.synchronize()
    messages = [str(w.message) for w in caught if issubclass(w.category, BlockingCallWarning)]
    assert len(messages) == 2, messages
    assert "alloc_pinned() of 4,194,304 bytes blocks" in messages[0] and "await device.aalloc_pinned(n" in messages[0]
    assert "synchronize() blocks" in messages[1] and "await device.asynchronize()" in messages[1]
    assert all(w.filename == __file__ for w in caught)
    monkeypatch.setattr(dev._internal.bd, "slow_alloc_bytes", 1 << 20)  # a device whose pool would grow for this
    with pytest.warns(BlockingCallWarning, match=r"alloc\(\) of 4,194,304 bytes blocks .*await device.aalloc\("):
        dev.alloc(1 << 20)
    with pytest.warns(BlockingCallWarning, match=r"clock\(\) \(it re-measures\) blocks .*await device.aclock\(\)"):
        dev.clock(refresh=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dev.clock()  # young: nothing to measure, nothing to say
        inside = {"__name__": "asyncgpu._a_feature"}  # asyncgpu's own calls: not the user's line to change
        exec("def pin(dev, n):\n    return dev.alloc_pinned(n)", inside)
        inside["pin"](dev, 1 << 20)


def test_blocking_forms_in_a_plain_thread_say_nothing():
    dev = asyncgpu.device("host:0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dev.alloc_pinned(1 << 20)
        dev.synchronize()


async def test_a_large_pinned_block_is_freed_on_the_workers_thread():
    dev = asyncgpu.device("host:0")
    freed_on: list[str] = []

    class Witness:
        def __del__(self):
            freed_on.append(threading.current_thread().name)

    given = dev._internal.bd.free_elsewhere

    def give(holder):
        holder.append(Witness())  # dropped with the block, wherever that happens
        return given(holder)

    dev._internal.bd.free_elsewhere = give
    host = await dev.aalloc_pinned(1 << 20)
    view = host[10:20]
    del host
    gc.collect()
    assert freed_on == []  # a view keeps the block alive
    del view
    gc.collect()  # (the last view goes on the loop's thread)
    await dev.run(lambda s: None)  # after the free, which was queued before it
    assert freed_on == [f"asyncgpu-{dev.name}-worker"]
    small = await dev.aalloc_pinned(16)
    small_copy = small.copy()
    del small
    gc.collect()
    await dev.run(lambda s: None)
    assert freed_on == [f"asyncgpu-{dev.name}-worker"] and small_copy.size == 16  # a small one: where it goes
    late = await dev.aalloc_pinned(1 << 20)
    dev.close()
    del late
    gc.collect()
    assert freed_on[-1] == threading.current_thread().name  # closed: freed in place


_EXIT_CHILD = """
import atexit, os, sys, threading, time
import asyncgpu
from asyncgpu._runtime import worker

worker.EXIT_SETTLE_S = float(sys.argv[1])
free_s = float(sys.argv[2])
dev = asyncgpu.device("host:0")
given = dev._internal.bd.free_elsewhere
write = os.write


class Witness:  # dropped with the block it rides with; the first free takes free_s, GIL released, as unpinning does
    def __init__(self, sleep_s):
        self.sleep_s = sleep_s

    def __del__(self):
        time.sleep(self.sleep_s)
        write(1, f"freed on {threading.current_thread().name}\\n".encode())


sleeps = [free_s]


def give(holder):
    holder.append(Witness(sleeps.pop() if sleeps else 0.0))
    return given(holder)


dev._internal.bd.free_elsewhere = give
late = []
atexit.register(late.clear)  # (registered before the worker starts: runs after asyncgpu's hook)
late.append(dev.alloc_pinned(1 << 20))  # (large: starts the worker, to free it there)
host = dev.alloc_pinned(1 << 20)
del host  # the last view, dropped just before the exit: its free runs on the worker
print("exiting", flush=True)
"""


def _exit_child(settle_s: float, free_s: float) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _EXIT_CHILD, str(settle_s), str(free_s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out, time.monotonic() - t0


def test_a_pinned_block_dropped_just_before_exit_is_freed_before_the_interpreter_ends():
    """The worker's free of a block dropped just before the exit finishes during it; a block dropped later in the
    exit is freed by the thread that drops it. (Unsettled, the interpreter's teardown ended the worker thread in
    the middle of such a free; in cuda.core's C++ free of a pinned block that aborted the process.)"""
    out, _ = _exit_child(10.0, 0.3)
    assert out.returncode == 0, out.stderr
    worker_name = "asyncgpu-host:0-worker"
    assert out.stdout.splitlines() == ["exiting", f"freed on {worker_name}", "freed on MainThread"], out
    assert out.stderr == ""


def test_an_exit_waits_for_the_worker_only_so_long_and_says_so():
    out, took_s = _exit_child(0.2, 5.0)
    assert took_s < 4.0, (took_s, out)  # (not the free's 5 s: the wait ends after 0.2 s)
    assert "asyncgpu-host:0-worker still ran a job or a free 0.2 s into the interpreter's exit" in out.stderr, out
    assert "asyncgpu.close_all()" in out.stderr


def test_an_exit_finishes_the_running_call_and_the_frees_and_skips_what_has_not_begun():
    """At the exit the worker finishes what it runs and the frees queued behind it, and skips the library calls
    queued that have not begun: nobody waits for them any more."""
    script = """
import os, time
import asyncgpu

dev = asyncgpu.device("host:0")
worker = dev._internal.worker
write = os.write


def running():
    time.sleep(0.3)
    write(1, b"running call done\\n")


class Witness:
    def __del__(self):
        write(1, b"freed\\n")


worker.call_soon(running)
time.sleep(0.05)  # (it runs now)
worker.call_soon(lambda: write(1, b"queued call ran\\n"))
assert worker.give([Witness()])
print("exiting", flush=True)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["exiting", "running call done", "freed"], out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_that_exits_normally_never_waits_for_the_parents_worker():
    """A child forked while the parent's worker runs a job ends through its own exit hooks at once."""
    script = """
import os, threading, time
import anyio, asyncgpu

dev = asyncgpu.device("host:0")
anyio.run(dev.prepare)  # the worker thread runs in the parent
release = threading.Event()
dev._internal.worker.call_soon(lambda: release.wait(30))  # and is busy at the fork
pid = os.fork()
if pid:
    t0 = time.monotonic()
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), round(time.monotonic() - t0, 1), flush=True)
    release.set()
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    code, took_s = out.stdout.split()[1:]
    assert code == "0" and float(took_s) < 5.0, out  # (not the 10 s a settle would wait for the parent's job)


# -- the demo starts every device at once --------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_never_waits_for_the_parents_worker_thread():
    import asyncio
    import json
    import os

    dev = asyncgpu.device("host:0")
    anyio.run(dev.prepare)  # the worker thread runs in the parent
    host = dev.alloc_pinned(1 << 20)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave at once
        try:
            os.close(r)
            out = {}
            try:
                asyncio.run(dev.run(print))
            except ClosedError as exc:
                out["run"] = str(exc)
            del host  # the parent's large pinned block, dropped in the child: freed in place, no thread waited for
            out["dropped"] = "ok"
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    assert "opened by the parent process" in out["run"] and out["dropped"] == "ok"
    assert dev._internal.worker.thread is not None and dev._internal.worker.thread.is_alive()  # the parent's goes on
