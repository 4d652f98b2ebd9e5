"""CUPTI's records on a scope's activities (``gpu_timer(source="cupti")``).

At a CUPTI scope's exit, `asyncgpu._timing.activity.ROUTER` has routed CUPTI's records to the activities (and graph
replays) whose external ids they carry. `apply_cupti` puts the device's own times in place of the events' where
CUPTI saw an activity's work, teaches each device how much its held event pairs add to that work, and returns the
work CUPTI saw inside blocks that asyncgpu did not launch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncgpu._runtime.clock import cut_kind
from asyncgpu._timing.activity import ROUTER, Activity, ReplayRecords

__all__ = ["apply_cupti", "drop_unadopted_replays"]

_PAIRED_KINDS = ("kernel", "memset", "memcpy")  # one launch, one CUPTI record: what teaches a device its pair excess


def drop_unadopted_replays() -> None:
    """Untag the records of graph replays no scope adopted (it closed meanwhile): nothing will route there once no
    scope uses CUPTI."""
    for ext, v in list(ROUTER.targets.items()):
        if isinstance(v, ReplayRecords) and v.refs <= 0:
            ROUTER.untag(ext)


def apply_cupti(
    acts: list[Activity], offset_ns: int, start_col: np.ndarray, dur_col: np.ndarray, from_cupti: np.ndarray
) -> tuple[list, int]:
    """CUPTI's device times in the columns (rows in the order of ``acts``; ``offset_ns``: CUPTI's clock minus the
    host's) where CUPTI saw the activity's work: a launch takes its own records' span, a block the span of its own
    and its launches' records; ``from_cupti`` marks those rows. Returns the rows to add, (device, stream, name,
    kind, start_ns, duration_ns): the work CUPTI saw inside a block that asyncgpu did not launch (a torch or CuPy
    kernel), with its own name; and how many activities other than blocks CUPTI saw no work for."""
    spans: dict[int, list] = {}  # id(act) -> [start, end] on CUPTI's clock
    extra = []
    for act in acts:
        for kind, start, end, _dev, _stream, name in act.cupti or ():
            node: Activity | None = act
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
            excess.setdefault((act.device, cut_kind(act.kind, act.name, act.spills)), []).append(
                act.duration_ms * 1e6 - (span[1] - span[0])
            )
        dur_col[i] = span[1] - span[0]
        start_col[i] = span[0] - offset_ns
        from_cupti[i] = True
    for (dev, kind), samples in excess.items():
        dev._internal.learn_pair_excess(samples, kind)
    rows = [
        (a.device, a.stream, name, kind, float(start - offset_ns), float(end - start))
        for a, kind, name, start, end in extra
    ]
    return rows, missing
