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
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, final

from . import _nvtx
from ._errors import NotReadyError, ScopeError

if TYPE_CHECKING:
    from ._device import Device
    from ._stream import Stream

__all__ = ["ActivityRecord", "Timer", "gpu_timer", "run_timed"]

_SCOPES: ContextVar[tuple] = ContextVar("asyncgpu_scopes", default=())
_NEW, _OPEN, _DONE = 0, 1, 2
_RELEASE_LAST = 1 << 62  # a deferred release queues behind every real wait of its stream

KINDS = ("kernel", "memcpy", "memset", "graph", "user")


@dataclass(frozen=True, slots=True)
class ActivityRecord:
    """One timed activity of a scope. Times in milliseconds, on the activity's device clock."""

    device: str  #: ``"cuda:0"``, ``"host:1"``
    stream: str  #: the stream's label (``s0``, ``s1``… worker streams; ``x0``… adopted streams)
    name: str
    kind: str  #: kernel, memcpy, memset, graph or user
    start_ms: float | None  #: from the scope's start on this device; None if the device had not finished it
    duration_ms: float | None  #: None if the device had not finished it when the scope ended

    @property
    def complete(self) -> bool:
        return self.duration_ms is not None


class _Activity:
    __slots__ = ("device", "stream", "name", "kind", "start_raw", "end_raw", "refs", "duration_ms", "nvtx_id")


def _owners(scopes: tuple, device: Device) -> list:
    return [s for s in scopes if s._state == _OPEN and device in s._devset]


def _begin(stream: Stream, name: str, kind: str, owners: list) -> _Activity:
    dev = stream.device
    raw = dev._pool_t.take()
    stream._bd.record(raw, stream._raw)
    act = _Activity()
    act.device, act.stream, act.name, act.kind = dev, stream, name, kind
    act.start_raw, act.end_raw, act.refs, act.duration_ms = raw, None, len(owners), None
    act.nvtx_id = None
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


def run_timed(stream: Stream, name: str, kind: str, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` (which enqueues work on ``stream``), bracketed by events for every open scope that
    covers the stream's device. The hot path of every built-in workload and launch."""
    scopes = _SCOPES.get()
    owners = _owners(scopes, stream.device) if scopes else None
    if not owners:
        fn(*args)
    else:
        act = _begin(stream, name, kind, owners)
        try:
            fn(*args)
        finally:
            _end(act)
    stream._tag = name


@final
class _ActivityBlock:
    """``with t.activity(...)`` / ``async with t.activity(...)``: times what is enqueued on the stream inside."""

    __slots__ = ("_timer", "_stream", "_name", "_kind", "_act")

    def __init__(self, timer: Timer, stream: Stream, name: str, kind: str) -> None:
        self._timer, self._stream, self._name, self._kind, self._act = timer, stream, name, kind, None

    def __enter__(self) -> _ActivityBlock:
        timer = self._timer
        if timer._state != _OPEN:
            raise ScopeError(f"activity {self._name!r} is outside its scope: use t.activity() inside the "
                             "`async with gpu_timer(...) as t:` block")
        owners = _owners(_SCOPES.get(), self._stream.device)
        if timer not in owners:
            owners.append(timer)
        self._act = _begin(self._stream, self._name, self._kind, owners)
        return self

    def __exit__(self, *exc: object) -> None:
        act, self._act = self._act, None
        if act is not None:
            _end(act)
            self._stream._tag = self._name

    async def __aenter__(self) -> _ActivityBlock:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


@final
class Timer:
    """A timing scope over some devices. Make one with `gpu_timer`; use it once (``async with`` or ``with``).

    Results, available after the block: `records`, `host_ms`, `cpu_ms`, `device_span_ms`, the totals methods,
    and a rich report (``rich.print(t)``; ``str(t)`` gives the same as plain text).
    """

    def __init__(self, devices: Iterable[Device], label: str, synchronize: bool, nvtx: bool) -> None:
        self.devices: tuple[Device, ...] = tuple(devices)
        self._devset = frozenset(self.devices)
        self.label = label
        self.synchronize = synchronize
        self._nvtx = nvtx
        self._state = _NEW
        self._acts: list[_Activity] = []
        self._start_marks: dict[Device, Any] = {}  # Device -> Event on its marker stream
        self._token: Any = None
        self._nvtx_id: Any = None
        self._t0_ns = self._t1_ns = self._c0_ns = 0
        self.records: list[ActivityRecord] = []  #: in issue order
        self.host_ms: float | None = None  #: host wall time of the body (issuing the work)
        self.wait_ms: float | None = None  #: host wall time the exit then waited for the devices
        self.cpu_ms: float | None = None  #: CPU time of this process during the scope (all threads)
        self.device_span_ms: dict[str, float] = {}  #: per device: scope start to the end of its last activity
        self.error: str | None = None  #: what the body raised, if anything

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
        finally:
            self._finish(fences)
            self.wait_ms = (time.perf_counter_ns() - self._t1_ns) / 1e6

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
        self._token = _SCOPES.set(_SCOPES.get() + (self,))
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
        if self._nvtx_id is not None:
            _nvtx.end(self._nvtx_id)
        if exc is not None:
            self.error = f"{type(exc).__name__}: {exc}"
        streams = {id(a.stream): a.stream for a in self._acts}
        return [s.record(tag="fence") for s in streams.values() if not s.device.closed]

    def _finish(self, fences: list) -> None:
        """Turn events into records (never blocks) and give every event back."""
        starts = self._start_marks
        spans = {d.name: 0.0 for d in self.devices}
        records = []
        for act in self._acts:
            bd = act.device._bd
            if act.duration_ms is None and act.end_raw is not None:
                try:
                    act.duration_ms = bd.elapsed_ms(act.start_raw, act.end_raw)
                except NotReadyError:
                    pass
            start_ms = None
            mark = starts[act.device]
            if act.duration_ms is not None and mark._raw is not None:
                try:
                    start_ms = bd.elapsed_ms(mark._raw, act.start_raw)
                except NotReadyError:
                    pass
            records.append(ActivityRecord(act.device.name, act.stream.label, act.name, act.kind, start_ms,
                                          act.duration_ms))
            if start_ms is not None:
                spans[act.device.name] = max(spans[act.device.name], start_ms + act.duration_ms)
            act.refs -= 1
            if act.refs == 0:
                _release_activity(act)
        for ev in (*starts.values(), *fences):
            ev.release()
        self.records = records
        self.device_span_ms = spans
        self._acts = []

    # -- results ------------------------------------------------------------------------------------------
    def totals_by_device(self) -> dict[str, float]:
        """Sum of activity durations per device, in ms (complete activities only)."""
        out = {d.name: 0.0 for d in self.devices}
        for r in self.records:
            if r.duration_ms is not None:
                out[r.device] = out.get(r.device, 0.0) + r.duration_ms
        return out

    def totals_by(self, field: str = "kind") -> dict[str, tuple[int, float]]:
        """``{value: (count, total_ms)}`` grouped by an `ActivityRecord` field (``kind``, ``name``, ``device``)."""
        out: dict[str, tuple[int, float]] = {}
        for r in self.records:
            key = getattr(r, field)
            n, total = out.get(key, (0, 0.0))
            out[key] = (n + 1, total + (r.duration_ms or 0.0))
        return out

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from ._report import timer_report

        yield timer_report(self)

    def __str__(self) -> str:
        from ._report import render_text

        return render_text(self)

    def __repr__(self) -> str:
        state = ("new", "open", "done")[self._state]
        return f"<asyncgpu.Timer {self.label!r} {state} devices={[d.name for d in self.devices]}>"


def gpu_timer(devices: Any = None, *, label: str = "scope", synchronize: bool = False, nvtx: bool = True) -> Timer:
    """A timing scope over ``devices`` (a device, a list of devices or specs like ``"cuda:1"``; default: every
    device of the default backend). ``synchronize=True`` synchronizes every device before and after, as Warp's
    ScopedTimer does; otherwise the scope waits only for the work timed in it. ``nvtx`` emits NVTX ranges."""
    from ._select import resolve_devices

    return Timer(resolve_devices(devices), label, synchronize, nvtx)


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
