"""Which timing scopes are open, and how they see launches (`asyncgpu._runtime.hooks.LaunchObserver`).

Scopes live in a context variable (`SCOPES`), so they nest per task; scopes opened with ``all_threads=True`` also
take the work of threads that have no scope of their own. While any scope of the process is open, `OBSERVER` is
installed: each launch on a device that an open scope covers, of a kind it records, becomes an `Activity` (`begin`
records the start event, `end` the end event) appended to every such scope, and graph replays hand their parts'
event pairs to them (`Observer.adopt`). While a scope uses CUPTI, each activity also gets an external id of the
timer's channel, pushed on the launching thread around its work (`begin`, `end`). `ActivityBlock` is a
``t.activity()`` block: one activity around the work enqueued inside (`block_stream` checks its arguments).

Threads: `begin` and `end` run on the launching thread (the hot path); `opened`, `closed` and `count_cupti_user`
on the thread that enters or leaves a scope.
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from typing import Any, Callable, Iterable, Protocol, final

from asyncgpu._backends import cupti
from asyncgpu._base.errors import ScopeError
from asyncgpu._base.records import KINDS
from asyncgpu._runtime import hooks
from asyncgpu._runtime.device import Device
from asyncgpu._runtime.stream import Stream
from asyncgpu._timing import nvtx as _nvtx
from asyncgpu._timing.activity import ROUTER, Activity, ReplayRecords
from asyncgpu._timing.harvest import ended
from asyncgpu._timing.scope_cupti import drop_unadopted_replays

__all__ = [
    "DONE",
    "ActivityBlock",
    "NEW",
    "OBSERVER",
    "OPEN",
    "SCOPES",
    "OpenScope",
    "begin",
    "block_stream",
    "check_kinds",
    "closed",
    "count_cupti_user",
    "current_scopes",
    "end",
    "opened",
    "owners_of",
]

NEW, OPEN, DONE = 0, 1, 2  # a scope's states: made, entered, left
SCOPES: ContextVar[tuple] = ContextVar("asyncgpu_scopes", default=())
_THREAD_SCOPES: tuple = ()  # scopes opened with all_threads=True: they also take work of threads with no scope
_OPEN_COUNT = 0  # open scopes in the process: the launch observer is installed while there is one
_CUPTI_USERS = 0  # open scopes using CUPTI: launches get external ids while there is one
_STATE_LOCK = threading.Lock()
_BLOCKS = threading.local()  # .stack: the activity blocks open on this thread (CUPTI source only)


class OpenScope(Protocol):
    """What the observer reads and fills of a scope (`asyncgpu._timing.scope.Timer`)."""

    _state: int
    _devset: frozenset[Device]
    _kinds: frozenset[str]
    _nvtx: bool
    _acts: list[Activity]
    _host_ranges: list[tuple]  # (name, kind, start_ns, end_ns, thread ident) per activity block

    def _attach(self, key: Any, make_layer: Callable[[], Any], fence: Stream | None) -> Any: ...


def current_scopes() -> tuple[Any, ...]:
    """The scopes open in this context (task, or thread), or, when it has none, the ``all_threads`` scopes."""
    return SCOPES.get() or _THREAD_SCOPES


def opened(scope: OpenScope, all_threads: bool) -> None:
    """``scope`` (already in `SCOPES`) is open: the first open scope installs the observer."""
    global _THREAD_SCOPES, _OPEN_COUNT
    with _STATE_LOCK:
        if all_threads:
            _THREAD_SCOPES = _THREAD_SCOPES + (scope,)
        _OPEN_COUNT += 1
        if _OPEN_COUNT == 1:
            hooks.install(OBSERVER)


def closed(scope: OpenScope, all_threads: bool) -> None:
    """``scope`` (already out of `SCOPES`) is closed: the last open scope uninstalls the observer."""
    global _THREAD_SCOPES, _OPEN_COUNT
    with _STATE_LOCK:
        if all_threads:
            _THREAD_SCOPES = tuple(s for s in _THREAD_SCOPES if s is not scope)
        _OPEN_COUNT -= 1
        if _OPEN_COUNT == 0:
            hooks.uninstall(OBSERVER)


def count_cupti_user(delta: int) -> None:
    """A scope starts (+1) or stops (-1) needing external ids on launches. When the last one stops, the records
    of graph replays no scope adopted (it closed meanwhile) are dropped: nothing will route there."""
    global _CUPTI_USERS
    with _STATE_LOCK:
        _CUPTI_USERS += delta
        if not _CUPTI_USERS:
            drop_unadopted_replays()


def owners_of(scopes: tuple, device: Device, kind: str) -> list:
    """The open ones of ``scopes`` that record ``kind`` on ``device``."""
    return [s for s in scopes if s._state == OPEN and device in s._devset and kind in s._kinds]


def begin(stream: Stream, name: str, kind: str, owners: list, block: bool = False) -> Activity:
    """Record an activity's start event on ``stream`` for its ``owners`` (open scopes); ``block``: a
    ``t.activity()`` block, which launches run inside (CUPTI source)."""
    rt = stream._internal.dev
    raw = rt.timing_pool.take()
    try:
        rt.record_raw(stream, raw)
    except BaseException:
        rt.timing_pool.give(raw)  # not recorded: as it was
        raise
    act = Activity(rt.device, stream, name, kind, raw, len(owners))
    act.held = stream._internal.held and not block
    act.spills = stream._internal.spills and not block
    nvtx = _nvtx.ACTIVE or _nvtx.sink is not None
    for scope in owners:
        scope._acts.append(act)
        if nvtx and scope._nvtx and act.nvtx_id is None:
            act.nvtx_id = _nvtx.start(name, kind)
    if _CUPTI_USERS:
        act.ext = ROUTER.tag(act)
        stack = getattr(_BLOCKS, "stack", None)
        if stack:
            act.parent = stack[-1]
        if block:
            if stack is None:
                stack = _BLOCKS.stack = []
            stack.append(act)
        cupti.push(act.ext, cupti.TIMER)
    return act


def end(act: Activity, block: bool = False) -> None:
    """Record ``act``'s end event on its stream, and hand it to its device's harvest."""
    if not block:  # a launch is issued once its call returned (a held one cannot start before: see `launch_now`)
        act.issued_ns = time.perf_counter_ns()
    if act.ext:
        cupti.pop(cupti.TIMER)
        if block:
            stack = getattr(_BLOCKS, "stack", None)
            if stack and act in stack:
                stack.remove(act)
    stream, pool = act.stream, act.device._internal.timing_pool
    raw = pool.take()
    try:
        stream._internal.dev.record_raw(stream, raw)
    except BaseException:
        pool.give(raw)  # not recorded: the activity stays unfinished
        raise
    act.end_raw = raw
    if act.nvtx_id is not None:
        _nvtx.end(act.nvtx_id)
    ended(act)


class Observer:
    """How open scopes see launches, graph replays and layers (`asyncgpu._runtime.hooks.LaunchObserver`).
    Installed while any scope of the process is open."""

    def launch_begin(self, stream: Stream, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> Any:
        scopes = SCOPES.get() or _THREAD_SCOPES
        owned = owners_of(scopes, stream.device, kind) if scopes else None
        return begin(stream, name, kind, owned) if owned else None

    def launch_end(self, act: Activity, ok: bool) -> None:
        end(act)

    def wanted_kinds(self, device: Device, kinds: frozenset[str]) -> frozenset[str]:
        scopes = SCOPES.get() or _THREAD_SCOPES
        return frozenset(k for k in kinds if owners_of(scopes, device, k)) if scopes else frozenset()

    def adopt(
        self, stream: Stream, name: str, kind: str, start_raw: Any, end_raw: Any, replay: hooks.Replay | None = None
    ) -> bool:
        scopes = SCOPES.get() or _THREAD_SCOPES
        owned = owners_of(scopes, stream.device, kind) if scopes else None
        if not owned:
            return False
        act = Activity(stream.device, stream, name, kind, start_raw, len(owned))
        act.end_raw = end_raw
        act.issued_ns = time.perf_counter_ns()  # (the replay was launched just before its parts are adopted)
        target = ROUTER.targets.get(replay.token_of(self) or 0) if replay is not None else None
        if isinstance(target, ReplayRecords):
            target.refs += 1
            act.replay = (target, replay.nodes, replay.count)  # type: ignore[union-attr]  # (not None here)
        for scope in owned:
            scope._acts.append(act)
        ended(act)
        return True

    def correlate(self, stream: Stream) -> Any:
        if not _CUPTI_USERS:
            return None
        ext = ReplayRecords().ext  # what CUPTI records for the replay's nodes, until its acts go
        cupti.push(ext, cupti.TIMER)
        return ext

    def uncorrelate(self, token: Any) -> None:
        cupti.pop(cupti.TIMER)  # (the replay's records stay under `token` while an activity of it lives)

    def attach(self, device: Device, key: Any, make_layer: Callable[[], Any], fence: Stream | None) -> list[Any]:
        scopes = SCOPES.get() or _THREAD_SCOPES
        return [s._attach(key, make_layer, fence) for s in scopes if s._state == OPEN and device in s._devset]


OBSERVER = Observer()


@final
class ActivityBlock:
    """``with t.activity(...)`` / ``async with t.activity(...)``: times what is enqueued on the stream inside.
    The block's host issue time becomes a range on the host track of the timeline."""

    __slots__ = ("_timer", "_stream", "_name", "_kind", "_act", "_t0_ns")
    _timer: OpenScope
    _stream: Stream
    _name: str
    _kind: str
    _act: Activity | None
    _t0_ns: int

    def __init__(self, timer: OpenScope, stream: Stream, name: str, kind: str) -> None:
        self._timer, self._stream, self._name, self._kind, self._act = timer, stream, name, kind, None
        self._t0_ns = 0

    def __enter__(self) -> ActivityBlock:
        timer = self._timer
        if timer._state != OPEN:
            raise ScopeError(
                f"activity {self._name!r} is outside its scope: use t.activity() inside the "
                "`async with gpu_timer(...) as t:` block"
            )
        self._t0_ns = time.perf_counter_ns()
        kind = self._kind
        scopes = SCOPES.get()
        if not scopes or scopes == (timer,):  # this scope alone (the common case)
            owners = [timer] if kind in timer._kinds else []
        else:
            owners = owners_of(scopes, self._stream.device, kind)
            if timer not in owners and kind in timer._kinds:
                owners.append(timer)
        if owners:
            stream = self._stream
            hooks.check_queue(stream._internal)  # (a full stream, in a loop's thread: `QueueFullError`, nothing begun)
            act = self._act = begin(stream, self._name, self._kind, owners, block=True)
            act.issued_ns = self._t0_ns  # a block is issued when it is entered (its work follows inside)
        return self

    def __exit__(self, *exc: object) -> None:
        act, self._act = self._act, None
        if act is not None:
            end(act, block=True)
            si = self._stream._internal
            si.tag, si.last_kind = self._name, "user"  # (whatever ran inside: its engine is unknown)
            si.counted(2)
        timer = self._timer
        if timer._state == OPEN:  # a plain tuple here (hot path); a HostRange when the scope ends
            timer._host_ranges.append(
                (self._name, self._kind, self._t0_ns, time.perf_counter_ns(), threading.get_ident())
            )

    async def __aenter__(self) -> ActivityBlock:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


def block_stream(
    devices: tuple[Device, ...], name: str, device: Device | None, stream: Stream | None, kind: str
) -> Stream:
    """The stream a block ``t.activity(name, device, stream=, kind=)`` of a scope over ``devices`` times
    (default: ``device``'s default stream), its arguments checked."""
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
            if len(devices) != 1:
                raise ScopeError(
                    f"activity {name!r}: this scope covers {len(devices)} devices, name one "
                    "with device=... or stream=..."
                )
            device = devices[0]
        stream = device.stream
    elif device is not None and stream.device is not device:
        raise ScopeError(f"activity {name!r}: that stream belongs to {stream.device.name}, not {device.name}")
    if stream.device not in devices:
        raise ScopeError(
            f"activity {name!r} is on {stream.device.name}, which this scope does not cover: "
            f"add it to gpu_timer([...]) (it covers {', '.join(d.name for d in devices)})"
        )
    return stream


def check_kinds(kinds: Iterable[str] | None) -> frozenset[str]:
    """The activity kinds a scope records (``kinds=`` of `gpu_timer`: None for all), checked."""
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
