"""After ``os.fork()`` the child never waits for ever on a worker of the parent: it gets `ClosedError` naming the fix,
and `asyncgpu.device` opens a fresh worker there (CUDA: says to use the 'spawn' start method)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import traceback

import pytest

import asyncgpu
from asyncgpu._backends.cuda import CudaBackend

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python 3.12+: forking a process that runs threads (the workers' threads) warns; that is what is tested here.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def _outcome(fn) -> str:
    try:
        return f"ok {fn()!r}"
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        return f"{type(exc).__name__}: {exc}"


def _in_child(probe) -> dict:
    """Run ``probe()`` (-> dict of outcomes) in a forked child; the child dies after 20 s (never hangs the test)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave at once (no pytest teardown here)
        try:
            os.close(r)
            signal.alarm(20)
            try:
                out = probe()
            except BaseException:  # noqa: BLE001
                out = {"probe failed": traceback.format_exc()}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([r], [], [], 30)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail("the forked child hung")
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert chunks, "the forked child died without a report (a hang caught by its alarm?)"
    return json.loads(b"".join(chunks))


def _loop_waits(ev) -> dict:
    out = {"asyncio": _outcome(lambda: asyncio.run(ev.wait()))}
    try:
        import uvloop

        out["uvloop"] = _outcome(lambda: uvloop.run(ev.wait()))
    except ImportError:
        pass
    import trio

    out["trio"] = _outcome(lambda: trio.run(ev.wait))
    return out


def test_a_forked_child_gets_a_clear_error_and_a_fresh_worker():
    dev = asyncgpu.device("host:0")
    dev.stream.spin_us(300_000)
    ev = dev.record()  # pending when the parent forks: its stream thread does not exist in the child
    stream = dev.stream

    def probe() -> dict:
        out = {
            "query": _outcome(ev.query),
            "wait_sync": _outcome(ev.wait_sync),
            "spin": _outcome(lambda: stream.spin_us(10)),
            "record": _outcome(dev.record),
            "timer": _outcome(lambda: asyncgpu.gpu_timer(dev).__enter__()),
            **_loop_waits(ev),
            "close": _outcome(dev.close),  # returns at once: nothing of the parent's is touched
        }
        fresh = asyncgpu.device("host:0")
        out["fresh is new"] = fresh is not dev
        fresh.stream.spin_us(1_000)
        out["fresh works"] = _outcome(lambda: fresh.record().wait_sync(timeout_s=10))
        return out

    out = _in_child(probe)
    fix = re.compile(
        rf"host:0's worker(, which)? was opened by the parent process \(pid {os.getpid()}\) before os.fork\(\); its "
        r"threads do not run in this process \(pid \d+\): open the device again with asyncgpu.device\('host:0'\)"
    )
    waits = [k for k in ("asyncio", "uvloop", "trio") if k in out]
    for key in ("query", "wait_sync", "spin", "record", "timer", *waits):
        assert out[key].startswith("ClosedError: ") and fix.search(out[key]), (key, out[key])
    assert out["close"] == "ok None"
    assert out["fresh is new"] is True and out["fresh works"] == "ok None"
    ev.wait_sync()  # the parent's worker is untouched
    ev.release()


def test_a_forked_child_never_waits_on_a_lock_a_parents_thread_held_at_the_fork():
    """The pools' reclaim lock held by a parent's thread (the waiter thread growing a pool ahead) when the process
    forks stays held in the child: the child's `pool_stats` does not wait on it."""
    dev = asyncgpu.device("host:0")
    dev.record().release()
    with dev._internal.reclaim_lock:  # as if the waiter thread were reclaiming at the fork
        out = _in_child(lambda: {"pool_stats": _outcome(lambda: dev.pool_stats().in_use >= 0)})
    assert out["pool_stats"] == "ok True"


def test_a_forked_child_of_a_process_that_initialized_cuda_is_told_to_spawn():
    """The CUDA backend's part, without a GPU: a backend that had initialized the driver says so in the child."""
    backend = CudaBackend()
    backend._drv, backend._probe, backend._count = object(), (True, "1 CUDA device(s)"), 1  # as after cuInit
    backend.forked(4242)
    ok, why = backend.available()
    assert not ok and backend.device_count() == 0
    assert "initialized in the parent process (pid 4242) before os.fork()" in why
    assert "multiprocessing.get_context('spawn')" in why
    never = CudaBackend()  # a parent that never initialized CUDA leaves the child free to probe
    never.forked(4242)
    assert never._probe is None


@pytest.mark.gpu
def test_a_forked_child_cannot_use_the_parents_gpu_and_is_told_to_spawn():
    dev = asyncgpu.device(0, backend="cuda")
    dev.stream.spin_us(200_000)
    ev = dev.record()

    def probe() -> dict:
        return {
            "query": _outcome(ev.query),
            **_loop_waits(ev),
            "open": _outcome(lambda: asyncgpu.device(0, backend="cuda")),
            "close": _outcome(dev.close),
        }

    out = _in_child(probe)
    for key in ("query", "asyncio", "trio"):
        assert out[key].startswith("ClosedError: ") and "'spawn'" in out[key], (key, out[key])
    assert out["open"].startswith("NoDeviceError: ") and "get_context('spawn')" in out["open"], out["open"]
    assert out["close"] == "ok None"
    ev.wait_sync()  # the parent's worker is untouched
    ev.release()
