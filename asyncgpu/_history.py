"""Kernel history, as Dr.Jit's ``kernel_history()``: one record per launch made through asyncgpu, cleared on read.

    asyncgpu.kernel_history.enabled = True        # process-wide switch (or: with kernel_history.recording():)
    ...                                           # stream.launch(...), spin_us, inc_loop, memset, copy_to_host
    for r in asyncgpu.kernel_history():           # KernelRecords since the last call, in issue order
        print(r.name, r.device, r.grid, r.duration_ms)

What is recorded: every launch through an asyncgpu `Stream` (``launch`` and the built-in workloads) while the
history is on, from any thread, inside or outside `gpu_timer` scopes. Work captured into a CUDA graph is not
launched at capture time and is not recorded; graph replays are not either.

How: each recorded launch takes a pair of pooled timing events around the launch (two event records of host
cost, no host wait). Durations and absolute starts are resolved when the history is read: the start is placed
on the host time base (``time.perf_counter_ns()``) through the device's clock calibration, and the event pair's
own overhead is taken out of kernel durations, exactly as `gpu_timer` does, so both report the same numbers.
When off, the launch path pays one module-attribute check.

Threads: launches may come from any thread; `kernel_history()` may be called from any thread. With
``wait=True`` (the default) it blocks the calling thread (GIL released) until the recorded launches have run;
from async code, await an event recorded after the work first, or pass ``wait=False``.

Memory: records wait in a queue until read. Every `COMPACT_AT` pending records, those the devices have finished
are resolved in the launch path and their events go back to the pools, so a history that is never read holds
two events per launch still in flight, plus one small record per launch.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, final

from ._errors import AsyncGPUError, NotReadyError

if TYPE_CHECKING:
    from ._device import Device
    from ._stream import Stream

__all__ = ["KernelRecord", "kernel_history"]

#: Read by ``asyncgpu._timer.timed_now`` on every launch: the whole cost of the history when it is off.
ON = False
COMPACT_AT = 8192  #: pending records that trigger resolving the finished ones in the launch path
_LAUNCH_KINDS = ("kernel", "graph")  # kinds whose durations lose the event pair's overhead (as gpu_timer's)

_state_lock = threading.Lock()
_forced = False  # the `enabled` flag
_depth = 0  # open `recording()` blocks
_pending: deque = deque()  # _Pending, appended in issue order from any thread
_done: deque = deque()  # KernelRecords resolved by a compaction, not read yet
_read_lock = threading.Lock()  # one reader or compaction at a time
_seq = itertools.count()
_RELEASE_LAST = 1 << 62  # a release queues behind every real wait of its stream (as asyncgpu._timer's)


@final
@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One launch made through asyncgpu while the history was on."""

    name: str  #: the launch's name (``launch(name=...)``, the kernel's name, or the workload: ``spin``…)
    device: str  #: ``"cuda:0"``, ``"host:1"``
    stream: str  #: the stream's label (``s0``… worker streams, ``x0``… adopted ones)
    kind: str  #: ``kernel``, ``memset`` or ``memcpy``
    grid: tuple[int, int, int] | None  #: launch grid (CUDA kernels); None where there is none (host, copies)
    block: tuple[int, int, int] | None  #: block shape (CUDA kernels); None where there is none
    duration_ms: float | None  #: on the device, in ms; None if its device failed or was closed before the read
    start_ns: int | None  #: absolute start, host time base (``time.perf_counter_ns()``); None if not placed
    issue_ns: int  #: host time at which the launch was issued (same time base)
    seq: int  #: issue order over the whole process

    @property
    def end_ns(self) -> int | None:
        """Absolute end on the host time base, when both start and duration are known."""
        if self.start_ns is None or self.duration_ms is None:
            return None
        return self.start_ns + round(self.duration_ms * 1e6)


class _Pending:
    __slots__ = ("stream", "name", "kind", "grid", "block", "start_raw", "end_raw", "issue_ns", "seq")


def _dim3(value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return (value, 1, 1)
    dims = tuple(int(v) for v in value)
    return (dims + (1, 1, 1))[:3]  # type: ignore[return-value]


def _shape(stream: Stream, fn: Any, args: tuple) -> tuple[Any, Any]:
    """Grid and block of a launch, from what `Stream` hands the backend (see `asyncgpu._stream`)."""
    what = getattr(fn, "__name__", "")
    if what == "launch":  # (raw_stream, kernel, config, kernel_args)
        config = args[2]
        return _dim3(getattr(config, "grid", None)), _dim3(getattr(config, "block", None))
    if stream.device.backend == "cuda":  # the built-in kernels' configurations, as asyncgpu._cuda launches them
        if what == "spin":
            return (1, 1, 1), (1, 1, 1)
        if what == "inc_loop":  # (raw_stream, array, n, iterations)
            from ._cuda import _INC_BLOCK

            return (max(1, (args[2] + _INC_BLOCK - 1) // _INC_BLOCK), 1, 1), (_INC_BLOCK, 1, 1)
    return None, None


# -- the launch path (asyncgpu._timer.timed_now) ---------------------------------------------------------------
def begin(stream: Stream, name: str, kind: str, fn: Any, args: tuple) -> _Pending:
    """Record the start event of a launch about to be made on ``stream``."""
    dev = stream.device
    p = _Pending()
    p.stream, p.name, p.kind = stream, name, kind
    p.grid, p.block = _shape(stream, fn, args)
    raw = dev._pool_t.take()
    try:
        stream._bd.record(raw, stream._raw)
    except BaseException:
        dev._pool_t.give(raw)
        raise
    p.start_raw, p.end_raw, p.issue_ns = raw, None, time.perf_counter_ns()
    return p


def end(p: _Pending) -> None:
    """Record the end event after the launch and queue the record."""
    stream = p.stream
    raw = stream.device._pool_t.take()
    try:
        stream._bd.record(raw, stream._raw)
    except BaseException:
        stream.device._pool_t.give(raw)
        drop(p)
        raise
    p.end_raw = raw
    p.seq = next(_seq)
    _pending.append(p)
    if len(_pending) >= COMPACT_AT:
        _compact()


def drop(p: _Pending) -> None:
    """The launch failed: give the start event back (once the device has passed it)."""
    _release(p)


# -- reading ------------------------------------------------------------------------------------------------
@final
class _KernelHistory:
    """``asyncgpu.kernel_history``: call it for the records since the last call; switch it with `enabled` or
    `recording`. See `asyncgpu._history`."""

    def __call__(self, *, wait: bool = True) -> list[KernelRecord]:
        """The launches recorded since the last call, in issue order, and forget them (cleared on read).

        ``wait=True`` blocks the calling thread (GIL released) until they have run. ``wait=False`` never
        blocks: launches the devices have not finished stay for the next call."""
        with _read_lock:
            pending = _take_all(_pending)
            if wait:
                _wait_for(pending)
            out, keep = _resolve_all(pending)
            _pending.extendleft(reversed(keep))
            out.extend(_take_all(_done))
        out.sort(key=lambda r: r.seq)
        return out

    @property
    def enabled(self) -> bool:
        """Whether launches are being recorded (this flag, or an open `recording` block). Process-wide."""
        return ON

    @enabled.setter
    def enabled(self, value: bool) -> None:
        global _forced
        with _state_lock:
            _forced = bool(value)
            _update()

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record launches inside the block (process-wide, every thread); blocks nest and may overlap across
        threads: the history stays on while any is open or `enabled` is set."""
        global _depth
        with _state_lock:
            _depth += 1
            _update()
        try:
            yield
        finally:
            with _state_lock:
                _depth -= 1
                _update()

    def clear(self) -> None:
        """Forget every record without resolving it (events go back to their pools)."""
        with _read_lock:
            for p in _take_all(_pending):
                _release(p)
            _take_all(_done)

    def __repr__(self) -> str:
        return f"<asyncgpu.kernel_history enabled={ON} pending={len(_pending) + len(_done)}>"


kernel_history = _KernelHistory()


def _update() -> None:
    global ON
    ON = _forced or _depth > 0


def _take_all(queue: deque) -> list:
    out = []
    for _ in range(len(queue)):  # appends from other threads meanwhile stay for the next read
        out.append(queue.popleft())
    return out


def _wait_for(pending: list) -> None:
    """Block until the last recorded launch of each stream has run (streams run in order)."""
    last: dict[int, _Pending] = {}
    for p in pending:
        last[id(p.stream)] = p
    for p in last.values():
        dev = p.stream.device
        if dev.closed:
            continue
        try:
            dev._bd.sync_event(p.end_raw)
        except AsyncGPUError:
            pass  # a failed device: its records come back without times


def _resolve_all(pending: list) -> tuple[list[KernelRecord], list[_Pending]]:
    placements: dict[Device, tuple] = {}
    out, keep = [], []
    for p in pending:
        rec = _resolve(p, placements)
        if rec is None:
            keep.append(p)
        else:
            out.append(rec)
    return out, keep


def _placement(dev: Device) -> tuple:
    """``(anchor raw event, its host ns, rate, event-pair overhead ns)``, or Nones when the clock is unusable."""
    try:
        cal = dev.clock(max_age_s=0.25)
    except AsyncGPUError:
        return None, 0, 1.0, 0.0
    return cal._anchor, cal.host_ns, cal.rate, cal.bracket_overhead_ns


def _resolve(p: _Pending, placements: dict) -> KernelRecord | None:
    """The record of a finished launch (its events released), or None while the device has not finished it."""
    stream = p.stream
    dev, bd = stream.device, stream._bd
    duration_ms = start_ns = None
    if not dev.closed:
        try:
            if not bd.query(p.end_raw):
                return None
            duration_ms = bd.elapsed_ms(p.start_raw, p.end_raw)
            place = placements.get(dev)
            if place is None:
                place = placements[dev] = _placement(dev)
            anchor, host_ns, rate, overhead_ns = place
            if anchor is not None:
                start = host_ns + bd.elapsed_ms(anchor, p.start_raw) * 1e6 * rate
                if p.kind in _LAUNCH_KINDS and overhead_ns > 0:  # as gpu_timer(subtract_overhead=True)
                    cut = min(duration_ms * 1e6, overhead_ns)
                    start += cut / 2
                    duration_ms -= cut / 1e6
                start_ns = round(start)
        except NotReadyError:
            return None
        except AsyncGPUError:
            pass  # a failed or closed device: the record keeps what is known
    _release(p)
    return KernelRecord(p.name, dev.name, stream.label, p.kind, p.grid, p.block, duration_ms, start_ns, p.issue_ns,
                        p.seq)


def _release(p: _Pending) -> None:
    dev, key = p.stream.device, p.stream.handle
    for raw in (p.start_raw, p.end_raw):
        if raw is not None:
            dev._recycle(raw, True, key, _RELEASE_LAST)
    p.start_raw = p.end_raw = None


def _compact() -> None:
    """From the launch path: resolve the records the devices have finished, so their events go back."""
    if not _read_lock.acquire(blocking=False):
        return  # someone is reading or compacting
    try:
        out, keep = _resolve_all(_take_all(_pending))
        _pending.extendleft(reversed(keep))
        _done.extend(out)
    finally:
        _read_lock.release()
