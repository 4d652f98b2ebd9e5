"""Exports at the edge of the data path: a Perfetto / Chrome trace (`write_trace`, `trace_dict`, and `read_trace`
to read one back), and the records as JSON (`to_json`) or CSV (`to_csv`).

A source is a `Timeline`, anything with a ``timeline`` (a finished `Timer`), or a list of them (several scopes,
merged in order).

Trace layout (Trace Event Format, JSON object form; ``ts``/``dur`` in µs, 3 decimals, from ``origin_ns``)::

    pid 1            "host"                      one track per host thread: scopes and t.activity() blocks
    pid device_pid(d)        "<device> <description>"    one track per stream of device d; "(NOT aligned...)" when its
                                                 clock is not on the host time base
    otherData        asyncgpu_trace_version, origin_ns (perf_counter_ns), the tables (devices with their
                     clocks, streams, names), the scopes, and the unfinished rows (no times: not drawn)

Layers: a timeline's ``layers`` (in-kernel records, handoffs between threads) add their own events through
the protocol of `asyncgpu._trace`: tracks numbered from ``first_tid`` on the device processes or the host's, and
flow arrows. `read_trace` does not bring layers back. Exporting reads data only: no device, event or pool is
touched.

Complete events (``"ph": "X"``) must nest on a track; rows that overlap without nesting (activity blocks of
concurrent tasks) go to extra tracks of the same stream or thread, named ``"s0 (2)"``. Device events carry
``args.row``, the row in the timeline, so `read_trace` rebuilds the columns in issue order.

Threads: any thread; nothing here touches a device.
"""

from __future__ import annotations

import errno
import json
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO, Union

import numpy as np

from ._records import KIND_CODES, KINDS, CollectiveMark, DeviceClock, HostRange, ScopeInfo, Timeline
from ._trace import HOST_PID, device_pid
from ._trace import lanes as nesting_lanes

__all__ = ["read_trace", "to_csv", "to_json", "trace_dict", "write_trace"]

TRACE_VERSION = 1
_CHUNK_ROWS = 100_000  # rows formatted per string: bounds the memory of a large export

Source = Union[Timeline, Any, Sequence[Any]]  # a Timeline, an object with a ``timeline`` (a Timer), or a list


# -- the trace -------------------------------------------------------------------------------------------------
def write_trace(source: Source, path: str | os.PathLike) -> None:
    """Write ``source`` as a Perfetto / Chrome trace (open it at https://ui.perfetto.dev). Raises `OSError`
    naming the path and the fix when it cannot be written."""
    tl = _merged(source)
    with _open_for_writing(path, "the trace") as f:
        for chunk in _trace_chunks(tl):
            f.write(chunk)


def trace_dict(source: Source) -> dict:
    """The trace `write_trace` writes, as a dict (parsed from the same text)."""
    return json.loads("".join(_trace_chunks(_merged(source))))


def _trace_chunks(tl: Timeline) -> Iterator[str]:
    done = np.flatnonzero(_drawn(tl))
    origin_ns = _origin_ns(tl, done)
    s_ns = np.rint(tl.start_ns[done] - origin_ns).astype(np.int64)
    e_ns = np.rint(tl.end_ns[done] - origin_ns).astype(np.int64)
    order = np.lexsort((s_ns - e_ns, s_ns))  # by start, the longer first: parents before their children
    done, s_ns, e_ns = done[order], s_ns[order], e_ns[order]
    meta = _process_meta(HOST_PID, "host", 0)
    for d, name in enumerate(tl.devices):
        label = f"{name} {tl.descriptions[d]}".strip()
        if not tl.clocks[d].aligned:
            label += " (NOT aligned: relative time)"
        meta += _process_meta(device_pid(d), label, d + 1)
    tids = np.zeros(len(done), np.int64)  # device tracks: one per stream and lane
    tid_stream = [-1]  # stream code of each tid
    stream_col = tl.stream[done]
    for st, (d, label) in enumerate(tl.streams):
        rows = np.flatnonzero(stream_col == st)
        lanes = nesting_lanes(s_ns[rows], e_ns[rows])
        for lane in range(int(lanes.max()) + 1 if rows.size else 1):
            tids[rows[lanes == lane]] = len(tid_stream)
            meta.append(_thread_meta(device_pid(d), len(tid_stream), label if lane == 0 else f"{label} ({lane + 1})"))
            tid_stream.append(st)
    host_events, host_meta = _host_events(tl, origin_ns, len(tid_stream))
    yield (
        '{"displayTimeUnit":"ns","otherData":'
        + json.dumps(_other_data(tl, origin_ns), allow_nan=False)
        + ',"traceEvents":[\n'
    )
    yield ",\n".join(json.dumps(m) for m in meta + host_meta)
    n_names, n_kinds = len(tl.names), len(KINDS)
    keys, inverse = np.unique((tids * n_names + tl.name[done]) * n_kinds + tl.kind[done], return_inverse=True)
    prefixes = np.empty(len(keys), dtype=object)
    for i, key in enumerate(keys.tolist()):
        tid, rest = divmod(key, n_names * n_kinds)
        nm, kd = divmod(rest, n_kinds)
        d, label = tl.streams[tid_stream[tid]]
        prefixes[i] = (
            f'{{"name":{json.dumps(tl.names[nm])},"cat":"{KINDS[kd]}","ph":"X","pid":{device_pid(d)},'
            f'"tid":{tid},"args":{{"stream":{json.dumps(label)},"kind":"{KINDS[kd]}","duration_ms":'
        )
    yield from _format(
        ',\n%s%.6f,"row":%d},"ts":%.3f,"dur":%.3f}',
        prefixes[inverse.reshape(-1)].tolist(),
        (tl.duration_ns[done] / 1e6).tolist(),
        done.tolist(),
        (s_ns / 1e3).tolist(),
        ((e_ns - s_ns) / 1e3).tolist(),
    )
    yield from host_events
    next_tid = len(tid_stream) + len(host_meta)
    for layer in tl.layers:
        layer_events, tids_used = layer.trace_events(tl, origin_ns, next_tid)
        next_tid += tids_used
        for ev in layer_events:
            yield ",\n" + json.dumps(ev, allow_nan=False)
    yield "\n]}\n"


def _host_events(tl: Timeline, origin_ns: int, first_tid: int) -> tuple[Iterator[str], list[dict]]:
    """The host ranges as complete events on the host process, one track per thread (and lane)."""
    ranges = tl.host_ranges
    s_ns = np.array([r.start_ns - origin_ns for r in ranges], np.int64)
    e_ns = np.array([r.end_ns - origin_ns for r in ranges], np.int64)
    threads = {t: k for k, t in enumerate(dict.fromkeys(r.thread for r in ranges))}
    thread_col = np.array([threads[r.thread] for r in ranges], np.int64)
    tids = np.zeros(len(ranges), np.int64)
    meta: list[dict] = []
    for thread, k in threads.items():
        rows = np.flatnonzero(thread_col == k)
        lanes = nesting_lanes(s_ns[rows], e_ns[rows])
        for lane in range(int(lanes.max()) + 1):
            tid = first_tid + len(meta)
            tids[rows[lanes == lane]] = tid
            meta.append(_thread_meta(HOST_PID, tid, thread if lane == 0 else f"{thread} ({lane + 1})"))
    order = np.lexsort((s_ns - e_ns, s_ns))
    prefixes = [
        f'{{"name":{json.dumps(r.name)},"cat":{json.dumps(r.kind)},"ph":"X","pid":{HOST_PID},"tid":{t},'
        f'"args":{{"kind":{json.dumps(r.kind)},"thread":{json.dumps(r.thread)},"row":'
        for r, t in zip(ranges, tids.tolist())
    ]
    events = _format(
        ',\n%s%d},"ts":%.3f,"dur":%.3f}',
        [prefixes[i] for i in order.tolist()],
        order.tolist(),
        (s_ns[order] / 1e3).tolist(),
        ((e_ns - s_ns)[order] / 1e3).tolist(),
    )
    return events, meta


def _drawn(tl: Timeline) -> np.ndarray:
    """The rows with every time known: the rest (unfinished) have no place on a track."""
    return tl.complete & np.isfinite(tl.end_ns)


def _origin_ns(tl: Timeline, done: np.ndarray) -> int:
    """The earliest time of the trace (scope starts, activity starts, host ranges): every ``ts`` is >= 0."""
    candidates = [tl.scope_start_ns] + [r.start_ns for r in tl.host_ranges]
    if done.size:
        candidates.append(math.floor(tl.start_ns[done].min()))
    return int(min(candidates))


def _process_meta(pid: int, name: str, sort_index: int) -> list[dict]:
    return [
        {"ph": "M", "pid": pid, "tid": 0, "ts": 0, "name": "process_name", "args": {"name": name}},
        {"ph": "M", "pid": pid, "tid": 0, "ts": 0, "name": "process_sort_index", "args": {"sort_index": sort_index}},
    ]


def _thread_meta(pid: int, tid: int, name: str) -> dict:
    return {"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": "thread_name", "args": {"name": name}}


def _other_data(tl: Timeline, origin_ns: int) -> dict:
    from ._version import __version__

    unfinished = np.flatnonzero(~_drawn(tl))
    info = _scope_info(tl)
    for d, dev in enumerate(info["devices"]):
        dev["pid"] = device_pid(d)
    return {
        "asyncgpu_trace_version": TRACE_VERSION,
        "asyncgpu_version": __version__,
        "origin_ns": origin_ns,
        "time_base": "ts and dur: µs from origin_ns, host time.perf_counter_ns()",
        **info,
        "host_pid": HOST_PID,
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
    }


def read_trace(path: str | os.PathLike) -> Timeline:
    """A `Timeline` from a trace written by `write_trace` (times within 1 ns). Raises `ValueError` ("not an
    asyncgpu trace: ...") for other JSON or a corrupt file, `OSError` when it cannot be read."""
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not an asyncgpu trace: {path} is not valid JSON ({exc})") from None
    meta = doc.get("otherData") if isinstance(doc, dict) else None
    version = meta.get("asyncgpu_trace_version") if isinstance(meta, dict) else None
    if version is None:
        raise ValueError(
            f"not an asyncgpu trace: {path} has no otherData.asyncgpu_trace_version (it was not "
            "written by asyncgpu.write_trace)"
        )
    if version != TRACE_VERSION:
        raise ValueError(
            f"not an asyncgpu trace this version reads: {path} is trace version {version}, this "
            f"asyncgpu reads version {TRACE_VERSION}: use the asyncgpu that wrote it"
        )
    assert isinstance(meta, dict)  # the version was read from it
    try:
        return _from_trace(doc["traceEvents"], meta)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"not an asyncgpu trace: {path} is corrupt ({type(exc).__name__}: {exc})") from None


def _from_trace(events: list, meta: dict) -> Timeline:
    origin_ns = int(meta["origin_ns"])
    devices = meta["devices"]
    streams = tuple((int(d), str(label)) for d, label in meta["streams"])
    stream_code = {(device_pid(d), label): i for i, (d, label) in enumerate(streams)}
    names = tuple(meta["names"])
    name_code = {nm: i for i, nm in enumerate(names)}
    xs = [e for e in events if e["ph"] == "X" and "row" in e.get("args", ())]  # layers' events have no row
    host = sorted((e for e in xs if e["pid"] == HOST_PID), key=lambda e: e["args"]["row"])
    dev = [e for e in xs if e["pid"] != HOST_PID]
    n = int(meta["rows"])
    rows = np.fromiter((e["args"]["row"] for e in dev), np.int64, len(dev))
    unfinished = np.array(meta["unfinished"], np.int64).reshape(-1, 4)
    seen = np.zeros(n, np.int64)
    np.add.at(seen, np.concatenate([rows, unfinished[:, 0]]), 1)
    if not np.all(seen == 1):
        raise ValueError(f"rows {np.flatnonzero(seen != 1)[:5].tolist()}... are missing or repeated")
    stream, name, kind = (np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int8))
    start, end, dur = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    stream[rows] = [stream_code[e["pid"], e["args"]["stream"]] for e in dev]
    name[rows] = [name_code[e["name"]] for e in dev]
    kind[rows] = [KIND_CODES[e["cat"]] for e in dev]
    s_ns = np.rint(np.fromiter((e["ts"] for e in dev), np.float64, len(dev)) * 1e3)
    start[rows] = origin_ns + s_ns
    end[rows] = origin_ns + s_ns + np.rint(np.fromiter((e["dur"] for e in dev), np.float64, len(dev)) * 1e3)
    dur[rows] = np.fromiter((e["args"]["duration_ms"] for e in dev), np.float64, len(dev)) * 1e6
    u = unfinished[:, 0]
    stream[u], name[u], kind[u] = unfinished[:, 1], unfinished[:, 2], unfinished[:, 3]
    device = np.array([d for d, _ in streams], np.int16)[stream]
    host_ranges = tuple(
        HostRange(
            e["name"],
            e["cat"],
            origin_ns + round(e["ts"] * 1e3),
            origin_ns + round(e["ts"] * 1e3) + round(e["dur"] * 1e3),
            e["args"]["thread"],
        )
        for e in host
    )
    scopes = meta["scopes"]
    return Timeline(
        label=meta["label"],
        devices=tuple(d["name"] for d in devices),
        streams=streams,
        names=names,
        device=device,
        stream=stream,
        name=name,
        kind=kind,
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
            )
            for d in devices
        ),
        host_ranges=host_ranges,
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
    )


# -- records as JSON and CSV -------------------------------------------------------------------------------------
def to_json(source: Source, path: str | os.PathLike | None = None) -> str | None:
    """The records as JSON: the scope's metadata (label, scope start/end in host ns, devices and their clocks,
    scopes, host ranges) and ``records``, one object per activity (times in ns, ``start_ms`` from the scope's
    start; null when unfinished). Returns the text when ``path`` is None, else writes it there."""
    tl = _merged(source)
    head = {
        "asyncgpu_records_version": 1,
        **_scope_info(tl),
        "host_ranges": [
            {"name": r.name, "kind": r.kind, "start_ns": r.start_ns, "end_ns": r.end_ns, "thread": r.thread}
            for r in tl.host_ranges
        ],
    }
    body = _records_text(
        tl,
        '{"device":%s,"stream":%s,"name":%s,"kind":%s,"start_ns":%s,"end_ns":%s,"duration_ns":%s,"start_ms":%s},\n',
        json.dumps,
        "null",
    )[:-2]
    return _deliver(f'{json.dumps(head, allow_nan=False)[:-1]},"records":[\n{body}\n]}}\n', path, "the records")


def to_csv(source: Source, path: str | os.PathLike | None = None) -> str | None:
    """The records as CSV: a header and one line per activity (device, stream, name, kind, start_ns, end_ns,
    duration_ns in host ns, start_ms from the scope's start; empty when unfinished). Returns the text when
    ``path`` is None, else writes it there."""
    text = _records_text(_merged(source), "%s,%s,%s,%s,%s,%s,%s,%s\n", _csv_field, "")
    return _deliver("device,stream,name,kind,start_ns,end_ns,duration_ns,start_ms\n" + text, path, "the CSV")


def _records_text(tl: Timeline, template: str, quote: Callable[[str], str], null: str) -> str:
    """One ``template`` per row, filled with device, stream, name, kind (each ``quote``-d), start_ns, end_ns,
    duration_ns (whole ns) and start_ms (6 decimals); ``null`` where a time is NaN (unfinished)."""

    def strings(values: np.ndarray, fmt: str) -> list[str]:
        out = ((fmt + "\n") * len(values) % tuple(values.tolist())).split("\n")[:-1]
        for i in np.flatnonzero(~np.isfinite(values)).tolist():
            out[i] = null
        return out

    def labels(table: Sequence[str], codes: np.ndarray) -> list[str]:
        return np.array([quote(x) for x in table], dtype=object)[codes].tolist()

    return "".join(
        _format(
            template,
            labels(tl.devices, tl.device),
            labels([lb for _, lb in tl.streams], tl.stream),
            labels(tl.names, tl.name),
            labels(KINDS, tl.kind),
            strings(tl.start_ns, "%.0f"),
            strings(tl.end_ns, "%.0f"),
            strings(tl.duration_ns, "%.0f"),
            strings(tl.start_ms(), "%.6f"),
        )
    )


def _csv_field(text: str) -> str:
    """A CSV field (RFC 4180): quoted, with doubled quotes, when it holds a comma, a quote or a line break."""
    return f'"{text.replace(chr(34), chr(34) * 2)}"' if any(c in text for c in ',"\r\n') else text


# -- shared ------------------------------------------------------------------------------------------------------
def _format(template: str, *columns: list) -> Iterator[str]:
    """``template`` (one row) filled from ``columns`` row by row, ``_CHUNK_ROWS`` rows per string: one %-format
    per chunk, so the formatting runs in C."""
    k, n = len(columns), len(columns[0])
    for lo in range(0, n, _CHUNK_ROWS):
        m = min(_CHUNK_ROWS, n - lo)
        flat: list[Any] = [None] * (m * k)
        for j, col in enumerate(columns):
            flat[j::k] = col[lo : lo + m]
        yield (template * m) % tuple(flat)


def _scope_info(tl: Timeline) -> dict:
    """The scope metadata shared by the trace and the JSON records."""
    devices = []
    for d, name in enumerate(tl.devices):
        c = tl.clocks[d]
        devices.append(
            {
                "name": name,
                "description": tl.descriptions[d],
                "aligned": c.aligned,
                "bound_ns": _finite(c.bound_ns),
                "offset_ns": None if c.offset_ns is None else int(c.offset_ns),
                "drift_ppm": _finite(c.drift_ppm),
                "reason": c.reason,
                "overhead_ns": c.overhead_ns,
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


def _merged(source: Source) -> Timeline:
    """One timeline from a source: device, stream and name tables are united (by name), rows concatenated in
    order. A device is aligned only if it was aligned in every scope that has it (its worst clock is kept)."""
    if isinstance(source, Timeline):
        return source
    if not isinstance(source, (list, tuple)):
        tl = getattr(source, "timeline", None)  # a Timer (ScopeError, naming the fix, while it is open)
        if isinstance(tl, Timeline):
            return tl
    if not isinstance(source, (list, tuple)) or not source:
        raise TypeError(f"export a Timeline, a Timer or a non-empty list of them, not {type(source).__name__}")
    tls = [_merged(s) for s in source]
    if len(tls) == 1:
        return tls[0]
    devices: dict[str, int] = {}
    clocks: dict[str, list[DeviceClock]] = {}
    descriptions: dict[str, str] = {}
    streams: dict[tuple[int, str], int] = {}
    names: dict[str, int] = {}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("device", "stream", "name")}
    for tl in tls:
        dev_map = np.array([devices.setdefault(nm, len(devices)) for nm in tl.devices], np.int16)
        for d, nm in enumerate(tl.devices):
            clocks.setdefault(nm, []).append(tl.clocks[d])
            descriptions.setdefault(nm, tl.descriptions[d])
        st_map = np.array(
            [streams.setdefault((int(dev_map[d]), label), len(streams)) for d, label in tl.streams], np.int32
        )
        nm_map = np.array([names.setdefault(nm, len(names)) for nm in tl.names], np.int32)
        cols["device"].append(dev_map[tl.device])
        cols["stream"].append(st_map[tl.stream])
        cols["name"].append(nm_map[tl.name])
    errors = [tl.error for tl in tls if tl.error]
    return Timeline(
        label=" + ".join(dict.fromkeys(tl.label for tl in tls)),
        devices=tuple(devices),
        streams=tuple(streams),
        names=tuple(names),
        device=np.concatenate(cols["device"]),
        stream=np.concatenate(cols["stream"]),
        name=np.concatenate(cols["name"]),
        kind=np.concatenate([tl.kind for tl in tls]),
        start_ns=np.concatenate([tl.start_ns for tl in tls]),
        end_ns=np.concatenate([tl.end_ns for tl in tls]),
        duration_ns=np.concatenate([tl.duration_ns for tl in tls]),
        scope_start_ns=min(tl.scope_start_ns for tl in tls),
        scope_end_ns=max(tl.scope_end_ns for tl in tls),
        clocks=tuple(_worst(cs) for cs in clocks.values()),
        host_ranges=tuple(r for tl in tls for r in tl.host_ranges),
        descriptions=tuple(descriptions.values()),
        error="; ".join(errors) if errors else None,
        cancelled=any(tl.cancelled for tl in tls),
        host_ms=_sum(tl.host_ms for tl in tls),
        wait_ms=_sum(tl.wait_ms for tl in tls),
        cpu_ms=_sum(tl.cpu_ms for tl in tls),
        marks=tuple(_shifted_marks(tls)),
        scopes=tuple(sc for tl in tls for sc in tl.scope_infos()),
        layers=tuple(ly for tl in tls for ly in tl.layers),
    )


def _sum(values: Iterator[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _shifted_marks(tls: list[Timeline]) -> Iterator[CollectiveMark]:
    """The marks of merged timelines, their rows counted in the merged order."""
    base = 0
    for tl in tls:
        for m in tl.marks:
            yield CollectiveMark(m.name, m.host_ns, m.row + base, m.thread)
        base += len(tl)


def _worst(clocks: list[DeviceClock]) -> DeviceClock:
    unaligned = [c for c in clocks if not c.aligned]
    return unaligned[0] if unaligned else max(clocks, key=lambda c: c.bound_ns)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _deliver(text: str, path: str | os.PathLike | None, what: str) -> str | None:
    if path is None:
        return text
    with _open_for_writing(path, what) as f:
        f.write(text)
    return None


@contextmanager
def _open_for_writing(path: str | os.PathLike, what: str) -> Iterator[TextIO]:
    """``open(path, "w")``; an `OSError` (same errno and subclass) that names the path and the fix."""
    p = Path(path)
    try:
        f = open(p, "w", encoding="utf-8", newline="")
    except OSError as exc:
        fix = {
            errno.ENOENT: f"the directory {p.parent} does not exist: create it first",
            errno.EACCES: "no permission to write there: choose a writable path",
            errno.EISDIR: "it is a directory: give a file name",
        }.get(exc.errno or 0, exc.strerror or str(exc))
        raise OSError(exc.errno, f"cannot write {what} to {p}: {fix}") from exc
    with f:
        yield f
