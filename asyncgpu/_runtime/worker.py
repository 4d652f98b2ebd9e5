"""`Worker`: a device's own thread, which runs callables one after another with the device current in it.

One per `Device` (``asyncgpu-cuda:0-worker``), started by the first job. It runs what must not hold an event loop's
thread: the awaitable forms of the device's blocking calls (`Device.aalloc_pinned`, `Device.aclock`,
`Device.prepare`, the end of `Device.asynchronize`…), the user's launch-heavy callables (`Device.run`: a
framework's training or inference step, one task per GPU, each launching from its own thread), and the freeing
of large pinned host memory (`give`). Jobs run in the order they were submitted. Before each one the device is
made current in the thread (`BackendDevice.make_current`: CUDA needs its context current per thread, and a job
may have switched it). A job runs in a copy of the submitting task's `contextvars` context, so the task's open
`gpu_timer` scopes time the launches it makes, as they would in the task.

The task that submitted a job is parked through the one loop adapter (`asyncgpu._runtime.loops`: a `Parked` per
job, woken through the loop's thread-safe entry point) and resumes with the job's result, or with the
exception it raised (its traceback runs through the worker thread's frames).

Cancellation (`wait`), as ``anyio.to_thread.run_sync``: a job that has not started is withdrawn and never runs.
A running job cannot be interrupted: the task waits for it to return, then raises the cancellation; the job's
result is dropped, and an exception it raised becomes the cancellation's ``__context__``. With
``abandon_on_cancel`` the task raises at once instead, and the job runs on, its outcome dropped.

Closing (`close`): jobs still queued fail with `ClosedError`; the running one finishes and the thread is joined
(unless `close` is called from a job, whose thread then ends after it). In a child process after ``os.fork()``
(`forget`) the worker is closed without waiting for a thread that is not there.

At the interpreter's exit (`settle_at_exit`, an ``atexit`` hook: Python still runs): each running worker finishes
the job it runs and the frees queued, for up to `EXIT_SETTLE_S`, skips the jobs and library calls not begun
(nobody awaits them now), and from then on declines `give` (the dropping thread frees the block itself). The
thread is a daemon, and the interpreter's teardown ends a daemon thread that takes the GIL back after a driver
call: one doing so inside cuda.core's C++ free of a pinned block aborted the process ("terminate called without
an active exception", `dev/diag_exit_abort.py`, run 61).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import os
import queue
import threading
import time
import warnings
import weakref
from typing import Any, Callable

from asyncgpu._base.errors import ClosedError
from asyncgpu._runtime import loops
from asyncgpu._runtime.engine import report_unraisable

__all__ = ["RUNNING", "Job", "Worker"]

RUNNING = 3  #: a `loops.Parked` state of jobs only: the job runs, so a cancellation can no longer withdraw it
EXIT_SETTLE_S = 10.0  #: how long the interpreter's exit waits for the workers' running jobs and queued frees, in all
_STOP = object()
_started: weakref.WeakSet[Worker] = weakref.WeakSet()  # the workers whose thread was started (`settle_at_exit`)
_started_lock = threading.Lock()


class Job:
    """One callable submitted to a `Worker`, with the task parked on it (``parked.item``: ``(ok, value)``)."""

    __slots__ = ("fn", "args", "context", "parked")

    def __init__(self, fn: Callable[..., Any], args: tuple, context: contextvars.Context, parked: loops.Parked) -> None:
        self.fn: Callable[..., Any] | None = fn
        self.args: tuple | None = args
        self.context: contextvars.Context | None = context
        self.parked = parked


class _Call:
    """A callable the worker thread runs for the library, with nobody waiting for it (`Worker.call_soon`, and
    `Worker.give`'s frees, which run even once the worker is closing: ``even_closed``)."""

    __slots__ = ("fn", "even_closed")

    def __init__(self, fn: Callable[[], Any], even_closed: bool = False) -> None:
        self.fn, self.even_closed = fn, even_closed


class Worker:
    """One device's worker thread (see the module docstring). ``make_current()`` makes the device current in the
    calling thread; ``closed_error()`` is the `ClosedError` a submission to a closed worker raises."""

    def __init__(self, name: str, make_current: Callable[[], None], closed_error: Callable[[], ClosedError]) -> None:
        self.name = name  #: the thread's name, ``asyncgpu-cuda:0-worker``
        self._make_current = make_current
        self._closed_error = closed_error
        self._lock = threading.Lock()  # the jobs' `Parked` states; starting and closing
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()  # (its `put` may be called from a finalizer)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._running = False  # a job runs now (`busy`)

    @property
    def thread(self) -> threading.Thread | None:
        """The worker thread, None before the first job (and after `forget`)."""
        return self._thread

    def busy(self) -> bool:
        """Whether a job or a library call (`call_soon`, `give`) runs or waits to (a snapshot; one taken from the
        queue but not begun yet may read as not busy). Never blocks."""
        return self._running or not self._queue.empty()

    def start(self) -> None:
        """Start the thread now if it has not started (so that `give` can take objects later). Any thread."""
        with self._lock:
            if not self._closed and self._thread is None:
                self._start_locked()

    def _start_locked(self) -> None:
        t = threading.Thread(target=self._main, name=self.name, daemon=True)
        t.start()
        self._thread = t
        with _started_lock:
            _started.add(self)
            # (registered again, so that it runs before the hooks registered since: atexit runs the newest first)
            atexit.unregister(settle_at_exit)
            atexit.register(settle_at_exit)

    # -- the loop's side ----------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], args: tuple) -> Job:
        """Queue ``fn(*args)`` for the calling task, which must then await `wait` on the returned job (and nothing
        else before: on trio the job wakes the task itself). Raises `ClosedError` (naming the fix) on a closed
        worker and `RuntimeError` outside an asyncio (uvloop) or trio task; in both cases nothing was started."""
        kind, loop = loops.current()
        if kind == loops.THREAD:
            raise RuntimeError(
                "this awaits a device's worker thread: it needs a running asyncio (or uvloop) or trio event loop; "
                "in a plain thread call the function directly"
            )
        job = Job(fn, args, contextvars.copy_context(), loops.Parked(kind, loop))
        with self._lock:
            if self._closed:
                raise self._closed_error()
            if self._thread is None:
                self._start_locked()
            self._queue.put(job)
        return job

    async def wait(self, job: Job, *, abandon_on_cancel: bool = False) -> Any:
        """Wait for ``job`` (from `submit`, in the same task) and return its result, or raise its exception. A
        checkpoint. Cancellation: see the module docstring."""
        parked = job.parked
        if parked.kind == loops.ASYNCIO:
            await self._wait_asyncio(parked, abandon_on_cancel)
        else:
            await self._wait_trio(parked, abandon_on_cancel)
        ok, value = parked.item
        parked.item = None
        if not ok:
            raise value
        return value

    async def run(self, fn: Callable[..., Any], *args: Any, abandon_on_cancel: bool = False) -> Any:
        """`submit` ``fn(*args)`` and `wait` for it."""
        return await self.wait(self.submit(fn, args), abandon_on_cancel=abandon_on_cancel)

    def _withdraw(self, parked: loops.Parked, abandon: bool) -> int:
        """A cancellation reached the task: withdraw the job when that is still allowed. Returns the state it found
        (`RUNNING` and not ``abandon``: the task must wait for the job to return)."""
        with self._lock:
            state = parked.state
            if state == loops.WAITING or (state == RUNNING and abandon):
                parked.state = loops.WITHDRAWN
        return state

    async def _wait_asyncio(self, parked: loops.Parked, abandon: bool) -> None:
        try:
            await parked.target
        except BaseException as exc:  # a cancellation (or KeyboardInterrupt) thrown into the task
            state = self._withdraw(parked, abandon)
            if state == loops.WAITING or (state == RUNNING and abandon):
                raise
            if state == RUNNING:  # it cannot be interrupted: wait for it to return, then raise
                await self._outlast(parked)
            _chain(exc, parked)
            raise

    async def _outlast(self, parked: loops.Parked) -> None:
        """asyncio: wait until the running job of ``parked`` returns, through further cancellations. Shielded
        from anyio's cancel scopes too (which deliver a cancellation again at every loop iteration while the task
        waits), so the loop does not spin meanwhile."""
        import anyio

        with anyio.CancelScope(shield=True):
            while True:
                with self._lock:
                    if parked.state != RUNNING:
                        return
                    fut = parked.target = parked.loop.create_future()  # (the job wakes this one)
                try:
                    await fut
                except asyncio.CancelledError:
                    pass  # cancelled again (a plain task.cancel()): still waiting for the job

    async def _wait_trio(self, parked: loops.Parked, abandon: bool) -> None:
        lowlevel = parked.loop.lowlevel
        late = False  # cancelled once the job had started: trio delivers the cancellation after it returns

        def abort(_: Any) -> Any:
            nonlocal late
            state = self._withdraw(parked, abandon)
            if state == loops.WAITING or (state == RUNNING and abandon):
                return lowlevel.Abort.SUCCEEDED
            late = True
            return lowlevel.Abort.FAILED  # the job wakes the task when it returns

        await lowlevel.wait_task_rescheduled(abort)
        if late:
            try:
                await lowlevel.checkpoint()  # raises the cancellation that waited for the job
            except BaseException as exc:
                _chain(exc, parked)
                raise

    # -- the thread's side --------------------------------------------------------------------------------
    def _main(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is _STOP:
                break
            if type(item) is _Call:
                self._call(item)
            elif self._closed:  # queued before `close` (or `settle`): never run
                self._fail(item, self._closed_error())
            else:
                self._run(item)
            del item
        self._drain()

    def _run(self, job: Job) -> None:
        parked = job.parked
        with self._lock:
            if parked.state != loops.WAITING:  # withdrawn before it started
                return
            parked.state = RUNNING
            self._running = True
        fn, args, context = job.fn, job.args, job.context
        job.fn = job.args = job.context = None
        assert fn is not None and args is not None and context is not None
        try:
            self._make_current()
            outcome: tuple[bool, Any] = (True, context.run(fn, *args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, which raises it
            outcome = (False, exc)
        del fn, args, context
        with self._lock:
            self._running = False
            if parked.state != RUNNING:  # abandoned (`abandon_on_cancel`): nobody takes the outcome
                return
            parked.state = loops.WOKEN
            parked.item = outcome
        parked.wake()

    def _call(self, item: _Call) -> None:
        if self._closed and not item.even_closed:
            return
        try:
            self._make_current()  # (a driver call, a free too, runs in the device's context)
        except Exception:  # noqa: BLE001 - a failed device: the call runs all the same (a free must happen)
            pass
        self._running = True  # (`busy`: a library call, a clock refresh say, runs as long as a job may)
        try:
            item.fn()
        except Exception as exc:  # noqa: BLE001 - reported; the worker goes on
            report_unraisable(exc, "asyncgpu: a worker thread's job failed", item.fn)
        finally:
            self._running = False

    def _drain(self) -> None:
        """After the stop: jobs still queued fail with `ClosedError`; objects to drop are dropped here."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if type(item) is _Call:
                self._call(item)
            elif isinstance(item, Job):
                self._fail(item, self._closed_error())

    def _fail(self, job: Job, err: BaseException) -> None:
        parked = job.parked
        with self._lock:
            if parked.state != loops.WAITING:
                return
            parked.state = loops.WOKEN
            parked.item = (False, err)
        job.fn = job.args = job.context = None
        parked.wake()

    def call_soon(self, fn: Callable[[], Any]) -> bool:
        """Run ``fn()`` on the worker thread after the jobs queued before it, for the library (an exception is
        reported as unraisable, never raised). Any thread; never blocks; starts the thread if needed. False on
        a closed worker (nothing queued)."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                self._start_locked()
            self._queue.put(_Call(fn))
        return True

    # -- frees and lifetime ---------------------------------------------------------------------------------
    def give(self, holder: list) -> bool:
        """Empty the one-item list ``holder`` on the worker thread, after the jobs queued before it: the caller
        keeps no other reference to the object in it, whose release holds a thread (unpinning host memory), so it
        is freed there. Any thread, also a finalizer: never blocks and never starts a thread. False when the
        thread does not run (not started, closed, or in a child process after ``os.fork()``): the caller frees
        it."""
        t = self._thread
        if self._closed or t is None or not t.is_alive():
            return False
        self._queue.put(_Call(holder.clear, even_closed=True))
        return True

    def settle(self) -> threading.Event | None:
        """At the interpreter's exit: `close` without the join. From now on `give` declines, and the jobs and
        library calls not begun are skipped (a job fails with `ClosedError`). Returns an event set once the
        running job and the frees queued before have finished, or None when the thread does not run (or is the
        caller's). Any thread; never blocks."""
        t = self._thread
        if t is None or not t.is_alive() or t is threading.current_thread():
            self._closed = True  # (before the lock: after `forget`, a parent thread may have held it at the fork)
            return None
        with self._lock:
            self._closed = True
            done = threading.Event()
            self._queue.put(_Call(done.set, even_closed=True))
        return done

    def close(self) -> None:
        """Fail the jobs still queued with `ClosedError`, let the running one finish and join the thread (not
        from a job of this worker: its thread then ends after that job). Idempotent; any thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            t = self._thread
        if t is None:
            return
        self._queue.put(_STOP)
        if t is not threading.current_thread():
            t.join()

    def forget(self) -> None:
        """In a child process right after ``os.fork()``: the thread is the parent's. Closed, without waiting
        for it or taking a lock (a parent thread may have held it at the fork)."""
        self._closed = True
        self._thread = None
        self._queue = queue.SimpleQueue()


def _after_fork_in_child() -> None:
    """The parent's workers are not this process's (`Worker.forget`), and a parent thread may have held the lock."""
    global _started, _started_lock
    _started, _started_lock = weakref.WeakSet(), threading.Lock()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def settle_at_exit() -> None:
    """The ``atexit`` hook (see the module docstring): every started worker settles (`Worker.settle`), all within
    `EXIT_SETTLE_S` together; one still busy then is named in a `RuntimeWarning`, and the exit goes on."""
    deadline = time.monotonic() + EXIT_SETTLE_S
    with _started_lock:
        workers = list(_started)
    settling = [(w.name, w.settle()) for w in workers]  # (every one first: their queues finish in parallel)
    busy = [
        name for name, done in settling if done is not None and not done.wait(max(0.0, deadline - time.monotonic()))
    ]
    if busy:
        warnings.warn(
            f"asyncgpu: {', '.join(busy)} still ran a job or a free {EXIT_SETTLE_S:g} s into the interpreter's exit, "
            "which may cut it off: close the devices (`asyncgpu.close_all()`) or await their jobs before exiting",
            RuntimeWarning,
            stacklevel=1,
        )


def _chain(exc: BaseException, parked: loops.Parked) -> None:
    """The job of a cancelled wait returned: drop its result; its exception becomes ``exc``'s context."""
    outcome, parked.item = parked.item, None
    if outcome is not None and not outcome[0] and outcome[1] is not exc:
        exc.__context__ = outcome[1]
