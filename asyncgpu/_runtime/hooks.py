"""Launch observers: how features see the work launched through the core, without the core importing them.

Every launch through a `Stream` (``launch`` and the built-in workloads) goes through `launch`. A feature that
wants to see launches (timing scopes, `asyncgpu._timing.scope`; the kernel history, `asyncgpu._timing.history`)
installs an observer with `install` while it is active and removes it with `uninstall`, as Triton's launch hooks
let Proton plug in. With no observer installed a launch costs one truth test of `OBSERVERS`.

While a feature times launches on a device with event pairs (`want_holds`), each launch there is held
(`BackendDevice.hold`): the stream waits on the device until the observers' start records, the work and their
end records are all enqueued, so that the bracket measures the work, not the host's submission of it (unheld, a
bracket on an idle stream counts tens of µs of the host's time). The hold costs a few µs of host time per launch,
and a little GPU time per launch on a busy stream. Launches on other devices are neither held nor primed.

An observer implements `LaunchObserver`. Besides launches it answers three questions other core parts and
features ask through this module:

* `wanted_kinds` / `adopt`: a graph replay (`asyncgpu._runtime.graph`) asks which activity kinds the observers
  want timed on a device, records pooled events around those parts, and hands each pair to them.
* `attach`: a feature that draws its own data on a scope's timeline (in-kernel records, handoffs) hands the
  observers a layer (see `asyncgpu._base.layers`); each open scope covering the device keeps it until it ends.

Threads: launches come from any thread; observers must be thread-safe and cheap. `install`/`uninstall` may be
called from any thread (copy-on-write: the launch path reads the tuple without a lock).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from asyncgpu._runtime.device import Device
    from asyncgpu._runtime.stream import Stream, StreamInternal

__all__ = [
    "CaptureHook",
    "HOLD_USERS",
    "LaunchObserver",
    "OBSERVERS",
    "QUEUE_BOUND",
    "QUEUE_LIMIT",
    "Replay",
    "WHOLE_GRAPH",
    "adopt",
    "attach",
    "check_queue",
    "correlate",
    "holds_everywhere",
    "holds_on",
    "install",
    "launch",
    "launch_now",
    "should_hold",
    "uncorrelate",
    "uninstall",
    "want_holds",
    "wanted_kinds",
]

#: Launches (kernels, memsets, copies, holds, timing event records, graph replays, waits) on one stream that
#: `Stream.room` waits to be under. The driver queues about 1,000 per stream (a record of an event without timing
#: takes no slot) and then blocks the launching thread.
QUEUE_BOUND = 768
#: In an event loop's thread, a launch or timing record onto a stream with this many queued raises
#: `QueueFullError` (`StreamInternal.check_room`) instead of letting the driver block the loop. Above
#: `QUEUE_BOUND`, so that a task that awaited room can launch a step's worth of work (a timed launch takes up to
#: five slots) before it awaits room again; below the driver's queue, with room for what follows an admitted launch
#: unchecked (its primer, hold and brackets; an activity block's end).
QUEUE_LIMIT = QUEUE_BOUND + 128


def check_queue(si: StreamInternal) -> None:
    """The queue-full check before a launch or timing record onto the stream of ``si`` (``stream._internal``):
    `StreamInternal.check_room` when asyncgpu's count says `QUEUE_LIMIT` launches are queued. The hottest paths
    (`launch`, `Device.record`, a step's marks) inline its comparison: ``if si.ops - si.done_ops >= QUEUE_LIMIT:
    si.check_room()``."""
    if si.ops - si.done_ops >= QUEUE_LIMIT:
        si.check_room()


class LaunchObserver(Protocol):
    """What the core calls on an installed observer. Every method may be called from any thread."""

    def launch_begin(self, stream: Stream, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> Any:
        """Before ``fn(*args)`` enqueues work on ``stream``: return a token (recorded start event…), or None
        when this launch does not interest the observer."""

    def launch_end(self, token: Any, ok: bool) -> None:
        """After the launch (``ok`` False: ``fn`` raised, or a later observer's `launch_begin` did)."""

    def wanted_kinds(self, device: Device, kinds: frozenset[str]) -> frozenset[str]:
        """Which of ``kinds`` the observer wants timed on ``device`` now (a graph replay's parts)."""

    def adopt(
        self, stream: Stream, name: str, kind: str, start_raw: Any, end_raw: Any, replay: Replay | None = None
    ) -> bool:
        """Take a pair of pooled timing events already enqueued on ``stream`` around an activity; False: not
        wanted (the caller keeps the events). ``replay``: the graph replay the activity belongs to (see
        `correlate`)."""

    def correlate(self, stream: Stream) -> Any:
        """Before a launch the observer cannot wrap (a graph replay): tag what this thread enqueues next (CUPTI's
        external correlation); returns a token for `uncorrelate` (None: nothing done)."""

    def uncorrelate(self, token: Any) -> None:
        """After that launch."""

    def attach(self, device: Device, key: Any, make_layer: Callable[[], Any], fence: Stream | None) -> list[Any]:
        """Give each open scope covering ``device`` the layer stored under ``key`` (made by ``make_layer`` the
        first time; ``key=None``: always a new one); ``fence``: a stream the scope also waits for at its end.
        Returns the layers."""


WHOLE_GRAPH = (-1, -1)  #: `Replay.nodes` of the whole graph's activity


class Replay:
    """One replay of a graph, as `adopt` hands it to observers: ``tokens`` are the observers' `correlate` tokens
    (``[(observer, token)]``); ``nodes`` = ``(first, last)``: the work nodes (kernels, memsets, copies, counted in
    capture order among the graph's ``count``) that the part covers, or `WHOLE_GRAPH`."""

    __slots__ = ("tokens", "nodes", "count")

    def __init__(self, tokens: list[tuple[Any, Any]], nodes: tuple[int, int], count: int) -> None:
        self.tokens, self.nodes, self.count = tokens, nodes, count

    def token_of(self, observer: Any) -> Any:
        for o, token in self.tokens:
            if o is observer:
                return token
        return None


class CaptureHook(Protocol):
    """What a stream's ``capture_hook`` (`StreamInternal`) is while a graph capture is open on its device
    (`asyncgpu._runtime.graph`)."""

    def timed(self, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> None:
        """Take the launch of ``fn(*args)`` on the hooked stream instead of `launch_now`."""

    def refuse_graph(self, stream: Stream) -> None:
        """Raise if a graph may not be launched on ``stream`` now."""


#: The installed observers, read by the launch path without a lock (replaced, never mutated).
OBSERVERS: tuple[LaunchObserver, ...] = ()
#: How many users want launches held now (event-timing scopes, the kernel history); CUPTI needs no hold. The
#: launch path's first test: 0 means no launch is held or primed.
HOLD_USERS = 0
_HOLD_ALL = 0  # of which want every device's launches held (the kernel history)
_HOLD_ON: dict[Any, int] = {}  # BackendDevice -> users holding its launches (scopes); replaced, never mutated
#: The engine each launch kind runs on: an event bracket whose launch follows the other engine's work on its
#: stream is primed first (see `launch_now`). Other kinds (graphs, activity blocks) leave the engine unknown.
ENGINE_OF: dict[str | None, str] = {"kernel": "compute", "memset": "compute", "memcpy": "copy"}
#: Copies named here run on another copy engine than a copy to the host: a copy between device buffers
#: (`Stream.copy`). Their brackets are primed with a copy of their own kind every time, behind the hold: unprimed,
#: the start event completes behind whatever engine ran last (up to 7 µs early after a kernel, ~1 µs early on an
#: idle stream).
_COPY_ENGINE_OF_NAME = {"copy": "copy_d2d"}
_ALWAYS_PRIMED = "copy_d2d"


def engine_of(kind: str | None, name: str | None) -> str | None:
    """The engine a launch of ``kind`` called ``name`` runs on (`ENGINE_OF`; None: unknown)."""
    if kind == "memcpy":
        return _COPY_ENGINE_OF_NAME.get(name or "", "copy")
    return ENGINE_OF.get(kind)


_lock = threading.Lock()


def install(observer: LaunchObserver) -> None:
    """Start calling ``observer`` on every launch (idempotent)."""
    global OBSERVERS
    with _lock:
        if observer not in OBSERVERS:
            OBSERVERS = (*OBSERVERS, observer)


def uninstall(observer: LaunchObserver) -> None:
    """Stop calling ``observer`` (idempotent)."""
    global OBSERVERS
    with _lock:
        OBSERVERS = tuple(o for o in OBSERVERS if o is not observer)


def want_holds(delta: int, bds: Any = None) -> None:
    """A feature that times launches with event pairs says it starts (+1) or stops (-1) needing holds: on the
    devices ``bds`` (their `BackendDevice` objects; a scope's devices), or on every device (None: the kernel
    history, which times launches anywhere). A stop names the same devices as its start."""
    global HOLD_USERS, _HOLD_ALL, _HOLD_ON
    with _lock:
        HOLD_USERS += delta
        if bds is None:
            _HOLD_ALL += delta
            return
        on = dict(_HOLD_ON)
        for bd in bds:
            n = on.get(bd, 0) + delta
            if n:
                on[bd] = n
            else:
                del on[bd]
        _HOLD_ON = on


def holds_everywhere() -> bool:
    """Whether some feature times launches on every device now (the kernel history): a device opened meanwhile sets
    up what its held launches need at once (`asyncgpu._runtime.select.device`)."""
    return _HOLD_ALL != 0


def holds_on(bd: Any) -> bool:
    """Whether some feature times launches on the device of ``bd`` with event pairs now (`want_holds`): its
    launches are then held and primed. Launches on devices no such feature covers pay neither."""
    return HOLD_USERS != 0 and (_HOLD_ALL != 0 or bd in _HOLD_ON)


def should_hold(bd: Any, raw_stream: Any) -> bool:
    """The hold policy, asked only for a launch on a device some feature times with event pairs (`holds_on`):
    whether that launch onto ``raw_stream`` is held. Always: holding only onto an idle stream would spare busy
    streams the hold's GPU time, but a launch that follows short work may find the stream drained by the time it
    is enqueued. (``bd`` and ``raw_stream``: for a policy that looks at the stream, such as one a benchmark puts in
    its place.)"""
    return True


def launch(stream: Stream, name: str, kind: str, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` (which enqueues work on ``stream``) with the observers around it: the hot path of
    every built-in workload and launch. While the stream is being captured into a graph, the capture takes the
    call instead (it times the part on every replay)."""
    si = stream._internal
    hook = si.capture_hook
    if hook is None and not OBSERVERS:  # the hot path, `launch_now`'s first branch without its frame
        if si.ops - si.done_ops >= QUEUE_LIMIT:  # (`check_queue`, inlined)
            si.check_room()
        fn(*args)
        si.tag, si.last_kind = name, kind
        si.counted()
        return
    if hook is not None:
        hook.timed(name, kind, fn, args)
        return
    launch_now(stream, name, kind, fn, args)


def launch_now(stream: Stream, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> None:
    """`launch` without the capture check."""
    observers = OBSERVERS
    si = stream._internal
    if si.ops - si.done_ops >= QUEUE_LIMIT:  # (`check_queue` inlined; its primer, hold and brackets fit the margin)
        si.check_room()
    if not observers:  # the hot path: nobody watches this launch
        fn(*args)
        si.tag, si.last_kind = name, kind
        si.counted()
        return
    bd = si.bd
    primed = 0
    timed = holds_on(bd)
    if timed:
        # A record runs behind the engine of its stream's previous operation: after a compute<->copy switch the
        # start event would complete ~5 µs before the work starts. A tiny operation of the launch's own engine
        # first puts the start event behind that engine (`BackendDevice.prime`; measured in RESULTS.md run 26).
        engine = engine_of(kind, name)
        if engine is not None and engine != _ALWAYS_PRIMED and engine_of(si.last_kind, si.tag) != engine:
            bd.prime(si.raw, engine)
            primed = 1
    # Hold the stream until the observers' brackets and the work are all enqueued: on an idle stream the start
    # event would otherwise complete at once and the bracket count the host's submission time (see `hold`).
    held = bd.hold(si.raw, True) if timed and should_hold(bd, si.raw) else None  # (watched: it spans this launch)
    si.held = held is not None
    if timed and engine_of(kind, name) == _ALWAYS_PRIMED:  # behind the hold, so it runs right before the work
        bd.prime(si.raw, _ALWAYS_PRIMED)
        primed = 1
        if held is not None:  # (each step tells the hold's watchdog that this thread is not stuck: `progressed`)
            bd.progressed(held)
    begun: list[tuple[LaunchObserver, Any]] = []
    try:
        for o in observers:
            token = o.launch_begin(stream, name, kind, fn, args)
            if token is not None:
                begun.append((o, token))
        if held is not None:
            bd.progressed(held)
        fn(*args)
        if held is not None:
            bd.progressed(held)
    except BaseException:
        for o, token in reversed(begun):
            o.launch_end(token, False)
        raise
    else:
        for o, token in reversed(begun):
            o.launch_end(token, True)
    finally:
        si.tag, si.last_kind = name, kind
        if held is not None:
            si.held = False
            bd.release(held)
    si.tag = name
    si.counted(1 + primed + (held is not None) + 2 * len(begun))  # the work, primer, hold, 2 records each


def wanted_kinds(device: Device, kinds: frozenset[str]) -> frozenset[str]:
    """The activity kinds among ``kinds`` that some observer wants timed on ``device`` now."""
    out: frozenset[str] = frozenset()
    for o in OBSERVERS:
        out |= o.wanted_kinds(device, kinds)
    return out


def adopt(stream: Stream, name: str, kind: str, start_raw: Any, end_raw: Any, replay: Replay | None = None) -> bool:
    """Hand a pair of pooled timing events around an activity on ``stream`` to the observers. True when one
    took it (it then releases them); False: the caller keeps the events."""
    for o in OBSERVERS:
        if o.adopt(stream, name, kind, start_raw, end_raw, replay):
            return True
    return False


def correlate(stream: Stream) -> list[tuple[Any, Any]]:
    """Each observer's `LaunchObserver.correlate` token, before a launch made outside `launch` (a graph replay)."""
    out = []
    for o in OBSERVERS:
        token = o.correlate(stream)
        if token is not None:
            out.append((o, token))
    return out


def uncorrelate(tokens: list[tuple[Any, Any]]) -> None:
    """After that launch: each observer's `LaunchObserver.uncorrelate`, in reverse."""
    for o, token in reversed(tokens):
        o.uncorrelate(token)


def attach(device: Device, make_layer: Callable[[], Any], *, key: Any = None, fence: Stream | None = None) -> list[Any]:
    """Give a layer (see `asyncgpu._base.layers`) to every open scope covering ``device``: the one stored under
    ``key`` in each scope (made by ``make_layer`` the first time), or a new one per call when ``key`` is None.
    ``fence``: a stream each such scope also waits for when it ends. Returns the layers (empty: no scope)."""
    out: list[Any] = []
    for o in OBSERVERS:
        out += o.attach(device, key, make_layer, fence)
    return out
