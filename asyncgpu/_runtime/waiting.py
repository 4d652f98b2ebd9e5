"""Awaiting a backend event from an event loop: asyncio (and uvloop) or trio, whichever runs the caller.

`await_completion` parks the calling task on the device's `Engine`, which resumes it from its loop's poller
(shortly before a predicted completion, the loop itself polls the device's stream heads between iterations) or
through the loop's own thread-safe entry point (`asyncgpu._runtime.engine`). A loop's only wait on a device is woken
*early* instead: the task polls its own event between iterations for a bounded window, then parks again.

Cancellation: the wait is withdrawn from the engine before the cancellation propagates; nothing is left
behind (the engine never touches a withdrawn waiter's loop again, or, on trio, delivers the one wake-up that
was already under way, as trio's abort protocol requires).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

from asyncgpu._runtime import loops
from asyncgpu._runtime.engine import EARLY, KIND_ASYNCIO, KIND_THREAD, KIND_TRIO, Engine, Waiter, WaitFor

__all__ = ["await_completion", "block_until_complete"]

_now = time.perf_counter_ns


async def await_completion(engine: Engine, query: Callable[[Any], bool], wait_for: WaitFor) -> None:
    """Resume the calling task once ``query(wait_for.raw)`` is true. Always a checkpoint. Raises what the engine
    failed."""
    kind, loop = loops.current()
    if kind == loops.TRIO:
        return await _await_trio(loop, engine, query, wait_for)
    if kind != loops.ASYNCIO:
        raise RuntimeError("await event.wait() needs a running asyncio (or uvloop) or trio event loop")
    raw, key, seq, tag, record_ns, owner = wait_for
    if query(raw):  # already complete: still a checkpoint, without a round trip through the engine
        await asyncio.sleep(0)
        return
    fut = loop.create_future()
    w = engine.add(raw, key, seq, tag, record_ns, KIND_ASYNCIO, loop, fut, owner)
    try:
        while await fut:  # True: woken early (the loop's only wait here): poll it between iterations a while
            if await _poll_asyncio(engine, w, query):
                return
            fut = loop.create_future()
            if not engine.rearm(w, fut):
                _raise_if_failed(w)
                return
    except BaseException:
        engine.cancel(w)
        raise


async def _poll_asyncio(engine: Engine, w: Waiter, query: Callable[[Any], bool]) -> bool:
    raw, until, sleep = w.raw, w.poll_until_ns, asyncio.sleep
    w.woke_ns = _now()
    while True:
        if query(raw):
            engine.finish(w, _now())
            return True
        if _now() > until:
            return False
        await sleep(0)


async def _await_trio(trio: Any, engine: Engine, query: Callable[[Any], bool], wait_for: WaitFor) -> None:
    lowlevel = trio.lowlevel
    raw, key, seq, tag, record_ns, owner = wait_for
    if query(raw):
        await lowlevel.checkpoint()
        return
    task = lowlevel.current_task()
    w = engine.add(raw, key, seq, tag, record_ns, KIND_TRIO, lowlevel.current_trio_token(), task, owner)

    def abort(_: Any) -> Any:
        return lowlevel.Abort.SUCCEEDED if engine.cancel(w) else lowlevel.Abort.FAILED

    try:
        while await lowlevel.wait_task_rescheduled(abort):  # True: woken early; poll a while
            until = w.poll_until_ns
            w.woke_ns = _now()
            while True:
                if query(raw):
                    engine.finish(w, _now())
                    return
                if _now() > until:
                    break
                await lowlevel.checkpoint()
            if not engine.rearm(w, task):
                _raise_if_failed(w)
                return
    except BaseException:
        engine.cancel(w)
        raise


def block_until_complete(
    engine: Engine,
    query: Callable[[Any], bool],
    wait_for: WaitFor,
    deadline_ns: int | None = None,
    sync: Callable[[Any], None] | None = None,
) -> bool:
    """Block the calling plain thread (GIL released) until ``query(wait_for.raw)`` is true, or until ``deadline_ns``
    (``time.perf_counter_ns`` base; None: no limit). Returns False on timeout, with the wait withdrawn. Raises
    what the engine failed (`BackendError`, `ClosedError`).

    The waiter thread wakes this thread shortly before the predicted completion. Then, with ``sync`` (the
    driver's own wait: it spins without the GIL) and no deadline, the thread finishes the wait natively: the
    lowest latency, with a core spent only for the last few microseconds. Otherwise it polls ``query``,
    yielding the GIL between polls, for a bounded window."""
    raw, key, seq, tag, record_ns, owner = wait_for
    if query(raw):
        return True
    lock = threading.Lock()
    lock.acquire()
    w = engine.add(raw, key, seq, tag, record_ns, KIND_THREAD, None, lock, owner)
    try:
        while True:
            if deadline_ns is None:
                lock.acquire()
            else:
                left_s = (deadline_ns - _now()) / 1e9
                if not lock.acquire(timeout=max(left_s, 0.0)):
                    if engine.cancel(w):
                        return False
                    lock.acquire()  # a wake-up is under way: take it, then see where the event stands
                    _raise_if_failed(w)
                    return query(raw)
            if w.state != EARLY:  # FIRED: complete, or failed
                _raise_if_failed(w)
                return True
            w.woke_ns = _now()
            if sync is not None and deadline_ns is None:
                sync(raw)  # woken early: finish natively (GIL released)
                engine.finish(w, _now())
                return True
            until = w.poll_until_ns  # woken early: poll for a while, yielding the GIL between queries
            while True:
                if query(raw):
                    engine.finish(w, _now())
                    return True
                now = _now()
                if now > until or (deadline_ns is not None and now > deadline_ns):
                    break
                time.sleep(0)
            if not engine.rearm(w, lock):
                _raise_if_failed(w)
                return True
    except BaseException:
        engine.cancel(w)
        raise


def _raise_if_failed(w: Waiter) -> None:
    if w.error is not None:
        raise loops.fresh_error(w.error)
