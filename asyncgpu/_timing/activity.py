"""What timing scopes keep of their work in flight: an `Activity` per timed launch or block, until its last scope
has finished with it, and the CUPTI router of the timer's channel.

While a scope times with CUPTI (`asyncgpu._backends.cupti`), each activity gets an external id of the timer's
channel, pushed on the launching thread around its work; `ROUTER` maps that id back to the activity (or, for a
graph replay, to the `ReplayRecords` its activities share), and CUPTI's records are routed there at the flush.
"""

from __future__ import annotations

from typing import Any, final

from asyncgpu._backends import cupti
from asyncgpu._runtime import hooks
from asyncgpu._runtime.device import Device
from asyncgpu._runtime.stream import Stream

__all__ = ["ROUTER", "Activity", "ReplayRecords"]

ROUTER = cupti.Router(cupti.TIMER)  # external id -> activity (or a graph replay's records) until released
_NAN = float("nan")


class Activity:
    """One timed launch, graph part or block: its pair of events until they are harvested or released, and what
    its scopes read of it at their end."""

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
        "spills",
        "replay",
        "issued_ns",
    )
    device: Device
    stream: Stream
    name: str
    kind: str
    start_raw: Any
    end_raw: Any
    refs: int  # the open scopes that will read it: its events go back when the last one is done
    duration_ms: float | None
    nvtx_id: Any  # an NVTX range id (`asyncgpu._timing.nvtx.start`), None when none was opened
    placed: tuple[Any, float] | None  # (a clock's anchor or a harvest chain, host or chain time of its start, ns)
    ext: int  # the CUPTI external id (0: none pushed)
    parent: Activity | None  # the block this launch ran in (CUPTI source)
    cupti: list | None  # CUPTI records routed here: (kind, start_ns, end_ns, device, stream, name)
    held: bool  # the launch was held until its bracket was enqueued (`asyncgpu._runtime.hooks.launch_now`)
    spills: bool  # a memset, copy or inc_loop that spills the device's cache (`StreamInternal.spills`): its own cut
    replay: tuple[ReplayRecords, tuple[int, int], int] | None  # a graph replay: records, nodes, count
    issued_ns: float  # host perf_counter_ns when the host had issued it (`Timeline.issued_ns`); NaN: not yet

    def __init__(self, device: Device, stream: Stream, name: str, kind: str, start_raw: Any, refs: int) -> None:
        self.device, self.stream, self.name, self.kind = device, stream, name, kind
        self.start_raw, self.end_raw, self.refs, self.duration_ms = start_raw, None, refs, None
        self.nvtx_id = self.placed = self.parent = self.cupti = self.replay = None
        self.ext = 0
        self.held = self.spills = False
        self.issued_ns = _NAN


@final
class ReplayRecords:
    """The CUPTI records of one graph replay (every node), shared by the replay's activities."""

    __slots__ = ("ext", "cupti", "refs")

    def __init__(self) -> None:
        self.ext = ROUTER.tag(self)
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
