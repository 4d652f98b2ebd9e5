"""Always-on step timing: ``async with step_timer(devices) as st:`` and ``with st.step(i):`` around each step of a
training or serving loop, on one or several devices, for as long as the loop runs, in constant memory.

Cost on the loop's thread, per step: a pooled timing event per device at the step's exit (on the stream named for the
device), a host clock read per device and two more, and an append to a queue; nothing waits for a device. A step
that follows the previous one directly (nothing launched through asyncgpu on its streams in between: ``chain``)
starts where that one's exit events are, so its entry records nothing; otherwise its entry records one event per
device too. The first operation after a step's launches costs the driver ~13-14 µs per device on H100, whichever it
is, and the next one ~4-5 µs, as on a drained stream (``dev/diag_mark_cost.py``, run 53): an exit's record takes the
first cost from the loop's own next operation (its ``loss.item()``) and adds about a drained record's. A loop that
waits for each step through ``await step.wait()`` waits on those records (`Step.wait`): it makes none of its own, and
the marks then cost it almost nothing beside the harvest (0-5 µs a step on 2 and 4 H100s, run 59).
A harvest thread (``asyncgpu-steps``) wakes every ``harvest_s`` seconds (`EVENTS_HARVEST_S`, or `CUPTI_HARVEST_S`
with the CUPTI source), queries (never synchronizes) the end events of the oldest pending steps, places the finished
ones on the host clock (`asyncgpu._runtime.clock.placement`, the timer's placement), gives their events back to the
pools, and computes each step's balance at once for the batch (`asyncgpu._analysis.steps.step_split`: busy,
launch-bound and dependency time, the straggler: the same rules as `asyncgpu.balance`). Results go into a `StepRing`
(the last ``keep`` steps in full, streaming quantiles and straggler counts over all), the trace stream and the live
view, each fed from the harvest thread.

Bounded: at most ``max_pending`` closed steps wait for their devices; one more drops the oldest (its events go back once
the device passes them, its start events at the next harvest: when it chained, they are the end events of the step
before it, which a harvest may be placing; `StepStats.dropped` counts it). When more than half of them wait, the step's
exit wakes the harvest thread before its cadence: steps faster than ``harvest_s / max_pending`` are harvested, not
dropped, as long as the devices keep up (with the CUPTI source that early harvest takes the steps' events and holds the
placed steps for CUPTI's next flush, at most `_MAX_HELD_STEPS`). Nothing grows with the number of steps.

One event pair per step per device cannot see gaps inside a step: the part of the device's span while the host was
still issuing the step counts as the host's (launch-bound), the rest as busy (`DeviceStep.span_ms` is the upper
bound). So a wait for the devices inside the step (``loss.item()``) reads as the host's time: wait after the step's
block, or call ``step.issued()`` before the wait (the end events are recorded there). Work on any stream is covered
by the pair only where it is ordered with the named stream: name the stream your framework launches on
(``streams={dev: torch_stream}``; any ``__cuda_stream__`` object is adopted).

Threads: `StepTimer.step` may be used from any thread (one step open at a time per timer: a second is a
`ScopeError`); `Step.wait` from any asyncio or trio task, `Step.wait_sync` from any thread. Results (`stats`,
`steps`, `balance`) may be read from any thread at any time: a snapshot under the timer's lock. Cancellation:
``async with`` waits at its exit (asynchronously) for the devices to pass the pending steps, then harvests them;
cancelled (or when the body is), it waits for nothing: pending steps are dropped, their events return to the pools
once the devices pass them. Either way the exit joins its threads (harvest, live view, trace writer) in a worker
thread, shielded: nothing is left running. A cancelled `Step.wait` withdraws its waits; the step's events go back
as if it had never waited.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from itertools import chain
from typing import Any, Callable, Coroutine, Mapping, NamedTuple, Sequence, final

import numpy as np

from asyncgpu._analysis.balance import BalanceReport, balance
from asyncgpu._analysis.steps import step_split
from asyncgpu._backends import cupti
from asyncgpu._base import collector
from asyncgpu._base.checks import number, whole
from asyncgpu._base.checks import timeout_s as check_timeout_s
from asyncgpu._base.errors import AsyncGPUError, ClockError, ScopeError
from asyncgpu._base.records import Timeline
from asyncgpu._runtime import loops
from asyncgpu._runtime.clock import ClockCalibration, extrapolation_error_ns, placement
from asyncgpu._runtime.device import Device
from asyncgpu._runtime.engine import WaitFor
from asyncgpu._runtime.hooks import QUEUE_LIMIT
from asyncgpu._runtime.stream import ALL_WORK, Stream, StreamInternal
from asyncgpu._runtime.waiting import await_completion, block_until_complete
from asyncgpu._timing.step_cupti import StepRecords, totals
from asyncgpu._timing.step_live import LiveView, wants_live
from asyncgpu._timing.step_stats import StepRecord, StepRing, StepStats, render_stats
from asyncgpu._timing.step_trace import TraceStream

__all__ = ["Step", "StepTimer", "step_timer"]

_NEW, _OPEN, _DONE = 0, 1, 2
#: The events source's default harvest cadence (s) without a live view; with one, the harvest follows the redraw
#: period (``1 / refresh_hz``, 0.5 s by default), so each redraw has new steps. A harvest runs Python under the GIL,
#: taken from the loop's threads. At short cadences what it costs the loop is mostly fixed per harvest: on a
#: host-bound torch loop of ~3-5 ms steps on one, two and four H100s a harvest made the steps it overlapped 0.6-1.3 ms
#: longer whether it took 16 steps or 80 (`dev/diag_step_events.py` ``overlap``): every 50 ms that was 1.2-3.1 % of
#: the loop's time, every 0.25 s 0.4-0.95 %, every 0.5 s 0.3-1.1 %, every 1 s 0.21-0.22 % on one and two H100s
#: (`bench_steps`' harvest thread, runs 52-54; on four, +1.40 %: two harvests of 24 and 48 ms of CPU). Beyond 1 s
#: the cadence stops mattering: on four H100s a harvest's CPU is mostly per step (15-25 µs a step, its events
#: placed the most of it), and every 2 s it cost a host-bound loop 0.44 and 0.36 % against 0.36 and 0.39 % every
#: 1 s in the same run (run 58). Steps reach the results (ring, trace, rank exchange) up to this late. Steps
#: faster than ``harvest_s / (max_pending / 2)`` wake it sooner (`DEFAULT_MAX_PENDING`).
EVENTS_HARVEST_S = 1.0
#: `step_timer`'s default ``max_pending``: half of it wakes the harvest before its cadence, so a 1 s cadence holds
#: for steps of ≥ ~2 ms. Each pending step holds one or two pooled events per device.
DEFAULT_MAX_PENDING = 1024
#: The step timer's clock ages (s), shortest and longest (``max_clock_age_s=None``, the default, `_ClockAge`): its
#: harvests re-measure a device's clock calibration older than the device's current age before placing steps. Each
#: calibration pings the device from the harvest thread (~50 driver calls, each letting go of the GIL and taking it
#: back from the loop's threads): on a host-bound torch loop one took 1-2 ms and the steps that overlapped it were
#: 1.1-4.8 ms longer; at `gpu_timer`'s 0.25 s that was 0.5-2.8 % of the loop's time, at 2 s 0.16-0.23 % on two and
#: four H100s. Between calibrations placement extrapolates with the device's drift (its latest slope,
#: `asyncgpu._runtime.clock.DRIFT_WINDOW_S`); how far that went off is measured at each re-measure, and the age
#: follows it (`STEPS_CLOCK_ERROR_NS`). The drift moves with the GPU's load and temperature: on one H100 going from
#: idle to busy, points predicted 8 s ahead were off 1-4 µs p50 (8 max), 30 s ahead 26-51 µs; hence the longest age.
#: `gpu_timer` keeps 0.25 s for µs-exact activities.
STEPS_CLOCK_AGE_S = (2.0, 10.0)
#: How far (ns) the step timer lets a device's extrapolated clock go off between calibrations: at each re-measure
#: the previous calibration's placement of the new one's ``%globaltimer`` point is compared with the new one's
#: (`asyncgpu._runtime.clock.extrapolation_error_ns`, both calibrations' own bounds included, ~1-2 µs), and the next
#: age is the one at which that error, growing with the age, would reach this (at most twice the last age). Steps
#: last milliseconds: 5 µs is a thousandth of a 5 ms step.
STEPS_CLOCK_ERROR_NS = 5_000.0
#: the CUPTI source's default cadence (s): each harvest flushes CUPTI and parses its records under the GIL, taken from
#: the loop's threads. Part of that is fixed per flush (4 H100s, ~80,000 records a second: the flushes cost the
#: loop 4.5 % of its time every 0.5 s, 3.0-3.4 % every 1 s, 2.2-3.0 % every 2 s), so a slower cadence costs less
#: per step; steps then reach the ring, the live view and the rank exchange this late. Harvests woken early by
#: ``max_pending`` take events only (`StepTimer._harvest`)
CUPTI_HARVEST_S = 2.0
_MAX_HELD_STEPS = 65_536  # CUPTI: placed steps held for the next flush at most (more flush it early)
_LIVE_RECENT = 64  # steps the live view draws (and judges the verdict on): a snapshot of them costs ~0.3 ms
Listener = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any], None]


_now_ns = time.perf_counter_ns


class _Mark(NamedTuple):
    """What a step's record on one stream needs, looked up once per timer: a step's entry and exit run between a
    loop's steps, with the CPU's caches full of the step's own work, where each lookup costs several times what it
    costs in a tight loop (on the host backend a chained entry took ~1.5 µs in a loop of entries, ~4.7 µs between
    steps of work)."""

    si: StreamInternal
    take: Callable[[], Any]  #: the device's timing pool's `take`
    give: Callable[[Any], None]  #: its `give`
    record: Callable[[Any, Any], None]  #: the backend's record (event, stream)
    raw: Any  #: the backend stream
    seqs: Any  #: the stream's record numbers (`StreamInternal.seqs`)


def _record_all(marks: list[_Mark], raws: list, issued: list | None = None, seqs: list | None = None) -> int:
    """A pooled timing event recorded now on each of ``marks``' streams, appended to ``raws`` (as `Device.record`
    records, without the `Event` objects); ``issued`` gets each record's host instant (ns) and ``seqs`` its record
    number on its stream (what a wait on it is ordered by, `Step.wait`). Returns the streams'
    `StreamInternal.work` summed after the records (each stream's only grows: equal sums, no work on any of them
    in between). On failure ``raws`` holds the events recorded so far, for the caller to give back. One call per
    step: its loop is most of what a step costs the loop's thread."""
    work = 0
    for m in marks:
        si = m.si
        if si.ops - si.done_ops >= QUEUE_LIMIT:  # (`hooks.check_queue`, inlined as `Device.record` does)
            si.check_room()  # (raises in a loop's thread when the stream is full, before anything is taken)
        raw = m.take()
        if issued is not None:
            issued.append(_now_ns())
        try:
            m.record(raw, m.raw)
        except BaseException:
            m.give(raw)
            raise
        raws.append(raw)
        if seqs is not None:
            seqs.append(next(m.seqs))
        si.ops += 1  # (`StreamInternal.marked`, inlined: a lone timing event takes a launch slot and is no work)
        if si.ops >= si.next_check:
            si.checkpoint()
        work += si.work
    return work


_NONE: tuple = ()  # a step's events and instants before it has any (no list made per step for nothing)


@final
class Step:
    """``with st.step(i) as step:`` — one step of a `StepTimer` (a sync context manager: usable in tasks and plain
    threads). Made by `StepTimer.step`; used once. ``await step.wait()`` after its block waits for its devices.

    Closed, it waits in its timer's queue for its devices (the harvest thread takes it from there): its host
    instants (ns) and its events, one per stream. Ownership of the events, for the pools: a step gives back its
    start events (its own, or the previous step's end events that it took, `StepTimer._chained`) and its end events
    unless the next step took them (``_lent``) or might still take them (``_kept``: harvested while it was the
    newest closed step; then whoever decides gives them back). End events that a `wait` is on go back when the
    wait ends (`StepTimer._pin`). The flags change under the timer's lock."""

    __slots__ = (
        "_timer",
        "index",
        "_begin_ns",
        "_exit_ns",
        "_starts",
        "_ends",
        "_issued",
        "_seqs",
        "_work",
        "_all_work",
        "_lent",
        "_kept",
        "_dropped",
    )

    def __init__(self, timer: StepTimer, index: int) -> None:
        self._timer, self.index = timer, index
        self._begin_ns = self._exit_ns = 0  # the host's entry and exit (ns; 0: not yet; an entry: used)
        self._starts: Sequence[Any] = _NONE
        self._ends: Sequence[Any] = _NONE
        self._issued: Sequence[int] = _NONE  # each end event's record instant (ns)
        self._seqs: Sequence[int] = _NONE  # each end event's record number on its stream
        self._work = 0  # the streams' work right after the end events (`_record_all`, `StepTimer._chained`)
        self._all_work = -1  # the process's work (`ALL_WORK`) right before them
        self._lent = self._kept = False
        self._dropped = False  # its events went back unplaced (the queue's bound, a failed device, the timer's end)

    def __enter__(self) -> Step:
        self._timer._open(self)
        return self

    def issued(self) -> None:
        """Say that the step's device work is all issued, before the step waits for the devices inside its block
        (``loss.item()``): the step's end events are recorded now, so the wait counts as neither the devices' time
        nor the host's issuing. Without it they are recorded when the block ends. Once per step; no wait."""
        self._timer._issue(self)

    def wait(self) -> Coroutine[Any, Any, None]:
        """``await step.wait()``: resume once every device has finished the step's work (its end events, recorded
        when the block ended or at `issued`): the wait a loop makes after each step (for its loss), on the events
        the timer recorded anyway. A loop that records events of its own to wait on (``device.record()``) records a
        second one per device, about as costly as the timer's (~4-5 µs per device on H100): this one records
        nothing, except for a step the queue dropped (``max_pending`` steps closed after it), which is waited for
        through a new event per stream, no earlier than its end.

        Any asyncio (uvloop) or trio task, any number of times; a checkpoint. Cancellation withdraws the waits at
        once. Raises `ScopeError` before the step's end events exist, `BackendError` if a device fails."""
        self._check_ended("await step.wait()")
        return self._timer._wait(self)

    def wait_sync(self, *, timeout_s: float | None = None) -> None:
        """Block the calling thread (GIL released) until every device has finished the step's work: `wait` for a
        plain thread's loop. ``timeout_s`` (seconds): `TimeoutError` if the devices have not finished by then,
        nothing lost. Called from an event loop's thread on a step not yet finished, it warns
        (`BlockingCallWarning`): ``await step.wait()`` there."""
        self._check_ended("call step.wait_sync()")
        self._timer._wait_sync(self, None if timeout_s is None else check_timeout_s(timeout_s))

    def _check_ended(self, call: str) -> None:
        if not self._ends:
            raise ScopeError(
                f"step {self.index} has no end yet: {call} after its `with st.step()` block (or after step.issued())"
            )

    def __exit__(self, *exc: object) -> None:
        self._timer._close(self)

    def __repr__(self) -> str:
        return f"<asyncgpu step {self.index}>"


class _ClockAge:
    """One device's clock age under the step timers' adaptive policy (`STEPS_CLOCK_AGE_S`, `STEPS_CLOCK_ERROR_NS`):
    it starts at the shortest age; each new calibration seen (`seen`) is compared with the one before it, and the
    age becomes the span between them scaled by ``STEPS_CLOCK_ERROR_NS`` / the error found there, at most twice the
    age before, within `STEPS_CLOCK_AGE_S`. A calibration without ``%globaltimer`` (the host backend's, or one
    whose kernel could not run) is passed over. The harvest thread."""

    __slots__ = ("age_s", "last", "error_ns")

    def __init__(self) -> None:
        self.age_s = STEPS_CLOCK_AGE_S[0]
        self.last: ClockCalibration | None = None
        self.error_ns: float | None = None  #: the latest extrapolation error found (ns, signed)

    def seen(self, cal: ClockCalibration | None) -> None:
        if cal is None or cal is self.last or cal.gt_point is None:
            return
        old, self.last = self.last, cal
        err = None if old is None else extrapolation_error_ns(old, cal)
        if old is None or err is None:
            return
        span_s = (cal.taken_ns - old.taken_ns) / 1e9
        if span_s <= 0:
            return
        self.error_ns = err
        fit_s = span_s * STEPS_CLOCK_ERROR_NS / max(abs(err), 1.0)
        shortest, longest = STEPS_CLOCK_AGE_S
        self.age_s = min(longest, max(shortest, min(fit_s, 2.0 * self.age_s)))


_AGES: dict[str, _ClockAge] = {}  # device name -> its adaptive clock age, for every step timer of the process


def _clock_age(d: Device) -> _ClockAge:
    """``d``'s adaptive clock age: one per device and process (what was learned of its clock outlives a timer)."""
    age = _AGES.get(d.name)
    if age is None:
        age = _AGES.setdefault(d.name, _ClockAge())
    return age


@final
class StepTimer:
    """Step timing over ``devices`` (see `step_timer`). Use it as ``async with`` (or ``with`` in a thread)."""

    def __init__(
        self,
        devices: list[Device],
        streams: list[Stream],
        keep: int,
        max_pending: int,
        live: Any,
        trace: Any,
        label: str,
        harvest_s: float | None,
        refresh_hz: float,
        max_clock_age_s: float | None,
        source: str = "events",
        chain: bool = True,
    ) -> None:
        self.devices = tuple(devices)
        self.label = label
        self._streams = streams
        self._marks = [
            _Mark(si, si.dev.timing_pool.take, si.dev.timing_pool.give, si.bd.record, si.raw, si.seqs)
            for si in (s._internal for s in streams)
        ]
        self._keep, self._max_pending = keep, max_pending
        self._early = max_pending // 2 + 1  # closed steps waiting that wake the harvest thread early
        self._live_arg, self._trace_arg = live, trace
        self._harvest_s, self._refresh_hz = harvest_s, refresh_hz
        self._fixed_age_s = max_clock_age_s  #: each device's clock age, or None: adaptive (`_ClockAge`)
        self._lock = threading.Lock()
        self._state = _NEW
        self._current: Step | None = None
        self._next_index = 0
        self._pending: deque[Step] = deque()  # closed steps, oldest first, waiting for the harvest
        self._dropped = 0
        self._chain = chain
        self._tail: Step | None = None  # the newest closed step, while the next may take its end events
        #: start events of dropped steps, given back by the next harvest (`_close`): a chained step's start
        #: events are the end events of the step before it, which the harvest thread may be placing right now
        self._deferred: list[Sequence[Any]] = []
        #: end events that waits are on (`_pin`): id of a step's ``_ends`` -> how many waits; and those whose
        #: give-back came while they were pinned, given back by the last wait's end (`_unpin`)
        self._pins: dict[int, int] = {}
        self._pinned_out: dict[int, Sequence[Any]] = {}
        self._ring = StepRing(tuple(d.name for d in devices), keep)
        self._collecting = False  # holds `collector` (from the harvest thread's start to `_finish`)
        self._listeners: list[Listener] = []
        self._closers: list[Callable[[], None]] = []
        self._stop = threading.Event()
        #: set by a step's exit when half of ``max_pending`` steps wait: the harvest thread wakes before its cadence
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: LiveView | None = None
        self._trace: TraceStream | None = None
        self.error: BaseException | None = None  #: the harvest's latest failure (a failed device), if any
        self._source_arg = source
        #: where busy time comes from: ``"events"`` (the step's event pair) or ``"cupti"`` (every kernel's record)
        self.source = "events"
        self.source_note = ""  #: why ``source="auto"`` gave the events source, if it did
        self._cupti: StepRecords | None = None
        #: CUPTI: placed steps waiting for the next flush (`_attribute`), as the harvest's arrays, and their count
        self._held: list[tuple[np.ndarray, ...]] = []
        self._held_steps = 0
        self._flushed_s = time.perf_counter()  # when CUPTI was last flushed (perf_counter s)
        self._names: tuple[list[dict[str, list[float]]], threading.Lock] | None = None

    # -- the loop's side ----------------------------------------------------------------------------------------
    def step(self, index: int | None = None) -> Step:
        """A step, numbered ``index`` (default: one more than the last). ``with st.step(i):`` around the step's
        work. Leaving records an event on each device's stream; entering records one too, unless the step follows
        the previous one directly (``chain``); neither waits."""
        if index is None:
            index = self._next_index
        else:
            index = whole("index", index, hint="the step's number")
        self._next_index = index + 1
        return Step(self, index)

    def _open(self, step: Step) -> None:
        if self._state != _OPEN:
            state = "has not been entered" if self._state == _NEW else "has ended"
            raise ScopeError(f"step_timer {self.label!r} {state}: open steps inside `async with step_timer(...)`")
        if step._begin_ns:
            raise ScopeError(f"step {step.index} was already used: open a new one with st.step()")
        if self._current is not None:
            raise ScopeError(
                f"step {self._current.index} is still open: leave its `with st.step()` block before opening "
                f"step {step.index} (one step at a time per timer; time concurrent loops with a timer each)"
            )
        self._current = step
        step._begin_ns = _now_ns()
        tail = self._tail
        if tail is not None and self._chained(step, tail):
            return
        starts: list[Any] = []
        try:
            _record_all(self._marks, starts)
        except BaseException:  # (a full stream in a loop's thread, a failed device): the recorded ones go back
            self._current, step._begin_ns = None, 0
            self._give_back(starts, [])
            raise
        step._starts = starts

    def _chained(self, step: Step, tail: Step) -> bool:
        """Whether ``step`` takes the newest closed step's end events (``tail``'s) as its start events: when
        ``chain`` is on and nothing but lone event records was enqueued through asyncgpu on the timer's streams
        since they were recorded (no work, wait or timed block: `StreamInternal.work`), a start event recorded now
        would complete at the same device instant (the stream runs in order). Otherwise that step's end events go
        back to the pools here if it was harvested already. The loop's thread; never blocks."""
        if ALL_WORK[0] == tail._all_work:  # (nothing on any stream: one read where the streams' sum takes a loop)
            work = tail._work
        else:
            work = 0
            for m in self._marks:  # (as `_record_all` sums it)
                work += m.si.work
        with self._lock:
            if self._tail is not tail:  # (None: the harvest dropped it at a failure)
                return False
            self._tail = None
            if self._chain and work == tail._work:
                tail._lent = True
                step._starts = tail._ends  # (never changed once recorded: shared, not copied)
                return True
            kept = tail._kept
        if kept:
            self._give_back([], tail._ends)
        return False

    def _issue(self, step: Step) -> None:
        if self._current is not step:
            raise ScopeError(f"step {step.index} is not open: call issued() inside its `with st.step()` block")
        if step._ends:
            raise ScopeError(f"step {step.index} was already marked issued: call issued() once per step")
        ends: list[Any] = []
        issued: list[int] = []
        seqs: list[int] = []
        step._all_work = ALL_WORK[0]  # (before the records: work enqueued while they are made is seen as work)
        try:
            step._work = _record_all(self._marks, ends, issued, seqs)
        except BaseException:
            self._give_back([], ends)
            raise
        step._ends, step._issued, step._seqs = ends, issued, seqs

    def _close(self, step: Step) -> None:
        if self._current is not step:
            raise ScopeError(f"step {step.index} is not the open step: it was closed already")
        try:
            if not step._ends:
                self._issue(step)
        except BaseException:
            self._current = None
            self._give_back(step._starts, [])
            raise
        step._exit_ns = _now_ns()
        with self._lock:  # (open or pending at every instant, to a wait on it from another thread: `_pin`)
            self._pending.append(step)
            self._current = None
            self._tail = step
            waiting = len(self._pending)
            if waiting <= self._max_pending:
                if waiting == self._early:  # (once per filling: the harvest takes them, or they were dropped)
                    self._wake.set()
                return
            old = self._pending.popleft()  # (never the tail: max_pending >= 1)
            old._dropped = True
            self._dropped += 1
            self._deferred.append(old._starts)
            if len(self._deferred) == self._early:  # (a bound on the events held back: the harvest gives them)
                self._wake.set()
        self._give_back([], [] if old._lent else old._ends)

    def _drop_tail(self) -> Sequence[Any]:
        """No step will take the newest closed step's end events any more (under the timer's lock): those of them
        that nothing else gives back (it was harvested, its events kept), to give back."""
        tail, self._tail = self._tail, None
        return tail._ends if tail is not None and tail._kept and not tail._lent else []

    def _give_deferred(self) -> None:
        """Give back the start events of the steps dropped since the last harvest (the harvest thread, or the
        timer's end once that thread is joined: nothing places events then)."""
        if not self._deferred:  # (most harvests: nothing was dropped; a drop being added now waits for the next)
            return
        with self._lock:
            deferred, self._deferred = self._deferred, []
        for starts in deferred:
            self._give_back(starts, [])

    def _give_back(self, starts: Sequence[Any], ends: Sequence[Any]) -> None:
        """Give ``starts`` and ``ends`` (a step's events, one per stream) back once the devices pass them, except
        those a wait is on: their wait's end gives them back (`_unpin`). Never under the timer's lock."""
        if self._pins:
            with self._lock:
                starts, ends = self._unless_pinned(starts), self._unless_pinned(ends)
        for s, raw in zip(self._streams, starts):
            s._internal.dev.recycle_later(raw)
        for s, raw in zip(self._streams, ends):
            s._internal.dev.recycle_later(raw)

    def _give_back_unharvested(self, steps: Sequence[Step], kept: Sequence[Any]) -> None:
        """Give back the events of closed ``steps`` that no harvest will place (a failed device, the timer's end;
        marked dropped under the lock by the caller), and ``kept``: the newest closed step's end events that nothing
        takes any more (`_drop_tail`)."""
        for item in steps:
            self._give_back(item._starts, [] if item._lent else item._ends)
        self._give_back([], kept)

    # -- waits on a step's end events -----------------------------------------------------------------------------
    def _unless_pinned(self, events: Sequence[Any]) -> Sequence[Any]:
        """``events`` (a step's, one per stream), or nothing when a wait is on them: they are kept for its end to
        give back (`_unpin`). Under the timer's lock."""
        if events and id(events) in self._pins:
            self._pinned_out[id(events)] = events
            return _NONE
        return events

    def _pin(self, step: Step) -> Sequence[Any] | None:
        """Keep ``step``'s end events from the pools until `_unpin` (a wait is on them): they are returned. None
        when they may be back in the pools already: the step was dropped, or is neither open nor pending, so a
        harvest has taken it (its devices passed it). A loop waits on its newest step: one look at the queue's end."""
        ends, q = step._ends, self._pending
        with self._lock:
            if step._dropped or not (step is self._current or (q and (q[-1] is step or step in q))):
                return None
            self._pins[id(ends)] = self._pins.get(id(ends), 0) + 1
        return ends

    def _unpin(self, ends: Sequence[Any]) -> None:
        key = id(ends)
        with self._lock:
            left = self._pins[key] - 1
            if left:
                self._pins[key] = left
                return
            del self._pins[key]
            out = self._pinned_out.pop(key, None)
        if out is not None:
            self._give_back([], out)

    def _waits(self, step: Step, ends: Sequence[Any]) -> list[tuple[Any, Callable[[Any], bool], WaitFor]]:
        """Per stream: its device's engine, query and what a wait on the step's end event there is for (the tag
        of the work before it while nothing was enqueued since, for the engine's prediction of its completion)."""
        same = ALL_WORK[0] == step._all_work
        return [
            (m.si.dev.engine, m.si.bd.query, WaitFor(raw, m.si.key, seq, m.si.tag if same else None, ns))
            for m, raw, seq, ns in zip(self._marks, ends, step._seqs, step._issued)
        ]

    async def _wait(self, step: Step) -> None:
        """`Step.wait`."""
        ends = self._pin(step)
        if ends is None:
            if not step._dropped:
                await loops.checkpoint(*loops.current())
                return
            evs = self._plain_records()  # (its events may be another step's by now: new records follow its end)
            try:
                for ev in evs:
                    await ev.wait()
            finally:
                for ev in evs:
                    ev.release()
            return
        try:
            for engine, query, wait_for in self._waits(step, ends):
                await await_completion(engine, query, wait_for)
        finally:
            self._unpin(ends)

    def _wait_sync(self, step: Step, timeout_s: float | None) -> None:
        """`Step.wait_sync` (``timeout_s`` checked)."""
        deadline_ns = None if timeout_s is None else _now_ns() + int(timeout_s * 1e9)
        ends = self._pin(step)
        if ends is None:
            if step._dropped:
                evs = self._plain_records()
                try:
                    for ev in evs:
                        ev.wait_sync(timeout_s=None if deadline_ns is None else max(0, deadline_ns - _now_ns()) / 1e9)
                finally:
                    for ev in evs:
                        ev.release()
            return
        try:
            waits = self._waits(step, ends)
            if not all(query(w.raw) for _, query, w in waits):
                loops.warn_blocking("step.wait_sync()", "`await step.wait()`")
            for (engine, query, wait_for), m in zip(waits, self._marks):
                sync = m.si.bd.sync_event if deadline_ns is None else None
                if not block_until_complete(engine, query, wait_for, deadline_ns, sync):
                    raise TimeoutError(f"the devices had not finished step {step.index} after {timeout_s} s")
        finally:
            self._unpin(ends)

    # -- the harvest thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            wait_s = float(self._harvest_s or 0.0)
            if self._held:  # (CUPTI: steps wait for the flush, due `harvest_s` after the last one)
                wait_s = max(0.0, self._flushed_s + wait_s - time.perf_counter())
            self._wake.wait(wait_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._harvest()
            except Exception as exc:  # (kept for the user: `error`; the loop never sees it, the next pass retries)
                self.error = exc

    def _finished_prefix(self) -> int:
        """How many steps at the front of the queue the devices have finished (under the timer's lock). A stream
        passes its events in order, so the newest finished step says that every step before it finished too: the
        newest is queried first, then the steps 2, 3, 5, 9, ... from the back until one has finished (a loop's
        devices run a few steps behind its host), then a binary search between: ``O(log k)`` queries for ``k``
        unfinished steps (each a driver call under the GIL, which a host-bound loop's threads wait for)."""
        pending = self._pending
        queries = [s._internal.dev.query for s in self._streams]

        def finished(step: Step) -> bool:
            return all(q(raw) for q, raw in zip(queries, step._ends))

        n = len(pending)
        if not n or finished(pending[-1]):
            return n
        lo, hi = 0, n - 1  # the steps before lo finished; step hi did not
        back = 1
        while hi > 0:
            at = max(0, n - 1 - back)
            if finished(pending[at]):
                lo = at + 1
                break
            hi, back = at, 2 * back
        while lo < hi:
            mid = (lo + hi) // 2
            if finished(pending[mid]):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _harvest(self, final: bool = False) -> int:
        """Take the finished steps at the front of the queue (queries only), place and analyse them, feed the ring,
        the trace and the listeners. Any thread; returns how many were taken from the queue.

        With the CUPTI source, placed steps are held (their events already back in the pools) until CUPTI's next
        flush, due `harvest_s` after the previous one (or at ``final``, the timer's end): a harvest before it, woken
        early by steps that fill half of ``max_pending``, queries events only. So the flush's cadence, whose cost
        is partly fixed per flush, does not follow the loop's step rate."""
        done = []
        self._give_deferred()  # (the previous harvest, which may have placed them, is over)
        try:
            with self._lock:
                for _ in range(self._finished_prefix()):
                    done.append(self._pending.popleft())
            if not done:
                if self._held and (final or self._flush_due()):
                    self._attribute()
                return 0
            # (step events are placed, never trimmed: no per-kind overheads to gather)
            places = [
                placement(s.device, max_age_s=self._clock_age_s(s.device), subtract_overhead=False)
                for s in self._streams
            ]
            if self._fixed_age_s is None:
                for s, place in zip(self._streams, places):
                    _clock_age(s.device).seen(place.calibration)
        except AsyncGPUError as exc:  # (a closed or failed device: nothing more will finish)
            self.error = exc
            with self._lock:
                done += list(self._pending)
                self._pending.clear()
                for it in done:
                    it._dropped = True
                self._dropped += len(done)
                kept = self._drop_tail()  # (nothing takes their events now)
            self._give_back_unharvested(done, kept)
            return 0
        # (the Python here runs per step under the GIL, taken from the loop's threads: one pass over the steps, the
        # events transposed per device by zip, the rest in numpy)
        n, nd = len(done), len(self._streams)
        head = np.fromiter(chain.from_iterable((it.index, it._begin_ns, it._exit_ns) for it in done), np.int64, 3 * n)
        index, begin, exit_ = head[0::3], head[1::3], head[2::3]
        issued = np.fromiter(chain.from_iterable([it._issued for it in done]), np.float64, n * nd).reshape(n, nd)
        ends_by_dev = list(zip(*[it._ends for it in done]))
        starts_by_dev = list(zip(*[it._starts for it in done]))
        # (a chained step's start events are the step before's end events, placed just now: one driver call per
        # event, not two)
        own = [i for i in range(n) if not (i and done[i - 1]._lent)]
        start, end = np.empty((n, nd)), np.empty((n, nd))
        for d, place in enumerate(places):
            end[:, d] = place.host_ns_many(ends_by_dev[d])
            start[1:, d] = end[:-1, d]
            if own:
                starts = starts_by_dev[d]
                start[own, d] = place.host_ns_many([starts[i] for i in own])
        # A step's device span starts no earlier than its entry: a start event taken from the previous step's end
        # (`_chained`) completed before it when the stream was idle, where one recorded at the entry would have
        # completed a few µs after it.
        np.maximum(start, begin[:, None], out=start)
        with self._lock:
            tail = done[-1]
            tail._kept = tail is self._tail  # (only the newest closed step can be the tail)
            free = [i for i, it in enumerate(done) if not (it._lent or it._kept)]
            if self._pins:  # (a wait is on some of these events: they go back at its end)
                held_starts = {i for i, it in enumerate(done) if self._unless_pinned(it._starts) is not it._starts}
                held_ends = {i for i in free if self._unless_pinned(done[i]._ends) is not done[i]._ends}
                starts_by_dev = [tuple(e for i, e in enumerate(st) if i not in held_starts) for st in starts_by_dev]
                free = [i for i in free if i not in held_ends]
        for d, s in enumerate(self._streams):
            ends = ends_by_dev[d]
            s._internal.dev.timing_pool.give_many([*starts_by_dev[d], *(ends[i] for i in free)])
        if self._cupti is None:
            self._publish(index, begin, exit_, start, end, issued, None)
            return n
        self._held.append((index, begin, exit_, start, end, issued))
        self._held_steps += n
        if final or self._held_steps >= _MAX_HELD_STEPS or self._flush_due():
            self._attribute()
        return n

    def _clock_age_s(self, d: Device) -> float:
        """How old ``d``'s clock calibration may be when steps are placed (s)."""
        return _clock_age(d).age_s if self._fixed_age_s is None else self._fixed_age_s

    def _flush_due(self) -> bool:
        return time.perf_counter() - self._flushed_s >= 0.9 * float(self._harvest_s or 0.0)

    def _attribute(self) -> None:
        """CUPTI's flush: the held steps' busy time from the records, then published (the harvest thread). A
        failed flush (`SourceError`) loses the held steps, as it would have lost a harvest's."""
        records = self._cupti  # (steps are held only with the CUPTI source, dropped after the last harvest)
        assert records is not None
        held, self._held, self._held_steps = self._held, [], 0
        self._flushed_s = time.perf_counter()
        index, begin, exit_, start, end, issued = (np.concatenate(col) for col in zip(*held))
        records.take()
        measured = records.measured(start, end, issued)
        records.forget_before(end[-1])
        self._publish(index, begin, exit_, start, end, issued, measured)

    def _publish(
        self,
        index: np.ndarray,
        begin: np.ndarray,
        exit_: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        issued: np.ndarray,
        measured: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        """Balance of placed steps (host ns; ``measured``: CUPTI's busy time per step and device, `StepRecords`),
        into the ring, the trace and the listeners (the harvest thread)."""
        split = step_split(begin.astype(np.float64), exit_.astype(np.float64), start, end, issued, measured)
        collected_ns, _ = collector.pauses_in(begin, exit_)  # (the host's issuing time that the collector took)
        with self._lock:
            self._ring.add(index, begin, exit_, start, end, issued, split, collected_ns)
        if self._trace is not None:
            self._trace.put(index, begin, exit_, start, end)
        for fn in self._listeners:
            try:
                fn(index, begin, exit_, end, issued, split)
            except Exception as exc:  # (a listener's failure is its own: the steps are kept)
                self.error = exc

    # -- results ------------------------------------------------------------------------------------------------
    def stats(self, recent: int | None = None) -> StepStats:
        """A snapshot: aggregates over every harvested step and the last ``recent`` steps kept (default all
        ``keep``). Any thread; O(keep · devices) under the timer's lock."""
        with self._lock:
            return self._ring.stats(
                self.label,
                len(self._pending),
                self._dropped,
                self._trace.dropped if self._trace is not None else 0,
                self._keep if recent is None else recent,
            )

    def steps(self) -> list[StepRecord]:
        """The kept steps (the last ``keep`` harvested), oldest first."""
        with self._lock:
            return self._ring.recent()

    def kernels(self, top: int = 10) -> dict[str, list[tuple[str, int, float]]]:
        """With ``source="cupti"``: per device, the ``top`` kernels by total time while the timer ran, as
        ``(name, count, total ms)`` (memsets and memcpys under their kind); empty with the events source. Any
        thread."""
        top = whole("top", top, minimum=1, hint="how many kernels per device")
        if self._names is None:
            return {}
        names, lock = self._names
        with lock:
            return {d.name: totals(n, top) for d, n in zip(self.devices, names)}

    def balance(self, index: int) -> BalanceReport:
        """`asyncgpu.balance` of kept step ``index``: one activity per device (its busy block), the step as the
        scope. `KeyError` when that step is not kept (any more)."""
        rec = next((r for r in self.steps() if r.index == index), None)
        if rec is None:
            raise KeyError(f"step {index} is not among the kept steps (st.steps()): keep= holds the last {self._keep}")
        devs = rec.devices
        return balance(
            Timeline.from_arrays(
                label=f"{self.label} step {index}",
                devices=[d.device for d in devs],
                device=np.arange(len(devs)),
                start_ns=[d.end_ns - d.busy_ms * 1e6 for d in devs],
                end_ns=[d.end_ns for d in devs],
                issued_ns=[d.issued_ns for d in devs],
                scope_start_ns=rec.begin_ns,
                scope_end_ns=rec.exit_ns,
            )
        )

    def _listen(self, fn: Listener, close: Callable[[], None] | None = None) -> None:
        """``fn(index, begin_ns, exit_ns, end_ns, issued_ns, split)`` on the harvest thread for each batch of steps
        (`asyncgpu.ranks.watch_steps`); ``close()`` when the timer ends, after the last batch."""
        self._listeners.append(fn)
        if close is not None:
            self._closers.append(close)

    # -- entry and exit -----------------------------------------------------------------------------------------
    def _pick_source(self) -> None:
        """Open CUPTI's session for ``source="cupti"``/``"auto"`` (blocks: the process's first session takes
        tens of ms; async entries run it in a worker thread)."""
        self.source, self.source_note = cupti.choose(self._source_arg, self.devices, cupti.STEPS, "this step timer")
        if self.source == "cupti":
            devs = self.devices
            self._cupti = StepRecords(
                [d.index for d in devs],
                own=lambda: [(d.index, c, h) for d in devs for c, h in d._internal.bd.own_streams()],
            )
            self._names = self._cupti.names, self._cupti.names_lock  # (kept after the timer ends)

    def _start(self) -> None:
        if self._state != _NEW:
            self._drop_source()
            raise ScopeError(f"step_timer {self.label!r} was already used: make a new one for each loop")
        for d in self.devices:
            d._internal.check_open()
        if self._trace_arg is not None:
            self._trace = TraceStream(self._trace_arg, self._ring.devices)
        try:
            if wants_live(self._live_arg):
                self._live = LiveView(lambda: self.stats(_LIVE_RECENT), refresh_hz=self._refresh_hz)
        except BaseException:
            if self._trace is not None:
                self._trace.close()
            self._drop_source()
            raise
        self._state = _OPEN
        if self._harvest_s is None:
            if self.source == "cupti":
                self._harvest_s = CUPTI_HARVEST_S
            elif self._live is None:  # (a harvest costs the loop less, seldom)
                self._harvest_s = EVENTS_HARVEST_S
            else:  # (each redraw has new steps)
                self._harvest_s = min(EVENTS_HARVEST_S, 1 / self._refresh_hz)
        self._thread = threading.Thread(target=self._run, name="asyncgpu-steps", daemon=True)
        self._thread.start()
        collector.acquire()  # (each step's host time in Python's garbage collection: `_publish`)
        self._collecting = True

    def _finish(self, drop: bool) -> None:
        """Stop the harvest thread, take what finished (everything, unless ``drop``), close the live view, the
        trace and the listeners. Blocks (a worker thread for ``async with``)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if not drop:
                self._harvest(final=True)
            with self._lock:
                left = list(self._pending)
                self._pending.clear()
                for it in left:
                    it._dropped = True
                self._dropped += len(left) + self._held_steps  # (held: cancelled before CUPTI's flush)
                self._held, self._held_steps = [], 0
                kept = self._drop_tail()
            self._give_back_unharvested(left, kept)
        finally:
            self._give_deferred()
            if self._collecting:
                self._collecting = False
                collector.release()
            self._drop_source()
            for close in [*self._closers, *(c.close for c in (self._live, self._trace) if c is not None)]:
                close()

    def _drop_source(self) -> None:
        if self._cupti is not None:
            self._cupti = None
            cupti.release(cupti.STEPS)

    def _open_step_left(self) -> str | None:
        step, self._current = self._current, None
        if step is None:
            return None
        step._dropped = True
        self._give_back(step._starts, step._ends)
        step._starts = step._ends = _NONE
        return f"step {step.index} was never closed: its `with st.step()` block did not end before the timer's"

    def _drain_events(self) -> list[Any]:
        """What the exit waits for while steps are pending (`_plain_records`), else nothing."""
        with self._lock:
            busy = bool(self._pending)
        return self._plain_records() if busy else []

    def _plain_records(self) -> list[Any]:
        """One event without timing recorded now on each stream: it takes no launch slot (a stream the body filled
        still gets it: no `QueueFullError`)."""
        return [s.device.record(s, timing=False) for s in self._streams]

    async def __aenter__(self) -> StepTimer:
        import anyio

        if self._source_arg != "events":
            await anyio.to_thread.run_sync(self._pick_source)
        async with anyio.create_task_group() as tg:  # every device's clock first, off the loop's thread, at once
            for d in self.devices:
                tg.start_soon(self._clock_of, d)
        self._start()
        return self

    async def _clock_of(self, d: Device) -> None:
        try:
            await d.aclock(max_age_s=self._clock_age_s(d))
        except ClockError:
            pass  # (placed relative to the step's own events then; the timeline's clock says why)

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> None:
        import anyio

        self._state = _DONE
        unclosed = self._open_step_left()
        drop = et is not None and issubclass(et, anyio.get_cancelled_exc_class())
        try:
            if not drop:
                for ev in self._drain_events():
                    with ev:
                        await ev.wait()
        except BaseException:
            drop = True
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._finish, drop)
        if unclosed and et is None:
            raise ScopeError(unclosed)

    def __enter__(self) -> StepTimer:
        if self._source_arg != "events":
            self._pick_source()
        for d in self.devices:  # every device's clock first (the first one measures the event pair's overhead too)
            try:
                d.clock(max_age_s=self._clock_age_s(d))
            except ClockError:
                pass
        self._start()
        return self

    def __exit__(self, et: Any, exc: Any, tb: Any) -> None:
        self._state = _DONE
        unclosed = self._open_step_left()
        drop = et is not None and issubclass(et, KeyboardInterrupt)
        try:
            if not drop:
                for ev in self._drain_events():
                    with ev:
                        ev.wait_sync()
        finally:
            self._finish(drop)
        if unclosed and et is None:
            raise ScopeError(unclosed)

    # -- drawn ----------------------------------------------------------------------------------------------------
    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield from render_stats(self.stats(), options.max_width)

    def __repr__(self) -> str:
        state = ("new", "open", "done")[self._state]
        return f"<asyncgpu.StepTimer {self.label!r} {state} devices={[d.name for d in self.devices]}>"


def step_timer(
    devices: Any = None,
    *,
    keep: int = 1000,
    streams: Mapping[Any, Any] | Any = None,
    max_pending: int = DEFAULT_MAX_PENDING,
    live: bool | str = False,
    trace: str | os.PathLike | None = None,
    label: str = "steps",
    harvest_s: float | None = None,
    refresh_hz: float = 2.0,
    max_clock_age_s: float | None = None,
    source: str = "events",
    chain: bool = True,
) -> StepTimer:
    """Always-on timing of the steps of a loop over ``devices`` (a device, a list, specs like ``"cuda:1"``;
    default: every device of the default backend). See the module `asyncgpu._timing.steps` for the cost and threads.

    ``keep``: the last steps kept in full (≥ 1); aggregates cover every step in constant memory. ``streams``: the
    stream each device's step events go on — a dict ``{device or name: stream}`` or a list in ``devices`` order, of
    asyncgpu `Stream` s or framework streams (``__cuda_stream__``: torch's current stream, CuPy's); default each
    device's default stream. ``max_pending``: closed steps that may wait for their devices before the oldest is
    dropped (≥ 1). ``live``: a terminal panel redrawn ``refresh_hz`` (≥ 2) times a second from a thread of its
    own (each redraw runs Python under the GIL, taken from the loop's thread: a low rate keeps that small);
    ``"auto"`` draws only when stdout is a terminal, ``True`` always, ``False`` (default) never. ``trace``: a
    path to stream the steps to as a Perfetto trace (`asyncgpu._timing.step_trace`: valid at every packet boundary,
    open it while it grows). ``harvest_s``: how often (seconds) finished steps are taken (default
    `EVENTS_HARVEST_S`, 1.0, or the live view's redraw period when it draws; with the CUPTI source
    `CUPTI_HARVEST_S`, 2.0: each harvest flushes CUPTI, whose fixed cost a slower cadence spreads; steps reach the
    results that late). ``max_clock_age_s``: a harvest re-measures a
    device's clock calibration older than this (seconds; ``math.inf``: never re-measure). Default None: an age
    per device that follows its measured extrapolation error, 2 to 10 s, keeping steps within
    `STEPS_CLOCK_ERROR_NS` (5 µs) of a fresh calibration's placement (`STEPS_CLOCK_AGE_S`), where `gpu_timer`
    takes 0.25 s: each calibration costs the loop's threads GIL time, and steps of milliseconds need no µs-exact
    placement.

    ``source``: where busy time comes from. ``"events"`` (default): the step's event pair (device time while the
    host still issued the step counts as the host's). ``"cupti"``: CUPTI's record of every kernel, memset and
    memcpy (cupti-python, the extra ``asyncgpu[cupti]``): busy time is exact, idle time inside the step is split
    at the host's issue, and `StepTimer.kernels` names where it went. Records only (nothing is pushed around
    launches), flushed and parsed in bulk on the harvest thread; `SourceError` naming the fix when CUPTI cannot
    be had (another profiler holds it, host devices). ``"auto"``: CUPTI when it can be had, else events
    (`StepTimer.source_note` says why).

    ``chain`` (default on): a step opened with nothing launched through asyncgpu on the timer's streams since the
    previous step's exit starts, on each device, where that step's exit events are (and no earlier than its own
    entry): its entry records no event, which takes about a third of what a step costs the loop's thread. Work
    that a framework launches onto those streams between two steps, outside asyncgpu, then counts to the next
    step where it still runs when the host has issued that step; pass ``chain=False`` if your loop launches
    device work between its steps."""
    from asyncgpu._runtime.select import resolve_devices

    devs = resolve_devices(devices)
    if not devs:
        raise ValueError("step_timer() needs at least one device: pass devices= (asyncgpu.devices())")
    keep = whole("keep", keep, minimum=1, hint="the number of recent steps kept in full")
    max_pending = whole("max_pending", max_pending, minimum=1, hint="closed steps that may wait for their devices")
    if harvest_s is not None:
        harvest_s = number("harvest_s", harvest_s, unit="seconds", minimum=1e-4)
    refresh_hz = number("refresh_hz", refresh_hz, unit="redraws per second", minimum=2.0)
    if max_clock_age_s is not None:
        max_clock_age_s = number("max_clock_age_s", max_clock_age_s, unit="seconds", infinite="never re-measure")
    wants_live(live)  # (checks the value)
    cupti.check_source(source)
    return StepTimer(
        devs,
        _streams(devs, streams),
        keep,
        max_pending,
        live,
        trace,
        label,
        harvest_s,
        refresh_hz,
        max_clock_age_s,
        source,
        chain,
    )


def _streams(devs: list[Device], streams: Any) -> list[Stream]:
    if streams is None:
        return [d.stream for d in devs]
    if isinstance(streams, Mapping):
        by_name = {(k.name if isinstance(k, Device) else str(k)): v for k, v in streams.items()}
        unknown = sorted(set(by_name) - {d.name for d in devs})
        if unknown:
            raise ValueError(f"streams= names {', '.join(unknown)}, not among the timer's devices")
        return [d.stream_of(by_name.get(d.name)) for d in devs]
    items = list(streams) if isinstance(streams, (list, tuple)) else None
    if items is None or len(items) != len(devs):
        raise TypeError(
            f"streams= is a dict {{device: stream}} or a list of {len(devs)} streams in the devices' order, "
            f"not {streams!r}"
        )
    return [d.stream_of(s) for d, s in zip(devs, items)]
