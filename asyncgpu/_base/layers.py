"""Trace layers: the protocol by which features draw their own data on a timeline's trace, and the track
numbering every trace writer shares.

A *layer* is finished data attached to a `Timeline` (``timeline.layers``): the in-kernel records of a collect
(`asyncgpu.kernel`), the handoffs of a channel within a scope (`asyncgpu._handoff.channel`). A layer draws itself on a
`Canvas`, which each trace writer provides (Chrome JSON in `asyncgpu._trace.export`, Perfetto protobuf in
`asyncgpu._trace.perfetto`), so one drawing serves both formats and the layer never touches a device, an event or a
pool::

    layer.draw(timeline, canvas)        # tracks, slices, instants, counters, flows; times in host ns
    layer.to_data() -> dict             # plain JSON types, with "kind": what `read_trace` reads back
    layer_from_data(data) -> layer      # through the reader the feature registered with `register_layer`

While a scope is open, a feature hands it a *live* layer through `asyncgpu._runtime.hooks.attach`; when the scope
ends it calls the live layer's ``finish()``, which returns the finished layer (the data) kept in the timeline.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

__all__ = [
    "HOST_PID",
    "Canvas",
    "LiveLayer",
    "TraceLayer",
    "column",
    "device_pid",
    "from_column",
    "in_order",
    "lanes",
    "layer_from_data",
    "register_layer",
]

HOST_PID = 1  #: the trace process of the host's threads


def device_pid(d: int) -> int:
    """The trace process of device ``d`` (its index in ``timeline.devices``)."""
    return 2 + d


class Canvas(Protocol):
    """What a trace writer offers a layer to draw on. Times are host ns on the timeline's time base (floats,
    rounded to whole ns by the writer); ``device`` is an index into ``timeline.devices``, None for the host."""

    def track(self, name: str, device: int | None, parent: int | None = None) -> int:
        """A new track named ``name`` in the process of ``device``, nested under the track ``parent`` (a handle
        from this canvas) or directly under the process. Returns its handle."""
        ...

    def slices(
        self,
        track: int,
        names: Sequence[str],
        name: np.ndarray,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
        category: str,
        args: Mapping[str, np.ndarray] | None = None,
        flow_out: np.ndarray | None = None,
        flow_in: np.ndarray | None = None,
    ) -> None:
        """Slices on ``track``: slice ``i`` is ``names[name[i]]`` from ``start_ns[i]`` to ``end_ns[i]``. ``args``:
        per slice values (int or float arrays; NaN: no value). ``flow_out`` / ``flow_in``: per slice an id from
        `flow` (0: none) of an arrow that leaves / ends at the slice. Slices that overlap without nesting go to
        extra tracks of the same name, numbered."""
        ...

    def instants(
        self,
        track: int,
        names: Sequence[str],
        name: np.ndarray,
        at_ns: np.ndarray,
        category: str,
        args: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Instant events on ``track`` (as `slices`, without an end)."""
        ...

    def counter(self, name: str, device: int | None, at_ns: np.ndarray, values: np.ndarray, unit: str) -> None:
        """A counter track of the process of ``device``: ``values[i]`` holds from ``at_ns[i]`` on. ``unit``:
        ``"%"`` or ``"count"``."""
        ...

    def flow(self) -> int:
        """A new flow id (> 0), unique within the trace."""
        ...


class TraceLayer(Protocol):
    """Finished data drawn on a timeline's trace."""

    kind: str  #: the name its reader was registered under (`register_layer`)

    def draw(self, timeline: Any, canvas: Canvas) -> None: ...

    def to_data(self) -> dict[str, Any]: ...


class LiveLayer(Protocol):
    """A layer a scope holds while it is open; `finish` is called once, when the scope ends (on the thread that
    ends it), and returns the `TraceLayer` the timeline keeps (or None: nothing to draw)."""

    def finish(self) -> TraceLayer | None: ...


_READERS: dict[str, Callable[[Mapping[str, Any]], TraceLayer]] = {}


def register_layer(kind: str, from_data: Callable[[Mapping[str, Any]], TraceLayer]) -> None:
    """Make `layer_from_data` read layers of ``kind``: the feature that defines them calls this at import."""
    _READERS[kind] = from_data


def layer_from_data(data: Mapping[str, Any]) -> TraceLayer:
    """The layer ``data`` (from ``layer.to_data()``) describes. Raises `ValueError` for a kind no feature
    registered."""
    kind = data.get("kind")
    reader = _READERS.get(str(kind))
    if reader is None:
        raise ValueError(
            f"a trace layer of kind {kind!r}, which this asyncgpu does not know (known: {sorted(_READERS)})"
        )
    return reader(data)


def column(values: np.ndarray) -> list:
    """A numpy column as a JSON list (NaN as null)."""
    if values.dtype.kind == "f":
        return [None if math.isnan(v) else v for v in values.tolist()]
    return values.tolist()


def from_column(values: Sequence[Any], dtype: Any) -> np.ndarray:
    """The numpy column `column` wrote (null as NaN)."""
    if np.dtype(dtype).kind == "f":
        return np.array([math.nan if v is None else v for v in values], dtype)
    return np.array(values, dtype)


def lanes(start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """A lane per interval such that the intervals of each lane nest (a trace track holds only nested slices).
    Disjoint intervals, the common case, take one pass."""
    lanes = np.zeros(len(start_ns), np.int64)
    if in_order(start_ns, end_ns):
        return lanes
    order = np.lexsort((start_ns - end_ns, start_ns))
    s, e = start_ns[order], end_ns[order]
    if len(s) < 2 or bool(np.all(e[:-1] <= s[1:])):
        return lanes
    stacks: list[list[int]] = []  # per lane, the ends of its open intervals (innermost last)
    for i, si, ei in zip(order.tolist(), s.tolist(), e.tolist()):
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= si:
                stack.pop()
            if not stack or ei <= stack[-1]:
                stack.append(ei)
                lanes[i] = k
                break
        else:
            lanes[i] = len(stacks)
            stacks.append([ei])
    return lanes


def in_order(start_ns: np.ndarray, end_ns: np.ndarray) -> bool:
    """True when the intervals, as given (start <= end), follow one another without overlapping (one pass, no sort)."""
    return len(start_ns) < 2 or bool(np.all(end_ns[:-1] <= start_ns[1:]) and np.all(start_ns[:-1] <= start_ns[1:]))
