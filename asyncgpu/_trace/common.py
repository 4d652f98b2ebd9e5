"""What the two trace formats share (Chrome JSON, `asyncgpu._trace.export`; Perfetto protobuf,
`asyncgpu._trace.perfetto`): the rows a trace draws, its time origin, the metadata `read_trace` rebuilds a
`Timeline` from, the counters drawn from a timeline, and opening the file.

Metadata (a JSON object: ``otherData`` of a JSON trace, a debug annotation of a Perfetto trace): the trace
version, ``origin_ns`` (host ``perf_counter_ns``; JSON times count from it), the label, the scope times, the
devices with their clocks, the scopes, the stream and name tables, the unfinished rows (no times: not drawn),
host/wait/CPU times, the timing source, collective marks, and each layer's data (``layers``).

Issue arrows: each drawn row with an issue time (`Timeline.issued_ns`) gets a flow arrow from the "host issue"
track of its host process (one per process: the timeline holds no issuing thread per row), at the issue time,
to its slice; flow ids `issue_flow` are the row plus one, and the layers' flows are numbered after them. The
issue time of an unfinished row (not drawn) travels in the metadata (``unfinished_issued_ns``).

Counters, per device, in buckets of the trace's span (at most `COUNTER_BUCKETS`, each at least a µs):
``utilisation`` (%: the time the device was busy, overlapping streams counted once) and ``activities in
flight`` (the mean number of its activities running). Neither is recorded as such: both are functions of the
activities' start and end. Events in use and waits in flight are not in a timeline, so no counter shows them;
the handoff layer draws the handoffs in flight of each channel.

Threads: any thread; nothing here touches a device.
"""

from __future__ import annotations

import errno
import math
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Sequence

import numpy as np

from asyncgpu._base.layers import Canvas, layer_from_data
from asyncgpu._base.numbers import finite
from asyncgpu._base.records import CollectiveMark, DeviceClock, HostRange, ScopeInfo, Timeline

__all__ = [
    "COUNTER_BUCKETS",
    "ISSUE_TRACK",
    "ROW_WINDOW",
    "TRACE_VERSION",
    "draw_counters",
    "drawn",
    "drawn_span",
    "host_key",
    "issue_flow",
    "issued_rows",
    "open_for_writing",
    "origin_ns",
    "row_windows",
    "scope_info",
    "timeline_from",
    "trace_meta",
]

TRACE_VERSION = 1
COUNTER_BUCKETS = 1000
ROW_WINDOW = 1 << 17  #: timeline rows a pass over a large timeline looks at at once
ISSUE_TRACK = "host issue"  #: the host track the issue arrows start from (``r1/host issue`` for rank 1's)
_RANK_DEVICE = re.compile(r"^(r\d+)/")


def row_windows(tl: Timeline) -> Iterator[slice]:
    """The timeline's rows, `ROW_WINDOW` at a time: what a pass over a large timeline holds at once."""
    for lo in range(0, len(tl), ROW_WINDOW):
        yield slice(lo, min(lo + ROW_WINDOW, len(tl)))


def drawn(tl: Timeline, rows: Any = slice(None)) -> np.ndarray:
    """Of ``rows``, those with every time known (a mask): the rest (unfinished) have no place on a track."""
    return np.isfinite(tl.duration_ns[rows]) & np.isfinite(tl.start_ns[rows]) & np.isfinite(tl.end_ns[rows])


def drawn_span(tl: Timeline) -> tuple[float, float, int]:
    """The earliest start and the latest end of the drawn rows (ns; inf, -inf without any), and how many."""
    spans = _window_spans(tl)
    if not spans:
        return math.inf, -math.inf, 0
    return min(lo for _, lo, _, _ in spans), max(hi for _, _, hi, _ in spans), sum(n for _, _, _, n in spans)


def _window_spans(tl: Timeline) -> list[tuple[slice, float, float, int]]:
    """Per window of rows with drawn rows: the window, its earliest start, its latest end, how many it draws."""
    out = []
    for w in row_windows(tl):
        m = drawn(tl, w)
        n = int(m.sum())
        if n:
            lo = float(np.min(tl.start_ns[w], where=m, initial=math.inf))
            hi = float(np.max(np.maximum(tl.end_ns[w], tl.start_ns[w]), where=m, initial=-math.inf))
            out.append((w, lo, hi, n))
    return out


def origin_ns(tl: Timeline) -> int:
    """The earliest time of the trace (scope starts, host ranges, the starts and issue times of the drawn rows),
    whole ns."""
    lo, _, _ = drawn_span(tl)
    for w in row_windows(tl):
        issued = tl.issued_ns[w][issued_rows(tl, w) - w.start]
        lo = min(lo, float(issued.min(initial=math.inf)))
    candidates = [tl.scope_start_ns] + [r.start_ns for r in tl.host_ranges]
    return int(min(candidates + ([math.floor(lo)] if math.isfinite(lo) else [])))


def issued_rows(tl: Timeline, rows: slice = slice(None)) -> np.ndarray:
    """Of ``rows`` (a window), the indices of the drawn rows with an issue time: the rows that get an arrow."""
    start = rows.start or 0
    return start + np.flatnonzero(drawn(tl, rows) & np.isfinite(tl.issued_ns[rows]))


def issue_flow(rows: np.ndarray) -> np.ndarray:
    """The flow id of each row's issue arrow (uint64; the canvases number the layers' flows after ``len(tl)``)."""
    return np.asarray(rows, np.uint64) + np.uint64(1)


def host_key(device: str) -> str:
    """The host process a device's work was issued from: ``""``, or ``r1`` for a device ``r1/cuda:0`` of a merged
    gather."""
    m = _RANK_DEVICE.match(device)
    return m.group(1) if m else ""


def scope_info(tl: Timeline) -> dict:
    """The scope metadata shared by the traces and the JSON records."""
    devices = []
    for d, name in enumerate(tl.devices):
        c = tl.clocks[d]
        devices.append(
            {
                "name": name,
                "description": tl.descriptions[d],
                "aligned": c.aligned,
                "bound_ns": finite(c.bound_ns),
                "offset_ns": None if c.offset_ns is None else int(c.offset_ns),
                "drift_ppm": finite(c.drift_ppm),
                "reason": c.reason,
                "overhead_ns": c.overhead_ns,
                "overhead_source": c.overhead_source,
            }
        )
    scopes = [
        {
            "label": sc.label,
            "start_ns": sc.start_ns,
            "end_ns": sc.end_ns,
            "rows": sc.rows,
            "error": sc.error,
            "cancelled": sc.cancelled,
        }
        for sc in tl.scope_infos()
    ]
    return {
        "label": tl.label,
        "scope_start_ns": int(tl.scope_start_ns),
        "scope_end_ns": int(tl.scope_end_ns),
        "error": tl.error,
        "cancelled": tl.cancelled,
        "devices": devices,
        "scopes": scopes,
    }


def trace_meta(tl: Timeline, origin: int, host_pid: int, device_pids: Sequence[int]) -> dict:
    """The metadata of a trace of ``tl`` (see the module docstring)."""
    from asyncgpu._version import __version__

    unfinished = np.concatenate([w.start + np.flatnonzero(~drawn(tl, w)) for w in row_windows(tl)] + [np.zeros(0, int)])
    info = scope_info(tl)
    for dev, pid in zip(info["devices"], device_pids):
        dev["pid"] = pid
    return {
        "asyncgpu_trace_version": TRACE_VERSION,
        "asyncgpu_version": __version__,
        "origin_ns": origin,
        "time_base": "ts and dur: µs from origin_ns, host time.perf_counter_ns()",
        **info,
        "host_pid": host_pid,
        "streams": [[d, label] for d, label in tl.streams],
        "names": list(tl.names),
        "rows": len(tl),
        "host_ms": tl.host_ms,
        "wait_ms": tl.wait_ms,
        "cpu_ms": tl.cpu_ms,
        "source": tl.source,
        "source_note": tl.source_note,
        "marks": [[m.name, m.host_ns, m.row, m.thread] for m in tl.marks],
        "unfinished_rows": int(unfinished.size),
        "unfinished": np.column_stack(
            [unfinished, tl.stream[unfinished], tl.name[unfinished], tl.kind[unfinished]]
        ).tolist(),
        "unfinished_issued_ns": [None if not math.isfinite(x) else round(x) for x in tl.issued_ns[unfinished].tolist()],
        "layers": [layer.to_data() for layer in tl.layers],
    }


def timeline_from(
    meta: Mapping[str, Any],
    rows: np.ndarray,
    stream: np.ndarray,
    name: np.ndarray,
    kind: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    duration_ns: np.ndarray,
    host_ranges: Sequence[HostRange],
    issued: tuple[np.ndarray, np.ndarray] | None = None,
) -> Timeline:
    """The `Timeline` a trace holds: ``meta`` (`trace_meta`) and, per drawn row ``rows[i]``, its stream, name
    and kind codes and its times (ns); ``issued``: ``(rows, issue times in ns)`` of the drawn rows that have one
    (the issue arrows' starts); the unfinished rows come from ``meta``. Raises `ValueError` when rows are
    missing or repeated, `KeyError` / `TypeError` / `IndexError` for malformed metadata."""
    n = int(meta["rows"])
    unfinished = np.array(meta["unfinished"], np.int64).reshape(-1, 4)
    seen = np.zeros(n, np.int64)
    np.add.at(seen, np.concatenate([rows, unfinished[:, 0]]), 1)
    if not np.all(seen == 1):
        raise ValueError(f"rows {np.flatnonzero(seen != 1)[:5].tolist()}... are missing or repeated")
    streams = tuple((int(d), str(label)) for d, label in meta["streams"])
    stream_col, name_col, kind_col = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int8)
    start, end, dur = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    stream_col[rows], name_col[rows], kind_col[rows] = stream, name, kind
    start[rows], end[rows], dur[rows] = start_ns, end_ns, duration_ns
    u = unfinished[:, 0]
    stream_col[u], name_col[u], kind_col[u] = unfinished[:, 1], unfinished[:, 2], unfinished[:, 3]
    issued_col = np.full(n, np.nan)
    if issued is not None:
        issued_col[issued[0]] = issued[1]
    issued_col[u] = [math.nan if x is None else x for x in meta.get("unfinished_issued_ns", [None] * len(u))]
    devices = meta["devices"]
    scopes = meta["scopes"]
    return Timeline(
        label=meta["label"],
        devices=tuple(d["name"] for d in devices),
        streams=streams,
        names=tuple(meta["names"]),
        device=np.array([d for d, _ in streams], np.int16)[stream_col],
        stream=stream_col,
        name=name_col,
        kind=kind_col,
        start_ns=start,
        end_ns=end,
        duration_ns=dur,
        scope_start_ns=int(meta["scope_start_ns"]),
        scope_end_ns=int(meta["scope_end_ns"]),
        clocks=tuple(
            DeviceClock(
                d["name"],
                bool(d["aligned"]),
                _nan(d["bound_ns"]),
                d["offset_ns"],
                d["drift_ppm"],
                d["reason"],
                float(d.get("overhead_ns", 0.0)),
                str(d.get("overhead_source", "")),
            )
            for d in devices
        ),
        host_ranges=tuple(host_ranges),
        descriptions=tuple(d["description"] for d in devices),
        error=meta["error"],
        cancelled=bool(meta["cancelled"]),
        host_ms=meta.get("host_ms"),
        wait_ms=meta.get("wait_ms"),
        cpu_ms=meta.get("cpu_ms"),
        source=str(meta.get("source", "events")),
        source_note=str(meta.get("source_note", "")),
        marks=tuple(CollectiveMark(str(n), int(t), int(r), str(th)) for n, t, r, th in meta.get("marks", ())),
        scopes=tuple(ScopeInfo(**sc) for sc in scopes) if len(scopes) > 1 else (),
        layers=tuple(layer_from_data(data) for data in meta.get("layers", ())),
        issued_ns=issued_col,
    )


def draw_counters(tl: Timeline, canvas: Canvas) -> None:
    """Per device with drawn activities, its ``utilisation`` and ``activities in flight`` counters (see the
    module docstring). The rows are taken a window of time at a time (about `ROW_WINDOW` rows each, in start
    order), so memory stays flat; the busy block still open at a window's end carries over to the next."""
    spans = _window_spans(tl)
    if not spans:
        return
    lo, hi, n = drawn_span(tl)
    width = max(math.ceil((hi - lo) / COUNTER_BUCKETS / 1e3) * 1e3, 1e3)
    edges = lo + width * np.arange(max(math.ceil((hi - lo) / width), 1) + 1)
    n_dev = len(tl.devices)
    busy, running = np.zeros((n_dev, len(edges))), np.zeros((n_dev, len(edges)))
    carry: list[tuple[float, float] | None] = [None] * n_dev  # per device, its busy block still open
    k = math.ceil(n / ROW_WINDOW)
    bounds = np.append(lo + (hi - lo) * np.arange(k) / k, math.inf)
    for t0, t1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        parts = [np.zeros(0, np.int64)]
        for w, w_lo, w_hi, _ in spans:  # rows come about in time order: few windows of rows hold a window of time
            if w_lo < t1 and w_hi >= t0:
                start = tl.start_ns[w]
                parts.append(w.start + np.flatnonzero(drawn(tl, w) & (start >= t0) & (start < t1)))
        rows = np.concatenate(parts)
        rows = rows[np.lexsort((tl.start_ns[rows], tl.device[rows]))]  # by device, then by start
        device = tl.device[rows]
        cuts = np.searchsorted(device, np.arange(n_dev + 1))
        for d in range(n_dev):
            mine = rows[cuts[d] : cuts[d + 1]]
            if not mine.size:
                continue
            s = tl.start_ns[mine]
            e = np.maximum(tl.end_ns[mine], s)
            running[d] += _running_ns(s, np.sort(e), edges)
            held = carry[d]
            if held is not None:
                s, e = np.append(held[0], s), np.append(held[1], e)
            reach = np.maximum.accumulate(e)
            opens = np.flatnonzero(s[1:] > reach[:-1]) + 1  # busy blocks: the union of the intervals
            block_lo = s[np.concatenate(([0], opens))]
            block_hi = reach[np.concatenate((opens - 1, [-1]))]
            busy[d] += _busy_ns(block_lo[:-1], block_hi[:-1], edges)
            carry[d] = (float(block_lo[-1]), float(block_hi[-1]))
    at = edges[:-1]
    for d, held in enumerate(carry):
        if held is None:
            continue
        busy[d] += _busy_ns(np.array([held[0]]), np.array([held[1]]), edges)
        for label, values, unit in (
            ("utilisation", np.diff(busy[d]) / width * 100, "%"),
            ("activities in flight", np.diff(running[d]) / width, "count"),
        ):
            keep = np.concatenate(([True], values[1:] != values[:-1]))  # a value where it changes
            canvas.counter(label, d, np.append(at[keep], hi), np.append(values[keep], 0.0), unit)


def _busy_ns(block_lo: np.ndarray, block_hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Busy time before each ``t`` given disjoint sorted busy blocks."""
    if not len(block_lo):
        return np.zeros(len(t))
    before = np.concatenate(([0.0], np.cumsum(block_hi - block_lo)))
    k = np.searchsorted(block_lo, t, side="right")  # blocks that start at or before t
    last = np.maximum(k - 1, 0)
    partial = np.where(k > 0, np.minimum(t, block_hi[last]) - block_lo[last], 0.0)
    return before[last] * (k > 0) + np.maximum(partial, 0.0)


def _running_ns(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Summed activity time before each ``t`` (sorted starts and ends): sum over s < t of (t - s), less the
    same over the ends."""
    out = np.zeros(len(t))
    for values, sign in ((starts, 1.0), (ends, -1.0)):
        k = np.searchsorted(values, t, side="left")
        prefix = np.concatenate(([0.0], np.cumsum(values)))
        out += sign * (k * t - prefix[k])
    return out


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


@contextmanager
def open_for_writing(path: str | os.PathLike, what: str, binary: bool = False) -> Iterator[IO[Any]]:
    """``open(path, "w")`` (``"wb"`` when ``binary``); an `OSError` raised while opening, writing or closing it
    becomes one (same errno and subclass) that names the path, the cause and the fix."""
    p = Path(path)
    try:
        f = open(p, "wb") if binary else open(p, "w", encoding="utf-8", newline="")
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {what} to {p}: {_write_problem(p, exc)}") from exc
    try:
        with f:
            yield f
    except OSError as exc:
        raise OSError(exc.errno, f"could not finish writing {what} to {p}: {_write_problem(p, exc)}") from exc


def _write_problem(p: Path, exc: OSError) -> str:
    """What went wrong writing ``p`` (the system's own words) and the fix, from the `OSError` it raised."""
    code, cause = exc.errno or 0, exc.strerror or str(exc)
    if code == errno.ENOENT and not p.parent.exists():
        return f"the directory {p.parent} does not exist: create it first"
    if code in (errno.ENOENT, errno.ENOTDIR) and not p.parent.is_dir():
        return f"{p.parent} is not a directory: choose a path in a directory"
    if code == errno.EISDIR:
        return "it is a directory: give a file name"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"{cause}: free space there, or choose a path on another device"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{cause}: choose a writable path"
    return f"{cause} ({p.parent} exists, but the system refused this file there): choose a writable path"
