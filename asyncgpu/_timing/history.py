"""Kernel history, as Dr.Jit's ``kernel_history()``: one record per launch made through asyncgpu, cleared on read.

    asyncgpu.kernel_history.enabled = True        # process-wide switch (or: with kernel_history.recording():)
    ...                                           # stream.launch(...), spin_us, inc_loop, memset, copy_to_host
    for r in asyncgpu.kernel_history():           # LaunchRecords since the last call, in issue order
        print(r.name, r.device, r.grid, r.duration_ms)

    with asyncgpu.kernel_history.recording(source="cupti") as rec:   # durations from CUPTI (or "auto")
        ...
    rec.source, rec.source_note                   # which source the block got, and why "auto" fell back

What is recorded: every launch through an asyncgpu `Stream` (``launch`` and the built-in workloads) while the
history is on, from any thread, inside or outside `gpu_timer` scopes. Work captured into a CUDA graph is not
launched at capture time and is not recorded; graph replays are not either.

How: each recorded launch takes a pair of pooled timing events around the launch (two event records of host
cost, no host wait). Durations and absolute starts are resolved when the history is read: the start is placed
on the host time base (``time.perf_counter_ns()``) through the device's clock calibration, and the event pair's
own overhead is taken out of kernel durations, exactly as `gpu_timer` does, so both report the same numbers.
When off, the launch path pays one module-attribute check.

The timing source, as `gpu_timer`'s ``source=``: ``enabled`` and ``recording()`` time with the events above.
``recording(source="cupti")`` (or ``"auto"``) holds the process's CUPTI session while the block is open (CUPTI
has one subscriber per process, so only a block may take it: never the process-wide switch): each launch then
also runs under an external correlation id of the history's own channel (`asyncgpu._backends.cupti`), launches
are not held, and a launch that CUPTI saw takes CUPTI's start and end of its work (placed on the host time base
through CUPTI's clock offset, not trimmed). Leaving such a block waits for the launches recorded so far and
flushes CUPTI (blocks the calling thread: about 0.1 ms per hundred launches). Each `LaunchRecord` says where its
times come from (``source``): a launch CUPTI did not see (recorded outside the block, still running at a
``wait=False`` read, or on the host backend) keeps its event times.

Threads: launches may come from any thread; `kernel_history()` may be called from any thread. With
``wait=True`` (the default) it blocks the calling thread (GIL released) until the recorded launches have run;
from async code, await an event recorded after the work first, or pass ``wait=False``. Turning events timing on
(``enabled = True``, an events ``recording()``) never blocks: it queues what each open device's held launches need
(the holds' page and the engine primers; compiled once per process) on that device's worker thread, as does a
device opened while it is on, so that the first recorded launch does not set it up on its own thread (an event
loop's, say).

Memory: records wait in a queue until read. Every `COMPACT_AT` pending records, those the devices have finished
are resolved in the launch path and their events go back to the pools, so a history that is never read holds
two events per launch still in flight, plus one small record per launch. Launches recorded under CUPTI wait for
the next read or the block's end (CUPTI's flush) before their events go back.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from asyncgpu._backends import cupti
from asyncgpu._base.errors import AsyncGPUError, NotReadyError, ScopeError
from asyncgpu._runtime import hooks, loops, select
from asyncgpu._runtime.clock import Placement, placement

if TYPE_CHECKING:
    from asyncgpu._runtime.device import Device
    from asyncgpu._runtime.stream import Stream

__all__ = ["HistoryRecording", "LaunchRecord", "kernel_history"]

ON = False  #: whether the history is on (its launch observer is installed while it is)
COMPACT_AT = 8192  #: pending records that trigger resolving the finished ones in the launch path

_state_lock = threading.Lock()
_forced = False  # the `enabled` flag
_depth = 0  # open `recording()` blocks
_cupti_depth = 0  # of which hold CUPTI: launches get an external id of the history's channel while there is one
_ROUTER = cupti.Router(cupti.HISTORY)  # external id -> `_Pending`, until its record is made or dropped
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
    source: str = "events"  #: where ``duration_ms`` and ``start_ns`` come from: ``"cupti"`` or ``"events"``

    @property
    def end_ns(self) -> int | None:
        """Absolute end on the host time base, when both start and duration are known."""
        if self.start_ns is None or self.duration_ms is None:
            return None
        return self.start_ns + round(self.duration_ms * 1e6)


class _Pending:
    __slots__ = (
        "stream",
        "name",
        "kind",
        "grid",
        "block",
        "start_raw",
        "end_raw",
        "issue_ns",
        "seq",
        "ext",
        "cupti",
        "span",
    )
    stream: Stream
    name: str
    kind: str
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None
    start_raw: Any
    end_raw: Any
    issue_ns: int
    seq: int
    ext: int  # the CUPTI external id (0: none pushed)
    cupti: list | None  # CUPTI records routed here (`cupti.Router`)
    span: tuple[int, int] | None  # CUPTI's start on the host time base and duration, ns, once flushed


def _dim3(value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return (value, 1, 1)
    dims = tuple(int(v) for v in value)
    return (dims + (1, 1, 1))[:3]  # type: ignore[return-value]


def _shape(stream: Stream, fn: Any, args: tuple) -> tuple[Any, Any]:
    """Grid and block of a launch, from what `Stream` hands the backend (see `asyncgpu._runtime.stream`)."""
    what = getattr(fn, "__name__", "")
    if what == "launch":  # (raw_stream, kernel, config, kernel_args)
        config = args[2]
        return _dim3(getattr(config, "grid", None)), _dim3(getattr(config, "block", None))
    n = args[2] if what == "inc_loop" else 1  # inc_loop: (raw_stream, array, n, iterations)
    shape = stream._internal.dev.workload_shape(what, n) if what in ("spin", "inc_loop") else None
    return shape if shape is not None else (None, None)


# -- the launch path (asyncgpu._runtime.hooks calls the observer) --------------------------------------------------
class _Observer:
    """The history's launch observer (`asyncgpu._runtime.hooks.LaunchObserver`): installed while the history is on.
    Graph replays are not recorded."""

    def launch_begin(self, stream: Stream, name: str, kind: str, fn: Any, args: tuple) -> Any:
        return begin(stream, name, kind, fn, args)

    def launch_end(self, p: _Pending, ok: bool) -> None:
        if p.ext:
            cupti.pop(cupti.HISTORY)
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
    rt = stream._internal.dev
    p = _Pending()
    p.stream, p.name, p.kind = stream, name, kind
    p.grid, p.block = _shape(stream, fn, args)
    raw = rt.timing_pool.take()
    try:
        rt.record_raw(stream, raw)
    except BaseException:
        rt.timing_pool.give(raw)
        raise
    p.start_raw, p.end_raw, p.issue_ns = raw, None, time.perf_counter_ns()
    p.ext, p.cupti, p.span = 0, None, None
    if _cupti_depth:
        p.ext = _ROUTER.tag(p)
        cupti.push(p.ext, cupti.HISTORY)
    return p


def end(p: _Pending) -> None:
    """Record the end event after the launch and queue the record."""
    stream = p.stream
    rt = stream._internal.dev
    raw = rt.timing_pool.take()
    try:
        rt.record_raw(stream, raw)
    except BaseException:
        rt.timing_pool.give(raw)
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
    `recording`. See `asyncgpu._timing.history`."""

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
            if _cupti_depth:
                _collect_cupti()
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

    def recording(self, *, source: str = "events") -> HistoryRecording:
        """Record launches inside the block (process-wide, every thread); blocks nest and may overlap across
        threads: the history stays on while any is open or `enabled` is set. ``source`` as in `gpu_timer`:
        ``"events"`` (the default), ``"cupti"`` (CUPTI's times for the launches it sees while the block is open;
        `SourceError` naming the fix when CUPTI cannot be had) or ``"auto"`` (CUPTI when it can be had, else
        events); ``with ... as rec``: ``rec.source`` and ``rec.source_note`` say which one the block got, and why.
        See `asyncgpu._timing.history` for what leaving a CUPTI block costs."""
        return HistoryRecording(source)

    def clear(self) -> None:
        """Forget every record without resolving it (events go back to their pools)."""
        with _read_lock:
            for p in _take_all(_pending):
                _release(p)
            _take_all(_done)

    def __repr__(self) -> str:
        return f"<asyncgpu.kernel_history enabled={ON} pending={len(_pending) + len(_done)}>"


kernel_history = _KernelHistory()


@final
class HistoryRecording:
    """A ``with kernel_history.recording(source=...) as rec:`` block: use it once. Once entered, `source` says
    where the block's launches get their times (``"cupti"`` or ``"events"``) and `source_note` why ``"auto"``
    fell back to events (or that CUPTI's flush failed when the block ended)."""

    __slots__ = ("_source_req", "_state", "source", "source_note")

    def __init__(self, source: str) -> None:
        cupti.check_source(source)
        self._source_req = source
        self._state = 0  # 0 new, 1 open, 2 done
        self.source = "events"
        self.source_note = ""

    def __enter__(self) -> HistoryRecording:
        global _depth, _cupti_depth
        if self._state:
            raise ScopeError("this kernel_history.recording() block was already used: make a new one for each block")
        self.source, self.source_note = cupti.choose(self._source_req, None, cupti.HISTORY, "this process")
        self._state = 1
        with _state_lock:
            _depth += 1
            _cupti_depth += self.source == "cupti"
            _update()
        return self

    def __exit__(self, *exc: object) -> None:
        global _depth, _cupti_depth
        self._state = 2
        with _state_lock:
            _depth -= 1
            _cupti_depth -= self.source == "cupti"
            _update()
        if self.source == "cupti":  # the block's launches take their CUPTI times before CUPTI is left
            try:
                with _read_lock:
                    _wait_for(list(_pending))
                    self.source_note = _collect_cupti()
            finally:
                cupti.release(cupti.HISTORY)

    def __repr__(self) -> str:
        state = ("new", "open", "done")[self._state]
        return f"<asyncgpu.kernel_history.recording source={self.source!r} {state}>"


_holding = False  # this history asked for holds (`hooks.want_holds`)


def _update() -> None:
    """The launch observer is installed while the history is on; launches are held (on every device) while some
    of it times with events (CUPTI-only blocks need no hold, as a CUPTI scope). When holds start, each open
    device sets up what its held launches need (`_prepare_open_devices`)."""
    global ON, _holding
    ON = _forced or _depth > 0
    if ON:
        hooks.install(_OBSERVER)
    else:
        hooks.uninstall(_OBSERVER)
    hold = _forced or _depth > _cupti_depth
    if hold != _holding:
        hooks.want_holds(1 if hold else -1)
        _holding = hold
        if hold:
            _prepare_open_devices()


def _prepare_open_devices() -> None:
    """Queue the set-up of held launches (the holds' page, the engine primers, compiled once per process) on the
    worker thread of each open device that lacks it, without waiting (`select.prepare_timing_soon`): otherwise a
    device's first recorded launch sets them up on the launching thread, which may be an event loop's (~16 ms,
    4× H100). A device opened while the history holds launches queues its own (`select.device`)."""
    for d in select.opened():
        select.prepare_timing_soon(d)


def _collect_cupti() -> str:
    """Flush the history's CUPTI channel (blocks) and give each recorded launch CUPTI saw its span on the host
    time base. Returns "" or why the flush failed. Under `_read_lock`."""
    offset_ns, failed = _ROUTER.collect()
    if failed:
        return failed
    for p in list(_ROUTER.targets.values()):
        seen = cupti.span(p.cupti or ())
        if seen is not None:
            p.span = (seen[0] - offset_ns, seen[1] - seen[0])
    return ""


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
            dev._internal.sync_event(p.end_raw)
        except AsyncGPUError:
            pass  # a failed device: its records come back without times


def _resolve_all(pending: list, final: bool = True) -> tuple[list[LaunchRecord], list[_Pending]]:
    placements: dict[Device, Placement] = {}
    out, keep = [], []
    for p in pending:
        rec = _resolve(p, placements, final)
        if rec is None:
            keep.append(p)
        else:
            out.append(rec)
    return out, keep


def _resolve(p: _Pending, placements: dict[Device, Placement], final: bool = True) -> LaunchRecord | None:
    """The record of a finished launch (its events released), or None while the device has not finished it, or
    (``final`` False: a compaction) while its CUPTI times may still come."""
    stream = p.stream
    dev = stream.device
    rt = dev._internal
    if p.span is not None:
        cupti_start_ns, cupti_ns = p.span
        _release(p)
        return LaunchRecord(
            p.name,
            dev.name,
            stream.label,
            p.kind,
            p.grid,
            p.block,
            cupti_ns / 1e6,
            cupti_start_ns,
            p.issue_ns,
            p.seq,
            "cupti",
        )
    if p.ext and not final:
        return None
    duration_ms = start_ns = None
    if not dev.closed:
        try:
            if not rt.query(p.end_raw):
                return None
            duration_ms = rt.elapsed_ms(p.start_raw, p.end_raw)
            place = placements.get(dev)
            if place is None:
                place = placements[dev] = placement(dev)
            if place.clock.aligned:
                start, duration_ns = place.trim(p.kind, place.host_ns(p.start_raw), duration_ms * 1e6, p.name)
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
    if p.ext:
        _ROUTER.untag(p.ext)
    dev = p.stream.device
    for raw in (p.start_raw, p.end_raw):
        if raw is not None:
            dev._internal.recycle_later(raw)
    p.start_raw = p.end_raw = None


def _compact() -> None:
    """From the launch path: resolve the records the devices have finished, so their events go back."""
    if not _read_lock.acquire(blocking=False):
        return  # someone is reading or compacting
    try:
        out, keep = _resolve_all(_take_all(_pending), final=False)
        _pending.extendleft(reversed(keep))
        _done.extend(out)
    finally:
        _read_lock.release()
