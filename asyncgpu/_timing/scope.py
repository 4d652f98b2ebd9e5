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
passes them. When the exit itself cannot wait (an event pool at its bound, a failed device), the scope keeps
what finished, gives every event back, and raises that error (unless the body's own error is on its way).

The blocking form (``with gpu_timer(...)``) waits for the devices at its exit: entered from a thread that
runs an event loop, it warns (`BlockingCallWarning`); use ``async with`` there.

Its parts: `observer` (open scopes, how they see launches), `harvest` (events of finished activities given back
early; the columns at the scope's end), `scope_cupti` (CUPTI's times), `functional` (`timing_begin` / `timing_end`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, final

import numpy as np

from asyncgpu._backends import cupti
from asyncgpu._base import collector
from asyncgpu._base.checks import number, whole
from asyncgpu._base.errors import AsyncGPUError, ScopeError
from asyncgpu._base.records import GC_KIND, GC_THREAD, ActivityRecord, CollectiveMark, HostRange, Timeline
from asyncgpu._runtime import hooks, loops
from asyncgpu._runtime.clock import CLOCK_MAX_AGE_S, Placement, placement
from asyncgpu._runtime.device import Device
from asyncgpu._runtime.event import block, peek_raw
from asyncgpu._runtime.stream import Stream
from asyncgpu._timing import nvtx as _nvtx
from asyncgpu._timing import observer as _observer
from asyncgpu._timing.activity import ROUTER, Activity
from asyncgpu._timing.harvest import POOL_KEEP, TRIM_INLINE, Columns, columns_of, host_ranges, trim_all
from asyncgpu._timing.observer import (
    DONE,
    NEW,
    OPEN,
    SCOPES,
    ActivityBlock,
    block_stream,
    check_kinds,
    count_cupti_user,
)
from asyncgpu._timing.scope_cupti import apply_cupti

__all__ = ["Timer", "current_scopes", "gpu_timer", "is_open"]


def current_scopes() -> tuple[Timer, ...]:
    """The scopes open in this context (task, or thread), or, when it has none, the ``all_threads`` scopes."""
    return _observer.current_scopes()


def is_open(scope: Timer) -> bool:
    """Whether ``scope`` is between its entry and its exit."""
    return scope._state == OPEN


ReportFunc = Callable[[list, str], None]


class _Records(list[ActivityRecord]):
    """A list of `ActivityRecord` that may also be called (``t.records()``) and then returns a plain copy."""

    __slots__ = ()

    def __call__(self) -> list[ActivityRecord]:
        return list(self)


#: the shortest garbage collection inside a scope's body that its timeline keeps as a host range (ns)
GC_RANGE_MIN_NS = 500_000


@final
class Timer:
    """A timing scope over some devices. Make one with `gpu_timer`; use it once (``async with`` or ``with``).

    Results, available after the block: `timeline` (columnar, numpy), `records` (a list of `ActivityRecord`),
    `host_ms`, `cpu_ms`, `device_span_ms`, the summaries (`activity_summary`, `device_summary`, `balance`), the
    totals methods, and a rich report (``rich.print(t)``; ``str(t)`` gives the same as plain text).
    """

    def __init__(
        self,
        devices: Iterable[Device],
        label: str,
        synchronize: bool,
        nvtx: bool,
        kinds: Iterable[str] | None = None,
        report_func: ReportFunc | None = None,
        max_clock_age_s: float = CLOCK_MAX_AGE_S,
        subtract_overhead: bool = True,
        all_threads: bool = False,
        source: str = "events",
    ) -> None:
        cupti.check_source(source)
        if not isinstance(label, str):
            raise TypeError(f"label is the scope's name in reports: a str, not {label!r}")
        if report_func is not None and not callable(report_func):
            raise TypeError(
                "report_func is called as report_func(records, indent) when the scope ends: pass a function "
                f"(or None), not {report_func!r}"
            )
        max_clock_age_s = number("max_clock_age_s", max_clock_age_s, unit="seconds", infinite="never re-measure")
        self._source_req = source
        self.source = "events"  #: where this scope's durations come from (``"cupti"`` or ``"events"``), once entered
        self.source_note = ""  #: why ``source="auto"`` fell back to events, if it did
        self._cupti_pending = False  # CUPTI was acquired and not yet flushed and released
        self._cupti_offset_ns = 0  # CUPTI's clock minus the host's, read at the flush
        self._holding = False  # this scope asks for held launches now (`hooks.want_holds`)
        self._held = False  # it did (events source)
        self.devices: tuple[Device, ...] = tuple(devices)
        self._all_threads = all_threads
        self._layers: dict[Any, Any] = {}  # live layers by key (asyncgpu._runtime.hooks.attach)
        self._fence_streams: dict[int, Stream] = {}  # more streams to wait for at exit (GPU-side handoff takes)
        self._marks: list[CollectiveMark] = []
        self._layer_lock = threading.Lock()
        self._devset = frozenset(self.devices)
        self._bds = tuple(d._internal.bd for d in self._devset)  # (whose launches `hooks.want_holds` holds)
        self.label = label
        self.synchronize = synchronize
        self._nvtx = nvtx
        self._kinds = check_kinds(kinds)
        self._report_func = report_func
        self._max_clock_age_s = max_clock_age_s
        self._subtract_overhead = subtract_overhead
        self._state = NEW
        self._acts: list[Activity] = []
        self._host_ranges: list[tuple] = []  # (name, kind, start_ns, end_ns, thread ident) per activity block
        self._start_marks: dict[Device, Any] = {}  # Device -> Event on its marker stream
        self._token: Any = None
        self._nvtx_id: Any = None
        self._collecting = False  # holds `collector` from the start to `_stop`: the body's garbage collections
        self._depth = 0
        self._t0_ns = self._t1_ns = self._c0_ns = 0
        self._timeline: Timeline | None = None
        self._records: _Records | None = None
        self.host_ms: float | None = None  #: host wall time in the body (enqueueing, and any awaits there), ms
        self.wait_ms: float | None = None  #: host wall time the exit then waited for the devices, ms
        self.cpu_ms: float | None = None  #: CPU time of this process during the scope (all threads), ms
        self.device_span_ms: dict[str, float] = {}  #: per device: scope start to the end of its last activity
        self.error: str | None = None  #: what the body raised, if anything
        self.cancelled = False  #: the scope (or its wait at exit) was cancelled

    # -- what features hand the scope (through asyncgpu._runtime.hooks and asyncgpu.ranks) -------------------
    def _attach(self, key: Any, make_layer: Callable[[], Any], fence: Stream | None) -> Any:
        """The live layer under ``key`` (made now if new; ``key=None``: always new); ``fence``: a stream to
        wait for at exit. Any thread."""
        with self._layer_lock:
            if fence is not None:
                self._fence_streams[id(fence)] = fence
            if key is None:
                key = object()
            layer = self._layers.get(key)
            if layer is None:
                layer = self._layers[key] = make_layer()
            return layer

    def mark(self, name: str, host_ns: int, thread: str) -> None:
        """Record a collective point (`asyncgpu.ranks.mark_collective`). Any thread; ScopeError once closed."""
        if self._state != OPEN:
            raise ScopeError(f"mark({name!r}) on gpu_timer {self.label!r}, which is not open: mark inside the scope")
        with self._layer_lock:
            self._marks.append(CollectiveMark(str(name), host_ns, len(self._acts), thread))

    # -- activities ---------------------------------------------------------------------------------------
    def activity(
        self, name: str, device: Device | None = None, *, stream: Stream | None = None, kind: str = "user"
    ) -> ActivityBlock:
        """Time the work enqueued on ``stream`` (default: ``device``'s default stream) inside the block."""
        return ActivityBlock(self, block_stream(self.devices, name, device, stream, kind), name, kind)

    # -- async form ---------------------------------------------------------------------------------------
    async def __aenter__(self) -> Timer:
        self._claim()
        if self.synchronize:
            await _synchronize_all(self.devices)
        if self._source_req != "cupti":  # (events, or "auto" that may fall back to events)
            await _prepare_timing_all(self.devices)
        self._start()
        return self

    async def __aexit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        self._stop(exc)
        fences: list = []
        fence_error = None
        try:
            fence_error = self._fence(fences, exc)
            if not loops.is_cancellation(exc):
                for ev in fences:
                    await ev.wait()
                if self.synchronize:
                    await _synchronize_all(self.devices)
        except BaseException as wait_exc:
            if loops.is_cancellation(wait_exc):
                self.cancelled = True
            raise
        finally:
            if self._cupti_pending:  # CUPTI's flush blocks: a worker thread, shielded (it always ends)
                import anyio
                import anyio.to_thread

                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._cupti_collect)
            try:  # placing the events may calibrate clocks: in worker threads first, all devices at once, shielded
                import anyio

                from asyncgpu._runtime.device import refresh_clocks

                with anyio.CancelScope(shield=True):
                    await refresh_clocks(self.devices, self._max_clock_age_s)
            finally:
                self._finish(fences)
            heavy = self._trim(at_most=TRIM_INLINE)
            if heavy:  # in a worker thread, shielded (it always ends): the loop keeps running meanwhile
                import anyio
                import anyio.to_thread

                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(trim_all, heavy)
        self._report()
        if fence_error is not None:
            raise fence_error

    # -- blocking form (plain threads, scripts) -----------------------------------------------------------
    def __enter__(self) -> Timer:
        loops.warn_blocking("`with gpu_timer(...)` (its exit waits for the devices)", "`async with gpu_timer(...)`")
        self._claim()
        if self.synchronize:
            for d in self.devices:
                d._internal.sync_device()  # (warned above if this thread runs an event loop)
        if self._source_req != "cupti":  # (here, not inside the first timed launch)
            for d in self.devices:
                d._internal.prepare_timing()
        self._start()
        return self

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        self._stop(exc)
        fences: list = []
        fence_error = None
        try:
            fence_error = self._fence(fences, exc)
            if not isinstance(exc, KeyboardInterrupt):
                for ev in fences:
                    block(ev)  # (`__enter__` warned if this thread runs an event loop)
                if self.synchronize:
                    for d in self.devices:
                        if not d.closed:
                            d._internal.sync_device()
        finally:
            self._cupti_collect()
            self._finish(fences)
            trim_all(self.devices)
        self._report()
        if fence_error is not None:
            raise fence_error

    # -- the steps ----------------------------------------------------------------------------------------
    def _claim(self) -> None:
        if self._state != NEW:
            raise ScopeError(f"gpu_timer {self.label!r} was already used: make a new gpu_timer(...) for each scope")
        if not self.devices:
            raise ScopeError("gpu_timer() needs at least one device")
        for d in self.devices:
            d._internal.check_open()
        self._state = OPEN

    def _pick_source(self) -> None:
        """Take the CUPTI session when the scope asks for it and can have it; else say why not
        (`asyncgpu._backends.cupti.choose`)."""
        self.source, self.source_note = cupti.choose(self._source_req, self.devices, cupti.TIMER, "this scope")
        if self.source == "cupti":
            count_cupti_user(1)
            self._cupti_pending = True

    def _cupti_collect(self) -> None:
        """Flush CUPTI (blocks), route its records to their activities and leave the session."""
        if not self._cupti_pending:
            return
        self._cupti_pending = False
        try:
            self._cupti_offset_ns, failed = ROUTER.collect()
            if failed:  # the events' durations stand, and the timeline says why
                self.source, self.source_note = "events", failed
        finally:
            cupti.release(cupti.TIMER)

    def _start(self) -> None:
        marks: dict[Device, Any] = {}
        try:  # here, not in `_claim`: nothing between taking CUPTI and the scope's exit may leave it taken
            self._pick_source()
            for d in self.devices:
                marks[d] = d._internal.mark_now()
        except BaseException:
            for ev in marks.values():
                ev.release()
            self._state = DONE
            if self._cupti_pending:
                self._cupti_pending = False
                count_cupti_user(-1)
                cupti.release(cupti.TIMER)
            raise
        self._start_marks = marks
        self._holding = self._held = self.source == "events"
        if self._holding:  # event pairs need held launches (on this scope's devices); CUPTI times the work itself
            hooks.want_holds(1, self._bds)
        outer = SCOPES.get()
        self._depth = len(outer)
        self._token = SCOPES.set(outer + (self,))
        _observer.opened(self, self._all_threads)
        if self._nvtx:
            self._nvtx_id = _nvtx.start(self.label, "scope")
        collector.acquire()
        self._collecting = True
        self._t0_ns, self._c0_ns = time.perf_counter_ns(), time.process_time_ns()

    def _stop(self, exc: BaseException | None) -> None:
        """End the scope on the host (never raises: what the scope took is given back in `_finish`)."""
        self._t1_ns = time.perf_counter_ns()
        self.host_ms = (self._t1_ns - self._t0_ns) / 1e6
        self.cpu_ms = (time.process_time_ns() - self._c0_ns) / 1e6
        self._state = DONE
        try:
            SCOPES.reset(self._token)
        except ValueError:  # exited in another context than it was entered: remove it by hand
            SCOPES.set(tuple(s for s in SCOPES.get() if s is not self))
        if self._cupti_pending:  # no more external ids for this scope (its flush comes after the devices)
            count_cupti_user(-1)
        _observer.closed(self, self._all_threads)
        if self._holding:
            self._holding = False
            hooks.want_holds(-1, self._bds)
        if self._nvtx_id is not None:
            _nvtx.end(self._nvtx_id)
        if self._collecting:
            self._collecting = False
            collector.release()
        if exc is not None:
            self.error = f"{type(exc).__name__}: {exc}"
            self.cancelled = loops.is_cancellation(exc)

    def _fence(self, fences: list, exc: BaseException | None) -> AsyncGPUError | None:
        """Record into ``fences`` what the exit waits for: one event (without timing: the timing pool may be the
        one at its bound) on every stream the scope used. A stream where that fails (an exhausted pool, a failed
        device) is not waited for; the first such error is returned, to be raised once the scope is finished,
        unless the body raised (``exc``): its error goes on, and this one is only noted."""
        streams = {id(a.stream): a.stream for a in self._acts}
        streams.update(self._fence_streams)
        error = None
        for s in streams.values():
            if s.device.closed:
                continue
            try:
                fences.append(s.record(timing=False, tag="fence"))
            except AsyncGPUError as err:
                error = error or err
        if error is not None and exc is None:
            self.error = f"{type(error).__name__} at the scope's exit: {error}"
            return error
        return None

    def _finish(self, fences: list) -> None:
        """Turn events into the timeline (never waits for the devices) and give every event back."""
        self.wait_ms = (time.perf_counter_ns() - self._t1_ns) / 1e6
        dev_codes = {d: i for i, d in enumerate(self.devices)}
        placements = {d: self._placement(d) for d in self.devices}
        cols = columns_of(self._acts, dev_codes, placements)  # (gives back the events no other scope reads)
        for ev in (*self._start_marks.values(), *fences):
            ev.release()
        self._note_unheld()
        if self.source == "cupti":
            self._apply_cupti(cols)
        cols.trim(placements)
        self._timeline = self._make_timeline(cols, placements)
        self.device_span_ms = self._device_spans(self._timeline, dev_codes)
        self._acts = []
        self._host_ranges = []
        self._start_marks = {}

    def _note_unheld(self) -> None:
        """Say in `source_note` which devices could not hold their launches (never silently: their brackets on
        idle streams may hold host time)."""
        unheld = [f"{d.name}: {why}" for d in self.devices if (why := d._internal.hold_problem())] if self._held else []
        if unheld:
            held_note = "launches not held (" + "; ".join(unheld) + ")"
            self.source_note = f"{self.source_note}; {held_note}" if self.source_note else held_note

    def _apply_cupti(self, cols: Columns) -> None:
        """CUPTI's device times in ``cols`` where CUPTI saw the work, and rows for the work that others launched
        inside blocks (`asyncgpu._timing.scope_cupti.apply_cupti`)."""
        extra, missing = apply_cupti(self._acts, self._cupti_offset_ns, cols.start, cols.dur, cols.from_cupti)
        if missing:
            self.source_note = f"CUPTI saw no work for {missing} activities: their event-pair durations are kept"
        if extra:
            cols.append(extra)

    def _make_timeline(self, cols: Columns, placements: dict[Device, Placement]) -> Timeline:
        """The `Timeline` of ``cols``, with the scope's host ranges, marks and finished layers."""
        with self._layer_lock:
            live, self._layers = list(self._layers.values()), {}
            marks, self._marks = tuple(self._marks), []
        finished = tuple(ly for ly in (layer.finish() for layer in live) if ly is not None)
        scope_range = HostRange(self.label, "scope", self._t0_ns, self._t1_ns, threading.current_thread().name)
        collections = tuple(  # (they stop every thread that runs Python: the host's time, on a track of their own)
            HostRange(f"garbage collection (generation {g})", GC_KIND, a, b, GC_THREAD)
            for a, b, g in collector.pauses_between(self._t0_ns, self._t1_ns)
            if b - a >= GC_RANGE_MIN_NS  # (the many short ones would only clutter the host's track)
        )
        return Timeline(
            label=self.label,
            devices=tuple(d.name for d in self.devices),
            streams=tuple((cols.dev_codes[s.device], s.label) for s in cols.streams),
            names=tuple(cols.names),
            device=cols.device,
            stream=cols.stream,
            name=cols.name,
            kind=cols.kind,
            start_ns=cols.start,
            end_ns=cols.start + cols.dur,
            duration_ns=cols.dur,
            scope_start_ns=self._t0_ns,
            scope_end_ns=self._t1_ns,
            clocks=tuple(placements[d].clock for d in self.devices),
            host_ranges=host_ranges(self._host_ranges) + collections + (scope_range,),
            descriptions=tuple(d.description for d in self.devices),
            error=self.error,
            cancelled=self.cancelled,
            host_ms=self.host_ms,
            wait_ms=self.wait_ms,
            cpu_ms=self.cpu_ms,
            marks=marks,
            scopes=(),
            layers=finished,
            source=self.source,
            source_note=self.source_note,
            issued_ns=cols.issued,
        )

    def _device_spans(self, tl: Timeline, dev_codes: dict[Device, int]) -> dict[str, float]:
        """Per device: the scope's start to the end of its last finished activity, ms."""
        spans = {}
        for d, code in dev_codes.items():
            e = tl.end_ns[(tl.device == code) & np.isfinite(tl.end_ns)]
            spans[d.name] = float((e.max() - self._t0_ns) / 1e6) if e.size else 0.0
        return spans

    def _trim(self, at_most: int) -> list[Device]:
        """Shrink the devices' pools back to `POOL_KEEP` free events (a burst of activities grew them) where that
        means at most ``at_most`` releases and events to go through; returns the devices left for a worker thread
        (`DeviceInternal.trim` blocks about 1 µs per event: thousands would stall a loop)."""
        heavy = [d for d in self.devices if not d.closed and d._internal.trim_backlog(POOL_KEEP) > at_most]
        trim_all([d for d in self.devices if d not in heavy])
        return heavy

    def _placement(self, dev: Device) -> Placement:
        """Where this device's events go on the host time base; when its clock cannot be aligned, relative to
        the scope's start mark (and its `DeviceClock` says why)."""
        mark = self._start_marks.get(dev)
        fallback = (peek_raw(mark), float(self._t0_ns)) if mark is not None and peek_raw(mark) is not None else None
        return placement(
            dev, max_age_s=self._max_clock_age_s, subtract_overhead=self._subtract_overhead, fallback=fallback
        )

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
    def records(self) -> _Records:
        """The activities in issue order, once the scope has ended (before: `ScopeError`, as `timeline`): call
        it, ``t.records()``, as `Timeline.records` and `Channel.records`; the list it returns also works uncalled
        (``t.records``)."""
        if self._records is None:
            self._records = _Records(self.timeline.records())
        return self._records

    def totals_by_device(self) -> dict[str, float]:
        """Sum of activity durations per device, in ms (complete activities only)."""
        tl = self.timeline
        sums = np.bincount(tl.device, weights=np.nan_to_num(tl.duration_ns), minlength=len(tl.devices)) / 1e6
        return {name: float(sums[i]) for i, name in enumerate(tl.devices)}

    def totals_by(self, field: str = "kind") -> dict[str, tuple[int, float]]:
        """``{value: (count, total_ms)}`` grouped by an `ActivityRecord` field (``kind``, ``name``, ``device``,
        ``stream``)."""
        fields = ("kind", "name", "device", "stream")
        if field not in fields:
            raise ValueError(f"totals_by() groups by one of {', '.join(map(repr, fields))}, not {field!r}")
        out: dict[str, tuple[int, float]] = {}
        for r in self.records:
            key = getattr(r, field)
            n, total = out.get(key, (0, 0.0))
            out[key] = (n + 1, total + (r.duration_ms or 0.0))
        return out

    def activity_summary(self) -> Any:
        """Per activity name and kind: count, total, mean, min, max (see `asyncgpu.activity_summary`)."""
        from asyncgpu._analysis.summary import activity_summary

        return activity_summary(self.timeline)

    def device_summary(self) -> Any:
        """Per device: busy time (union of intervals), idle, largest gap, utilisation (`asyncgpu.device_summary`)."""
        from asyncgpu._analysis.summary import device_summary

        return device_summary(self.timeline)

    def balance(self, work_units: Any = None) -> Any:
        """The workload balance report (`asyncgpu.balance`); ``work_units`` per device for a suggested re-split."""
        from asyncgpu._analysis.balance import balance

        return balance(self.timeline, work_units)

    def report(self, *, order: str = "issue", limit: int | None = 50, work_units: Any = None) -> Any:
        """The report as a rich renderable: the timeline in ``order`` (``"issue"`` or ``"time"``; the first
        ``limit`` activities, 50 by default, then a line saying how many more; None for all, drawn as plain lines
        beyond 500), the summaries, the balance (``work_units`` as in `balance`: the re-split in whole units) and a
        footer. ``rich.print(t)`` prints ``t.report()``."""
        from asyncgpu._analysis.report import timeline_report

        if limit is not None:
            limit = whole("limit", limit, hint="activities shown; None: all")
        return timeline_report(self.timeline, limit=limit, order=order, work_units=work_units)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield self.report() if self._timeline is not None else str(self)

    def __str__(self) -> str:
        from asyncgpu._analysis.report import render

        if self._timeline is None:
            return f"gpu_timer {self.label!r}: no results yet (the scope has not ended)"
        return render(self.report(), 100)

    def __repr__(self) -> str:
        state = ("new", "open", "done")[self._state]
        return f"<asyncgpu.Timer {self.label!r} {state} devices={[d.name for d in self.devices]}>"


def gpu_timer(
    devices: Any = None,
    *,
    label: str = "scope",
    synchronize: bool = False,
    nvtx: bool = True,
    kinds: Iterable[str] | None = None,
    report_func: ReportFunc | None = None,
    max_clock_age_s: float = CLOCK_MAX_AGE_S,
    subtract_overhead: bool = True,
    all_threads: bool = False,
    source: str = "events",
) -> Timer:
    """A timing scope over ``devices`` (a device, a list of devices or specs like ``"cuda:1"``; default: every
    device of the default backend). Use it once, with ``async with`` (or ``with``, which blocks at its exit).

    - ``synchronize``: synchronize every device before and after (as Warp's ScopedTimer); otherwise the scope
      waits only for the work timed in it.
    - ``nvtx``: emit an NVTX range for the scope and for each activity.
    - ``kinds``: the activity kinds recorded (default: all of `KINDS`), as Warp's ``cuda_filter``.
    - ``report_func(records, indent)``: called when the scope ends (``indent`` grows with nesting).
    - ``max_clock_age_s``: a device clock calibration older than this is refreshed when the scope ends.
    - ``subtract_overhead`` (events source): take the event pair's own latency, measured per device and kind of
      work (`Device.clock`, or learned from CUPTI scopes: `DeviceInternal.pair_excess_ns`), out of kernels, graphs,
      memsets and memcpys (half from the start); blocks (``kind="user"``) are never corrected. ``False`` keeps
      the raw event times.
    - ``all_threads``: also record the work of plain threads that have no scope of their own (join them before
      the scope ends); otherwise a scope records its own context's work (its task, the tasks it starts, and
      threads run in a copy of its context).
    - ``source``: where durations come from. ``"events"`` (the default): pairs of pooled events, each launch held
      on the device until its bracket is enqueued (`asyncgpu._runtime.hooks.launch_now`; blocks are not held).
      ``"cupti"``: CUPTI's activity records (``asyncgpu[cupti]``), including the work others launch inside a
      block; a CUPTI flush at the scope's end, and `SourceError` when CUPTI cannot be had (another subscriber,
      cupti-python missing, the host backend). ``"auto"``: CUPTI when it can be had, else events;
      `Timeline.source` and `Timeline.source_note` say which, and why. The README's "Durations as exact as CUPTI"
      explains both sources and their costs.
    """
    from asyncgpu._runtime.select import resolve_devices

    return Timer(
        resolve_devices(devices),
        label,
        synchronize,
        nvtx,
        kinds=kinds,
        report_func=report_func,
        max_clock_age_s=max_clock_age_s,
        subtract_overhead=subtract_overhead,
        all_threads=all_threads,
        source=source,
    )


async def _prepare_timing_all(devices: tuple) -> None:
    """Set up what the devices' first events-timed launches would otherwise set up on the loop's thread (the
    holds' page, the engine primers: `DeviceInternal.prepare_timing`), each on its device's worker thread, all at
    once. Returns at once where everything is set up already (the host backend has nothing to set up). A
    cancellation waits for a preparation under way (it always ends)."""
    todo = [d for d in devices if d._internal.timing_unprepared()]
    if not todo:
        return
    import anyio

    async with anyio.create_task_group() as tg:
        for d in todo:
            tg.start_soon(d._internal.worker.run, d._internal.prepare_timing)


async def _synchronize_all(devices: tuple) -> None:
    """`Device.asynchronize` each device in turn (their waits overlap: the later ones are mostly done by then)."""
    for d in devices:
        await d.asynchronize()
