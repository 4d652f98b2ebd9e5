"""Exports at the edge of the data path: a trace (`write_trace`, `trace_dict`, and `read_trace` to read one back)
and the records as JSON (`to_json`) or CSV (`to_csv`).

A source is a `Timeline`, anything with a ``timeline`` (a finished `Timer`), or a list of them (several scopes,
merged in order).

Formats: the path's suffix chooses. ``.pftrace``, ``.perfetto-trace`` and ``.pb`` get Perfetto's native
protobuf format (`asyncgpu._trace.perfetto`, through the ``perfetto`` package: ``pip install "asyncgpu[perfetto]"``);
any other path gets the Chrome Trace Event Format (JSON), laid out as follows (``ts``/``dur`` in µs with 3
decimals, counted from ``origin_ns``: whole ns at any absolute time)::

    pid 1            "host"                      one track per host thread: scopes and t.activity() blocks;
                                                 "host issue": where each activity was issued (a zero-length
                                                 slice), a flow arrow from there to the activity's slice
    pid device_pid(d)        "<device> <description>"    one track per stream of device d; "(NOT aligned...)" when its
                                                 clock is not on the host time base; counters
    otherData        the metadata of `asyncgpu._trace.common` (origin_ns, tables, clocks, scopes, unfinished rows,
                     layers' data)

Layers: a timeline's ``layers`` (in-kernel records, handoffs between threads) draw themselves on the writer's
canvas (`asyncgpu._base.layers`): tracks numbered after the streams and host threads, on the device processes or the
host's, and flow arrows; their data travels in the metadata, so `read_trace` brings them back. Exporting reads
data only: no device, event or pool is touched.

Complete events (``"ph": "X"``) must nest on a track; rows that overlap without nesting (activity blocks of
concurrent tasks) go to extra tracks of the same stream or thread, named ``"s0 (2)"``. Device events carry
``args.row``, the row in the timeline, so `read_trace` rebuilds the columns in issue order.

Threads: any thread; nothing here touches a device.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

import numpy as np

from asyncgpu._base.checks import file_path
from asyncgpu._base.layers import HOST_PID, device_pid
from asyncgpu._base.layers import lanes as nesting_lanes
from asyncgpu._base.records import KIND_CODES, KINDS, CollectiveMark, DeviceClock, HostRange, Timeline
from asyncgpu._trace.common import (
    ISSUE_TRACK,
    TRACE_VERSION,
    draw_counters,
    drawn,
    host_key,
    issued_rows,
    open_for_writing,
    origin_ns,
    scope_info,
    timeline_from,
)
from asyncgpu._trace.common import trace_meta as _trace_meta
from asyncgpu._trace.perfetto import NATIVE_SUFFIXES, read_perfetto, write_perfetto

__all__ = ["read_trace", "to_csv", "to_json", "trace_dict", "write_trace"]

_CHUNK_ROWS = 100_000  # rows formatted per string: bounds the memory of a large export

Source = Union[Timeline, Any, Sequence[Any]]  # a Timeline, an object with a ``timeline`` (a Timer), or a list


# -- the trace -------------------------------------------------------------------------------------------------
def write_trace(source: Source, path: str | os.PathLike) -> None:
    """Write ``source`` as a trace to open at https://ui.perfetto.dev: Perfetto's native protobuf format when
    ``path`` ends in ``.pftrace``, ``.perfetto-trace`` or ``.pb`` (needs ``pip install "asyncgpu[perfetto]"``;
    `ImportError` naming it otherwise), else Chrome trace JSON. Raises `OSError` naming the path and the fix when
    it cannot be written, `TypeError` for a ``path`` that is not a str or a path (bytes, a number)."""
    path = file_path("path", path)
    tl = _merged(source)
    if Path(path).suffix.lower() in NATIVE_SUFFIXES:
        write_perfetto(tl, path)
        return
    with open_for_writing(path, "the trace") as f:
        for chunk in _trace_chunks(tl):
            f.write(chunk)


def trace_dict(source: Source) -> dict:
    """The JSON trace `write_trace` writes, as a dict (parsed from the same text)."""
    return json.loads("".join(_trace_chunks(_merged(source))))


def _trace_chunks(tl: Timeline) -> Iterator[str]:
    done = np.flatnonzero(drawn(tl))
    origin = origin_ns(tl)
    s_ns = np.rint(tl.start_ns[done] - origin).astype(np.int64)
    e_ns = np.rint(tl.end_ns[done] - origin).astype(np.int64)
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
    host_events, host_meta = _host_events(tl, origin, len(tid_stream))
    row_tid = np.zeros(len(tl), np.int64)
    row_tid[done] = tids
    issue_events, issue_meta = _issue_events(tl, origin, len(tid_stream) + len(host_meta), row_tid)
    host_meta += issue_meta
    other = _trace_meta(tl, origin, HOST_PID, [device_pid(d) for d in range(len(tl.devices))])
    yield '{"displayTimeUnit":"ns","otherData":' + json.dumps(other, allow_nan=False) + ',"traceEvents":[\n'
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
    yield from issue_events
    canvas = _JsonCanvas(origin, len(tid_stream) + len(host_meta), len(tl))
    for layer in tl.layers:
        layer.draw(tl, canvas)
    draw_counters(tl, canvas)
    for ev in canvas.events():
        yield ",\n" + json.dumps(ev, allow_nan=False)
    yield "\n]}\n"


class _JsonCanvas:
    """The `asyncgpu._base.layers.Canvas` of a JSON trace: Trace Event Format events, on tracks numbered from
    ``first_tid`` (a track gets a tid, and more for its lanes, only once it has events), flows numbered after
    ``first_flow`` (the issue arrows' ids come first)."""

    def __init__(self, origin_ns: int, first_tid: int, first_flow: int = 0) -> None:
        self._origin, self._next_tid = origin_ns, first_tid
        self._tracks: list[tuple[int, str]] = []  # (pid, name)
        self._items: list[list[tuple]] = []  # per track: slices and instants, as given
        self._counters: list[dict] = []
        self._flows = first_flow

    def track(self, name: str, device: int | None, parent: int | None = None) -> int:
        self._tracks.append((HOST_PID if device is None else device_pid(device), name))
        self._items.append([])
        return len(self._tracks) - 1

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
        self._items[track].append((names, name, start_ns, end_ns, category, args or {}, flow_out, flow_in))

    def instants(
        self,
        track: int,
        names: Sequence[str],
        name: np.ndarray,
        at_ns: np.ndarray,
        category: str,
        args: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self._items[track].append((names, name, at_ns, None, category, args or {}, None, None))

    def counter(self, name: str, device: int | None, at_ns: np.ndarray, values: np.ndarray, unit: str) -> None:
        pid = HOST_PID if device is None else device_pid(device)
        ts = self._us_from_ns(np.asarray(at_ns, np.float64))
        self._counters += [
            {"name": name, "ph": "C", "pid": pid, "tid": 0, "ts": t, "args": {unit: v}}
            for t, v in zip(ts.tolist(), np.asarray(values, np.float64).tolist())
        ]

    def flow(self) -> int:
        self._flows += 1
        return self._flows

    def _us_from_ns(self, ns: np.ndarray) -> np.ndarray:
        """µs from the origin, 3 decimals, never before it."""
        return np.maximum(np.rint(ns - self._origin), 0) / 1e3

    def events(self) -> Iterator[dict]:
        """Every event drawn: per track its names, its slices in time order (with their flows), its instants;
        then the counters."""
        for (pid, label), items in zip(self._tracks, self._items):
            if not items:
                continue
            spans = [it for it in items if it[3] is not None]
            s_us = [self._us_from_ns(np.asarray(it[2], np.float64)) for it in spans]
            s = np.concatenate([np.zeros(0), *s_us])
            e = np.concatenate(
                [
                    np.zeros(0),
                    *(np.maximum(self._us_from_ns(np.asarray(it[3], np.float64)), x) for it, x in zip(spans, s_us)),
                ]
            )
            refs = [(k, i) for k, it in enumerate(spans) for i in range(len(it[2]))]
            lanes = nesting_lanes(s, e)
            first = self._next_tid
            self._next_tid += int(lanes.max(initial=0)) + 1
            for k in range(self._next_tid - first):
                name = label if k == 0 else f"{label} ({k + 1})"
                yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": first + k, "ts": 0, "args": {"name": name}}
            for j in np.lexsort((s - e, s)).tolist():
                k, i = refs[j]
                names, name_col, _, _, cat, args, out, into = spans[k]
                ev = {"name": names[name_col[i]], "cat": cat, "ph": "X", "pid": pid, "tid": first + int(lanes[j])}
                ev |= {"ts": float(s[j]), "dur": round(float(e[j] - s[j]), 3), "args": _args(args, i)}
                yield ev
                for ids, flow in ((out, {"ph": "s"}), (into, {"ph": "f", "bp": "e"})):
                    if ids is not None and ids[i]:
                        yield {
                            "name": "flow",
                            "cat": cat,
                            **flow,
                            "id": int(ids[i]),
                            "pid": pid,
                            "tid": ev["tid"],
                            "ts": ev["ts"],
                        }
            for names, name_col, at_ns, end, cat, args, _, _ in items:
                if end is None:
                    for i, ts in enumerate(self._us_from_ns(np.asarray(at_ns, np.float64)).tolist()):
                        yield {
                            "name": names[name_col[i]],
                            "cat": cat,
                            "ph": "i",
                            "s": "t",
                            "pid": pid,
                            "tid": first,
                            "ts": ts,
                            "args": _args(args, i),
                        }
        yield from self._counters


def _args(args: Mapping[str, np.ndarray], i: int) -> dict:
    """The args of item ``i``: ints as ints, floats as floats, NaN left out."""
    out = {}
    for key, values in args.items():
        v = values[i].item()
        if isinstance(v, float):
            if math.isnan(v):
                continue
        out[key] = v
    return out


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


def _issue_events(
    tl: Timeline, origin_ns: int, first_tid: int, row_tid: np.ndarray
) -> tuple[Iterator[str], list[dict]]:
    """Where each drawn row with an issue time was issued: a zero-length slice on the "host issue" track of its
    host process, in time order, with a flow (``s``) from it to the row's slice (``f``, bound to the slice that
    encloses its start: ``bp: "e"``). ``row_tid``: the tid of each drawn row's slice. Flow id: the row + 1."""
    rows = issued_rows(tl)
    keys = {key: k for k, key in enumerate(dict.fromkeys(host_key(d) for d in tl.devices))}
    dev_key = np.array([keys[host_key(d)] for d in tl.devices] or [0], np.int64)
    key_col = dev_key[tl.device[rows]]
    used = sorted(set(key_col.tolist()))
    tid_of = np.zeros(max(len(keys), 1), np.int64)
    meta: list[dict] = []
    for key, k in keys.items():
        if k in used:
            tid_of[k] = first_tid + len(meta)
            meta.append(_thread_meta(HOST_PID, int(tid_of[k]), f"{key}/{ISSUE_TRACK}" if key else ISSUE_TRACK))
    rows = rows[np.argsort(tl.issued_ns[rows], kind="stable")]
    at = (np.rint(tl.issued_ns[rows] - origin_ns) / 1e3).tolist()
    tid = tid_of[dev_key[tl.device[rows]]].tolist()
    names = np.array([json.dumps(nm) for nm in tl.names] or ['""'], dtype=object)[tl.name[rows]].tolist()
    flow = (rows + 1).tolist()
    start = (np.rint(tl.start_ns[rows] - origin_ns) / 1e3).tolist()
    pid = [device_pid(int(d)) for d in tl.device[rows].tolist()]
    events = _format(
        ',\n{"name":%s,"cat":"issue","ph":"X","pid":' + str(HOST_PID) + ',"tid":%d,"ts":%.3f,"dur":0}'
        ',\n{"name":"issue","cat":"issue","ph":"s","id":%d,"pid":' + str(HOST_PID) + ',"tid":%d,"ts":%.3f}'
        ',\n{"name":"issue","cat":"issue","ph":"f","bp":"e","id":%d,"pid":%d,"tid":%d,"ts":%.3f}',
        names,
        tid,
        at,
        flow,
        tid,
        at,
        flow,
        pid,
        row_tid[rows].tolist(),
        start,
    )
    return events, meta


def _process_meta(pid: int, name: str, sort_index: int) -> list[dict]:
    return [
        {"ph": "M", "pid": pid, "tid": 0, "ts": 0, "name": "process_name", "args": {"name": name}},
        {"ph": "M", "pid": pid, "tid": 0, "ts": 0, "name": "process_sort_index", "args": {"sort_index": sort_index}},
    ]


def _thread_meta(pid: int, tid: int, name: str) -> dict:
    return {"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": "thread_name", "args": {"name": name}}


def read_trace(path: str | os.PathLike) -> Timeline:
    """A `Timeline` from a trace written by `write_trace`, JSON or Perfetto protobuf (told apart by their first
    byte; times within 1 ns), with its layers (in-kernel records, handoffs). Raises `ValueError` ("not an asyncgpu
    trace: ...") for other files or a corrupt one, `OSError` when it cannot be read."""
    path = file_path("path", path)
    with open(path, "rb") as f:
        data = f.read()
    if data.lstrip()[:1] not in (b"{", b"["):
        return read_perfetto(data, path)
    try:
        doc = json.loads(data)
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
    """The timeline of a JSON trace: the device and host events that carry a row (layers' events do not)."""
    origin = int(meta["origin_ns"])
    streams = [(int(d), str(label)) for d, label in meta["streams"]]
    stream_code = {(device_pid(d), label): i for i, (d, label) in enumerate(streams)}
    name_code = {nm: i for i, nm in enumerate(meta["names"])}
    xs = [e for e in events if e["ph"] == "X" and "row" in e.get("args", {})]
    issues = [e for e in events if e["ph"] == "s" and e.get("cat") == "issue"]
    host = sorted((e for e in xs if e["pid"] == HOST_PID), key=lambda e: e["args"]["row"])
    dev = [e for e in xs if e["pid"] != HOST_PID]
    s_ns = np.rint(np.fromiter((e["ts"] for e in dev), np.float64, len(dev)) * 1e3)
    d_ns = np.rint(np.fromiter((e["dur"] for e in dev), np.float64, len(dev)) * 1e3)
    return timeline_from(
        meta,
        np.fromiter((e["args"]["row"] for e in dev), np.int64, len(dev)),
        np.array([stream_code[e["pid"], e["args"]["stream"]] for e in dev], np.int32),
        np.array([name_code[e["name"]] for e in dev], np.int32),
        np.array([KIND_CODES[e["cat"]] for e in dev], np.int8),
        origin + s_ns,
        origin + s_ns + d_ns,
        np.fromiter((e["args"]["duration_ms"] for e in dev), np.float64, len(dev)) * 1e6,
        [
            HostRange(
                e["name"],
                e["cat"],
                origin + round(e["ts"] * 1e3),
                origin + round(e["ts"] * 1e3) + round(e["dur"] * 1e3),
                e["args"]["thread"],
            )
            for e in host
        ],
        (
            np.fromiter((e["id"] - 1 for e in issues), np.int64, len(issues)),
            origin + np.rint(np.fromiter((e["ts"] for e in issues), np.float64, len(issues)) * 1e3),
        ),
    )


# -- records as JSON and CSV -------------------------------------------------------------------------------------
def to_json(source: Source, path: str | os.PathLike | None = None) -> str | None:
    """The records as JSON: the scope's metadata (label, scope start/end in host ns, devices and their clocks,
    scopes, host ranges) and ``records``, one object per activity (times in ns, ``start_ms`` from the scope's
    start; null when unfinished; ``issued_ns``, when the host issued it, null when not known). Returns the text
    when ``path`` is None, else writes it there."""
    path = None if path is None else file_path("path", path)
    tl = _merged(source)
    head = {
        "asyncgpu_records_version": 1,
        **scope_info(tl),
        "host_ranges": [
            {"name": r.name, "kind": r.kind, "start_ns": r.start_ns, "end_ns": r.end_ns, "thread": r.thread}
            for r in tl.host_ranges
        ],
    }
    body = _records_text(
        tl,
        '{"device":%s,"stream":%s,"name":%s,"kind":%s,"start_ns":%s,"end_ns":%s,"duration_ns":%s,"start_ms":%s,'
        '"issued_ns":%s},\n',
        json.dumps,
        "null",
    )[:-2]
    return _deliver(f'{json.dumps(head, allow_nan=False)[:-1]},"records":[\n{body}\n]}}\n', path, "the records")


def to_csv(source: Source, path: str | os.PathLike | None = None) -> str | None:
    """The records as CSV: a header and one line per activity (device, stream, name, kind, start_ns, end_ns,
    duration_ns in host ns, start_ms from the scope's start, empty when unfinished; issued_ns, empty when not
    known). Returns the text when ``path`` is None, else writes it there."""
    path = None if path is None else file_path("path", path)
    text = _records_text(_merged(source), "%s,%s,%s,%s,%s,%s,%s,%s,%s\n", _csv_field, "")
    header = "device,stream,name,kind,start_ns,end_ns,duration_ns,start_ms,issued_ns\n"
    return _deliver(header + text, path, "the CSV")


def _records_text(tl: Timeline, template: str, quote: Callable[[str], str], null: str) -> str:
    """One ``template`` per row, filled with device, stream, name, kind (each ``quote``-d), start_ns, end_ns,
    duration_ns (whole ns), start_ms (6 decimals) and issued_ns (whole ns); ``null`` where a time is NaN
    (unfinished, or not known)."""

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
            strings(tl.issued_ns, "%.0f"),
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
        issued_ns=np.concatenate([tl.issued_ns for tl in tls]),
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


def _deliver(text: str, path: str | os.PathLike | None, what: str) -> str | None:
    if path is None:
        return text
    with open_for_writing(path, what) as f:
        f.write(text)
    return None
