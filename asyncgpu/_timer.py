"""The timing scope: ``async with gpu_timer(devices) as t:`` times the work enqueued on every device inside it.

Inside a scope, each launch through an asyncgpu `Stream` (and each ``with t.activity(...)`` block) records a
pair of pooled timing events on its stream: no host wait, about two event records of host cost. When the
scope exits it waits for its devices (asynchronously: the loop keeps running) and turns the events into
`ActivityRecord` s; the events go back to their pools.

Nesting: scopes live in a context variable, so they nest per task (child tasks inherit the enclosing scopes).
An activity is recorded once and appears in every open scope of the context that covers its device.

Cancellation and errors: when the body raises, the scope still waits for the work already enqueued and keeps
its records. When the scope is cancelled (or the wait at exit is), it does not wait: records of work the
device has not finished have ``duration_ms = None``, and their events return to the pool once the device
passes them.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Callable, Iterable, final

import numpy as np

from . import _history, _nvtx
from ._errors import AsyncGPUError, NotReadyError, ScopeError
from ._records import KIND_CODES, KINDS, ActivityRecord, DeviceClock, HostRange, Timeline

if TYPE_CHECKING:
    from ._device import Device
    from ._stream import Stream

__all__ = ["ActivityRecord", "KINDS", "Timer", "gpu_timer", "run_timed", "timing_begin", "timing_end", "timing_print"]

_SCOPES: ContextVar[tuple] = ContextVar("asyncgpu_scopes", default=())
_THREAD_SCOPES: tuple = ()  # scopes opened with all_threads=True: they also take work of threads with no scope
_THREAD_SCOPES_LOCK = threading.Lock()
_NEW, _OPEN, _DONE = 0, 1, 2
_RELEASE_LAST = 1 << 62  # a deferred release queues behind every real wait of its stream

class _Activity:
    __slots__ = ("device", "stream", "name", "kind", "start_raw", "end_raw", "refs", "duration_ms", "nvtx_id",
                 "placed")


def _owners(scopes: tuple, device: Device, kind: str) -> list:
    return [s for s in scopes if s._state == _OPEN and device in s._devset and kind in s._kinds]


def _begin(stream: Stream, name: str, kind: str, owners: list) -> _Activity:
    dev = stream.device
    raw = dev._pool_t.take()
    stream._bd.record(raw, stream._raw)
    act = _Activity()
    act.device, act.stream, act.name, act.kind = dev, stream, name, kind
    act.start_raw, act.end_raw, act.refs, act.duration_ms = raw, None, len(owners), None
    act.nvtx_id = act.placed = None
    for scope in owners:
        scope._acts.append(act)
        if scope._nvtx and act.nvtx_id is None:
            act.nvtx_id = _nvtx.start(name, kind)
    return act


def _end(act: _Activity) -> None:
    stream = act.stream
    raw = act.device._pool_t.take()
    stream._bd.record(raw, stream._raw)
    act.end_raw = raw
    if act.nvtx_id is not None:
        _nvtx.end(act.nvtx_id)


def adopt_activity(stream: Stream, name: str, kind: str, start_raw: Any, end_raw: Any) -> bool:
    """Hand a pair of pooled timing events, already enqueued on ``stream`` by someone else (a graph's event
    nodes), to every open scope of this context that covers the stream's device and the kind. Returns False
    (and takes nothing) when no scope wants it: the caller then keeps the events."""
    scopes = _SCOPES.get() or _THREAD_SCOPES
    owners = _owners(scopes, stream.device, kind) if scopes else None
    if not owners:
        return False
    act = _Activity()
    act.device, act.stream, act.name, act.kind = stream.device, stream, name, kind
    act.start_raw, act.end_raw, act.refs, act.duration_ms = start_raw, end_raw, len(owners), None
    act.nvtx_id = act.placed = None
    for scope in owners:
        scope._acts.append(act)
    return True


def attach_layer(device: Device, layer: Any) -> int:
    """Hand ``layer`` (an object with ``trace_events(timeline, origin_ns, first_tid) -> (events, tids_used)``, see
    `asyncgpu._export`: in-kernel records, handoffs) to every open scope of this context (or, with none, of ``all_threads`` scopes) that covers
    ``device``; it goes into the scope's ``timeline.extra["layers"]`` and the trace. Returns how many took it."""
    scopes = open_scopes(device)
    for scope in scopes:
        scope._layers.append(layer)
    return len(scopes)


def open_scopes(device: Device) -> list[Timer]:
    """The open scopes of this context (or, with none, the ``all_threads`` scopes) that cover ``device``."""
    scopes = _SCOPES.get() or _THREAD_SCOPES
    return [s for s in scopes if s._state == _OPEN and device in s._devset] if scopes else []


def scope_is_open(scope: Timer) -> bool:
    return scope._state == _OPEN


def run_timed(stream: Stream, name: str, kind: str, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` (which enqueues work on ``stream``), bracketed by events for every open scope that
    covers the stream's device. The hot path of every built-in workload and launch. While the stream is being
    captured into a graph, the capture takes the call instead (it times the part on every replay)."""
    if stream._capture is not None:
        stream._capture.timed(name, kind, fn, args)
        return
    timed_now(stream, name, kind, fn, args)


def timed_now(stream: Stream, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> None:
    """`run_timed` without the capture check: bracket ``fn(*args)`` for the open scopes, or just call it.
    While the kernel history is on (`asyncgpu._history`), the launch also gets a record there; when it is off,
    that costs one attribute check."""
    scopes = _SCOPES.get() or _THREAD_SCOPES
    owners = _owners(scopes, stream.device, kind) if scopes else None
    if not owners and not _history.ON:  # the hot path: nothing records this launch
        fn(*args)
        stream._tag = name
        return
    pending = _history.begin(stream, name, kind, fn, args) if _history.ON else None
    try:
        if not owners:
            fn(*args)
        else:
            act = _begin(stream, name, kind, owners)
            try:
                fn(*args)
            finally:
                _end(act)
    except BaseException:
        if pending is not None:
            _history.drop(pending)
        raise
    if pending is not None:
        _history.end(pending)
    stream._tag = name


@final
class _ActivityBlock:
    """``with t.activity(...)`` / ``async with t.activity(...)``: times what is enqueued on the stream inside.
    The block's host issue time becomes a range on the host track of the timeline."""

    __slots__ = ("_timer", "_stream", "_name", "_kind", "_act", "_t0_ns")

    def __init__(self, timer: Timer, stream: Stream, name: str, kind: str) -> None:
        self._timer, self._stream, self._name, self._kind, self._act = timer, stream, name, kind, None
        self._t0_ns = 0

    def __enter__(self) -> _ActivityBlock:
        timer = self._timer
        if timer._state != _OPEN:
            raise ScopeError(f"activity {self._name!r} is outside its scope: use t.activity() inside the "
                             "`async with gpu_timer(...) as t:` block")
        self._t0_ns = time.perf_counter_ns()
        owners = _owners(_SCOPES.get(), self._stream.device, self._kind)
        if timer not in owners and self._kind in timer._kinds:
            owners.append(timer)
        if owners:
            self._act = _begin(self._stream, self._name, self._kind, owners)
        return self

    def __exit__(self, *exc: object) -> None:
        act, self._act = self._act, None
        if act is not None:
            _end(act)
            self._stream._tag = self._name
        timer = self._timer
        if timer._state == _OPEN:  # a plain tuple here (hot path); a HostRange when the scope ends
            timer._host_ranges.append((self._name, self._kind, self._t0_ns, time.perf_counter_ns(),
                                       threading.get_ident()))

    async def __aenter__(self) -> _ActivityBlock:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


ReportFunc = Callable[[list, str], None]


@final
class Timer:
    """A timing scope over some devices. Make one with `gpu_timer`; use it once (``async with`` or ``with``).

    Results, available after the block: `timeline` (columnar, numpy), `records` (a list of `ActivityRecord`),
    `host_ms`, `cpu_ms`, `device_span_ms`, the summaries (`activity_summary`, `device_summary`, `balance`), the
    totals methods, and a rich report (``rich.print(t)``; ``str(t)`` gives the same as plain text).
    """

    def __init__(self, devices: Iterable[Device], label: str, synchronize: bool, nvtx: bool,
                 kinds: Iterable[str] | None = None, report_func: ReportFunc | None = None,
                 max_clock_age_s: float = 0.25, subtract_overhead: bool = True, all_threads: bool = False) -> None:
        self.devices: tuple[Device, ...] = tuple(devices)
        self._all_threads = all_threads
        self._layers: list[Any] = []
        self._fence_streams: dict[int, Stream] = {}  # more streams to wait for at exit (GPU-side handoff takes)
        self._devset = frozenset(self.devices)
        self.label = label
        self.synchronize = synchronize
        self._nvtx = nvtx
        self._kinds = _check_kinds(kinds)
        self._report_func = report_func
        self._max_clock_age_s = max_clock_age_s
        self._subtract_overhead = subtract_overhead
        self._state = _NEW
        self._acts: list[_Activity] = []
        self._host_ranges: list[tuple] = []  # (name, kind, start_ns, end_ns, thread ident) per activity block
        self._clocks: dict[Device, DeviceClock] = {}
        self._start_marks: dict[Device, Any] = {}  # Device -> Event on its marker stream
        self._token: Any = None
        self._nvtx_id: Any = None
        self._depth = 0
        self._t0_ns = self._t1_ns = self._c0_ns = 0
        self._timeline: Timeline | None = None
        self._records: list[ActivityRecord] | None = None
        self.host_ms: float | None = None  #: host wall time of the body (issuing the work)
        self.wait_ms: float | None = None  #: host wall time the exit then waited for the devices
        self.cpu_ms: float | None = None  #: CPU time of this process during the scope (all threads)
        self.device_span_ms: dict[str, float] = {}  #: per device: scope start to the end of its last activity
        self.error: str | None = None  #: what the body raised, if anything
        self.cancelled = False  #: the scope (or its wait at exit) was cancelled

    # -- activities ---------------------------------------------------------------------------------------
    def activity(self, name: str, device: Device | None = None, *, stream: Stream | None = None,
                 kind: str = "user") -> _ActivityBlock:
        """Time the work enqueued on ``stream`` (default: ``device``'s default stream) inside the block."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if stream is None:
            if device is None:
                if len(self.devices) != 1:
                    raise ScopeError(f"activity {name!r}: this scope covers {len(self.devices)} devices, name one "
                                     "with device=... or stream=...")
                device = self.devices[0]
            stream = device.stream
        elif device is not None and stream.device is not device:
            raise ScopeError(f"activity {name!r}: that stream belongs to {stream.device.name}, not {device.name}")
        if stream.device not in self._devset:
            raise ScopeError(f"activity {name!r} is on {stream.device.name}, which this scope does not cover: "
                             f"add it to gpu_timer([...]) (it covers {', '.join(d.name for d in self.devices)})")
        return _ActivityBlock(self, stream, name, kind)

    # -- async form ---------------------------------------------------------------------------------------
    async def __aenter__(self) -> Timer:
        self._claim()
        if self.synchronize:
            await _synchronize_all(self.devices)
        self._start()
        return self

    async def __aexit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        fences = self._stop(exc)
        try:
            if not _is_cancellation(exc):
                for ev in fences:
                    await ev.wait()
                if self.synchronize:
                    await _synchronize_all(self.devices)
        except BaseException as wait_exc:
            if _is_cancellation(wait_exc):
                self.cancelled = True
            raise
        finally:
            self._finish(fences)
            self.wait_ms = (time.perf_counter_ns() - self._t1_ns) / 1e6
        self._report()

    # -- blocking form (plain threads, scripts) -----------------------------------------------------------
    def __enter__(self) -> Timer:
        self._claim()
        if self.synchronize:
            for d in self.devices:
                d.synchronize()
        self._start()
        return self

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        fences = self._stop(exc)
        try:
            if not isinstance(exc, KeyboardInterrupt):
                for ev in fences:
                    ev.sync()
                if self.synchronize:
                    for d in self.devices:
                        d.synchronize()
        finally:
            self._finish(fences)
            self.wait_ms = (time.perf_counter_ns() - self._t1_ns) / 1e6
        self._report()

    # -- the steps ----------------------------------------------------------------------------------------
    def _claim(self) -> None:
        if self._state != _NEW:
            raise ScopeError(f"gpu_timer {self.label!r} was already used: make a new gpu_timer(...) for each scope")
        if not self.devices:
            raise ScopeError("gpu_timer() needs at least one device")
        for d in self.devices:
            d._check_open()
        self._state = _OPEN

    def _start(self) -> None:
        self._start_marks = {d: d._mark() for d in self.devices}
        outer = _SCOPES.get()
        self._depth = len(outer)
        self._token = _SCOPES.set(outer + (self,))
        if self._all_threads:
            global _THREAD_SCOPES
            with _THREAD_SCOPES_LOCK:
                _THREAD_SCOPES = _THREAD_SCOPES + (self,)
        if self._nvtx:
            self._nvtx_id = _nvtx.start(self.label, "scope")
        self._t0_ns, self._c0_ns = time.perf_counter_ns(), time.process_time_ns()

    def _stop(self, exc: BaseException | None) -> list:
        """End the scope on the host; returns the events to wait for (one fence per stream used)."""
        self._t1_ns = time.perf_counter_ns()
        self.host_ms = (self._t1_ns - self._t0_ns) / 1e6
        self.cpu_ms = (time.process_time_ns() - self._c0_ns) / 1e6
        self._state = _DONE
        try:
            _SCOPES.reset(self._token)
        except ValueError:  # exited in another context than it was entered: remove it by hand
            _SCOPES.set(tuple(s for s in _SCOPES.get() if s is not self))
        if self._all_threads:
            global _THREAD_SCOPES
            with _THREAD_SCOPES_LOCK:
                _THREAD_SCOPES = tuple(s for s in _THREAD_SCOPES if s is not self)
        if self._nvtx_id is not None:
            _nvtx.end(self._nvtx_id)
        if exc is not None:
            self.error = f"{type(exc).__name__}: {exc}"
            self.cancelled = _is_cancellation(exc)
        streams = {id(a.stream): a.stream for a in self._acts}
        streams.update(self._fence_streams)
        return [s.record(tag="fence") for s in streams.values() if not s.device.closed]

    def _finish(self, fences: list) -> None:
        """Turn events into the timeline (never waits for the devices) and give every event back."""
        acts = self._acts
        n = len(acts)
        dev_codes = {d: i for i, d in enumerate(self.devices)}
        placements = {d: self._placement(d) for d in self.devices}
        streams: dict[Any, int] = {}
        names: dict[str, int] = {}
        device_col = np.empty(n, np.int16)
        stream_col = np.empty(n, np.int32)
        name_col = np.empty(n, np.int32)
        kind_col = np.empty(n, np.int8)
        start_col = np.full(n, np.nan)
        dur_col = np.full(n, np.nan)
        for i, act in enumerate(acts):
            dev = act.device
            code = dev_codes[dev]
            device_col[i] = code
            st = streams.get(act.stream)
            if st is None:
                st = streams[act.stream] = len(streams)
            stream_col[i] = st
            nm = names.get(act.name)
            if nm is None:
                nm = names[act.name] = len(names)
            name_col[i] = nm
            kind_col[i] = KIND_CODES[act.kind]
            bd = dev._bd
            if act.duration_ms is None and act.end_raw is not None:
                try:
                    act.duration_ms = bd.elapsed_ms(act.start_raw, act.end_raw)
                except NotReadyError:
                    pass
            if act.duration_ms is not None:
                dur_col[i] = act.duration_ms * 1e6
                anchor, anchor_ns, scale = placements[dev]
                if act.placed is not None and act.placed[0] is anchor:
                    start_col[i] = act.placed[1]
                elif anchor is not None:
                    try:
                        start_col[i] = anchor_ns + bd.elapsed_ms(anchor, act.start_raw) * 1e6 * scale
                    except NotReadyError:
                        pass
                    else:
                        act.placed = (anchor, start_col[i])
            act.refs -= 1
            if act.refs == 0:
                _release_activity(act)
        for ev in (*self._start_marks.values(), *fences):
            ev.release()
        clocks = tuple(self._clocks.pop(d) for d in self.devices)
        _subtract_overheads(clocks, device_col, kind_col, start_col, dur_col)
        self._timeline = Timeline(
            self.label, tuple(d.name for d in self.devices),
            tuple((dev_codes[s.device], s.label) for s in streams), tuple(names), device_col, stream_col, name_col,
            kind_col, start_col, start_col + dur_col, dur_col, self._t0_ns, self._t1_ns, clocks,
            _host_ranges(self._host_ranges) + (HostRange(self.label, "scope", self._t0_ns, self._t1_ns,
                                                         threading.current_thread().name),),
            tuple(d.description for d in self.devices), self.error, self.cancelled,
            {"layers": tuple(self._layers)} if self._layers else {})
        self._layers = []
        ends = self._timeline.end_ns
        spans = {}
        for d, code in dev_codes.items():
            e = ends[(device_col == code) & np.isfinite(ends)]
            spans[d.name] = float((e.max() - self._t0_ns) / 1e6) if e.size else 0.0
        self.device_span_ms = spans
        self._acts = []
        self._host_ranges = []
        self._start_marks = {}

    def _placement(self, dev: Device) -> tuple[Any, float, float]:
        """``(anchor raw event, its host time in ns, device-to-host rate)`` to place this device's events on the
        host time base; falls back to the scope's start mark (device-relative time) when the clock cannot be
        aligned, and says why in the scope's `DeviceClock`."""
        mark = self._start_marks.get(dev)
        try:
            cal = dev.clock(max_age_s=self._max_clock_age_s)
        except AsyncGPUError as exc:
            reason = f"clock calibration failed ({exc})"
        else:
            overhead = cal.bracket_overhead_ns if self._subtract_overhead else 0.0
            self._clocks[dev] = DeviceClock(dev.name, True, cal.bound_ns, cal.globaltimer_offset_ns, cal.drift_ppm,
                                            overhead_ns=overhead)
            return cal._anchor, float(cal.host_ns), cal.rate
        self._clocks[dev] = DeviceClock(dev.name, False, float("nan"), reason=reason)
        if mark is None or mark._raw is None:
            return None, 0.0, 1.0
        return mark._raw, float(self._t0_ns), 1.0

    def _report(self) -> None:
        if self._report_func is not None:
            self._report_func(self.records, "  " * self._depth)

    # -- results ------------------------------------------------------------------------------------------
    @property
    def timeline(self) -> Timeline:
        """The scope's records as columns (numpy), on the host time base. Available after the scope."""
        if self._timeline is None:
            raise ScopeError(f"gpu_timer {self.label!r} has no results yet: read them after the scope has ended")
        return self._timeline

    @property
    def records(self) -> list[ActivityRecord]:
        """The activities in issue order (empty before the scope ends)."""
        if self._records is None:
            if self._timeline is None:
                return []
            self._records = self._timeline.records()
        return self._records

    def totals_by_device(self) -> dict[str, float]:
        """Sum of activity durations per device, in ms (complete activities only)."""
        tl = self.timeline
        sums = np.bincount(tl.device, weights=np.nan_to_num(tl.duration_ns), minlength=len(tl.devices)) / 1e6
        return {name: float(sums[i]) for i, name in enumerate(tl.devices)}

    def totals_by(self, field: str = "kind") -> dict[str, tuple[int, float]]:
        """``{value: (count, total_ms)}`` grouped by an `ActivityRecord` field (``kind``, ``name``, ``device``,
        ``stream``)."""
        out: dict[str, tuple[int, float]] = {}
        for r in self.records:
            key = getattr(r, field)
            n, total = out.get(key, (0, 0.0))
            out[key] = (n + 1, total + (r.duration_ms or 0.0))
        return out

    def activity_summary(self) -> Any:
        """Per activity name and kind: count, total, mean, min, max (see `asyncgpu.activity_summary`)."""
        from ._summary import activity_summary

        return activity_summary(self.timeline)

    def device_summary(self) -> Any:
        """Per device: busy time (union of intervals), idle, largest gap, utilisation (`asyncgpu.device_summary`)."""
        from ._summary import device_summary

        return device_summary(self.timeline)

    def balance(self, work_units: Any = None) -> Any:
        """The workload balance report (`asyncgpu.balance`); ``work_units`` per device for a suggested re-split."""
        from ._summary import balance

        return balance(self.timeline, work_units)

    def report(self, *, order: str = "issue", limit: int | None = 50) -> Any:
        """The report as a rich renderable: the timeline in ``order`` (``"issue"`` or ``"time"``, the first
        ``limit`` activities; None for all), the summaries, the balance and a footer. ``rich.print(t)`` prints
        ``t.report()``."""
        from ._report import timer_report

        return timer_report(self, limit=limit, order=order)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield self.report()

    def __str__(self) -> str:
        from ._report import render_text

        return render_text(self)

    def __repr__(self) -> str:
        state = ("new", "open", "done")[self._state]
        return f"<asyncgpu.Timer {self.label!r} {state} devices={[d.name for d in self.devices]}>"


def gpu_timer(devices: Any = None, *, label: str = "scope", synchronize: bool = False, nvtx: bool = True,
              kinds: Iterable[str] | None = None, report_func: ReportFunc | None = None,
              max_clock_age_s: float = 0.25, subtract_overhead: bool = True, all_threads: bool = False) -> Timer:
    """A timing scope over ``devices`` (a device, a list of devices or specs like ``"cuda:1"``; default: every
    device of the default backend).

    ``synchronize=True`` synchronizes every device before and after, as Warp's ScopedTimer does; otherwise the
    scope waits only for the work timed in it. ``nvtx`` emits NVTX ranges. ``kinds`` picks which activity kinds
    are recorded (default: all of `KINDS`), as Warp's ``cuda_filter``. ``report_func(records, indent)`` is called
    when the scope ends (``indent`` grows with nesting). A device clock calibration older than
    ``max_clock_age_s`` is refreshed when the scope ends (about 0.35 ms per device on H200; the GPU clocks drift
    by up to ~10 ppm against the host's, corrected once a second of history exists).

    ``subtract_overhead``: a pair of CUDA events adds launch and completion latency to what it brackets (about
    3.7 µs on H200, measured once per device, see `Device.clock`); it is taken out of kernel and graph
    activities (half from the start), so their durations match what CUPTI reports. ``False`` keeps the raw
    event times. Other kinds are never corrected.

    Scopes belong to the context that opens them (each task, and threads run in a copy of its context). Plain
    threads started inside the scope have a context of their own: ``all_threads=True`` makes the scope also
    record the work of threads that have no scope of their own (join them before the scope ends).
    """
    from ._select import resolve_devices

    return Timer(resolve_devices(devices), label, synchronize, nvtx, kinds, report_func, max_clock_age_s,
                 subtract_overhead, all_threads)


def _host_ranges(raw: list[tuple]) -> tuple[HostRange, ...]:
    names = {t.ident: t.name for t in threading.enumerate()}
    return tuple(HostRange(n, k, t0, t1, names.get(ident, f"thread {ident}")) for n, k, t0, t1, ident in raw)


_LAUNCH_KINDS = np.array([KIND_CODES["kernel"], KIND_CODES["graph"]], np.int8)


def _subtract_overheads(clocks: tuple, device_col: np.ndarray, kind_col: np.ndarray, start_col: np.ndarray,
                        dur_col: np.ndarray) -> None:
    """Take each device's measured event-pair overhead out of its kernel and graph activities (in place): half
    of it from the start, all of it from the duration (never below zero)."""
    launches = np.isin(kind_col, _LAUNCH_KINDS)
    for code, clock in enumerate(clocks):
        if clock.overhead_ns > 0:
            m = launches & (device_col == code)
            cut = np.minimum(dur_col[m], clock.overhead_ns)
            start_col[m] += cut / 2
            dur_col[m] -= cut


def _check_kinds(kinds: Iterable[str] | None) -> frozenset[str]:
    if kinds is None:
        return frozenset(KINDS)
    if isinstance(kinds, str):
        kinds = (kinds,)
    out = frozenset(kinds)
    bad = sorted(out - set(KINDS))
    if bad:
        raise ValueError(f"unknown activity kind(s) {', '.join(map(repr, bad))}: use some of {', '.join(KINDS)}")
    return out


# -- functional form, for code that cannot wrap its work in a scope ------------------------------------------
_functional: list[Timer] = []


def timing_begin(devices: Any = None, *, kinds: Iterable[str] | None = None, synchronize: bool = False,
                 label: str = "timing") -> Timer:
    """Start recording (as Warp's ``timing_begin``): activities enqueued from here on, in this context and the
    tasks it starts, are recorded until `timing_end`. Blocking form: call it from plain code or a thread."""
    t = gpu_timer(devices, label=label, synchronize=synchronize, kinds=kinds)
    t.__enter__()
    _functional.append(t)
    return t


def timing_end(timer: Timer | None = None) -> list[ActivityRecord]:
    """Stop the recording started by `timing_begin` (the latest one by default), wait for its devices (GIL
    released) and return its records. The `Timer` itself is returned by `timing_begin` for the other results."""
    if not _functional:
        raise ScopeError("timing_end() without timing_begin(): call asyncgpu.timing_begin() first")
    if timer is None:
        timer = _functional[-1]
    elif timer not in _functional:
        raise ScopeError("that timer was not started by timing_begin(), or was already ended")
    _functional.remove(timer)
    timer.__exit__(None, None, None)
    return timer.records


def timing_print(records: Iterable[ActivityRecord], indent: str = "") -> None:
    """Print records as the activity and per-device tables (to the terminal through rich)."""
    from rich.console import Console

    from ._report import records_report

    Console().print(records_report(list(records), indent))


def _release_activity(act: _Activity) -> None:
    dev, key = act.device, act.stream.handle
    dev._recycle(act.start_raw, True, key, _RELEASE_LAST)
    if act.end_raw is not None:
        dev._recycle(act.end_raw, True, key, _RELEASE_LAST)
    act.start_raw = act.end_raw = None


async def _synchronize_all(devices: tuple) -> None:
    import anyio.to_thread

    for d in devices:
        await anyio.to_thread.run_sync(d.synchronize, abandon_on_cancel=True)


def _is_cancellation(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return True
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, trio.Cancelled)
