"""The handoffs of a channel as a trace layer (`asyncgpu._base.layers`): `HandoffLayer` collects them while a scope
is open, `HandoffTrace` is its finished form, drawn in the scope's trace and carried as data by `read_trace`."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, fields
from typing import Any, Mapping

import numpy as np

from asyncgpu._base.errors import AsyncGPUError
from asyncgpu._base.layers import Canvas, register_layer
from asyncgpu._handoff.records import Handoff, HandoffRecord

__all__ = ["HandoffLayer", "HandoffTrace", "try_resolve"]


class HandoffLayer:
    """The handoffs of one channel within one open scope (a live layer, `asyncgpu._base.layers`). Its finished form
    is drawn in the scope's trace: on the producer's device a slice from put to GPU-ready, on the consumer's
    side a slice from GPU-ready to the take (host-side: on the consumer thread's track) or the stream's wait
    (GPU-side: on the consumer device), with a flow arrow."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handoffs: list[Handoff] = []
        self._seen: set[int] = set()

    def add(self, h: Handoff) -> None:
        if id(h) not in self._seen:
            self._seen.add(id(h))
            self.handoffs.append(h)

    def finish(self) -> HandoffTrace:
        """At the scope's end (it waited for the consumers' streams): the finished handoffs, as data."""
        for h in self.handoffs:
            if not h._resolved and h._state != 0:
                try_resolve(h)
        return HandoffTrace(self.name, tuple(h._as_record() for h in self.handoffs if h._resolved))


@dataclass(frozen=True)
class HandoffTrace:
    """The handoffs of one channel within one finished scope: a trace layer (`asyncgpu._base.layers`)."""

    name: str
    handoffs: tuple[HandoffRecord, ...]
    kind = "handoffs"

    def records(self) -> list[HandoffRecord]:
        return list(self.handoffs)

    def draw(self, tl: Any, canvas: Canvas) -> None:
        """On the producer's device a slice from put to GPU-ready; on the consumer's side a slice from GPU-ready
        to the take (host-side: a track of the host named after the consumer thread) or the stream's wait
        (GPU-side: a track of the consumer device); an arrow from the first to the second; and a counter of the
        handoffs put and not yet taken."""
        aligned = {name: tl.clocks[d].aligned for d, name in enumerate(tl.devices)}
        index = {name: d for d, name in enumerate(tl.devices)}
        tracks: dict[
            tuple[int | None, str], tuple[list, ...]
        ] = {}  # (device, label): name, start, end, seq, latency, out, in
        cat = f"handoff {self.name}"
        put_take: list[tuple[float, float]] = []
        for r in self.handoffs:
            if r.producer not in index or not aligned[r.producer] or not math.isfinite(r.ready_ns):
                continue  # a device outside this scope, or off the host time base: never mix time bases
            start = min(float(r.put_ns), r.ready_ns)
            if r.gpu_side:
                if r.consumer not in index or not aligned[r.consumer] or not math.isfinite(r.wait_end_ns):
                    continue
                consumer: tuple[int | None, str] = (index[r.consumer], f"handoff {self.name} → {r.consumer_stream}")
                c_start = r.wait_start_ns if math.isfinite(r.wait_start_ns) else r.wait_end_ns
                c_end, label = r.wait_end_ns, f"{self.name} #{r.seq} wait"
            else:
                consumer = (None, f"{r.consumer} · handoff {self.name}")
                c_start, c_end = min(r.ready_ns, float(r.take_ns)), float(r.take_ns)
                label = f"{self.name} #{r.seq} take"
            flow = canvas.flow()
            latency_us = r.latency_ns / 1e3 if math.isfinite(r.latency_ns) else math.nan
            ends = (
                (
                    (index[r.producer], f"handoff {self.name}"),
                    f"{self.name} #{r.seq} in flight",
                    start,
                    r.ready_ns,
                    flow,
                    0,
                ),
                (consumer, label, c_start, max(c_end, c_start), 0, flow),
            )
            for key, *values in ends:
                cols = tracks.setdefault(key, ([], [], [], [], [], [], []))
                for col, value in zip(cols, (*values[:3], r.seq, latency_us, *values[3:])):
                    col.append(value)
            put_take.append((float(r.put_ns), c_end))
        for (device, label), (names, start_ns, end_ns, seq, latency, out, into) in tracks.items():
            canvas.slices(
                canvas.track(label, device),
                names,
                np.arange(len(names)),
                np.array(start_ns),
                np.array(end_ns),
                cat,
                {"seq": np.array(seq), "latency_us": np.array(latency)},
                flow_out=np.array(out),
                flow_in=np.array(into),
            )
        if put_take:
            times = np.array(put_take).T.ravel()
            steps = np.repeat([1, -1], len(put_take))
            order = np.argsort(times, kind="stable")
            canvas.counter(f"handoffs in flight ({self.name})", None, times[order], np.cumsum(steps[order]), "count")

    def to_data(self) -> dict[str, Any]:
        """The handoffs as plain JSON types (`read_trace` makes the layer again with `from_data`)."""
        rows = [[None if isinstance(v, float) and math.isnan(v) else v for v in astuple(r)] for r in self.handoffs]
        return {"kind": self.kind, "name": self.name, "fields": [f.name for f in fields(HandoffRecord)], "rows": rows}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> HandoffTrace:
        """The layer `to_data` described."""
        floats = {f.name for f in fields(HandoffRecord) if f.type == "float"}
        records = []
        for row in data["rows"]:
            values: dict[str, Any] = {
                k: math.nan if v is None and k in floats else v for k, v in zip(data["fields"], row)
            }
            records.append(HandoffRecord(**values))
        return cls(str(data["name"]), tuple(records))


register_layer(HandoffTrace.kind, HandoffTrace.from_data)


def try_resolve(h: Handoff) -> None:
    """Resolve a handoff whose events have completed (used when a trace is written before the waiter
    thread got to it)."""
    pair = h._wait_events
    try:
        if pair is not None and not pair[1].query():
            return
        if pair is None and (h._event is None or not h._event.query()):
            return
    except AsyncGPUError:
        return
    h._resolve()
