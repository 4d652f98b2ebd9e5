"""`Device`: the per-device async worker: its streams, its pools of recycled events, its completion engine.

Get one with `asyncgpu.device` / `asyncgpu.devices`; there is one open worker per device and process.

Threads: every method may be called from any thread. The worker owns one waiter thread (started on the first
wait), one worker thread (``asyncgpu-cuda:0-worker``, started by the first job: `run` and the awaitable forms
below; `asyncgpu._runtime.worker`) and, on the host backend, one thread per stream. `close` stops them; pending
waits and queued jobs then fail with `ClosedError`, events in use are destroyed as they come back, and nothing
is leaked. Its events, streams and arrays then raise `ClosedError` naming the fix, as does a worker the parent
process opened, used in a child after ``os.fork()`` (`mark_forked`: its threads do not run there).

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
import itertools
import os
import sys
import threading
import time
import weakref
from collections import deque
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, TypeVar, final

import numpy as np

from asyncgpu._backends.contract import BackendDevice
from asyncgpu._base.checks import number, whole
from asyncgpu._base.errors import AsyncGPUError, BackendError, ClosedError, DeviceMismatchError
from asyncgpu._runtime import loops
from asyncgpu._runtime.clock import CLOCK_MAX_AGE_S, DEFAULT_SAMPLES, ClockCalibration, calibrate
from asyncgpu._runtime.engine import Engine
from asyncgpu._runtime.event import Event
from asyncgpu._runtime.hooks import QUEUE_LIMIT
from asyncgpu._runtime.memory import DeviceArray
from asyncgpu._runtime.pool import EventPool, PoolStats
from asyncgpu._runtime.stream import SEQ_BITS, Stream
from asyncgpu._runtime.worker import Worker

if TYPE_CHECKING:
    from asyncgpu._runtime.graph import Graph

__all__ = ["WORKLOADS", "Device", "refresh_clocks"]

_now = time.perf_counter_ns
_first = itemgetter(0)
_T = TypeVar("_T")

#: the built-in workloads `Device.prepare` takes by name (``inc_loop_profiled``: `asyncgpu.kernel.KernelProfiler`'s)
WORKLOADS = ("spin", "inc_loop", "inc_loop_profiled")
#: an async scope's exit re-measures, off the loop, the clocks that would be older than their scope's limit by then
_CLOCK_MARGIN_S = 0.01

#: released events a pool that runs out looks at per reclaim: a bound on the caller's thread (tens of thousands at
#: once stall a loop for milliseconds)
RECLAIM_BATCH = 1024
_FIRST_EVENTS = 64  #: free events of each pool `prepare` makes sure of: a device's first launches make none


@final
class Device:
    """The async worker of one device (``cuda:0``, ``host:1``…). See the module docstring for threads."""

    bd: BackendDevice
    name: str
    index: int
    backend: str
    description: str
    options: dict[str, int]
    _on_close: Callable[[Device], None] | None
    _closed: bool
    _forked_from: int | None
    _lock: threading.Lock
    _reclaim_lock: threading.Lock
    engine: Engine
    worker: Worker
    timing_pool: EventPool
    plain_pool: EventPool
    _returns: deque[tuple[Any, bool, int]]
    owned_streams: list[Stream]
    adopted_streams: dict[int, Stream]
    graphs: weakref.WeakSet[Graph]
    streams: tuple[Stream, ...]
    stream: Stream
    _mark_seqs: itertools.count[int]
    _clock_lock: threading.Lock
    _clock: ClockCalibration | None
    _clock_ref: ClockCalibration | None
    _clock_retired: Any
    clock_events: list[Any]
    kept_events: dict[int, Any]
    pair_excess_samples: dict[str, deque[float]]
    _pair_excess_ns: dict[str, float]

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
        self.bd = bd
        self.name = bd.name  #: ``"cuda:0"``, ``"host:1"``
        self.index = bd.index
        self.backend = bd.backend  #: ``"cuda"`` or ``"host"``
        self.description = bd.description
        self.options = {"streams": streams, "max_events": max_events}
        self._on_close = on_close
        self._closed = False
        self._forked_from = None  # the parent's pid, in a child process after os.fork() (`mark_forked`)
        self._lock = threading.Lock()
        self._reclaim_lock = threading.Lock()  # one `_reclaim` at a time
        self.engine = Engine(bd)
        self.worker = Worker(f"asyncgpu-{bd.name}-worker", bd.make_current, self.closed_error)
        bd.free_elsewhere = self.worker.give  # large pinned blocks are freed on the worker thread
        grow_soon = self.engine.run_soon if bd.grows_ahead else None  # (costly events: made on the waiter thread)
        self.timing_pool, self.plain_pool = (
            EventPool(
                bd,
                timing=timing,
                max_events=max_events,
                reclaim=self._reclaim,
                grow_soon=grow_soon,
                wait_released=self._wait_released,
            )
            for timing in (True, False)
        )
        self._returns = deque()  # released events the device may not have passed yet: (raw, timing, seq)
        self.owned_streams = []
        self.adopted_streams = {}
        self.graphs = weakref.WeakSet()  # graphs captured here (asyncgpu._graph), closed with it
        self.streams = tuple(self._new_stream() for _ in range(streams))
        self.stream = self.streams[0]  #: the default stream
        self._mark_seqs = itertools.count()
        self._clock_lock = threading.Lock()
        self._clock = None
        self._clock_ref = None  # the oldest with a %globaltimer point: drift baseline
        self._clock_retired = None  # the previous anchor event, reused one refresh later
        self.clock_events = []  # raw timing events of the calibrations (not from the pools)
        self.kept_events = {}  # id -> raw timing event of its pool that a feature keeps for a while (see `keep`)
        self.pair_excess_samples = {}  # per kind: raw event pair minus CUPTI, ns, for the latest launches
        self._pair_excess_ns = {}  # per kind: their 20th percentile, once there are 5
        return self

    # -- clock --------------------------------------------------------------------------------------------
    def clock(
        self, *, refresh: bool = False, max_age_s: float = CLOCK_MAX_AGE_S, samples: int = DEFAULT_SAMPLES
    ) -> ClockCalibration:
        """This device's clock calibration against the host clock (``time.perf_counter_ns()``): the anchor
        that places its events on the host time base, its error bound, the ``%globaltimer`` offset and drift.
        Re-measured when older than ``max_age_s`` (or when ``refresh``): that blocks the calling thread about
        0.1-0.4 ms on a GPU (the first time in a process also compiles the calibration kernels), and warns
        (`BlockingCallWarning`) in an event loop's thread: ``await device.aclock()`` measures on the device's worker
        thread instead. Raises `ClockError` when the device does not answer (see `asyncgpu._runtime.clock`)."""
        self.check_open()
        max_age_s = number("max_age_s", max_age_s, unit="seconds", infinite="never re-measure")
        samples = whole("samples", samples, minimum=1, hint="pings; the best is kept")
        if self.clock_stale(max_age_s, refresh) and not _called_by_asyncgpu():
            loops.warn_blocking(f"{self.name}.clock() (it re-measures)", "`await device.aclock()`")
        return self.calibration(max_age_s=max_age_s, refresh=refresh, samples=samples)

    async def aclock(
        self, *, refresh: bool = False, max_age_s: float = CLOCK_MAX_AGE_S, samples: int = DEFAULT_SAMPLES
    ) -> ClockCalibration:
        """`clock` for a task: a calibration young enough is returned at once; a measurement runs on the device's
        worker thread while the loop runs on. A checkpoint. Cancelled while it measures, the measurement (a
        fraction of a millisecond, bounded by its timeout) finishes first (see `run`)."""
        self.check_open()
        max_age_s = number("max_age_s", max_age_s, unit="seconds", infinite="never re-measure")
        samples = whole("samples", samples, minimum=1, hint="pings; the best is kept")
        if not self.clock_stale(max_age_s, refresh):
            await loops.checkpoint(*loops.current())
            cal = self._clock
            if cal is not None:
                return cal
        return await self.worker.run(self.calibration, max_age_s, refresh, samples)

    def clock_stale(self, max_age_s: float, refresh: bool = False) -> bool:
        """Whether `clock` would measure now (no calibration yet, one older than ``max_age_s``, or ``refresh``).
        Never blocks."""
        cal = self._clock
        return cal is None or refresh or time.perf_counter_ns() - cal.taken_ns > max_age_s * 1e9

    def calibration(
        self, max_age_s: float = CLOCK_MAX_AGE_S, refresh: bool = False, samples: int = DEFAULT_SAMPLES
    ) -> ClockCalibration:
        """`clock` without its argument checks: what placements (`asyncgpu._runtime.clock.placement`), `aclock` on
        the worker thread and `refresh_clocks` call. Blocks while it measures; any thread."""
        with self._clock_lock:
            cal = self._clock
            if cal is None or refresh or time.perf_counter_ns() - cal.taken_ns > max_age_s * 1e9:
                self.check_open()
                cal = calibrate(self, samples, previous=self._clock_ref)
                if self._clock_ref is None and cal.gt_point is not None:
                    self._clock_ref = cal
                if self._clock is not None:
                    if self._clock_retired is not None:
                        self.clock_events.append(self._clock_retired)
                    self._clock_retired = self._clock.anchor
                self._clock = cal
            return cal

    def learn_pair_excess(self, samples_ns: Any, kind: str = "kernel") -> None:
        """Take samples of what a held event pair added to work of ``kind`` (``"kernel"``, ``"memset"``,
        ``"memcpy"``) that CUPTI also timed (raw pair minus CUPTI's span, ns): the CUPTI source hands them over,
        and the events source then subtracts their 20th percentile for that kind (`pair_excess_ns`) instead of
        the calibration's. A low quantile, not the median: some brackets hold more than the pair's own latency
        (the first and last of a sequence of launches read up to 4 µs more), and that excess is not the pair's.
        The latest 255 per kind are kept. Any thread."""
        kept = self.pair_excess_samples.setdefault(kind, deque(maxlen=255))
        kept.extend(float(x) for x in samples_ns)
        if len(kept) >= 5:
            self._pair_excess_ns[kind] = float(np.percentile(list(kept), 20))

    def pair_excess_ns(self, kind: str = "kernel") -> float | None:
        """The 20th percentile of the samples learned for ``kind`` (`learn_pair_excess`), ns; None before there
        are 5. Never blocks."""
        return self._pair_excess_ns.get(kind)

    def forget_pair_excess(self) -> None:
        """Drop what CUPTI scopes taught (`learn_pair_excess`): the calibration's overheads apply again."""
        self.pair_excess_samples.clear()
        self._pair_excess_ns.clear()

    def last_clock(self) -> ClockCalibration | None:
        """The latest clock calibration, however old, without measuring (None before the first). Never blocks."""
        return self._clock

    # -- events -------------------------------------------------------------------------------------------
    def record(self, stream: Stream | Any | None = None, *, timing: bool = True, tag: Any = None) -> Event:
        """Record a pooled event on ``stream`` (default: `stream`; a foreign ``__cuda_stream__`` object is
        adopted) and return it. Release it with ``event.release()`` or a ``with`` block. A record with timing takes
        one of the driver's ~1,000 launch slots of the stream (one without, ``timing=False``, takes none): past
        them the driver blocks the calling thread until the device drains. In an event loop's thread a record
        onto a full stream raises `QueueFullError` instead, taking nothing (``await stream.room()`` first)."""
        if self._closed:
            self.check_open()
        s = self.stream if stream is None else self.stream_of(stream)
        if timing and s.ops - s.done_ops >= QUEUE_LIMIT:
            s.check_room()  # (raises in a loop's thread when the stream is full: before anything is taken)
        pool = self.timing_pool if timing else self.plain_pool
        raw = pool.take()
        try:
            s.bd.record(raw, s.raw)
        except BaseException:
            pool.give(raw)  # not recorded: as it was
            raise
        if timing:  # a timing record takes one of the driver's launch slots (a plain one does not)
            s.ops += 1  # (`Stream.counted`, inlined: this is the hot path of every record)
            if s.ops >= s.next_check:
                s.counted(0)
        ev = Event._recorded(self, raw, timing, s.handle, next(s.seqs), _now(), s.tag if tag is None else tag)
        s.tag = None  # a second record right behind this one has no work of its own before it
        return ev

    def create_event(self, *, timing: bool = True) -> Event:
        """A pooled event that is not recorded yet: record it with ``event.record(stream)``."""
        self.check_open()
        return Event._create(self, (self.timing_pool if timing else self.plain_pool).take(), timing)

    def mark_now(self) -> Event:
        """A timing event at the present moment of the device's clock (scope starts and ends)."""
        self.check_open()
        raw = self.timing_pool.take()
        ev = Event._create(self, raw, True)
        try:
            ev.key = self.bd.mark(raw)
        except BaseException:
            ev.raw = None
            self.timing_pool.give(raw)
            raise
        ev.seq, ev.record_ns, ev.tag = next(self._mark_seqs), time.perf_counter_ns(), "mark"
        return ev

    def pool_stats(self, timing: bool = True) -> PoolStats:
        """Counters of the pool of timing (or non-timing) events, after taking back the released events the
        device has passed (``in_use``: held by callers, or released and still ahead of the device)."""
        self._reclaim(everything=True)
        return (self.timing_pool if timing else self.plain_pool).stats()

    def recycle(self, raw: Any, timing: bool, key: int | None, seq: int = 0) -> None:
        """Give ``raw`` back to its pool once the device can no longer touch it (``key``: the stream it was last
        recorded on, None if never; ``seq``: that record's number on its stream, 0 if unknown). Cheap and
        lock-free: a recorded event waits in a queue that the pool reclaims from when it runs out (`_reclaim`),
        never queried here. Any thread (also ``__del__``)."""
        if key is None or self._closed:
            (self.timing_pool if timing else self.plain_pool).give(raw)
        else:
            self._returns.append((raw, timing, seq))

    def recycle_later(self, raw: Any) -> None:
        """Give the recorded timing event ``raw`` back to its pool once the device has passed it."""
        self._returns.append((raw, True, 0))

    def _reclaim(self, everything: bool = False, wait: bool = True) -> int:
        """`_reclaim_now` once no other reclaim is under way (reclaims take turns: none then holds events another
        has taken off the queue and not given back yet, which `pool_stats` would count in use). ``wait`` False (a
        pool growing ahead, on the waiter thread): 0 at once if another reclaim is under way. Any thread; 0 in a
        child process after ``os.fork()`` (a parent's thread may have held the lock at the fork: never wait)."""
        if self._forked_from is not None or not self._reclaim_lock.acquire(blocking=wait):
            return 0
        try:
            return self._reclaim_now(everything)
        finally:
            self._reclaim_lock.release()

    def _wait_released(self, timing: bool) -> int | None:
        """A pool of ``timing`` events at its bound, with nothing the device has passed: wait for the oldest
        release of that kind still ahead of the device and return None (the pool reclaims it), where the calling
        thread may block (a plain thread, a Jupyter cell: as a launch onto a full stream blocks there). Else,
        and in an event loop's thread, return how many such releases there are (0: none, the pool is really
        full) without waiting. A failing device raises `BackendError`."""
        if self._forked_from is not None:
            return 0
        with self._reclaim_lock:  # (a reclaim takes items off the queue and puts the pending ones back)
            ahead = [raw for raw, kind, _ in self._returns if kind == timing]
        if ahead and (loops.current()[0] == loops.THREAD or loops.in_jupyter_kernel()):
            self.bd.sync_event(ahead[0])  # (the GIL released)
            return None
        return len(ahead)

    def _reclaim_now(self, everything: bool) -> int:
        """Give back to their pools the released events the device has passed, oldest first: up to the first
        one still pending, or (``everything``: a pool at its bound, a trim) all of them. Returns how many. A pool
        that runs out looks at the oldest `RECLAIM_BATCH` only: a take on a loop's thread never pays for a whole
        burst's releases at once (the rest come back at later takes, a pool at its bound or a trim).

        A stream passes its records in order, so one query of each stream's newest released record (by its
        ``seq``, see `asyncgpu._runtime.stream.SEQ_BITS`) answers for all its older ones, and a binary search finds
        the last one passed on a stream still running: a reclaim costs one query per stream (log2 of its releases
        for a running one), not one per event. (Two threads recording on one stream at once may number their
        records out of the device's order; an event reclaimed that way is at worst re-recorded while its old
        record is pending, which the driver allows, and nobody waits on a released event.)"""
        returns, query = self._returns, self.bd.query
        taken: list[tuple[Any, bool, int]] = []
        for _ in range(len(returns) if everything else min(len(returns), RECLAIM_BATCH)):
            try:
                taken.append(returns.popleft())
            except IndexError:
                break
        per_stream: dict[int, list[tuple[int, Any]]] = {}  # stream id -> its releases here: (seq, raw)
        for raw, _, seq in taken:
            sid = seq >> SEQ_BITS
            if sid:
                per_stream.setdefault(sid, []).append((seq, raw))
        passed: dict[int, int] = {}  # stream id -> a seq the device has passed
        try:
            for sid, recs in per_stream.items():
                recs.sort(key=_first)
                if self._closed or query(recs[-1][1]):
                    passed[sid] = recs[-1][0]
                    continue
                lo, hi = -1, len(recs) - 1  # the newest is pending: the last one passed, in log2(n) queries
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if query(recs[mid][1]):
                        lo = mid
                    else:
                        hi = mid
                if lo >= 0:
                    passed[sid] = recs[lo][0]
        except BackendError:
            pass  # (the loop below meets it again)
        pending: list[tuple[Any, bool, int]] = []
        given = 0
        for item in taken:
            raw, timing, seq = item
            if seq <= passed.get(seq >> SEQ_BITS, -1):
                done = True
            elif pending and not everything:
                pending.append(item)
                continue
            else:
                try:
                    done = self._closed or query(raw)
                except BackendError:  # a failed device: never reuse its events
                    (self.timing_pool if timing else self.plain_pool).discard(raw)
                    continue
            if done:
                (self.timing_pool if timing else self.plain_pool).give(raw)
                given += 1
            else:
                pending.append(item)
        returns.extendleft(reversed(pending))
        return given

    def keep(self, raw: Any, kept: bool = True) -> None:
        """A feature keeps the pooled timing event ``raw`` as a time reference beyond one activity (``kept``) or
        gives it back (``kept=False``: to the pool, the device must have passed it). Kept events are destroyed
        when the device closes. Any thread."""
        if kept:
            self.kept_events[id(raw)] = raw
        elif self.kept_events.pop(id(raw), None) is not None:  # (else `close` has destroyed it already)
            self.timing_pool.give(raw)

    def trim_backlog(self, keep: int = 256) -> int:
        """How many releases and surplus free events a `trim` to ``keep`` would go through (a snapshot). Hot."""
        surplus = max(self.timing_pool.free_count() - keep, 0) + max(self.plain_pool.free_count() - keep, 0)
        return len(self._returns) + surplus

    def trim(self, keep: int = 256) -> None:
        """Reclaim the released events the device has passed and destroy free events beyond ``keep`` per pool: the
        pools shrink back once a burst of work is over (a finished scope calls this). Any thread; blocks
        about 1 µs per destroyed event."""
        self._reclaim(everything=True)
        self.timing_pool.trim(keep)
        self.plain_pool.trim(keep)

    # -- streams ------------------------------------------------------------------------------------------
    def _new_stream(self) -> Stream:
        s = Stream._create(self, self.bd.create_stream(), f"s{len(self.owned_streams)}", True)
        self.owned_streams.append(s)
        return s

    def create_stream(self) -> Stream:
        """A new non-blocking stream owned by this worker (closed with it)."""
        self.check_open()
        with self._lock:
            return self._new_stream()

    def adopt_stream(self, obj: Any) -> Stream:
        """Wrap a framework's stream (any object with ``__cuda_stream__``: torch, CuPy, cuda.core) so asyncgpu
        can record and launch on it. asyncgpu never closes an adopted stream."""
        self.check_open()
        if isinstance(obj, Stream):
            if obj.device is not self:
                raise DeviceMismatchError(f"that stream belongs to {obj.device.name}, not {self.name}")
            return obj
        raw = self.bd.adopt_stream(obj)
        handle = self.bd.stream_handle(raw)
        with self._lock:
            s = self.adopted_streams.get(handle)
            if s is None:
                s = self.adopted_streams[handle] = Stream._create(self, raw, f"x{len(self.adopted_streams)}", False)
            return s

    def stream_of(self, stream: Any) -> Stream:
        if stream is None:
            return self.stream
        if isinstance(stream, Stream):
            if stream.device is not self:
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
        self.check_open()
        n, dt = whole("n", n), _plain_dtype(dtype)
        self._check_fits(n, dt, pinned=False)
        s = self.stream_of(stream)
        slow = self.bd.slow_alloc_bytes
        if slow is not None and n * dt.itemsize >= slow and not _called_by_asyncgpu():
            loops.warn_blocking(f"{self.name}.alloc() of {n * dt.itemsize:,} bytes", "`await device.aalloc(n, dtype)`")
        return DeviceArray._create(self, self.bd.alloc(n, dt, s.raw), n, dt)

    async def aalloc(self, n: int, dtype: Any = np.float32, *, stream: Stream | None = None) -> DeviceArray:
        """`alloc` on the device's worker thread, for a task: the loop runs on while the memory is allocated. A
        checkpoint; arguments are checked here, before anything runs. Cancellation: see `run`."""
        self.check_open()
        n, dt = whole("n", n), _plain_dtype(dtype)
        self._check_fits(n, dt, pinned=False)
        s = self.stream_of(stream)
        buf = await self.worker.run(self.bd.alloc, n, dt, s.raw)
        return DeviceArray._create(self, buf, n, dt)

    def alloc_pinned(self, n: int, dtype: Any = np.float32) -> np.ndarray:
        """A numpy array of ``n`` elements in page-locked host memory (on the host backend, memory made resident
        at once, as pinning does); ``n`` and ``dtype`` as in `alloc`. Pinning holds the calling thread for the
        whole block (CUDA: about 0.5 ms per MB): in an event loop's thread a large block warns
        (`BlockingCallWarning`); ``await device.aalloc_pinned(n)`` there. A large block is freed on the device's
        worker thread once its last view is gone, whichever thread drops it (unpinning holds a thread too)."""
        self.check_open()
        n, dt = whole("n", n), _plain_dtype(dtype)
        self._check_fits(n, dt, pinned=True)
        slow = self.bd.slow_pinned_bytes
        if slow is not None and n * dt.itemsize >= slow:
            if not _called_by_asyncgpu():
                loops.warn_blocking(
                    f"{self.name}.alloc_pinned() of {n * dt.itemsize:,} bytes",
                    "`await device.aalloc_pinned(n, dtype)`",
                )
            self.worker.start()  # (to free it there later: a finalizer never starts a thread)
        return self.bd.alloc_pinned(n, dt)

    async def aalloc_pinned(self, n: int, dtype: Any = np.float32) -> np.ndarray:
        """`alloc_pinned` on the device's worker thread, for a task: one task per device pins its buffers at the
        same time as the others, and the loop runs on. A checkpoint; arguments are checked here, before anything
        runs. Cancelled while it pins, the allocation finishes first and is freed (see `run`)."""
        self.check_open()
        n, dt = whole("n", n), _plain_dtype(dtype)
        self._check_fits(n, dt, pinned=True)
        return await self.worker.run(self.bd.alloc_pinned, n, dt)

    def _check_fits(self, n: int, dt: np.dtype, *, pinned: bool) -> None:
        """`ValueError` for an allocation larger than all of the memory it would come from (the device's, or the
        host's RAM for ``pinned`` memory). Asks only for 1 GiB or more."""
        nbytes = n * dt.itemsize
        if nbytes < 1 << 30:
            return
        total = _host_ram() if pinned else (self.bd.memory_info() or (0, None))[1]
        if total is not None and nbytes > total:
            where = "host RAM" if pinned else f"memory {self.name} allocates from"
            raise ValueError(
                f"{n:,} elements of {dt} are {nbytes:,} bytes, more than the {total:,} bytes of {where}: allocate less"
            )

    def memory_info(self) -> tuple[int, int] | None:
        """``(free, total)`` bytes of the memory this device allocates from (the GPU's; the host RAM on the host
        backend), or None when the backend cannot tell. Any thread; a driver call on CUDA."""
        self.check_open()
        return self.bd.memory_info()

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
        self.check_open()
        s = self.stream_of(stream)
        return await self.worker.run(fn, s, *args, abandon_on_cancel=abandon_on_cancel)

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
        self.check_open()
        events = whole("events", events, maximum=self.timing_pool.bound(), hint="free timing events to have ready")
        for w in what:
            if isinstance(w, str) and w not in WORKLOADS:
                raise ValueError(
                    f"no built-in workload {w!r}: prepare() takes {', '.join(map(repr, WORKLOADS))} or a kernel "
                    "(what stream.launch() takes)"
                )
            if w is None:
                raise TypeError("prepare() takes workload names or kernels, not None")
        bd = self.bd
        items = what or (*WORKLOADS[:2], *bd.own_kernels)
        todo = [w for w in items if not bd.is_prepared(w)]
        if not todo and self.engine.started() and self.timing_pool.free_count() >= max(events, _FIRST_EVENTS):
            self.worker.start()
            await loops.checkpoint(*loops.current())
            return

        def load() -> None:
            self.engine.start()  # (its waiter thread: no thread start at the first wait, on the loop's thread)
            self.timing_pool.reserve(max(events, _FIRST_EVENTS))  # (the first launches make no events)
            self.plain_pool.reserve(_FIRST_EVENTS)
            for w in todo:
                if isinstance(w, str):
                    bd.prepare(w)
                else:
                    bd.prepare_kernel(w)

        await self.worker.run(load)

    # -- lifetime -----------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Block the calling thread (GIL released) until all work on this device is done (also other libraries'
        work on its streams). Called from an event loop's thread it warns (`BlockingCallWarning`): ``await
        device.asynchronize()`` there."""
        self.check_open()
        loops.warn_blocking(
            f"{self.name}.synchronize()",
            "`await device.asynchronize()` (or `await anyio.to_thread.run_sync(device.synchronize)`)",
        )
        self.bd.sync_device()

    async def asynchronize(self) -> None:
        """`synchronize` for a task: waits, without a thread, for an event recorded on each of the worker's
        streams (its own and the adopted ones), then finishes on the device's worker thread with the driver's
        device-wide wait, which covers work asyncgpu did not see (other libraries' streams): by then it
        returns at once unless such work is still running. A checkpoint. Cancellation withdraws the waits (a
        device-wide wait already running is abandoned: it ends by itself)."""
        self.check_open()
        fences: list[Event] = []
        try:
            for s in (*self.owned_streams, *self.adopted_streams.values()):
                if s.capture_hook is None:  # (a stream being captured runs nothing until its graph is launched)
                    fences.append(s.record(timing=False, tag="synchronize"))
            for ev in fences:
                await ev.wait()
        finally:
            for ev in fences:
                ev.release()
        await self.worker.run(self.bd.sync_device, abandon_on_cancel=True)

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """`close` for a task: waits for the work queued on the worker's streams and for the jobs of its worker
        thread without blocking the loop (asyncio, uvloop or trio), then closes. A checkpoint. Cancelled while
        it waits, the worker stays open and nothing is left behind (close it again). Idempotent."""
        kind, loop = loops.current()
        if self._closed:
            await loops.checkpoint(kind, loop)
            return
        fences: list[Event] = []
        try:
            for s in self.owned_streams:
                fences.append(s.record(timing=False, tag="close"))
            for ev in fences:
                await ev.wait()
            if self.worker.busy():
                await self.worker.run(_nothing)  # (after the jobs queued before it)
        except AsyncGPUError:  # a failed device, or closed meanwhile by another task: close it all the same
            pass
        finally:
            for ev in fences:
                ev.release()
        self.close()

    def _work_queued(self) -> bool:
        """Whether a stream of the worker has work left to run, or its worker thread a job (a snapshot; False when
        the device cannot say)."""
        if self.worker.busy():
            return True
        try:
            return not all(self.bd.stream_idle(s.raw) for s in self.owned_streams)
        except AsyncGPUError:
            return False

    def check_open(self) -> None:
        """Raise `ClosedError` (naming the fix) if the worker is closed."""
        if self._closed:
            raise self.closed_error()

    def closed_error(self, what: str | None = None) -> ClosedError:
        """The `ClosedError` naming the fix, for this closed worker or for ``what`` of it (``"this event"``)."""
        head = f"{self.name}'s worker" if what is None else f"{what} belongs to {self.name}'s worker, which"
        again = f"open the device again with asyncgpu.device({self.name!r}) and use its new streams and events"
        if self._forked_from is None:
            return ClosedError(f"{head} is closed (device.close() was called): {again}")
        why = (
            f"{head} was opened by the parent process (pid {self._forked_from}) before os.fork(); its threads do "
            f"not run in this process (pid {os.getpid()})"
        )
        if self.backend == "cuda":
            return ClosedError(
                f"{why}, and CUDA cannot be used in a process forked after CUDA was initialized: start worker "
                "processes with the 'spawn' method (multiprocessing.get_context('spawn'), "
                "torch.multiprocessing.spawn) and open devices in them"
            )
        return ClosedError(f"{why}: {again} in this process")

    def mark_forked(self, parent_pid: int) -> None:
        """In a child process right after ``os.fork()`` (`asyncgpu._runtime.select` calls it): this worker's threads
        and backend state belong to the parent. Mark it closed, so that every use raises `ClosedError` naming
        the fix instead of waiting for ever; touch nothing else (a parent thread may have held its locks)."""
        self._forked_from = parent_pid
        self._closed = True
        self.worker.forget()

    def close(self) -> None:
        """Stop the worker: pending waits and the jobs queued for its worker thread fail with `ClosedError` (the
        running job finishes first); streams, events and the threads are released. Work already enqueued still
        runs: on the host backend this waits for it (and warns, `BlockingCallWarning`, in an event loop's thread:
        ``await device.aclose()`` there). Idempotent."""
        if self._closed:
            return
        if self._work_queued():
            loops.warn_blocking(f"{self.name}.close() with work queued", "`await device.aclose()`")
        self.worker.close()  # (before the streams go: the running job may launch on them)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._on_close is not None:
            self._on_close(self)
        for graph in list(self.graphs):
            graph.close()
        self.engine.close()
        self._reclaim(everything=True)  # closed: every queued release goes back (and the closed pools destroy it)
        with self._clock_lock:
            for raw in (self._clock.anchor if self._clock else None, self._clock_retired, *self.clock_events):
                if raw is not None:
                    self.bd.destroy_event(raw)
            self._clock = self._clock_ref = self._clock_retired = None
            self.clock_events = []
        for raw in list(self.kept_events.values()):
            self.timing_pool.discard(raw)  # (kept events are the timing pool's)
        self.kept_events.clear()
        for s in (*self.owned_streams, *self.adopted_streams.values()):
            s.release_checks()
        for s in self.owned_streams:
            self.bd.close_stream(s.raw)
        self.bd.close()
        self.timing_pool.close()
        self.plain_pool.close()

    def __repr__(self) -> str:
        return f"<asyncgpu.Device {self.name} {self.description}{' closed' if self._closed else ''}>"


async def refresh_clocks(devices: Any, max_age_s: float) -> None:
    """Re-measure, in worker threads and all at once, the clocks of ``devices`` that a placement with
    ``max_age_s`` would re-measure soon: an async scope's exit then places its events without calibrating on the
    loop's thread (the first calibration in a process compiles its kernels). A failure is left to the placement,
    which reports it. A checkpoint; run it shielded where it must finish."""
    import anyio
    import anyio.to_thread

    limit_s = max(max_age_s - _CLOCK_MARGIN_S, 0.0)
    stale = [d for d in devices if not d.closed and d.clock_stale(limit_s)]
    if not stale:
        return

    async def one(d: Device) -> None:
        try:
            await anyio.to_thread.run_sync(d.calibration, limit_s)
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
