"""The one adapter between asyncgpu and the caller's concurrency: which loop am I in, park, wake, checkpoint.

asyncgpu serves plain threads, asyncio (uvloop included) and trio. Everything that blocks or parks a caller
(`asyncgpu._runtime.waiting`, the completion engine, `asyncgpu._handoff.channel`, `asyncgpu._timing.scope`) asks
this module:

* `current` — where the caller runs: ``(THREAD, None)``, ``(ASYNCIO, loop)`` or ``(TRIO, trio module)``.
* `post` — run a function in a loop's thread from any thread, through the loop's own thread-safe entry point
  (asyncio ``loop.call_soon_threadsafe``, trio ``TrioToken.run_sync_soon``); there, `resolve_here` resumes a
  parked task (a future's result; trio's ``reschedule``) and `scheduler` schedules the next iteration's
  callback (the completion engine's pollers). A foreign thread never touches a loop's objects directly
  (``anyio.Event.set()`` from a thread loses wake-ups on asyncio and raises on trio).
* `Parked` — one thread or task parked until another thread wakes it (a channel's getters and putters).
* `checkpoint`, `is_cancellation`, `fresh_error`.
* `warn_blocking` — a blocking call made from a loop's thread says so (`BlockingCallWarning`).

trio is never imported here: a caller runs in trio only if trio is already imported.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import warnings
from typing import Any, Callable

from asyncgpu._base.errors import BlockingCallWarning

__all__ = [
    "ASYNCIO",
    "THREAD",
    "TRIO",
    "Parked",
    "checkpoint",
    "current",
    "fresh_error",
    "in_jupyter_kernel",
    "is_cancellation",
    "post",
    "resolve_here",
    "scheduler",
    "trio_module",
    "warn_blocking",
]

ASYNCIO, TRIO, THREAD = 0, 1, 2  #: where a caller runs (the completion engine's waiter kinds use the same codes)
WAITING, WOKEN, WITHDRAWN = 0, 1, 2  #: states of a `Parked`


def trio_module() -> Any:
    """The trio module if the calling thread runs a trio task, else None (trio is never imported here)."""
    trio = sys.modules.get("trio")
    if trio is None:
        return None
    try:
        trio.lowlevel.current_task()
    except (RuntimeError, AttributeError):  # not in trio (or trio is still being imported by another thread)
        return None
    return trio


def current() -> tuple[int, Any]:
    """Where the caller runs: ``(ASYNCIO, running loop)``, ``(TRIO, trio module)`` or ``(THREAD, None)``."""
    try:
        return ASYNCIO, asyncio.get_running_loop()
    except RuntimeError:
        pass
    trio = trio_module()
    if trio is not None:
        return TRIO, trio
    return THREAD, None


async def checkpoint(kind: int, loop: Any) -> None:
    """Let the loop run other tasks once (and deliver a pending cancellation)."""
    if kind == ASYNCIO:
        await asyncio.sleep(0)
    else:
        await loop.lowlevel.checkpoint()


def is_cancellation(exc: BaseException | None) -> bool:
    """True for asyncio's and trio's cancellation and for KeyboardInterrupt."""
    if exc is None:
        return False
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return True
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, trio.Cancelled)


def fresh_error(err: BaseException) -> BaseException:
    """One exception instance per resumed task, so their tracebacks do not pile up on a shared object."""
    clone = type(err)(*err.args)
    clone.__cause__ = err.__cause__ or err
    return clone


def post(kind: int, loop: Any, fn: Callable[..., Any], *args: Any) -> None:
    """From any thread: run ``fn(*args)`` in the loop's thread at its next iteration. ``loop``: the asyncio loop,
    or the `trio.lowlevel.TrioToken`. Skipped when the loop has closed: nobody is left to wake."""
    try:
        if kind == ASYNCIO:
            loop.call_soon_threadsafe(fn, *args)
        else:
            loop.run_sync_soon(fn, *args)
    except RuntimeError:  # trio's RunFinishedError is a RuntimeError too
        pass


def scheduler(kind: int, loop: Any) -> Callable[[Callable[[], None]], Any]:
    """How to run a callback at the loop's next iteration, from the loop's own thread: asyncio ``call_soon``,
    trio ``TrioToken.run_sync_soon`` (``loop`` as in `post`)."""
    return loop.call_soon if kind == ASYNCIO else loop.run_sync_soon


def resolve_here(kind: int, target: Any, err: BaseException | None, value: Any = None) -> None:
    """In the loop's own thread: resume one parked target (a future or a trio task) with ``value`` or ``err``."""
    if kind == ASYNCIO:
        if not target.done():
            if err is None:
                target.set_result(value)
            else:
                target.set_exception(fresh_error(err))
    else:  # (trio runs the caller, so trio and its outcome are imported: no import statement per wake)
        modules = sys.modules
        outcome = modules["outcome"]
        modules["trio"].lowlevel.reschedule(
            target, outcome.Value(value) if err is None else outcome.Error(fresh_error(err))
        )


class Parked:
    """A thread or task parked until another thread wakes it. Its ``state`` and ``item`` change under the
    owner's lock (passed to `block` / `wait`); `wake` may be called from any thread, once, after the state
    was set to ``WOKEN`` under that lock."""

    __slots__ = ("kind", "loop", "target", "token", "state", "item")
    kind: int
    loop: Any
    target: Any  # a held lock (a plain thread), a future (asyncio) or a task (trio)
    token: Any
    state: int
    item: Any  # what the waker hands over (a channel's item), None for nothing

    def __init__(self, kind: int, loop: Any) -> None:
        self.kind, self.loop, self.state, self.item, self.token = kind, loop, WAITING, None, None
        if kind == THREAD:
            self.target = threading.Lock()
            self.target.acquire()
        elif kind == ASYNCIO:
            self.target = loop.create_future()
        else:  # trio: ``loop`` is the trio module
            self.target = loop.lowlevel.current_task()
            self.token = loop.lowlevel.current_trio_token()

    def wake(self) -> None:
        if self.kind == THREAD:
            self.target.release()
        else:
            post(
                self.kind, self.loop if self.kind == ASYNCIO else self.token, resolve_here, self.kind, self.target, None
            )

    def block(self, lock: threading.Lock, deadline_ns: int | None, now_ns: int) -> bool:
        """Plain thread: wait (GIL released) to be woken; False on timeout (``deadline_ns``, on the base of
        ``now_ns``, ``time.perf_counter_ns``), with the parking withdrawn. ``lock`` is the owner's lock (not
        held by the caller)."""
        if deadline_ns is None:
            self.target.acquire()
            return True
        if self.target.acquire(timeout=max(deadline_ns - now_ns, 0) / 1e9):
            return True
        with lock:
            if self.state == WAITING:
                self.state = WITHDRAWN
                return False
        self.target.acquire()  # woken meanwhile: take the wake-up
        return True

    async def wait(self, lock: threading.Lock) -> None:
        """Task: wait to be woken. Cancellation withdraws the parking (or, if the wake-up is already under
        way, lets it arrive and re-raises: the caller then sees ``state == WOKEN`` and puts things back)."""
        if self.kind == ASYNCIO:
            try:
                await self.target
            except BaseException:
                with lock:
                    if self.state == WAITING:
                        self.state = WITHDRAWN
                raise
            return
        lowlevel = self.loop.lowlevel

        def abort(_: Any) -> Any:
            with lock:
                if self.state == WAITING:
                    self.state = WITHDRAWN
                    return lowlevel.Abort.SUCCEEDED
            return lowlevel.Abort.FAILED  # the wake-up is under way; the next checkpoint raises

        await lowlevel.wait_task_rescheduled(abort)


def warn_blocking(call: str, instead: str, stacklevel: int = 3) -> None:
    """Warn with `BlockingCallWarning` if the calling thread runs an asyncio (uvloop) loop or a trio task:
    ``call`` is about to block it, ``instead`` says what a task does. ``stacklevel`` as `warnings.warn`'s,
    counted from the caller of this function (3: the caller's caller, the user's line). Not in a Jupyter
    kernel: it runs each cell's plain code inside its own event loop, and a cell blocks by design."""
    if current()[0] != THREAD and not in_jupyter_kernel():
        warnings.warn(
            f"{call} blocks this thread, which runs an event loop: the loop's other tasks wait until it returns. "
            f"In a task, {instead}",
            BlockingCallWarning,
            stacklevel=stacklevel,
        )


def in_jupyter_kernel() -> bool:
    """Whether this process is a Jupyter kernel (its cells run plain code inside its event loop)."""
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)  # (never imports IPython)
    return get_ipython is not None and getattr(get_ipython(), "kernel", None) is not None
