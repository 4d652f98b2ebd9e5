"""Kernel history, as Dr.Jit's ``kernel_history()``: one record per launch made through asyncgpu, cleared on read.

    asyncgpu.kernel_history.enabled = True        # process-wide switch (or: with kernel_history.recording():)
    ...                                           # stream.launch(...), spin_us, inc_loop, memset, copy_to_host
    for r in asyncgpu.kernel_history():           # LaunchRecords since the last call, in issue order
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

from ._core import hooks, loops
from ._core.clock import Placement, placement
from ._errors import AsyncGPUError, NotReadyError

if TYPE_CHECKING:
    from ._core.device import Device
    from ._core.stream import Stream

__all__ = ["LaunchRecord", "kernel_history"]

ON = False  #: whether the history is on (its launch observer is installed while it is)
COMPACT_AT = 8192  #: pending records that trigger resolving the finished ones in the launch path

_state_lock = threading.Lock()
_forced = False  # the `enabled` flag
_depth = 0  # open `recording()` blocks
_pending: deque = deque()  # _Pending, appended in issue order from any thread
_done: deque = deque()  # KernelRecords resolved by a compaction, not read yet
_read_lock = threading.Lock()  # one reader or compaction at a time
_seq = itertools.count()


@final
@dataclass(frozen=True, slots=True)
class LaunchRecord:
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
    stream: Stream
    name: str
    kind: str
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None
    start_raw: Any
    end_raw: Any
    issue_ns: int
    seq: int


def _dim3(value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return (value, 1, 1)
    dims = tuple(int(v) for v in value)
    return (dims + (1, 1, 1))[:3]  # type: ignore[return-value]


def _shape(stream: Stream, fn: Any, args: tuple) -> tuple[Any, Any]:
    """Grid and block of a launch, from what `Stream` hands the backend (see `asyncgpu._core.stream`)."""
    what = getattr(fn, "__name__", "")
    if what == "launch":  # (raw_stream, kernel, config, kernel_args)
        config = args[2]
        return _dim3(getattr(config, "grid", None)), _dim3(getattr(config, "block", None))
    n = args[2] if what == "inc_loop" else 1  # inc_loop: (raw_stream, array, n, iterations)
    shape = stream.device.bd.workload_shape(what, n) if what in ("spin", "inc_loop") else None
    return shape if shape is not None else (None, None)


# -- the launch path (asyncgpu._core.hooks calls the observer) --------------------------------------------------
class _Observer:
    """The history's launch observer (`asyncgpu._core.hooks.LaunchObserver`): installed while the history is on.
    Graph replays are not recorded."""

    def launch_begin(self, stream: Stream, name: str, kind: str, fn: Any, args: tuple) -> Any:
        return begin(stream, name, kind, fn, args)

    def launch_end(self, p: _Pending, ok: bool) -> None:
        if ok:
            end(p)
        else:
            drop(p)

    def wanted_kinds(self, device: Device, kinds: frozenset[str]) -> frozenset[str]:
        return frozenset()

    def adopt(self, stream: Stream, name: str, kind: str, start_raw: Any, end_raw: Any, replay: Any = None) -> bool:
        return False

    def correlate(self, stream: Stream) -> Any:
        return None

    def uncorrelate(self, token: Any) -> None:
        return None

    def attach(self, device: Device, key: Any, make_layer: Any, fence: Any) -> list[Any]:
        return []


_OBSERVER = _Observer()


def begin(stream: Stream, name: str, kind: str, fn: Any, args: tuple) -> _Pending:
    """Record the start event of a launch about to be made on ``stream``."""
    dev = stream.device
    p = _Pending()
    p.stream, p.name, p.kind = stream, name, kind
    p.grid, p.block = _shape(stream, fn, args)
    raw = dev.timing_pool.take()
    try:
        stream.bd.record(raw, stream.raw)
    except BaseException:
        dev.timing_pool.give(raw)
        raise
    p.start_raw, p.end_raw, p.issue_ns = raw, None, time.perf_counter_ns()
    return p


def end(p: _Pending) -> None:
    """Record the end event after the launch and queue the record."""
    stream = p.stream
    raw = stream.device.timing_pool.take()
    try:
        stream.bd.record(raw, stream.raw)
    except BaseException:
        stream.device.timing_pool.give(raw)
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

    def __call__(self, *, wait: bool = True) -> list[LaunchRecord]:
        """The launches recorded since the last call, in issue order, and forget them (cleared on read).

        ``wait=True`` blocks the calling thread (GIL released) until they have run (in an event loop's thread,
        with records pending, it warns: `BlockingCallWarning`). ``wait=False`` never blocks: launches the devices
        have not finished stay for the next call."""
        if not isinstance(wait, bool):
            raise TypeError(f"wait is True (block until the launches have run) or False, not {wait!r}")
        if wait and _pending:
            loops.warn_blocking(
                "kernel_history() (it waits for the launches it reports)",
                "await an event recorded after the work, then call kernel_history(wait=False)",
            )
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
        if not isinstance(value, bool):
            raise TypeError(f"kernel_history.enabled is True or False, not {value!r}")
        with _state_lock:
            _forced = value
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


_holding = False  # this history asked for holds (`hooks.want_holds`)


def _update() -> None:
    global ON, _holding
    ON = _forced or _depth > 0
    if ON:
        hooks.install(_OBSERVER)
    else:
        hooks.uninstall(_OBSERVER)
    if ON != _holding:
        hooks.want_holds(1 if ON else -1)
        _holding = ON


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
            dev.bd.sync_event(p.end_raw)
        except AsyncGPUError:
            pass  # a failed device: its records come back without times


def _resolve_all(pending: list) -> tuple[list[LaunchRecord], list[_Pending]]:
    placements: dict[Device, Placement] = {}
    out, keep = [], []
    for p in pending:
        rec = _resolve(p, placements)
        if rec is None:
            keep.append(p)
        else:
            out.append(rec)
    return out, keep


def _resolve(p: _Pending, placements: dict[Device, Placement]) -> LaunchRecord | None:
    """The record of a finished launch (its events released), or None while the device has not finished it."""
    stream = p.stream
    dev, bd = stream.device, stream.bd
    duration_ms = start_ns = None
    if not dev.closed:
        try:
            if not bd.query(p.end_raw):
                return None
            duration_ms = bd.elapsed_ms(p.start_raw, p.end_raw)
            place = placements.get(dev)
            if place is None:
                place = placements[dev] = placement(dev)
            if place.clock.aligned:
                start, duration_ns = place.trim(p.kind, place.host_ns(p.start_raw), duration_ms * 1e6)
                start_ns, duration_ms = round(start), duration_ns / 1e6
        except NotReadyError:
            return None
        except AsyncGPUError:
            pass  # a failed or closed device: the record keeps what is known
    _release(p)
    return LaunchRecord(
        p.name, dev.name, stream.label, p.kind, p.grid, p.block, duration_ms, start_ns, p.issue_ns, p.seq
    )


def _release(p: _Pending) -> None:
    dev, key = p.stream.device, p.stream.handle
    for raw in (p.start_raw, p.end_raw):
        if raw is not None:
            dev.recycle_later(raw, key)
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
