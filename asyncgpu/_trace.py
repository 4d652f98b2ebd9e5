"""Trace layers: the protocol by which features draw their own data on a timeline's trace, and the track
numbering every trace writer shares.

A *layer* is finished data attached to a `Timeline` (``timeline.layers``): the in-kernel records of a gather
(`asyncgpu.kernel`), the handoffs of a channel within a scope (`asyncgpu._handoff`). A trace writer
(`asyncgpu._export`) asks each layer for its events and never touches a device, an event or a pool::

    layer.trace_events(timeline, origin_ns, first_tid) -> (events, tids_used)

``events`` are Trace Event Format dicts (``ts``/``dur`` in µs from ``origin_ns``) on the processes numbered
here (`HOST_PID`, `device_pid`), on tracks numbered from ``first_tid`` on; ``tids_used`` says how many.

While a scope is open, a feature hands it a *live* layer through `asyncgpu._core.hooks.attach`; when the scope
ends it calls the live layer's ``finish()``, which returns the finished layer (the data) kept in the timeline.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

__all__ = ["HOST_PID", "LiveLayer", "TraceLayer", "device_pid", "lanes"]

HOST_PID = 1  #: the trace process of the host's threads


def device_pid(d: int) -> int:
    """The trace process of device ``d`` (its index in ``timeline.devices``)."""
    return 2 + d


class TraceLayer(Protocol):
    """Finished data drawn on a timeline's trace."""

    def trace_events(self, timeline: Any, origin_ns: int, first_tid: int) -> tuple[list[dict], int]: ...


class LiveLayer(Protocol):
    """A layer a scope holds while it is open; `finish` is called once, when the scope ends (on the thread that
    ends it), and returns the `TraceLayer` the timeline keeps (or None: nothing to draw)."""

    def finish(self) -> TraceLayer | None: ...


def lanes(start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """A lane per interval such that the intervals of each lane nest (the Trace Event Format forbids complete
    events that overlap without nesting on one track). Disjoint intervals, the common case, take one pass."""
    lanes = np.zeros(len(start_ns), np.int64)
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
