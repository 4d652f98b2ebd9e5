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
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextvars import ContextVar
from typing import Any, Callable, Iterable, Sequence, final

import numpy as np

from asyncgpu._backends import cupti
from asyncgpu._base.checks import number, whole
from asyncgpu._base.errors import AsyncGPUError, NotReadyError, ScopeError
from asyncgpu._base.records import KIND_CODES, KINDS, ActivityRecord, CollectiveMark, HostRange, Timeline
from asyncgpu._runtime import hooks, loops
from asyncgpu._runtime.clock import CLOCK_MAX_AGE_S, Placement, cut_kind, placement
from asyncgpu._runtime.device import Device
from asyncgpu._runtime.engine import KIND_CALLBACK
from asyncgpu._runtime.stream import Stream
from asyncgpu._timing import nvtx as _nvtx

__all__ = ["Timer", "current_scopes", "gpu_timer", "timing_begin", "timing_end", "timing_print"]

_SCOPES: ContextVar[tuple] = ContextVar("asyncgpu_scopes", default=())
_THREAD_SCOPES: tuple = ()  # scopes opened with all_threads=True: they also take work of threads with no scope
_OPEN_COUNT = 0  # open scopes in the process: the launch observer is installed while there is one
_STATE_LOCK = threading.Lock()
_NEW, _OPEN, _DONE = 0, 1, 2

# The CUPTI source (`asyncgpu._backends.cupti`): while a scope uses it, each activity gets an external id of the
# timer's channel, pushed on the launching thread around its work, and CUPTI's records are routed to it by that id.
_CUPTI_USERS = 0  # open scopes using CUPTI
_ROUTER = cupti.Router(cupti.TIMER)  # external id -> activity (or a graph replay's records) until released
_BLOCKS = threading.local()  # .stack: the activity blocks open on this thread (CUPTI source only)
_PAIRED_KINDS = ("kernel", "memset", "memcpy")  # one launch, one CUPTI record: what teaches a device its pair excess
_NAN = float("nan")


class _Activity:
    __slots__ = (
        "device",
        "stream",
        "name",
        "kind",
        "start_raw",
        "end_raw",
        "refs",
        "duration_ms",
        "nvtx_id",
        "placed",
        "ext",
        "parent",
        "cupti",
        "held",
        "replay",
        "issued_ns",
    )
    device: Device
    stream: Stream
    name: str
    kind: str
    start_raw: Any
    end_raw: Any
    refs: int
    duration_ms: float | None
    nvtx_id: Any  # an NVTX range id (`_nvtx.start`), None when none was opened
    placed: tuple[Any, float] | None
    ext: int  # the CUPTI external id (0: none pushed)
    parent: _Activity | None  # the block this launch ran in (CUPTI source)
    cupti: list | None  # CUPTI records routed here: (kind, start_ns, end_ns, device, stream, name)
    held: bool  # the launch was held until its bracket was enqueued (`asyncgpu._runtime.hooks.launch_now`)
    replay: tuple[_ReplayRecords, tuple[int, int], int] | None  # a graph replay: records, nodes, count
    issued_ns: float  # host perf_counter_ns when the host had issued it (`Timeline.issued_ns`); NaN: not yet

    def __init__(self, device: Device, stream: Stream, name: str, kind: str, start_raw: Any, refs: int) -> None:
        self.device, self.stream, self.name, self.kind = device, stream, name, kind
        self.start_raw, self.end_raw, self.refs, self.duration_ms = start_raw, None, refs, None
        self.nvtx_id = self.placed = self.parent = self.cupti = self.replay = None
        self.ext = 0
        self.held = False
        self.issued_ns = _NAN


# Finished activities give their events back before their scope ends (a long scope would otherwise hold two events
# per activity until its exit): once `_HARVEST_EVERY` activities of a device wait and its pool runs low, the
# device's waiter thread is asked (an engine callback on that activity's end event) to take each finished
# activity's duration and start, then recycle its events. `_HARVEST_LOCK` orders that against `_finish`.
_HARVEST_EVERY = 256
_POOL_KEEP = 1024  # free events a device's pools keep when a scope ends (`Device.trim`)
_TRIM_INLINE = 128  # releases and surplus events an async scope's exit goes through on the loop's thread (~0.1 ms)
_UNHARVESTED: dict[Device, deque[_Activity]] = {}  # (entries of closed devices go at a scope's end)
_HARVESTING: set[Device] = set()  # devices with a harvest callback pending
_HARVEST_LOCK = threading.Lock()


def _ended(act: _Activity) -> None:
    """``act``'s end is recorded: keep it for its device's harvest (hot: a deque append), and when enough of the
    device's activities wait, have them harvested once the device passes this one."""
    dev = act.device
    q = _UNHARVESTED.get(dev)
    if q is None:
        q = _UNHARVESTED[dev] = deque()
    q.append(act)
    if len(q) < _HARVEST_EVERY or dev in _HARVESTING or not dev.timing_pool.running_low():
        return  # (a pool with free events to spare: no harvest, no work on the waiter thread)
    _HARVESTING.add(dev)
    s = act.stream
    try:
        dev.engine.add(act.end_raw, s.handle, next(s.seqs), None, 0, KIND_CALLBACK, None, lambda _raw: _harvest(dev))
    except AsyncGPUError:
        _HARVESTING.discard(dev)


@final
class _Chain:
    """A device's time line for harvested activities: ``raw``, a start event the device has passed, stands at
    ``t_ns`` (ns) on it; each harvested activity keeps its start as a time on the chain, so that one event per
    device places them all at the scope's end. A new chain starts when the device was idle for `_CHAIN_GAP_MS`
    (event times are float32 milliseconds: a short step between references keeps them exact)."""

    __slots__ = ("raw", "t_ns", "refs", "live")

    def __init__(self, raw: Any) -> None:
        self.raw, self.t_ns, self.refs, self.live = raw, 0.0, 0, True


_CHAINS: dict[Device, _Chain] = {}
_CHAIN_STEP_MS = 10.0  # a newer start becomes the chain's reference after this long
_CHAIN_GAP_MS = 1_000.0


def _harvest(dev: Device) -> None:
    """On the device's waiter thread: time the finished activities at the front of its queue (duration, start on
    the device's chain) and give their events back."""
    try:
        q = _UNHARVESTED.get(dev)
        if q is None or dev.closed:
            return
        query, elapsed, pool = dev.bd.query, dev.bd.elapsed_ms, dev.timing_pool
        with _HARVEST_LOCK:
            chain = _CHAINS.get(dev)
            while q:
                act = q[0]
                if act.start_raw is None:  # its scopes have finished it
                    q.popleft()
                    continue
                start, end = act.start_raw, act.end_raw
                if end is None or not query(end):
                    return
                q.popleft()
                step_ms = elapsed(chain.raw, start) if chain is not None else _CHAIN_GAP_MS
                if chain is None or step_ms >= _CHAIN_GAP_MS:  # none yet, or too long ago for float32 steps
                    if chain is not None:
                        _retire(dev, chain)
                    chain = _CHAINS[dev] = _Chain(start)
                    dev.keep(start)
                    step_ms = 0.0
                act.duration_ms = elapsed(start, end)
                act.placed = (chain, chain.t_ns + step_ms * 1e6)
                chain.refs += 1
                act.start_raw = act.end_raw = None
                pool.give(end)
                if start is chain.raw:
                    continue
                if step_ms >= _CHAIN_STEP_MS:  # the newest start becomes the reference
                    old = chain.raw
                    chain.raw, chain.t_ns = start, chain.t_ns + step_ms * 1e6
                    dev.keep(start)
                    dev.keep(old, False)
                else:
                    pool.give(start)
    finally:
        _HARVESTING.discard(dev)


def _trim_all(devices: Sequence[Device]) -> None:
    """`Device.trim` each open one of ``devices`` to `_POOL_KEEP` (a worker thread at an async scope's exit)."""
    for d in devices:
        if not d.closed:
            d.trim(_POOL_KEEP)


def _retire(dev: Device, chain: _Chain) -> None:
    """``chain`` takes no more activities; its event goes back once no activity refers to it. Under the lock."""
    chain.live = False
    if chain.refs == 0:
        dev.keep(chain.raw, False)


def _owners(scopes: tuple, device: Device, kind: str) -> list:
    return [s for s in scopes if s._state == _OPEN and device in s._devset and kind in s._kinds]


def _begin(stream: Stream, name: str, kind: str, owners: list, block: bool = False) -> _Activity:
    dev = stream.device
    raw = dev.timing_pool.take()
    try:
        stream.bd.record(raw, stream.raw)
    except BaseException:
        dev.timing_pool.give(raw)  # not recorded: as it was
        raise
    act = _Activity(dev, stream, name, kind, raw, len(owners))
    act.held = stream.held and not block
    nvtx = _nvtx.ACTIVE or _nvtx.sink is not None
    for scope in owners:
        scope._acts.append(act)
        if nvtx and scope._nvtx and act.nvtx_id is None:
            act.nvtx_id = _nvtx.start(name, kind)
    if _CUPTI_USERS:
        act.ext = _ROUTER.tag(act)
        stack = getattr(_BLOCKS, "stack", None)
        if stack:
            act.parent = stack[-1]
        if block:
            if stack is None:
                stack = _BLOCKS.stack = []
            stack.append(act)
        cupti.push(act.ext, cupti.TIMER)
    return act


def _end(act: _Activity, block: bool = False) -> None:
    if not block:  # a launch is issued once its call returned (a held one cannot start before: see `launch_now`)
        act.issued_ns = time.perf_counter_ns()
    if act.ext:
        cupti.pop(cupti.TIMER)
        if block:
            stack = getattr(_BLOCKS, "stack", None)
            if stack and act in stack:
                stack.remove(act)
    stream, pool = act.stream, act.device.timing_pool
    raw = pool.take()
    try:
        stream.bd.record(raw, stream.raw)
    except BaseException:
        pool.give(raw)  # not recorded: the activity stays unfinished
        raise
    act.end_raw = raw
    if act.nvtx_id is not None:
        _nvtx.end(act.nvtx_id)
    _ended(act)


@final
class _ReplayRecords:
    """The CUPTI records of one graph replay (every node), shared by the replay's activities."""

    __slots__ = ("ext", "cupti", "refs")

    def __init__(self) -> None:
        self.ext = _ROUTER.tag(self)
        self.cupti: list | None = None
        self.refs = 0

    def span(self, nodes: tuple[int, int], count: int) -> list | None:
        """The whole replay's span (``nodes`` = `hooks.WHOLE_GRAPH`), or that of its work nodes ``first..last``
        (in capture order) when CUPTI saw the ``count`` work nodes the capture holds."""
        recs = sorted(self.cupti or (), key=lambda r: r[1])
        if not recs:
            return None
        if nodes == hooks.WHOLE_GRAPH:
            return [recs[0][1], max(r[2] for r in recs)]
        if len(recs) != count:
            return None  # the graph holds work asyncgpu did not capture as parts: no node-by-node match
        first, last = nodes
        return [recs[first][1], max(r[2] for r in recs[first : last + 1])]


def _count_cupti_user(delta: int) -> None:
    """A scope starts (+1) or stops (-1) needing external ids on launches. When the last one stops, the records
    of graph replays no scope adopted (it closed meanwhile) are dropped: nothing will route there."""
    global _CUPTI_USERS
    with _STATE_LOCK:
        _CUPTI_USERS += delta
        if not _CUPTI_USERS:
            for ext, v in list(_ROUTER.targets.items()):
                if isinstance(v, _ReplayRecords) and v.refs <= 0:
                    _ROUTER.untag(ext)


def current_scopes() -> tuple[Timer, ...]:
    """The scopes open in this context (task, or thread), or, when it has none, the ``all_threads`` scopes."""
    return _SCOPES.get() or _THREAD_SCOPES


def is_open(scope: Timer) -> bool:
    """Whether ``scope`` is between its entry and its exit."""
    return scope._state == _OPEN


class _Observer:
    """How open scopes see launches, graph replays and layers (`asyncgpu._runtime.hooks.LaunchObserver`).
    Installed while any scope of the process is open."""

    def launch_begin(self, stream: Stream, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> Any:
        scopes = _SCOPES.get() or _THREAD_SCOPES
        owners = _owners(scopes, stream.device, kind) if scopes else None
        return _begin(stream, name, kind, owners) if owners else None

    def launch_end(self, act: _Activity, ok: bool) -> None:
        _end(act)

    def wanted_kinds(self, device: Device, kinds: frozenset[str]) -> frozenset[str]:
        scopes = _SCOPES.get() or _THREAD_SCOPES
        return frozenset(k for k in kinds if _owners(scopes, device, k)) if scopes else frozenset()

    def adopt(
        self, stream: Stream, name: str, kind: str, start_raw: Any, end_raw: Any, replay: hooks.Replay | None = None
    ) -> bool:
        scopes = _SCOPES.get() or _THREAD_SCOPES
        owners = _owners(scopes, stream.device, kind) if scopes else None
        if not owners:
            return False
        act = _Activity(stream.device, stream, name, kind, start_raw, len(owners))
        act.end_raw = end_raw
        act.issued_ns = time.perf_counter_ns()  # (the replay was launched just before its parts are adopted)
        target = _ROUTER.targets.get(replay.token_of(self) or 0) if replay is not None else None
        if isinstance(target, _ReplayRecords):
            target.refs += 1
            act.replay = (target, replay.nodes, replay.count)  # type: ignore[union-attr]  # (not None here)
        for scope in owners:
            scope._acts.append(act)
        _ended(act)
        return True

    def correlate(self, stream: Stream) -> Any:
        if not _CUPTI_USERS:
            return None
        ext = _ReplayRecords().ext  # what CUPTI records for the replay's nodes, until its acts go
        cupti.push(ext, cupti.TIMER)
        return ext

    def uncorrelate(self, token: Any) -> None:
        cupti.pop(cupti.TIMER)  # (the replay's records stay under `token` while an activity of it lives; see `_stop`)

    def attach(self, device: Device, key: Any, make_layer: Callable[[], Any], fence: Stream | None) -> list[Any]:
        scopes = _SCOPES.get() or _THREAD_SCOPES
        return [s._attach(key, make_layer, fence) for s in scopes if s._state == _OPEN and device in s._devset]


_OBSERVER = _Observer()


@final
class _ActivityBlock:
    """``with t.activity(...)`` / ``async with t.activity(...)``: times what is enqueued on the stream inside.
    The block's host issue time becomes a range on the host track of the timeline."""

    __slots__ = ("_timer", "_stream", "_name", "_kind", "_act", "_t0_ns")
    _timer: Timer
    _stream: Stream
    _name: str
    _kind: str
    _act: _Activity | None
    _t0_ns: int

    def __init__(self, timer: Timer, stream: Stream, name: str, kind: str) -> None:
        self._timer, self._stream, self._name, self._kind, self._act = timer, stream, name, kind, None
        self._t0_ns = 0

    def __enter__(self) -> _ActivityBlock:
        timer = self._timer
        if timer._state != _OPEN:
            raise ScopeError(
                f"activity {self._name!r} is outside its scope: use t.activity() inside the "
                "`async with gpu_timer(...) as t:` block"
            )
        self._t0_ns = time.perf_counter_ns()
        kind = self._kind
        scopes = _SCOPES.get()
        if not scopes or scopes == (timer,):  # this scope alone (the common case)
            owners = [timer] if kind in timer._kinds else []
        else:
            owners = _owners(scopes, self._stream.device, kind)
            if timer not in owners and kind in timer._kinds:
                owners.append(timer)
        if owners:
            stream = self._stream
            if stream.ops - stream.done_ops >= hooks.QUEUE_LIMIT:
                stream.check_room()  # (a full stream, in a loop's thread: `QueueFullError`, nothing begun)
            act = self._act = _begin(stream, self._name, self._kind, owners, block=True)
            act.issued_ns = self._t0_ns  # a block is issued when it is entered (its work follows inside)
        return self

    def __exit__(self, *exc: object) -> None:
        act, self._act = self._act, None
        if act is not None:
            _end(act, block=True)
            stream = self._stream
            stream.tag, stream.last_kind = self._name, "user"  # (whatever ran inside: its engine is unknown)
            stream.counted(2)
        timer = self._timer
        if timer._state == _OPEN:  # a plain tuple here (hot path); a HostRange when the scope ends
            timer._host_ranges.append(
                (self._name, self._kind, self._t0_ns, time.perf_counter_ns(), threading.get_ident())
            )

    async def __aenter__(self) -> _ActivityBlock:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


ReportFunc = Callable[[list, str], None]


class _Records(list[ActivityRecord]):
    """A list of `ActivityRecord` that may also be called (``t.records()``) and then returns a plain copy."""

    __slots__ = ()

    def __call__(self) -> list[ActivityRecord]:
        return list(self)


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
        self._start_marks: dict[Device, Any] = {}  # Device -> Event on its marker stream
        self._token: Any = None
        self._nvtx_id: Any = None
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
        if self._state != _OPEN:
            raise ScopeError(f"mark({name!r}) on gpu_timer {self.label!r}, which is not open: mark inside the scope")
        with self._layer_lock:
            self._marks.append(CollectiveMark(str(name), host_ns, len(self._acts), thread))

    # -- activities ---------------------------------------------------------------------------------------
    def activity(
        self, name: str, device: Device | None = None, *, stream: Stream | None = None, kind: str = "user"
    ) -> _ActivityBlock:
        """Time the work enqueued on ``stream`` (default: ``device``'s default stream) inside the block."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if not isinstance(name, str):
            raise TypeError(f"an activity's name is a str, not {name!r}")
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"stream= takes an asyncgpu Stream (device.stream, device.streams[i]), not {stream!r}")
        if device is not None and not isinstance(device, Device):
            raise TypeError(f"device= takes one of the scope's devices (t.devices), not {device!r}")
        if stream is None:
            if device is None:
                if len(self.devices) != 1:
                    raise ScopeError(
                        f"activity {name!r}: this scope covers {len(self.devices)} devices, name one "
                        "with device=... or stream=..."
                    )
                device = self.devices[0]
            stream = device.stream
        elif device is not None and stream.device is not device:
            raise ScopeError(f"activity {name!r}: that stream belongs to {stream.device.name}, not {device.name}")
        if stream.device not in self._devset:
            raise ScopeError(
                f"activity {name!r} is on {stream.device.name}, which this scope does not cover: "
                f"add it to gpu_timer([...]) (it covers {', '.join(d.name for d in self.devices)})"
            )
        return _ActivityBlock(self, stream, name, kind)

    # -- async form ---------------------------------------------------------------------------------------
    async def __aenter__(self) -> Timer:
        self._claim()
        if self.synchronize:
            await _synchronize_all(self.devices)
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
            heavy = self._trim(at_most=_TRIM_INLINE)
            if heavy:  # in a worker thread, shielded (it always ends): the loop keeps running meanwhile
                import anyio
                import anyio.to_thread

                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_trim_all, heavy)
        self._report()
        if fence_error is not None:
            raise fence_error

    # -- blocking form (plain threads, scripts) -----------------------------------------------------------
    def __enter__(self) -> Timer:
        loops.warn_blocking("`with gpu_timer(...)` (its exit waits for the devices)", "`async with gpu_timer(...)`")
        self._claim()
        if self.synchronize:
            for d in self.devices:
                d.bd.sync_device()  # (warned above if this thread runs an event loop)
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
                    ev.block()  # (`__enter__` warned if this thread runs an event loop)
                if self.synchronize:
                    for d in self.devices:
                        if not d.closed:
                            d.bd.sync_device()
        finally:
            self._cupti_collect()
            self._finish(fences)
            _trim_all(self.devices)
        self._report()
        if fence_error is not None:
            raise fence_error

    # -- the steps ----------------------------------------------------------------------------------------
    def _claim(self) -> None:
        if self._state != _NEW:
            raise ScopeError(f"gpu_timer {self.label!r} was already used: make a new gpu_timer(...) for each scope")
        if not self.devices:
            raise ScopeError("gpu_timer() needs at least one device")
        for d in self.devices:
            d.check_open()
        self._state = _OPEN

    def _pick_source(self) -> None:
        """Take the CUPTI session when the scope asks for it and can have it; else say why not
        (`asyncgpu._backends.cupti.choose`)."""
        self.source, self.source_note = cupti.choose(self._source_req, self.devices, cupti.TIMER, "this scope")
        if self.source == "cupti":
            _count_cupti_user(1)
            self._cupti_pending = True

    def _cupti_collect(self) -> None:
        """Flush CUPTI (blocks), route its records to their activities and leave the session."""
        if not self._cupti_pending:
            return
        self._cupti_pending = False
        try:
            self._cupti_offset_ns, failed = _ROUTER.collect()
            if failed:  # the events' durations stand, and the timeline says why
                self.source, self.source_note = "events", failed
        finally:
            cupti.release(cupti.TIMER)

    def _start(self) -> None:
        marks: dict[Device, Any] = {}
        try:  # here, not in `_claim`: nothing between taking CUPTI and the scope's exit may leave it taken
            self._pick_source()
            for d in self.devices:
                marks[d] = d.mark_now()
        except BaseException:
            for ev in marks.values():
                ev.release()
            self._state = _DONE
            if self._cupti_pending:
                self._cupti_pending = False
                _count_cupti_user(-1)
                cupti.release(cupti.TIMER)
            raise
        self._start_marks = marks
        self._holding = self._held = self.source == "events"
        if self._holding:  # event pairs need held launches; CUPTI times the work itself
            hooks.want_holds(1)
        outer = _SCOPES.get()
        self._depth = len(outer)
        self._token = _SCOPES.set(outer + (self,))
        global _THREAD_SCOPES, _OPEN_COUNT
        with _STATE_LOCK:
            if self._all_threads:
                _THREAD_SCOPES = _THREAD_SCOPES + (self,)
            _OPEN_COUNT += 1
            if _OPEN_COUNT == 1:
                hooks.install(_OBSERVER)
        if self._nvtx:
            self._nvtx_id = _nvtx.start(self.label, "scope")
        self._t0_ns, self._c0_ns = time.perf_counter_ns(), time.process_time_ns()

    def _stop(self, exc: BaseException | None) -> None:
        """End the scope on the host (never raises: what the scope took is given back in `_finish`)."""
        self._t1_ns = time.perf_counter_ns()
        self.host_ms = (self._t1_ns - self._t0_ns) / 1e6
        self.cpu_ms = (time.process_time_ns() - self._c0_ns) / 1e6
        self._state = _DONE
        try:
            _SCOPES.reset(self._token)
        except ValueError:  # exited in another context than it was entered: remove it by hand
            _SCOPES.set(tuple(s for s in _SCOPES.get() if s is not self))
        if self._cupti_pending:  # no more external ids for this scope (its flush comes after the devices)
            _count_cupti_user(-1)
        global _THREAD_SCOPES, _OPEN_COUNT
        with _STATE_LOCK:
            if self._all_threads:
                _THREAD_SCOPES = tuple(s for s in _THREAD_SCOPES if s is not self)
            _OPEN_COUNT -= 1
            if _OPEN_COUNT == 0:
                hooks.uninstall(_OBSERVER)
        if self._holding:
            self._holding = False
            hooks.want_holds(-1)
        if self._nvtx_id is not None:
            _nvtx.end(self._nvtx_id)
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
        issued_col = np.fromiter((a.issued_ns for a in acts), np.float64, n)
        chain_ns: dict[_Chain, float] = {}  # the host time of each chain's reference event
        with _HARVEST_LOCK:  # (waiter threads harvest finished activities meanwhile)
            for i, act in enumerate(acts):
                dev = act.device
                device_col[i] = dev_codes[dev]
                st = streams.get(act.stream)
                if st is None:
                    st = streams[act.stream] = len(streams)
                stream_col[i] = st
                nm = names.get(act.name)
                if nm is None:
                    nm = names[act.name] = len(names)
                name_col[i] = nm
                kind_col[i] = KIND_CODES[act.kind]
                if act.duration_ms is None and act.end_raw is not None:
                    try:
                        act.duration_ms = dev.bd.elapsed_ms(act.start_raw, act.end_raw)
                    except NotReadyError:
                        pass
                if act.duration_ms is not None:
                    dur_col[i] = act.duration_ms * 1e6
                    place = placements[dev]
                    if act.placed is not None and act.placed[0] is place.anchor:
                        start_col[i] = act.placed[1]
                    elif act.start_raw is None and act.placed is not None:  # harvested: a time on its chain
                        chain, t_ns = act.placed
                        at = chain_ns.get(chain)
                        if at is None:
                            at = chain_ns[chain] = _chain_host_ns(place, chain)
                        start_col[i] = at + (t_ns - chain.t_ns) * place.rate
                    elif place.anchor is not None:
                        try:
                            start_col[i] = place.host_ns(act.start_raw)
                        except NotReadyError:
                            pass
                        else:
                            act.placed = (place.anchor, start_col[i])
                act.refs -= 1
                if act.refs == 0:
                    _release_activity(act)
            for d in [d for d in _UNHARVESTED if d.closed]:  # (a closed worker destroyed its events)
                del _UNHARVESTED[d]
                _CHAINS.pop(d, None)

        for ev in (*self._start_marks.values(), *fences):
            ev.release()
        unheld = [f"{d.name}: {why}" for d in self.devices if (why := d.bd.hold_problem())] if self._held else []
        if unheld:  # never silently: its brackets on idle streams may hold host time
            held_note = "launches not held (" + "; ".join(unheld) + ")"
            self.source_note = f"{self.source_note}; {held_note}" if self.source_note else held_note
        from_cupti = np.zeros(n, bool)
        if self.source == "cupti":
            extra = self._apply_cupti(acts, start_col, dur_col, from_cupti)
            if extra:
                device_col, stream_col, name_col, kind_col, start_col, dur_col, from_cupti = _append_rows(
                    extra,
                    dev_codes,
                    streams,
                    names,
                    device_col,
                    stream_col,
                    name_col,
                    kind_col,
                    start_col,
                    dur_col,
                    from_cupti,
                )
                issued_col = np.concatenate([issued_col, np.full(len(extra), np.nan)])  # (launched by others)
        d2d_codes = [c for name, c in names.items() if cut_kind("memcpy", name) == "memcpy_d2d"]
        d2d = np.isin(name_col, d2d_codes) if d2d_codes else None  # copies between device buffers
        for d, code in dev_codes.items():
            placements[d].trim_columns((device_col == code) & ~from_cupti, kind_col, start_col, dur_col, d2d)
        with self._layer_lock:
            live, self._layers = list(self._layers.values()), {}
            marks, self._marks = tuple(self._marks), []
        finished = tuple(ly for ly in (layer.finish() for layer in live) if ly is not None)
        self._timeline = Timeline(
            self.label,
            tuple(d.name for d in self.devices),
            tuple((dev_codes[s.device], s.label) for s in streams),
            tuple(names),
            device_col,
            stream_col,
            name_col,
            kind_col,
            start_col,
            start_col + dur_col,
            dur_col,
            self._t0_ns,
            self._t1_ns,
            tuple(placements[d].clock for d in self.devices),
            _host_ranges(self._host_ranges)
            + (HostRange(self.label, "scope", self._t0_ns, self._t1_ns, threading.current_thread().name),),
            tuple(d.description for d in self.devices),
            self.error,
            self.cancelled,
            self.host_ms,
            self.wait_ms,
            self.cpu_ms,
            marks,
            (),
            finished,
            self.source,
            self.source_note,
            issued_col,
        )
        ends = self._timeline.end_ns
        spans = {}
        for d, code in dev_codes.items():
            e = ends[(device_col == code) & np.isfinite(ends)]
            spans[d.name] = float((e.max() - self._t0_ns) / 1e6) if e.size else 0.0
        self.device_span_ms = spans
        self._acts = []
        self._host_ranges = []
        self._start_marks = {}

    def _trim(self, at_most: int) -> list[Device]:
        """Shrink the devices' pools back to `_POOL_KEEP` free events (a burst of activities grew them) where that
        means at most ``at_most`` releases and events to go through; returns the devices left for a worker thread
        (`Device.trim` blocks about 1 µs per event: thousands would stall a loop)."""
        heavy = [d for d in self.devices if not d.closed and d.trim_backlog(_POOL_KEEP) > at_most]
        _trim_all([d for d in self.devices if d not in heavy])
        return heavy

    def _apply_cupti(self, acts: list, start_col: np.ndarray, dur_col: np.ndarray, from_cupti: np.ndarray) -> list:
        """CUPTI's device times in place of the events' where CUPTI saw the activity's work: a launch takes its
        own records' span, a block the span of its own and its launches' records. Returns the rows to add: the
        work CUPTI saw inside a block that asyncgpu did not launch (a torch or CuPy kernel), with its own name."""
        spans: dict[int, list] = {}  # id(act) -> [start, end] on CUPTI's clock
        extra = []
        for act in acts:
            for kind, start, end, _dev, _stream, name in act.cupti or ():
                node: _Activity | None = act
                while node is not None:
                    span = spans.get(id(node))
                    if span is None:
                        spans[id(node)] = [start, end]
                    else:
                        span[0], span[1] = min(span[0], start), max(span[1], end)
                    node = node.parent
                if act.kind == "user":  # a block's own records: work launched inside it by others
                    extra.append((act, kind, name, start, end))
        missing = 0
        offset = self._cupti_offset_ns
        excess: dict[tuple[Any, str], list[float]] = {}  # per device and kind: raw pair minus CUPTI, single launches
        for i, act in enumerate(acts):
            span = spans.get(id(act))
            if span is None and act.replay is not None:
                target, nodes, count = act.replay
                span = target.span(nodes, count)
            if span is None:
                missing += act.kind != "user"
                continue
            if act.held and act.kind in _PAIRED_KINDS and act.duration_ms is not None and len(act.cupti or ()) == 1:
                excess.setdefault((act.device, cut_kind(act.kind, act.name)), []).append(
                    act.duration_ms * 1e6 - (span[1] - span[0])
                )
            dur_col[i] = span[1] - span[0]
            start_col[i] = span[0] - offset
            from_cupti[i] = True
        for (dev, kind), samples in excess.items():
            dev.learn_pair_excess(samples, kind)
        if missing:
            self.source_note = f"CUPTI saw no work for {missing} activities: their event-pair durations are kept"
        return [
            (a.device, a.stream, name, kind, float(start - offset), float(end - start))
            for a, kind, name, start, end in extra
        ]

    def _placement(self, dev: Device) -> Placement:
        """Where this device's events go on the host time base; when its clock cannot be aligned, relative to
        the scope's start mark (and its `DeviceClock` says why)."""
        mark = self._start_marks.get(dev)
        fallback = (mark.raw, float(self._t0_ns)) if mark is not None and mark.raw is not None else None
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
        it, ``t.records()``, as `Timeline.records` and `Channel.records`; the list it returns also works uncalled,
        as before 0.2."""
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
        from asyncgpu._analysis.summary import balance

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
    device of the default backend).

    ``synchronize=True`` synchronizes every device before and after, as Warp's ScopedTimer does; otherwise the
    scope waits only for the work timed in it. ``nvtx`` emits NVTX ranges. ``kinds`` picks which activity kinds
    are recorded (default: all of `KINDS`), as Warp's ``cuda_filter``. ``report_func(records, indent)`` is called
    when the scope ends (``indent`` grows with nesting). A device clock calibration older than
    ``max_clock_age_s`` is refreshed when the scope ends (about 0.35 ms per device on H200; the GPU clocks drift
    by up to ~10 ppm against the host's, corrected once a second of history exists).

    ``subtract_overhead`` (events source): a pair of CUDA events adds launch and completion latency to what it
    brackets (a few µs), measured once per device at its clock calibration (`Device.clock`): against CUPTI's
    record of a kernel where CUPTI can be used here (cupti-python installed, no other profiler subscribed), else
    against the kernel's own ``%globaltimer`` span, which leaves the kernel's launch and exit out (durations then
    read ~1 µs under CUPTI's; `ClockCalibration.bracket_overhead_source` says which). It is taken out of kernels,
    graphs, memsets and memcpys (half from the start). A CUPTI-source scope that has run on the device teaches it
    the pair's excess over CUPTI on the user's own work (`Device.pair_excess_ns`), which is then subtracted
    instead. ``False`` keeps the raw event times. Blocks (``kind="user"``) are never corrected.

    ``source``: where durations come from. ``"cupti"``: CUPTI's activity records (NVIDIA's cupti-python, the
    extra ``asyncgpu[cupti]``): the device's own start and end of each kernel, memset and memcpy, and the kernels
    that torch, CuPy or others launch inside an activity block, with their own names. Costs a CUPTI flush at the
    scope's end (in a worker thread for ``async with``; about 0.1 ms per hundred activities) and one CUPTI
    subscriber per process: `SourceError` when torch.profiler or Nsight Systems holds it, when cupti-python is
    missing, or on the host backend. ``"events"`` (the default: cheaper, and it leaves CUPTI to the user's
    profilers): pairs of pooled CUDA events; each launch is held on the device until its bracket is enqueued, so
    an idle stream does not add the host's submission time (see `asyncgpu._runtime.hooks.launch_now`). A block
    (``t.activity``) is not held: on an idle stream its start may include host time; launch its work through
    asyncgpu or use CUPTI. ``"auto"``: CUPTI when it can be had, else events; `Timeline.source` and
    `Timeline.source_note` say which, and why.

    Scopes belong to the context that opens them (each task, and threads run in a copy of its context). Plain
    threads started inside the scope have a context of their own: ``all_threads=True`` makes the scope also
    record the work of threads that have no scope of their own (join them before the scope ends).
    """
    from asyncgpu._runtime.select import resolve_devices

    return Timer(
        resolve_devices(devices),
        label,
        synchronize,
        nvtx,
        kinds,
        report_func,
        max_clock_age_s,
        subtract_overhead,
        all_threads,
        source,
    )


def _host_ranges(raw: list[tuple]) -> tuple[HostRange, ...]:
    names = {t.ident: t.name for t in threading.enumerate()}
    return tuple(HostRange(n, k, t0, t1, names.get(ident, f"thread {ident}")) for n, k, t0, t1, ident in raw)


def _check_kinds(kinds: Iterable[str] | None) -> frozenset[str]:
    if kinds is None:
        return frozenset(KINDS)
    if isinstance(kinds, str):
        kinds = (kinds,)
    try:
        out = frozenset(kinds)
    except TypeError:
        raise TypeError(f"kinds is a list of activity kinds (some of {', '.join(KINDS)}), not {kinds!r}") from None
    bad = sorted(out - set(KINDS))
    if bad:
        raise ValueError(f"unknown activity kind(s) {', '.join(map(repr, bad))}: use some of {', '.join(KINDS)}")
    return out


# -- functional form, for code that cannot wrap its work in a scope ------------------------------------------
_functional: list[Timer] = []


def timing_begin(
    devices: Any = None,
    *,
    kinds: Iterable[str] | None = None,
    synchronize: bool = False,
    label: str = "timing",
    source: str = "events",
) -> Timer:
    """Start recording (as Warp's ``timing_begin``): activities enqueued from here on, in this context and the
    tasks it starts, are recorded until `timing_end`. Blocking form: call it from plain code or a thread.
    ``source`` as in `gpu_timer`."""
    t = gpu_timer(devices, label=label, synchronize=synchronize, kinds=kinds, source=source)
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
    """Print records (what `timing_end` returns, or a `Timer`'s) as the activity and per-device tables (to the
    terminal through rich)."""
    from rich.console import Console

    from asyncgpu._analysis.report import records_report

    if isinstance(records, Timer):
        records = records.records
    rows = list(records) if isinstance(records, Iterable) and not isinstance(records, str) else None
    if rows is None or not all(isinstance(r, ActivityRecord) for r in rows):
        raise TypeError(
            f"timing_print() prints ActivityRecords (what timing_end() returns, or t.records), not {records!r}"
        )
    Console().print(records_report(rows, indent))


def _append_rows(extra: list, dev_codes: dict, streams: dict, names: dict, *cols: np.ndarray) -> tuple:
    """``cols`` (device, stream, name, kind, start, duration, from_cupti) with the rows of ``extra`` added."""
    device_col, stream_col, name_col, kind_col, start_col, dur_col, from_cupti = cols
    k = len(extra)
    dv, st, nm, kd = np.empty(k, np.int16), np.empty(k, np.int32), np.empty(k, np.int32), np.empty(k, np.int8)
    sc, dc = np.empty(k), np.empty(k)
    for j, (dev, stream, name, kind, start, dur) in enumerate(extra):
        dv[j] = dev_codes[dev]
        st[j] = streams.setdefault(stream, len(streams))
        nm[j] = names.setdefault(name, len(names))
        kd[j] = KIND_CODES[kind]
        sc[j], dc[j] = start, dur
    return (
        np.concatenate([device_col, dv]),
        np.concatenate([stream_col, st]),
        np.concatenate([name_col, nm]),
        np.concatenate([kind_col, kd]),
        np.concatenate([start_col, sc]),
        np.concatenate([dur_col, dc]),
        np.concatenate([from_cupti, np.ones(k, bool)]),
    )


def _chain_host_ns(place: Placement, chain: _Chain) -> float:
    try:
        return place.host_ns(chain.raw)
    except NotReadyError:  # (cannot happen: harvested events are complete)
        return float("nan")


def _release_activity(act: _Activity) -> None:
    """Its last scope is done with ``act``: its events go back, and its chain's reference when that is retired.
    Under `_HARVEST_LOCK`."""
    placed = act.placed
    if placed is not None and isinstance(placed[0], _Chain):
        chain = placed[0]
        chain.refs -= 1
        if chain.refs == 0 and not chain.live:
            act.device.keep(chain.raw, False)
    if act.ext:
        _ROUTER.untag(act.ext)
    if act.replay is not None:  # (kept on the activity: a scope reads it after the release)
        target = act.replay[0]
        target.refs -= 1
        if target.refs <= 0:
            _ROUTER.untag(target.ext)
    dev = act.device
    if act.start_raw is not None:  # (None: harvested, its events already back)
        dev.recycle_later(act.start_raw)
    if act.end_raw is not None:
        dev.recycle_later(act.end_raw)
    act.start_raw = act.end_raw = None


async def _synchronize_all(devices: tuple) -> None:
    """`Device.asynchronize` each device in turn (their waits overlap: the later ones are mostly done by then)."""
    for d in devices:
        await d.asynchronize()
