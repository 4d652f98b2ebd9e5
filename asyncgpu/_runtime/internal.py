"""What the library reaches of a `Device`: its backend, engine, worker thread, event pools and clock state.

A `Device` shows users only what they call; every part of it meant for the library lives here, in the
`DeviceInternal` each device holds (``device._internal``), with plain names. The runtime's other modules (streams,
events, graphs, clock placement) and the features (timing scopes, the kernel history, handoffs, in-kernel records)
go through it; features reach the backend only through its methods, never the `BackendDevice` itself.

Threads: every method may be called from any thread unless it says otherwise.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from collections import deque
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from asyncgpu._backends.contract import BackendDevice
from asyncgpu._base.errors import BackendError, ClosedError
from asyncgpu._runtime import loops
from asyncgpu._runtime.clock import (
    CLOCK_MAX_AGE_S,
    DEFAULT_SAMPLES,
    DRIFT_WINDOW_S,
    ClockCalibration,
    calibrate,
    stale,
)
from asyncgpu._runtime.engine import Engine
from asyncgpu._runtime.event import Event
from asyncgpu._runtime.pool import EventPool
from asyncgpu._runtime.stream import SEQ_BITS
from asyncgpu._runtime.worker import Worker

if TYPE_CHECKING:
    from asyncgpu._runtime.device import Device
    from asyncgpu._runtime.graph import Graph
    from asyncgpu._runtime.stream import Stream

#: What an events-timed launch uses besides the launch itself (by the names `BackendDevice.prepare` takes): the
#: holds' pinned page of words and the engine primers (a kernel compiled once per process).
TIMING_NEEDS = ("hold", "prime")

__all__ = ["RECLAIM_BATCH", "DeviceInternal"]

_first = itemgetter(0)

#: released events a pool that runs out looks at per reclaim: a bound on the caller's thread (tens of thousands at
#: once stall a loop for milliseconds)
RECLAIM_BATCH = 1024


class DeviceInternal:
    """The library's side of one `Device` (``device._internal``): see the module docstring."""

    def __init__(self, device: Device, bd: BackendDevice, *, max_events: int) -> None:
        self.device = device
        self.bd = bd
        self.name = bd.name
        self.backend = bd.backend
        self.closed = False
        self.forked_from: int | None = None  # the parent's pid, in a child process after os.fork() (`mark_forked`)
        self.reclaim_lock = threading.Lock()  # one `reclaim` at a time
        self.engine = Engine(bd)
        self.worker = Worker(f"asyncgpu-{bd.name}-worker", bd.make_current, self.closed_error)
        bd.free_elsewhere = self.worker.give  # large pinned blocks are freed on the worker thread
        grow_soon = self.engine.run_soon if bd.grows_ahead else None  # (costly events: made on the waiter thread)
        self.timing_pool, self.plain_pool = (
            EventPool(
                bd,
                timing=timing,
                max_events=max_events,
                reclaim=self.reclaim,
                grow_soon=grow_soon,
                wait_released=self.wait_released,
            )
            for timing in (True, False)
        )
        # released events the device may not have passed yet: (raw, timing, seq)
        self.returns: deque[tuple[Any, bool, int]] = deque()
        self.owned_streams: list[Stream] = []
        self.adopted_streams: dict[int, Stream] = {}
        self.graphs: weakref.WeakSet[Graph] = weakref.WeakSet()  # graphs captured here, closed with it
        self.mark_seqs = itertools.count()
        self.clock_lock = threading.Lock()
        self.clock: ClockCalibration | None = None
        #: the latest calibrations with a %globaltimer point, the first of them the next one's drift baseline
        #: (`drift_base`)
        self.clock_points: deque[ClockCalibration] = deque()
        self.clock_retired: Any = None  # the previous anchor event, reused one refresh later
        self.clock_events: list[Any] = []  # raw timing events of the calibrations (not from the pools)
        self.kept_events: dict[int, Any] = {}  # id -> raw timing event a feature keeps for a while (see `keep`)
        self.pair_excess_samples: dict[str, deque[float]] = {}  # per kind: raw pair minus CUPTI, ns (latest)
        self._pair_excess_ns: dict[str, float] = {}  # per kind: their 20th percentile, once there are 5

    # -- the backend, for features -------------------------------------------------------------------------
    # (properties give the backend's bound method, looked up at each use as before: a caller binds it once for a
    # loop, and a test or probe that patches the backend still sees every call)
    @property
    def query(self) -> Callable[[Any], bool]:
        """``query(raw)``: whether the device has passed the backend event ``raw``. Never blocks."""
        return self.bd.query

    @property
    def elapsed_ms(self) -> Callable[[Any, Any], float]:
        """``elapsed_ms(start_raw, end_raw)``: milliseconds between two completed timing events."""
        return self.bd.elapsed_ms

    @property
    def sync_event(self) -> Callable[[Any], None]:
        """``sync_event(raw)``: block the calling thread (GIL released) until the device has passed ``raw``."""
        return self.bd.sync_event

    @property
    def inc_loop_profiled(self) -> Callable[..., None]:
        """The backend's profiled ``inc_loop`` launch, the ``fn`` a feature hands to `hooks.launch`."""
        return self.bd.inc_loop_profiled

    def record_raw(self, stream: Stream, raw: Any) -> None:
        """Record the pooled backend event ``raw`` on ``stream`` (a feature's bracket; counted by the caller)."""
        self.bd.record(raw, stream._internal.raw)

    def hold(self, stream: Stream) -> Any:
        """Hold ``stream`` on the device until `release` (`BackendDevice.hold`; None: not held)."""
        return self.bd.hold(stream._internal.raw)

    def release(self, held: Any) -> None:
        self.bd.release(held)

    def memset_raw(self, stream: Stream, ptr: Any, nbytes: int, byte: int) -> None:
        """Set ``nbytes`` at the device pointer ``ptr`` to ``byte``, on ``stream`` (not a timed launch)."""
        self.bd.memset(stream._internal.raw, ptr, nbytes, byte)

    def write_words32(self, stream: Stream, ptr: Any, values: Any) -> None:
        """Write 32-bit ``values`` at ``ptr``, in order on ``stream`` (`BackendDevice.write_words32`)."""
        self.bd.write_words32(stream._internal.raw, ptr, values)

    def copy_to_host_raw(self, stream: Stream, ptr: Any, out: Any, nbytes: int) -> None:
        """Copy ``nbytes`` from ``ptr`` into the pinned array ``out``, on ``stream`` (not a timed launch)."""
        self.bd.copy_to_host(stream._internal.raw, ptr, out, nbytes)

    def inc_loop_profiled_blocks(self, n: int) -> int:
        """The blocks (one in-kernel record lane each) of the profiled ``inc_loop`` over ``n`` elements."""
        return self.bd.inc_loop_profiled_blocks(n)

    def prepare_workload(self, workload: str) -> None:
        """Compile and load a built-in workload (`WORKLOADS`) if it is not yet: blocks the first time."""
        self.bd.prepare(workload)

    def timing_unprepared(self) -> tuple[str, ...]:
        """What an events-timed launch needs that this device has not set up yet (`TIMING_NEEDS` names), which its
        first timed launch would set up on the launching thread. Cheap; any thread."""
        return tuple(w for w in TIMING_NEEDS if w in self.bd.own_kernels and not self.bd.is_prepared(w))

    def prepare_timing(self) -> None:
        """Set up what `timing_unprepared` names: blocks the calling thread (the first time in a process it
        compiles asyncgpu's workload kernels, tens of ms)."""
        for w in self.timing_unprepared():
            self.bd.prepare(w)

    def hold_problem(self) -> str | None:
        """Why launches on this device cannot be held now, or None (`BackendDevice.hold_problem`)."""
        return self.bd.hold_problem()

    def sync_device(self) -> None:
        """Block the calling thread (GIL released) until the device is idle, without `Device.synchronize`'s
        warning."""
        self.bd.sync_device()

    def make_current(self) -> None:
        """Make the device current in the calling thread (CUDA's context; nothing on the host backend)."""
        self.bd.make_current()

    def profiler_start(self) -> None:
        self.bd.profiler_start()

    def profiler_stop(self) -> None:
        self.bd.profiler_stop()

    def workload_shape(self, workload: str, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
        """The grid and block of a built-in workload over ``n`` elements (None: not a grid launch)."""
        return self.bd.workload_shape(workload, n)

    # -- lifetime --------------------------------------------------------------------------------------------
    def check_open(self) -> None:
        """Raise `ClosedError` (naming the fix) if the worker is closed."""
        if self.closed:
            raise self.closed_error()

    def closed_error(self, what: str | None = None) -> ClosedError:
        """The `ClosedError` naming the fix, for this closed worker or for ``what`` of it (``"this event"``)."""
        head = f"{self.name}'s worker" if what is None else f"{what} belongs to {self.name}'s worker, which"
        again = f"open the device again with asyncgpu.device({self.name!r}) and use its new streams and events"
        if self.forked_from is None:
            return ClosedError(f"{head} is closed (device.close() was called): {again}")
        why = (
            f"{head} was opened by the parent process (pid {self.forked_from}) before os.fork(); its threads do "
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
        self.forked_from = parent_pid
        self.closed = True
        self.worker.forget()

    def release_all(self) -> None:
        """The closing device's events: every queued release goes back (the closed pools destroy it), the
        calibrations' and the kept events are destroyed (`Device.close`, before its streams go)."""
        self.reclaim(everything=True)
        with self.clock_lock:
            for raw in (self.clock.anchor if self.clock else None, self.clock_retired, *self.clock_events):
                if raw is not None:
                    self.bd.destroy_event(raw)
            self.clock = self.clock_retired = None
            self.clock_points.clear()
            self.clock_events = []
        for raw in list(self.kept_events.values()):
            self.timing_pool.discard(raw)  # (kept events are the timing pool's)
        self.kept_events.clear()

    # -- clock -------------------------------------------------------------------------------------------------
    def clock_stale(self, max_age_s: float, refresh: bool = False) -> bool:
        """Whether `clock` would measure now (no calibration yet, one older than ``max_age_s``, or ``refresh``).
        Never blocks."""
        return refresh or stale(self.clock, max_age_s)

    def calibration(
        self, max_age_s: float = CLOCK_MAX_AGE_S, refresh: bool = False, samples: int = DEFAULT_SAMPLES
    ) -> ClockCalibration:
        """`clock` without its argument checks: what placements (`asyncgpu._runtime.clock.placement`), `aclock` on
        the worker thread and `refresh_clocks` call. Blocks while it measures; any thread."""
        with self.clock_lock:
            cal = self.clock
            if cal is None or refresh or stale(cal, max_age_s):  # (`cal is None`: for the type checker too)
                self.check_open()
                cal = calibrate(self, samples, previous=self.drift_base())
                if cal.gt_point is not None:
                    self.clock_points.append(cal)
                if self.clock is not None:
                    if self.clock_retired is not None:
                        self.clock_events.append(self.clock_retired)
                    self.clock_retired = self.clock.anchor
                self.clock = cal
            return cal

    def drift_base(self) -> ClockCalibration | None:
        """The calibration the next one measures its drift from (under `clock_lock`): the newest kept that is at
        least `DRIFT_WINDOW_S` old, else the oldest kept; older ones are let go. None before the first."""
        points, now_ns = self.clock_points, time.perf_counter_ns()
        while len(points) > 1 and now_ns - points[1].taken_ns >= DRIFT_WINDOW_S * 1e9:
            points.popleft()
        return points[0] if points else None

    def learn_pair_excess(self, samples_ns: Any, kind: str = "kernel") -> None:
        """Take samples of what a held event pair added to work of ``kind`` (a kind of
        `asyncgpu._runtime.clock.cut_kind`: ``"kernel"``, ``"memset"``, ``"memcpy_d2d_spill"``…) that CUPTI also
        timed (raw pair minus CUPTI's span, ns): the CUPTI source hands them over, and the events source then
        subtracts their 20th percentile for that kind (`pair_excess_ns`) instead of the calibration's. A low
        quantile, not the median: some brackets hold more than the pair's own latency (the first and last of a
        sequence of launches read up to 4 µs more), and that excess is not the pair's.
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
        return self.clock

    # -- events --------------------------------------------------------------------------------------------
    def mark_now(self) -> Event:
        """A timing event at the present moment of the device's clock (scope starts and ends)."""
        self.check_open()
        raw = self.timing_pool.take()
        try:
            key = self.bd.mark(raw)
        except BaseException:
            self.timing_pool.give(raw)
            raise
        return Event._recorded(self, raw, True, key, next(self.mark_seqs), time.perf_counter_ns(), "mark")

    def recycle(self, raw: Any, timing: bool, key: int | None, seq: int = 0) -> None:
        """Give ``raw`` back to its pool once the device can no longer touch it (``key``: the stream it was last
        recorded on, None if never; ``seq``: that record's number on its stream, 0 if unknown). Cheap and
        lock-free: a recorded event waits in a queue that the pool reclaims from when it runs out (`reclaim`),
        never queried here. Any thread (also ``__del__``)."""
        if key is None or self.closed:
            (self.timing_pool if timing else self.plain_pool).give(raw)
        else:
            self.returns.append((raw, timing, seq))

    def recycle_later(self, raw: Any) -> None:
        """Give the recorded timing event ``raw`` back to its pool once the device has passed it."""
        self.returns.append((raw, True, 0))

    def reclaim(self, everything: bool = False, wait: bool = True) -> int:
        """`reclaim_now` once no other reclaim is under way (reclaims take turns: none then holds events another
        has taken off the queue and not given back yet, which `pool_stats` would count in use). ``wait`` False (a
        pool growing ahead, on the waiter thread): 0 at once if another reclaim is under way. Any thread; 0 in a
        child process after ``os.fork()`` (a parent's thread may have held the lock at the fork: never wait)."""
        if self.forked_from is not None or not self.reclaim_lock.acquire(blocking=wait):
            return 0
        try:
            return self.reclaim_now(everything)
        finally:
            self.reclaim_lock.release()

    def wait_released(self, timing: bool) -> int | None:
        """A pool of ``timing`` events at its bound, with nothing the device has passed: wait for the oldest
        release of that kind still ahead of the device and return None (the pool reclaims it), where the calling
        thread may block (a plain thread, a Jupyter cell: as a launch onto a full stream blocks there). Else,
        and in an event loop's thread, return how many such releases there are (0: none, the pool is really
        full) without waiting. A failing device raises `BackendError`."""
        if self.forked_from is not None:
            return 0
        with self.reclaim_lock:  # (a reclaim takes items off the queue and puts the pending ones back)
            ahead = [raw for raw, kind, _ in self.returns if kind == timing]
        if ahead and (loops.current()[0] == loops.THREAD or loops.in_jupyter_kernel()):
            self.bd.sync_event(ahead[0])  # (the GIL released)
            return None
        return len(ahead)

    def reclaim_now(self, everything: bool) -> int:
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
        returns, query = self.returns, self.bd.query
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
                if self.closed or query(recs[-1][1]):
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
                    done = self.closed or query(raw)
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
        return len(self.returns) + surplus

    def trim(self, keep: int = 256) -> None:
        """Reclaim the released events the device has passed and destroy free events beyond ``keep`` per pool: the
        pools shrink back once a burst of work is over (a finished scope calls this). Any thread; blocks
        about 1 µs per destroyed event."""
        self.reclaim(everything=True)
        self.timing_pool.trim(keep)
        self.plain_pool.trim(keep)
