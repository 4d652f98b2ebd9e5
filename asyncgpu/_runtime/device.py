"""`Device`: the per-device async worker: its streams, its pools of recycled events, its completion engine.

Get one with `asyncgpu.device` / `asyncgpu.devices`; there is one open worker per device and process.

Threads: every method may be called from any thread. The worker owns one waiter thread (started on the first
wait), one worker thread (``asyncgpu-cuda:0-worker``, started by the first job: `run` and the awaitable forms
below; `asyncgpu._runtime.worker`) and, on the host backend, one thread per stream. `close` stops them; pending
waits and queued jobs then fail with `ClosedError`, events in use are destroyed as they come back, and nothing
is leaked. Its events, streams and arrays then raise `ClosedError` naming the fix, as does a worker the parent
process opened, used in a child after ``os.fork()`` (`DeviceInternal.mark_forked`: its threads do not run there).

No call of a task needs to hold its loop's thread: the blocking calls have awaitable forms that wait for the
device, or run on the device's worker thread, while the loop runs the other devices' tasks. The naming rule:
``await x.verb()`` is async and ``x.verb_sync()`` blocks; a blocking method older than that rule keeps its name,
and its async form is the same name with an ``a`` in front, as Python's ``close``/``aclose`` and ``next``/``anext``:
`aalloc`, `aalloc_pinned`, `asynchronize`, `aclock`, `aclose`. New async calls have a plain verb: `prepare`
(compile and load kernels), `run` (a launch-heavy callable on the worker thread). Called from a thread that runs
an event loop, the blocking forms warn with `BlockingCallWarning` (once per call site, naming the async form)
when they would block: `synchronize`, `close` with work queued, `alloc_pinned` of a large block (pinning holds
the thread about 0.5 ms per MB on CUDA), `alloc` of a very large one (the memory pool may grow), `clock` when it
re-measures (the last three only when called by the user's code: a warning points at the caller's line). Large
pinned blocks are freed on the worker thread when their last view goes, whichever thread drops it.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, TypeVar, final

import numpy as np

from asyncgpu._backends.contract import BackendDevice
from asyncgpu._base.checks import number, whole
from asyncgpu._base.errors import AsyncGPUError, DeviceMismatchError
from asyncgpu._runtime import loops
from asyncgpu._runtime.clock import CLOCK_MAX_AGE_S, DEFAULT_SAMPLES, ClockCalibration
from asyncgpu._runtime.event import Event
from asyncgpu._runtime.hooks import QUEUE_LIMIT
from asyncgpu._runtime.internal import DeviceInternal
from asyncgpu._runtime.memory import DeviceArray
from asyncgpu._runtime.pool import EventPool, PoolStats
from asyncgpu._runtime.stream import Stream

if TYPE_CHECKING:
    pass

__all__ = ["WORKLOADS", "Device", "refresh_clocks"]

_now = time.perf_counter_ns
_first = itemgetter(0)
_T = TypeVar("_T")

#: the built-in workloads `Device.prepare` takes by name (``inc_loop_profiled``: `asyncgpu.kernel.KernelProfiler`'s)
WORKLOADS = ("spin", "inc_loop", "inc_loop_profiled")
#: an async scope's exit re-measures, off the loop, the clocks that would be older than their scope's limit by then
_CLOCK_MARGIN_S = 0.01

_FIRST_EVENTS = 64  #: free events of each pool `prepare` makes sure of: a device's first launches make none


@final
class Device:
    """The async worker of one device (``cuda:0``, ``host:1``…). See the module docstring for threads."""

    name: str
    index: int
    backend: str
    description: str
    options: dict[str, int]
    streams: tuple[Stream, ...]
    stream: Stream
    _internal: DeviceInternal
    _on_close: Callable[[Device], None] | None
    _lock: threading.Lock
    _timing_pool: EventPool
    _plain_pool: EventPool

    def __init__(self) -> None:
        raise TypeError("open devices with asyncgpu.device(...) or asyncgpu.devices()")

    @classmethod
    def _open(
        cls, bd: BackendDevice, *, streams: int, max_events: int, on_close: Callable[[Device], None] | None = None
    ) -> Device:
        """Open the worker of ``bd``. ``on_close(device)`` runs first thing in `close` (the registry of open
        workers, `asyncgpu._runtime.select`, forgets it there)."""
        if streams < 1:
            raise ValueError(f"a device needs at least one stream, got streams={streams}")
        self = object.__new__(cls)
        self.name = bd.name  #: ``"cuda:0"``, ``"host:1"``
        self.index = bd.index
        self.backend = bd.backend  #: ``"cuda"`` or ``"host"``
        self.description = bd.description
        self.options = {"streams": streams, "max_events": max_events}
        self._on_close = on_close
        self._lock = threading.Lock()
        self._internal = rt = DeviceInternal(self, bd, max_events=max_events)
        self._timing_pool, self._plain_pool = rt.timing_pool, rt.plain_pool  # (the hot path of `record`)
        self.streams = tuple(self._new_stream() for _ in range(streams))
        self.stream = self.streams[0]  #: the default stream
        return self

    # -- clock --------------------------------------------------------------------------------------------
    def clock(
        self, *, refresh: bool = False, max_age_s: float = CLOCK_MAX_AGE_S, samples: int = DEFAULT_SAMPLES
    ) -> ClockCalibration:
        """This device's clock calibration against the host clock (``time.perf_counter_ns()``): the anchor
        that places its events on the host time base, its error bound, the ``%globaltimer`` offset and drift.
        Re-measured when older than ``max_age_s`` (``math.inf``: never, once measured; otherwise the first second's
        calibrations, whose drift is not known yet, after 50 ms), or when ``refresh``: that blocks the calling thread
        about 0.1-0.4 ms on a GPU (the first time in a process also compiles the calibration kernels), and warns
        (`BlockingCallWarning`) in an event loop's thread: ``await device.aclock()`` measures on the device's worker
        thread instead. Raises `ClockError` when the device does not answer (see `asyncgpu._runtime.clock`)."""
        rt = self._internal
        rt.check_open()
        max_age_s = number("max_age_s", max_age_s, unit="seconds", infinite="never re-measure")
        samples = whole("samples", samples, minimum=1, hint="pings; the best is kept")
        if rt.clock_stale(max_age_s, refresh) and not _called_by_asyncgpu():
            loops.warn_blocking(f"{self.name}.clock() (it re-measures)", "`await device.aclock()`")
        return rt.calibration(max_age_s=max_age_s, refresh=refresh, samples=samples)

    async def aclock(
        self, *, refresh: bool = False, max_age_s: float = CLOCK_MAX_AGE_S, samples: int = DEFAULT_SAMPLES
    ) -> ClockCalibration:
        """`clock` for a task: a calibration young enough is returned at once; a measurement runs on the device's
        worker thread while the loop runs on. A checkpoint. Cancelled while it measures, the measurement (a
        fraction of a millisecond, bounded by its timeout) finishes first (see `run`)."""
        rt = self._internal
        rt.check_open()
        max_age_s = number("max_age_s", max_age_s, unit="seconds", infinite="never re-measure")
        samples = whole("samples", samples, minimum=1, hint="pings; the best is kept")
        if not rt.clock_stale(max_age_s, refresh):
            await loops.checkpoint(*loops.current())
            cal = rt.clock
            if cal is not None:
                return cal
        return await rt.worker.run(rt.calibration, max_age_s, refresh, samples)

    # -- events -------------------------------------------------------------------------------------------
    def record(self, stream: Stream | Any | None = None, *, timing: bool = True, tag: Any = None) -> Event:
        """Record a pooled event on ``stream`` (default: `stream`; a foreign ``__cuda_stream__`` object is
        adopted) and return it. Release it with ``event.release()`` or a ``with`` block. A record with timing takes
        one of the driver's ~1,000 launch slots of the stream (one without, ``timing=False``, takes none): past
        them the driver blocks the calling thread until the device drains. In an event loop's thread a record
        onto a full stream raises `QueueFullError` instead, taking nothing (``await stream.room()`` first)."""
        rt = self._internal
        if rt.closed:
            rt.check_open()
        s = self.stream if stream is None else self.stream_of(stream)
        si = s._internal
        if timing and si.ops - si.done_ops >= QUEUE_LIMIT:  # (`hooks.check_queue`, inlined)
            si.check_room()  # (raises in a loop's thread when the stream is full: before anything is taken)
        pool = self._timing_pool if timing else self._plain_pool
        raw = pool.take()
        try:
            si.bd.record(raw, si.raw)
        except BaseException:
            pool.give(raw)  # not recorded: as it was
            raise
        if timing:  # a timing record takes one of the driver's launch slots (a plain one does not)
            si.marked()
        ev = Event._recorded(rt, raw, timing, s.handle, next(si.seqs), _now(), si.tag if tag is None else tag)
        si.tag = None  # a second record right behind this one has no work of its own before it
        return ev

    def create_event(self, *, timing: bool = True) -> Event:
        """A pooled event that is not recorded yet: record it with ``event.record(stream)``."""
        self._internal.check_open()
        return Event._create(self._internal, (self._timing_pool if timing else self._plain_pool).take(), timing)

    def pool_stats(self, timing: bool = True) -> PoolStats:
        """Counters of the pool of timing (or non-timing) events, after taking back the released events the
        device has passed (``in_use``: held by callers, or released and still ahead of the device)."""
        self._internal.reclaim(everything=True)
        return (self._timing_pool if timing else self._plain_pool).stats()

    # -- streams ------------------------------------------------------------------------------------------
    def _new_stream(self) -> Stream:
        owned = self._internal.owned_streams
        s = Stream._create(self, self._internal.bd.create_stream(), f"s{len(owned)}", True)
        owned.append(s)
        return s

    def create_stream(self) -> Stream:
        """A new non-blocking stream owned by this worker (closed with it)."""
        self._internal.check_open()
        with self._lock:
            return self._new_stream()

    def adopt_stream(self, obj: Any) -> Stream:
        """Wrap a framework's stream (any object with ``__cuda_stream__``: torch, CuPy, cuda.core) so asyncgpu
        can record and launch on it. asyncgpu never closes an adopted stream."""
        self._internal.check_open()
        if isinstance(obj, Stream):
            if obj.device is not self:
                raise DeviceMismatchError(f"that stream belongs to {obj.device.name}, not {self.name}")
            return obj
        bd, adopted = self._internal.bd, self._internal.adopted_streams
        raw = bd.adopt_stream(obj)
        handle = bd.stream_handle(raw)
        with self._lock:
            s = adopted.get(handle)
            if s is None:
                s = adopted[handle] = Stream._create(self, raw, f"x{len(adopted)}", False)
            return s

    def stream_of(self, stream: Any) -> Stream:
        """``stream`` as this device's `Stream`: None is the default `stream`, a foreign ``__cuda_stream__``
        object is adopted (`adopt_stream`); another device's stream raises `DeviceMismatchError`."""
        if stream is None:
            return self.stream
        if isinstance(stream, Stream):
            if stream._internal.dev is not self._internal:  # (one `DeviceInternal` per `Device`)
                raise DeviceMismatchError(
                    f"that stream belongs to {stream.device.name}, not {self.name}: record on one of "
                    f"{self.name}'s streams, or on {stream.device.name}"
                )
            return stream
        return self.adopt_stream(stream)

    # -- memory -------------------------------------------------------------------------------------------
    def alloc(self, n: int, dtype: Any = np.float32, *, stream: Stream | None = None) -> DeviceArray:
        """``n`` elements (a whole number >= 0) of ``dtype`` (a numpy dtype of plain numbers, not ``object``)
        of device memory, allocated in order on ``stream`` (contents undefined). On CUDA it comes from the
        device's memory pool, in stream order (microseconds, unless the pool has to grow: a very large block then
        warns, `BlockingCallWarning`, in an event loop's thread; ``await device.aalloc(n)`` there)."""
        self._internal.check_open()
        n, dt = whole("n", n), _plain_dtype(dtype)
        self._check_fits(n, dt, pinned=False)
        s = self.stream_of(stream)
        slow = self._internal.bd.slow_alloc_bytes
        if slow is not None and n * dt.itemsize >= slow and not _called_by_asyncgpu():
            loops.warn_blocking(f"{self.name}.alloc() of {n * dt.itemsize:,} bytes", "`await device.aalloc(n, dtype)`")
        return DeviceArray._create(self, self._internal.bd.alloc(n, dt, s._internal.raw), n, dt)

    async def aalloc(self, n: int, dtype: Any = np.float32, *, stream: Stream | None = None) -> DeviceArray:
        """`alloc` on the device's worker thread, for a task: the loop runs on while the memory is allocated. A
        checkpoint; arguments are checked here, before anything runs. Cancellation: see `run`."""
        self._internal.check_open()
        n, dt = whole("n", n), _plain_dtype(dtype)
        self._check_fits(n, dt, pinned=False)
        s = self.stream_of(stream)
        buf = await self._internal.worker.run(self._internal.bd.alloc, n, dt, s._internal.raw)
        return DeviceArray._create(self, buf, n, dt)

    def alloc_pinned(self, n: int, dtype: Any = np.float32) -> np.ndarray:
        """A numpy array of ``n`` elements in page-locked host memory (on the host backend, memory made resident
        at once, as pinning does); ``n`` and ``dtype`` as in `alloc`. Pinning holds the calling thread for the
        whole block (CUDA: about 0.5 ms per MB): in an event loop's thread a large block warns
        (`BlockingCallWarning`); ``await device.aalloc_pinned(n)`` there. A large block is freed on the device's
        worker thread once its last view is gone, whichever thread drops it (unpinning holds a thread too)."""
        self._internal.check_open()
        n, dt = whole("n", n), _plain_dtype(dtype)
        self._check_fits(n, dt, pinned=True)
        slow = self._internal.bd.slow_pinned_bytes
        if slow is not None and n * dt.itemsize >= slow:
            if not _called_by_asyncgpu():
                loops.warn_blocking(
                    f"{self.name}.alloc_pinned() of {n * dt.itemsize:,} bytes",
                    "`await device.aalloc_pinned(n, dtype)`",
                )
            self._internal.worker.start()  # (to free it there later: a finalizer never starts a thread)
        return self._internal.bd.alloc_pinned(n, dt)

    async def aalloc_pinned(self, n: int, dtype: Any = np.float32) -> np.ndarray:
        """`alloc_pinned` on the device's worker thread, for a task: one task per device pins its buffers at the
        same time as the others, and the loop runs on. A checkpoint; arguments are checked here, before anything
        runs. Cancelled while it pins, the allocation finishes first and is freed (see `run`)."""
        self._internal.check_open()
        n, dt = whole("n", n), _plain_dtype(dtype)
        self._check_fits(n, dt, pinned=True)
        return await self._internal.worker.run(self._internal.bd.alloc_pinned, n, dt)

    def _check_fits(self, n: int, dt: np.dtype, *, pinned: bool) -> None:
        """`ValueError` for an allocation larger than all of the memory it would come from (the device's, or the
        host's RAM for ``pinned`` memory). Asks only for 1 GiB or more."""
        nbytes = n * dt.itemsize
        if nbytes < 1 << 30:
            return
        total = _host_ram() if pinned else (self._internal.bd.memory_info() or (0, None))[1]
        if total is not None and nbytes > total:
            where = "host RAM" if pinned else f"memory {self.name} allocates from"
            raise ValueError(
                f"{n:,} elements of {dt} are {nbytes:,} bytes, more than the {total:,} bytes of {where}: allocate less"
            )

    def memory_info(self) -> tuple[int, int] | None:
        """``(free, total)`` bytes of the memory this device allocates from (the GPU's; the host RAM on the host
        backend), or None when the backend cannot tell. Any thread; a driver call on CUDA."""
        self._internal.check_open()
        return self._internal.bd.memory_info()

    # -- the worker thread ---------------------------------------------------------------------------------
    async def run(
        self,
        fn: Callable[..., _T],
        /,
        *args: Any,
        stream: Stream | Any | None = None,
        abandon_on_cancel: bool = False,
    ) -> _T:
        """Call ``fn(stream, *args)`` on this device's worker thread (``asyncgpu-cuda:0-worker``) and return what
        it returns: a launch-heavy step (a framework's training or inference step) launched from a thread of its
        own, so that one task per GPU launches in parallel wherever the GIL is released (in driver calls, in
        torch's C++ dispatch). ``stream`` (default `stream`; a foreign ``__cuda_stream__`` object is adopted) is
        handed in as an asyncgpu `Stream`: for torch, ``torch.cuda.stream(torch.cuda.ExternalStream(
        stream.handle, device=torch.device("cuda", stream.device.index)))``. Keyword arguments of ``fn``: use
        ``functools.partial``, as with ``anyio.to_thread.run_sync``.

        Threads: jobs of one device run one after another, in the order submitted (asyncgpu's own awaitable
        forms queue there too); devices run in parallel. The device's context is current in the thread (CUDA;
        torch's current device is the job's business: ``torch.cuda.set_device``, or tensors' own devices). The
        job runs in a copy of the task's context: launches through asyncgpu's streams are timed by the task's
        open `gpu_timer` scopes. A checkpoint.

        Exceptions raised by ``fn`` propagate here, with their traceback through the worker thread.
        Cancellation (as ``anyio.to_thread.run_sync``): a job that has not started is withdrawn and never runs; a
        running one cannot be interrupted, so the task waits for it to return and then raises the cancellation
        (the result is dropped; an exception it raised is the cancellation's ``__context__``). With
        ``abandon_on_cancel=True`` the task raises at once and the job runs on, its outcome dropped.

        Raises `TypeError` for an ``fn`` that is not a plain callable, `ClosedError` on a closed device, and
        `DeviceMismatchError` for another device's stream, before anything starts."""
        if not callable(fn):
            raise TypeError(
                f"device.run() calls fn(stream, *args) on {self.name}'s worker thread: pass a function (a "
                f"framework's step), not {fn!r}"
            )
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"device.run() calls a plain function on a thread; {fn!r} is async: await it in the task, or pass "
                "the synchronous function that launches the work"
            )
        if not isinstance(abandon_on_cancel, bool):
            raise TypeError(f"abandon_on_cancel is True or False, not {abandon_on_cancel!r}")
        self._internal.check_open()
        s = self.stream_of(stream)
        return await self._internal.worker.run(fn, s, *args, abandon_on_cancel=abandon_on_cancel)

    async def prepare(self, *what: Any, events: int = 0) -> None:
        """Compile and load, on the device's worker thread, what launches need, so that no launch does it on the
        loop's thread (CUDA compiles asyncgpu's kernels with NVRTC once per process, ~0.1-1 s, and loads each
        module into each GPU lazily, at the first launch). Each of ``what`` is a built-in workload by name
        (`WORKLOADS`: ``"spin"``, ``"inc_loop"``, ``"inc_loop_profiled"``) or a kernel, as `Stream.launch` takes
        it; with none, the built-in workloads and the kernels asyncgpu launches by itself (engine primers,
        clock calibration). It also starts the worker thread and the waiter thread, so that the device's first
        awaitable call and first wait pay no thread start (under load, a new thread waits milliseconds for the
        GIL). What is loaded already costs
        nothing more (nothing to load on the host backend). ``events``: also grow the pool of timing events to at
        least that many free ones (a whole number >= 0; CUDA makes an event in ~7 µs, and a burst of records that
        finds the pool empty makes them as it goes, a few at a time, on the loop's thread and the waiter thread
        at once): before a known burst of thousands of records. A checkpoint; cancellation: see `run` (a compile
        in progress finishes; events made are kept)."""
        self._internal.check_open()
        events = whole("events", events, maximum=self._timing_pool.bound(), hint="free timing events to have ready")
        for w in what:
            if isinstance(w, str) and w not in WORKLOADS:
                raise ValueError(
                    f"no built-in workload {w!r}: prepare() takes {', '.join(map(repr, WORKLOADS))} or a kernel "
                    "(what stream.launch() takes)"
                )
            if w is None:
                raise TypeError("prepare() takes workload names or kernels, not None")
        rt = self._internal
        bd = rt.bd
        items = what or (*WORKLOADS[:2], *bd.own_kernels)
        todo = [w for w in items if not bd.is_prepared(w)]
        if not todo and rt.engine.started() and self._timing_pool.free_count() >= max(events, _FIRST_EVENTS):
            rt.worker.start()
            await loops.checkpoint(*loops.current())
            return

        def load() -> None:
            rt.engine.start()  # (its waiter thread: no thread start at the first wait, on the loop's thread)
            self._timing_pool.reserve(max(events, _FIRST_EVENTS))  # (the first launches make no events)
            self._plain_pool.reserve(_FIRST_EVENTS)
            for w in todo:
                if isinstance(w, str):
                    bd.prepare(w)
                else:
                    bd.prepare_kernel(w)

        await self._internal.worker.run(load)

    # -- lifetime -----------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Block the calling thread (GIL released) until all work on this device is done (also other libraries'
        work on its streams). Called from an event loop's thread it warns (`BlockingCallWarning`): ``await
        device.asynchronize()`` there."""
        self._internal.check_open()
        loops.warn_blocking(
            f"{self.name}.synchronize()",
            "`await device.asynchronize()` (or `await anyio.to_thread.run_sync(device.synchronize)`)",
        )
        self._internal.bd.sync_device()

    async def asynchronize(self) -> None:
        """`synchronize` for a task: waits, without a thread, for an event recorded on each of the worker's
        streams (its own and the adopted ones), then finishes on the device's worker thread with the driver's
        device-wide wait, which covers work asyncgpu did not see (other libraries' streams): by then it
        returns at once unless such work is still running. A checkpoint. Cancellation withdraws the waits (a
        device-wide wait already running is abandoned: it ends by itself)."""
        self._internal.check_open()
        fences: list[Event] = []
        try:
            for s in (*self._internal.owned_streams, *self._internal.adopted_streams.values()):
                if (
                    s._internal.capture_hook is None
                ):  # (a stream being captured runs nothing until its graph is launched)
                    fences.append(s.record(timing=False, tag="synchronize"))
            for ev in fences:
                await ev.wait()
        finally:
            for ev in fences:
                ev.release()
        await self._internal.worker.run(self._internal.bd.sync_device, abandon_on_cancel=True)

    @property
    def closed(self) -> bool:
        """Whether the worker is closed (`close`, or opened by the parent process before ``os.fork()``)."""
        return self._internal.closed

    async def aclose(self) -> None:
        """`close` for a task: waits for the work queued on the worker's streams and for the jobs of its worker
        thread without blocking the loop (asyncio, uvloop or trio), then closes. A checkpoint. Cancelled while
        it waits, the worker stays open and nothing is left behind (close it again). Idempotent."""
        kind, loop = loops.current()
        if self._internal.closed:
            await loops.checkpoint(kind, loop)
            return
        fences: list[Event] = []
        try:
            for s in self._internal.owned_streams:
                fences.append(s.record(timing=False, tag="close"))
            for ev in fences:
                await ev.wait()
            if self._internal.worker.busy():
                await self._internal.worker.run(_nothing)  # (after the jobs queued before it)
        except AsyncGPUError:  # a failed device, or closed meanwhile by another task: close it all the same
            pass
        finally:
            for ev in fences:
                ev.release()
        self.close()

    def _work_queued(self) -> bool:
        """Whether a stream of the worker has work left to run, or its worker thread a job (a snapshot; False when
        the device cannot say)."""
        if self._internal.worker.busy():
            return True
        try:
            return not all(self._internal.bd.stream_idle(s._internal.raw) for s in self._internal.owned_streams)
        except AsyncGPUError:
            return False

    def close(self) -> None:
        """Stop the worker: pending waits and the jobs queued for its worker thread fail with `ClosedError` (the
        running job finishes first); streams, events and the threads are released. Work already enqueued still
        runs: on the host backend this waits for it (and warns, `BlockingCallWarning`, in an event loop's thread:
        ``await device.aclose()`` there). Idempotent."""
        rt = self._internal
        if rt.closed:
            return
        if self._work_queued():
            loops.warn_blocking(f"{self.name}.close() with work queued", "`await device.aclose()`")
        rt.worker.close()  # (before the streams go: the running job may launch on them)
        with self._lock:
            if rt.closed:
                return
            rt.closed = True
        if self._on_close is not None:
            self._on_close(self)
        for graph in list(rt.graphs):
            graph.close()
        rt.engine.close()
        rt.release_all()  # (every queued release goes back: the closed pools destroy it)
        for s in (*self._internal.owned_streams, *self._internal.adopted_streams.values()):
            s._internal.release_checks()
        for s in self._internal.owned_streams:
            self._internal.bd.close_stream(s._internal.raw)
        self._internal.bd.close()
        self._timing_pool.close()
        self._plain_pool.close()

    def __repr__(self) -> str:
        return f"<asyncgpu.Device {self.name} {self.description}{' closed' if self._internal.closed else ''}>"


async def refresh_clocks(devices: Any, max_age_s: float) -> None:
    """Re-measure, in worker threads and all at once, the clocks of ``devices`` that a placement with
    ``max_age_s`` would re-measure soon: an async scope's exit then places its events without calibrating on the
    loop's thread (the first calibration in a process compiles its kernels). A failure is left to the placement,
    which reports it. A checkpoint; run it shielded where it must finish."""
    import anyio
    import anyio.to_thread

    limit_s = max(max_age_s - _CLOCK_MARGIN_S, 0.0)
    stale = [d for d in devices if not d.closed and d._internal.clock_stale(limit_s)]
    if not stale:
        return

    async def one(d: Device) -> None:
        try:
            await anyio.to_thread.run_sync(d._internal.calibration, limit_s)
        except AsyncGPUError:
            pass

    async with anyio.create_task_group() as tg:
        for d in stale:
            tg.start_soon(one, d)


def _called_by_asyncgpu() -> bool:
    """Whether the method calling this was called by asyncgpu's own code (a feature's internals): a warning then
    would point the user at a line that is not theirs to change, so the blocking forms say nothing."""
    return sys._getframe(2).f_globals.get("__name__", "").startswith("asyncgpu.")


def _nothing() -> None:
    """A job that marks its place in a worker's queue (`Device.aclose` waits for the jobs before it)."""


def _host_ram() -> int | None:
    """Bytes of physical memory of this machine (None where the platform cannot tell)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _plain_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a numpy dtype that device memory can hold: plain numbers (no Python objects, not empty)."""
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize == 0:
        raise TypeError(f"device memory holds plain numbers, not {dt}: use a numeric dtype such as np.float32")
    return dt
