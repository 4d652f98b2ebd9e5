"""Graphs captured from a stream, timed part by part on every replay.

    with stream.capture() as graph:         # what is launched on `stream` is captured, not run
        stream.spin_us(50)                  # each launch is a part (kind kernel, memset or memcpy)
        with graph.part("stage 2"):         # a named part (kind "user") around several launches
            stream.inc_loop(a, 10)
    async with gpu_timer(dev) as t:
        for _ in range(3):
            graph.launch()                  # per replay: a "graph" record, and one record per part
    graph.close()

How parts are timed. During the capture, each launch through the stream (`asyncgpu._runtime.hooks.launch` hands it
to the capture) and each `Graph.part` is bracketed by two event-record nodes (CUDA:
``cuEventRecordWithFlags(..., CU_EVENT_RECORD_EXTERNAL)``; a plain record would only join streams inside the
capture). Each node records a placeholder event of its own, owned by the graph, and is found after
instantiation by the event it records, so the mapping does not depend on the order in which the driver lists
nodes. A replay inside a `gpu_timer` scope takes fresh timing events from the device's pool for the parts the
open scopes want, points those nodes at them (``cuGraphExecEventRecordNodeSetEvent``: replays already enqueued
keep theirs), records a pair around the launch for the whole graph, and hands each pair to the scopes
(`asyncgpu._runtime.hooks.adopt`); the scopes give them back to the pool once the device has passed them. A
replay outside any scope points the nodes back at the placeholders (the pooled events may be in use elsewhere
by then) and only launches.

The host backend keeps what is submitted to the stream during the capture and submits it again on each
replay, completing the part events in between, so the same code and tests run on both backends.

Rules: one capture per device at a time. Begin and end it in one thread and do not ``await`` inside it: CUDA
captures in thread-local mode (other threads are free, but a capture-unsafe call in the capturing thread, such
as a synchronize, invalidates the capture). A workload the capturing task launches on another stream of the
device would run at once, outside the graph: it raises `ScopeError`. Use `Graph.part`, not ``t.activity()``,
to time a group of launches inside a capture. Replays of one graph run one after another, even on two streams.

Threads and cancellation: `Graph.launch` and `Graph.close` may be called from any thread. Neither waits for
the device nor is a checkpoint: a replay is enqueued, or the call raises; there is nothing to cancel.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, final

from asyncgpu._base.errors import ClosedError, DeviceMismatchError, ScopeError
from asyncgpu._runtime import hooks
from asyncgpu._runtime.stream import Stream

if TYPE_CHECKING:
    from asyncgpu._backends.contract import BackendDevice
    from asyncgpu._runtime.device import Device

__all__ = ["Graph", "GraphCapture"]

_CAPTURING, _READY, _CLOSED = 0, 1, 2
_NO_KINDS: frozenset = frozenset()

_current: ContextVar[GraphCapture | None] = ContextVar("asyncgpu_capture", default=None)
_active: dict[Device, GraphCapture] = {}  # the open capture of each device
_active_lock = threading.Lock()


class _Resources:
    """What a graph holds on its backend: the raw graph and the placeholder event of each event node."""

    __slots__ = ("bd", "raw", "events")
    bd: BackendDevice
    raw: Any
    events: list[Any]

    def __init__(self, bd: BackendDevice) -> None:
        self.bd, self.raw, self.events = bd, None, []

    def free(self) -> None:
        raw, self.raw = self.raw, None
        events, self.events = self.events, []
        try:
            if raw is not None:
                self.bd.destroy_graph(raw)
        finally:
            for event in events:
                self.bd.destroy_event(event)


def _free(res: _Resources) -> None:
    """`Graph.close` and the garbage collector: failures become warnings, as in any destructor."""
    try:
        res.free()
    except Exception as exc:  # noqa: BLE001 - a destructor never raises
        warnings.warn(f"a graph of {res.bd.name} could not be freed: {exc}", ResourceWarning, stacklevel=2)


@final
class Graph:
    """A graph captured on one stream. Made by ``with stream.capture() as graph:``; replay it with `launch`.

    `launch` and `close` may be called from any thread; see the module docstring for the rules of capture.
    """

    __slots__ = (
        "device",
        "stream",
        "bd",
        "_state",
        "_why",
        "_capture",
        "_res",
        "_parts",
        "_work",
        "_nodes",
        "_pointed",
        "_kinds",
        "_lock",
        "_finalizer",
        "__weakref__",
    )
    device: Device
    stream: Stream
    bd: BackendDevice
    _state: int
    _why: str
    _capture: GraphCapture | None
    _res: _Resources
    _parts: tuple[tuple[str, str, int, int], ...]
    _work: tuple[list[tuple[int, int] | None], int]
    _nodes: list[Any]
    _pointed: list[Any]
    _kinds: frozenset[str]
    _lock: threading.Lock
    _finalizer: weakref.finalize

    def __init__(self) -> None:
        raise TypeError("graphs come from `with stream.capture() as graph:`")

    @classmethod
    def _create(cls, stream: Stream, capture: GraphCapture) -> Graph:
        self = object.__new__(cls)
        self.device = stream.device
        self.stream = stream  #: the stream it was captured on: where `launch` replays it by default
        self.bd = stream._internal.bd
        self._state, self._why = _CAPTURING, ""
        self._capture = capture
        self._res = _Resources(self.bd)
        self._parts = ()  # (name, kind, start node index, end node index), in capture order
        self._work = ([], 0)  # `_work_nodes` of the parts, once the capture ended
        self._nodes = []  # the backend's event-record nodes, one per placeholder event
        self._pointed = []  # the raw event each node records now (None: unknown)
        self._kinds = _NO_KINDS
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _free, self._res)
        self._finalizer.atexit = False  # at exit the driver may be gone: let the process free it
        return self

    @property
    def parts(self) -> tuple[tuple[str, str], ...]:
        """``(name, kind)`` of each timed part, in capture order (empty until the capture ends)."""
        return tuple((name, kind) for name, kind, _, _ in self._parts)

    @property
    def closed(self) -> bool:
        return self._state == _CLOSED

    # -- capture ------------------------------------------------------------------------------------------
    def part(self, name: str) -> _PartBlock:
        """``with graph.part(name):`` inside the capture: the launches in the block form one part (kind
        ``user``), timed on every replay besides each launch of its own. Parts may nest."""
        if not isinstance(name, str):
            raise TypeError(f"a part's name is a str, not {name!r}")
        if self._state != _CAPTURING:
            raise ScopeError(
                f"graph.part({name!r}) is outside the capture: use it inside the "
                "`with stream.capture() as graph:` block"
            )
        assert self._capture is not None
        return _PartBlock(self._capture, name)

    def _finish_capture(self, raw: Any, parts: list) -> None:
        """The capture ended with ``raw``: find the event nodes and get ready to launch. Holds ``_lock``."""
        self._res.raw = raw
        self._nodes = self.bd.graph_event_nodes(raw, self._res.events)
        self._pointed = list(self._res.events)
        self._parts = tuple(p for p in parts if p is not None)
        self._work = self._work_nodes()
        self._kinds = frozenset({"graph", *(kind for _, kind, _, _ in self._parts)})
        self._state, self._capture = _READY, None

    def _discard(self, why: str) -> None:
        """Close without a launchable graph (the capture failed or its block raised). Holds ``_lock``."""
        self._state, self._why, self._capture = _CLOSED, why, None
        self._finalizer()

    # -- replay -------------------------------------------------------------------------------------------
    def launch(self, stream: Stream | Any | None = None, *, name: str = "graph") -> None:
        """Enqueue one replay on ``stream``: by default the stream it was captured on; any stream of the same
        device (or a framework stream of it, adopted). Inside open `gpu_timer` scopes covering the device, the
        replay is recorded as a ``graph`` activity called ``name``, and each captured part as an activity of
        its own name and kind (as far as each scope's ``kinds`` allow). Never blocks; any thread."""
        dev = self.device
        if not isinstance(name, str):
            raise TypeError(f"name is the replay's activity name: a str, not {name!r}")
        if self._state != _READY:
            raise self._unusable()
        if dev.closed:  # (after os.fork(): the parent's worker, closed, with its graphs still ready)
            raise dev._internal.closed_error("this graph")
        if stream is None:
            s = self.stream
        elif isinstance(stream, Stream):
            if stream.device is not dev:
                raise DeviceMismatchError(
                    f"this graph was captured on {dev.name} and cannot run on a stream of "
                    f"{stream.device.name}: capture it again there"
                )
            s = stream
        else:
            s = dev.adopt_stream(stream)
        si = s._internal
        hook = si.capture_hook
        if hook is not None:
            hook.refuse_graph(s)
        wanted = hooks.wanted_kinds(dev, self._kinds) if hooks.OBSERVERS else _NO_KINDS
        hooks.check_queue(si)
        with self._lock:
            if self._state != _READY:
                raise self._unusable()
            if not wanted:
                self._point(self._res.events)
                self.bd.launch_graph(self._res.raw, si.raw)
                si.counted()
                si.tag, si.last_kind = name, "graph"
                return
            pairs, tokens = self._launch_timed(s, name, wanted)
        si.tag, si.last_kind = name, "graph"
        nodes, count = self._work
        for act_name, kind, start_raw, end_raw, index in pairs:
            covered = nodes[index] if index >= 0 else hooks.WHOLE_GRAPH
            replay = hooks.Replay(tokens, covered, count) if covered is not None else None
            if not hooks.adopt(s, act_name, kind, start_raw, end_raw, replay):  # no scope left that wants it
                dev._internal.recycle_later(start_raw)
                dev._internal.recycle_later(end_raw)

    def _launch_timed(self, s: Stream, name: str, wanted: frozenset) -> tuple[list, list]:
        """Point the wanted parts' nodes at pooled events and launch between two more. Holds ``_lock``.
        Returns ``[(name, kind, start_raw, end_raw, part index or -1)]``, the whole graph first, and the
        observers' correlation tokens of the launch."""
        dev, bd, pool = self.device, self.bd, self.device._internal.timing_pool
        si = s._internal
        events = list(self._res.events)
        taken: list = []
        pairs: list = []
        tokens: list = []
        timed = hooks.holds_on(bd)  # (held as `hooks.launch_now` holds)
        held = bd.hold(si.raw, True) if timed and hooks.should_hold(bd, si.raw) else None
        try:
            for index, (part_name, kind, i, j) in enumerate(self._parts):
                if kind in wanted:
                    events[i] = pool.take()
                    taken.append(events[i])
                    events[j] = pool.take()
                    taken.append(events[j])
                    pairs.append((part_name, kind, events[i], events[j], index))
            self._point(events)
            whole = "graph" in wanted
            if whole:
                start = pool.take()
                taken.append(start)
                bd.record(start, si.raw)
                if held is not None:  # (the hold's watchdog: this thread is not stuck, `progressed`)
                    bd.progressed(held)
            tokens = hooks.correlate(s)  # CUPTI: the replay's nodes carry the scopes' external id
            try:
                bd.launch_graph(self._res.raw, si.raw)
                if held is not None:
                    bd.progressed(held)
                si.counted(1 + (held is not None) + whole)  # (its event nodes are part of the graph's launch)
            finally:
                hooks.uncorrelate(tokens)
            if whole:
                end = pool.take()
                taken.append(end)
                bd.record(end, si.raw)
                si.counted()
                pairs.insert(0, (name, "graph", start, end, -1))
        except BaseException:
            for raw in taken:  # back to the pool once the device has passed them (at once if never enqueued)
                dev._internal.recycle_later(raw)
            raise
        finally:
            if held is not None:
                bd.release(held)
        return pairs, tokens

    def _work_nodes(self) -> tuple[list[tuple[int, int] | None], int]:
        """Per part, the work nodes it covers as ``(first, last)`` among the captured kernels, memsets and copies
        (counted in capture order), None for a block with none; and how many work nodes there are."""
        work = [(i, j) for _, kind, i, j in self._parts if kind != "user"]
        out: list[tuple[int, int] | None] = []
        for _, _kind, i, j in self._parts:
            inside = [k for k, (a, b) in enumerate(work) if i <= a and b <= j]
            out.append((inside[0], inside[-1]) if inside else None)
        return out, len(work)

    def _point(self, events: list) -> None:
        """Make each event node record ``events[k]`` from the next launch on (only where that changes)."""
        pointed = self._pointed
        changed = [k for k, raw in enumerate(events) if pointed[k] is not raw]
        if not changed:
            return
        try:
            self.bd.set_graph_events(self._res.raw, [self._nodes[k] for k in changed], [events[k] for k in changed])
        except BaseException:
            for k in changed:
                pointed[k] = None  # unknown now: set again next time
            raise
        for k in changed:
            pointed[k] = events[k]

    def _unusable(self) -> Exception:
        if self._state == _CAPTURING:
            return ScopeError("this graph is still being captured: launch it after the `with stream.capture()` block")
        return ClosedError(
            f"this graph is closed ({self._why}): capture a new one with `with stream.capture() as graph:`"
        )

    # -- lifetime -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the executable graph and its events; a replay in flight still completes, and records of it
        already handed to scopes stay valid. Closing during the capture discards it. Idempotent; `Device.close`
        and the garbage collector do it too. Any thread."""
        with self._lock:
            if self._state == _CLOSED:
                return
            capture = self._capture if self._state == _CAPTURING else None
            self._state, self._why, self._capture = _CLOSED, "it was closed", None
        if capture is not None:
            capture._abandon()
        self._finalizer()

    def __repr__(self) -> str:
        state = ("capturing", "ready", "closed")[self._state]
        return f"<asyncgpu.Graph {self.device.name}/{self.stream.label} {state} parts={len(self._parts)}>"


@final
class _PartBlock:
    """``with graph.part(name):`` — brackets the launches inside by two event-record nodes."""

    __slots__ = ("_capture", "_name", "_start", "_slot")

    def __init__(self, capture: GraphCapture, name: str) -> None:
        self._capture, self._name, self._start, self._slot = capture, name, -1, -1

    def __enter__(self) -> _PartBlock:
        cap = self._capture
        if cap.graph is None or cap.graph._state != _CAPTURING:
            raise ScopeError(
                f"graph.part({self._name!r}) is outside the capture: use it inside the "
                "`with stream.capture() as graph:` block"
            )
        self._start = cap._event_node()
        self._slot = len(cap._parts)
        cap._parts.append(None)  # the place of this part in capture order, filled at the end of the block
        return self

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        cap = self._capture
        if exc is None and cap.graph is not None and cap.graph._state == _CAPTURING:
            cap._parts[self._slot] = (self._name, "user", self._start, cap._event_node())


@final
class GraphCapture:
    """The context manager of `Stream.capture`. While open it is the stream's capture hook: `hooks.launch` hands it
    every workload launched on the stream. Single use. Enter and exit it in one thread (see the module)."""

    __slots__ = ("stream", "graph", "_parts", "_guarded", "_token")

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.graph: Graph | None = None
        self._parts: list = []  # (name, kind, start node, end node), or None for a part still open
        self._guarded: list[Stream] = []
        self._token: Any = None

    def __enter__(self) -> Graph:
        stream = self.stream
        dev = stream.device
        dev._internal.check_open()
        if self.graph is not None:
            raise ScopeError("this capture was already used: call stream.capture() again for a new graph")
        graph = self.graph = Graph._create(stream, self)
        with _active_lock:
            _check_free(stream)
            _active[dev] = self
            stream._internal.capture_hook = self
            for other in (*dev._internal.owned_streams, *dev._internal.adopted_streams.values()):
                if other is not stream and other._internal.capture_hook is None:
                    other._internal.capture_hook = _OtherStream(self, other)
                    self._guarded.append(other)
        try:
            stream._internal.bd.begin_capture(stream._internal.raw)
        except BaseException:
            self._unhook()
            graph._discard("its capture could not begin")
            raise
        dev._internal.graphs.add(graph)
        self._token = _current.set(self)
        return graph

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            _current.reset(self._token)
        except ValueError:  # exited in another context than it was entered
            _current.set(None)
        graph, stream = self.graph, self.stream
        assert graph is not None
        bd = stream._internal.bd
        with graph._lock:
            closed_meanwhile = graph._state != _CAPTURING
            if not closed_meanwhile:
                self._unhook()
                if exc is not None:
                    bd.abort_capture(stream._internal.raw)
                    graph._discard(f"its capture block raised {type(exc).__name__}")
                    return
                try:
                    graph._finish_capture(bd.end_capture(stream._internal.raw), self._parts)
                except BaseException:
                    graph._discard("its capture failed")
                    raise
        if closed_meanwhile:
            if not stream.device.closed and stream._internal.capture_hook is None:
                bd.abort_capture(stream._internal.raw)  # closed from another thread, which could not end the capture
            if exc is None:
                raise ClosedError(f"the graph was closed during its capture ({graph._why}): capture it again")

    # -- the hook `hooks.launch` calls -----------------------------------------------------------------------
    def timed(self, name: str, kind: str, fn: Any, args: tuple) -> None:
        """Capture ``fn(*args)`` between two event-record nodes: a part of the graph."""
        start = self._event_node()
        fn(*args)
        self._parts.append((name, kind, start, self._event_node()))

    def refuse_graph(self, stream: Stream) -> None:
        raise ScopeError(
            f"{stream.label} of {stream.device.name} is being captured: a graph cannot be launched "
            "into a capture; launch it after the `with stream.capture()` block"
        )

    def _event_node(self) -> int:
        """Add an event-record node with a placeholder event of its own; returns its index."""
        assert self.graph is not None
        stream, res = self.stream, self.graph._res
        raw = stream._internal.bd.create_event(True)  # like the pooled events that replace it: nodes keep one kind
        try:
            stream._internal.bd.record_in_capture(raw, stream._internal.raw)
        except BaseException:
            stream._internal.bd.destroy_event(raw)
            raise
        res.events.append(raw)
        return len(res.events) - 1

    def _unhook(self) -> None:
        """Stop taking launches: the stream and the device's other streams run work again. Idempotent."""
        stream = self.stream
        with _active_lock:
            if stream._internal.capture_hook is self:
                stream._internal.capture_hook = None
            for other in self._guarded:
                hook = other._internal.capture_hook
                if isinstance(hook, _OtherStream) and hook.capture is self:
                    other._internal.capture_hook = None
            self._guarded = []
            if _active.get(stream.device) is self:
                del _active[stream.device]

    def _abandon(self) -> None:
        """`Graph.close` during the capture: stop it and end it (CUDA refuses from another thread: then the
        block's exit ends it)."""
        self._unhook()
        self.stream._internal.bd.abort_capture(self.stream._internal.raw)


@final
class _OtherStream:
    """The capture hook of the device's other streams while a capture is open. A workload that the capturing
    task launches there would run at once, outside the graph: it is refused. Other tasks and threads launch as
    they would without a capture."""

    __slots__ = ("capture", "stream")

    def __init__(self, capture: GraphCapture, stream: Stream) -> None:
        self.capture, self.stream = capture, stream

    def _refuse(self, what: str) -> None:
        if _current.get() is self.capture:
            s, captured = self.stream, self.capture.stream
            raise ScopeError(
                f"{what} was launched on {s.label} of {s.device.name} while {captured.label} is "
                "being captured: it would run at once, outside the graph. Launch it on the "
                f"captured stream ({captured.label}), or after the `with stream.capture()` block"
            )

    def timed(self, name: str, kind: str, fn: Any, args: tuple) -> None:
        self._refuse(repr(name))
        hooks.launch_now(self.stream, name, kind, fn, args)

    def refuse_graph(self, stream: Stream) -> None:
        self._refuse("a graph")


def _check_free(stream: Stream) -> None:
    """Raise `ScopeError` unless a capture may begin on ``stream``. Holds ``_active_lock``."""
    dev = stream.device
    if isinstance(stream._internal.capture_hook, GraphCapture):
        raise ScopeError(
            f"{stream.label} of {dev.name} is already being captured: captures do not nest; end that "
            "`with stream.capture()` block first"
        )
    other = _active.get(dev)
    if other is not None:
        raise ScopeError(
            f"{other.stream.label} of {dev.name} is being captured: one capture per device at a time; "
            "end that capture first"
        )
