"""`ProtoCanvas`: the `asyncgpu._base.layers.Canvas` that layers (in-kernel records, handoffs) and counters draw
on when a timeline is written as a Perfetto trace. It keeps their tracks and items until the writer asks for
their descriptors (`ProtoCanvas.plan`) and then for their packet sequences (`ProtoCanvas.write`).

Threads: the writer's thread; nothing here touches a device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from asyncgpu._base.layers import lanes as nesting_lanes

if TYPE_CHECKING:
    from asyncgpu._trace.perfetto.writer import Writer

__all__ = ["ProtoCanvas"]


class ProtoCanvas:
    """The `asyncgpu._base.layers.Canvas` of a Perfetto trace: tracks and items are kept (layers and counters are
    small) until `plan` makes their descriptors and `write` their sequences."""

    def __init__(self, writer: Writer) -> None:
        self.w = writer
        self.tracks: list[tuple[int | None, str, int | None]] = []  # (device, name, parent handle)
        self.items: list[list[tuple]] = []
        self.counters: list[tuple[int | None, str, np.ndarray, np.ndarray, str]] = []
        self.uuids: list[list[int]] = []  # per track: a uuid per lane
        self.counter_uuids: list[int] = []
        self._flows = len(writer.tl)  # (the issue arrows' ids come first)

    def track(self, name: str, device: int | None, parent: int | None = None) -> int:
        self.tracks.append((device, name, parent))
        self.items.append([])
        return len(self.tracks) - 1

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
        n = len(start_ns)
        s = np.rint(np.asarray(start_ns, np.float64)).astype(np.int64)
        e = np.maximum(np.rint(np.asarray(end_ns, np.float64)).astype(np.int64), s)
        none = np.zeros(n, np.uint64)
        out = none if flow_out is None else np.asarray(flow_out, np.uint64)
        into = none if flow_in is None else np.asarray(flow_in, np.uint64)
        self.items[track].append((list(names), np.asarray(name), s, e, category, dict(args or {}), out, into))

    def instants(
        self,
        track: int,
        names: Sequence[str],
        name: np.ndarray,
        at_ns: np.ndarray,
        category: str,
        args: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        t = np.rint(np.asarray(at_ns, np.float64)).astype(np.int64)
        self.items[track].append((list(names), np.asarray(name), t, None, category, dict(args or {}), None, None))

    def counter(self, name: str, device: int | None, at_ns: np.ndarray, values: np.ndarray, unit: str) -> None:
        t = np.rint(np.asarray(at_ns, np.float64)).astype(np.int64)
        self.counters.append((device, name, t, np.asarray(values, np.float64), unit))

    def flow(self) -> int:
        self._flows += 1
        return self._flows

    def _parent(self, device: int | None) -> int:
        return self.w.processes[""] if device is None else self.w.device_uuids[device]

    def plan(self) -> None:
        """The descriptors: a track per lane of each track (slices that overlap without nesting), counters."""
        pb, w = self.w.pb, self.w
        for (device, name, parent), items in zip(self.tracks, self.items):
            spans = [it for it in items if it[3] is not None]
            s = np.concatenate([np.zeros(0, np.int64)] + [it[2] for it in spans])
            e = np.concatenate([np.zeros(0, np.int64)] + [it[3] for it in spans])
            n = int(nesting_lanes(s, e).max(initial=0)) + 1
            up = self.uuids[parent][0] if parent is not None else self._parent(device)
            self.uuids.append([w.child(up, name if j == 0 else f"{name} ({j + 1})") for j in range(n)])
        for device, name, _, _, unit in self.counters:
            t = pb.TrackDescriptor(uuid=next(w.new_uuids), parent_uuid=self._parent(device), name=name)
            t.sibling_order_rank = next(w.new_ranks)
            if unit == "count":
                t.counter.unit = pb.CounterDescriptor.UNIT_COUNT
            else:
                t.counter.unit_name = unit
            w.descriptors.append(t)
            self.counter_uuids.append(int(t.uuid))

    def write(self) -> None:
        """The sequences: slices and instants of each track (a sequence per lane), then the counters."""
        for uuids, items in zip(self.uuids, self.items):
            if items:
                self._track(uuids, items)
        for uuid, (_, _, t, values, _) in zip(self.counter_uuids, self.counters):
            self.w.counter_sequence(uuid, t, values)

    def _track(self, uuids: list[int], items: list[tuple]) -> None:
        """One track's slices (a sequence per lane) and instants (on the first lane), names interned."""
        names: dict[str, int] = {}
        cats: dict[str, int] = {}
        arg_iids: dict[str, int] = {}
        for it in items:
            for key in it[5]:
                arg_iids.setdefault(key, len(arg_iids) + 1)
        spans = [it for it in items if it[3] is not None]
        points = [it for it in items if it[3] is None]

        def iids(group: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
            name = [np.array([names.setdefault(x, len(names) + 1) for x in it[0]], np.uint64)[it[1]] for it in group]
            cat = [np.full(len(it[2]), cats.setdefault(it[4], len(cats) + 1), np.uint64) for it in group]
            return _cat(name, np.uint64), _cat(cat, np.uint64)

        s_name, s_cat = iids(spans)
        i_name, i_cat = iids(points)
        s, e = _cat([it[2] for it in spans], np.int64), _cat([it[3] for it in spans], np.int64)
        out, into = _cat([it[6] for it in spans], np.uint64), _cat([it[7] for it in spans], np.uint64)
        slice_args, instant_args = _ArgColumns(arg_iids, spans), _ArgColumns(arg_iids, points)
        interned = self.w.interned(
            {v: k for k, v in names.items()}, {v: k for k, v in cats.items()}, {v: k for k, v in arg_iids.items()}
        )
        lanes = nesting_lanes(s, e)
        instants = (_cat([it[2] for it in points], np.int64), i_name, i_cat, instant_args.select(slice(None)))
        for lane, uuid in enumerate(uuids):
            sel = np.flatnonzero(lanes == lane)
            self.w.sequence(
                uuid,
                interned,
                s[sel],
                e[sel],
                s_name[sel],
                s_cat[sel],
                slice_args.select(sel),
                out[sel],
                into[sel],
                instants if lane == 0 else None,
            )


class _ArgColumns:
    """The args of several items of one track as one column per annotation (NaN or absent: not present)."""

    def __init__(self, iids: Mapping[str, int], items: list[tuple]) -> None:
        sizes = [len(it[2]) for it in items]
        self.columns: list[tuple[int, np.ndarray, np.ndarray]] = []
        for key, iid in iids.items():
            values, present = [], []
            for it, n in zip(items, sizes):
                v = it[5].get(key)
                if v is None:
                    values.append(np.zeros(n, np.int64))
                    present.append(np.zeros(n, bool))
                else:
                    v = np.asarray(v)
                    values.append(v)
                    present.append(~np.isnan(v) if v.dtype.kind == "f" else np.ones(n, bool))
            if values:
                kinds = {v.dtype.kind for v, p in zip(values, present) if p.any()}
                dtype = np.float64 if "f" in kinds else np.int64
                self.columns.append((iid, _cat(values, dtype), _cat(present, bool)))

    def select(self, sel: Any) -> list[tuple[int, np.ndarray, np.ndarray | None]]:
        return [(iid, v[sel], p[sel]) for iid, v, p in self.columns]


def _cat(parts: list, dtype: Any) -> np.ndarray:
    return np.concatenate([np.zeros(0, dtype)] + [np.asarray(p).astype(dtype) for p in parts])
