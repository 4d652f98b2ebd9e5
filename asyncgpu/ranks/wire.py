"""The payload one rank sends to another in `asyncgpu.gather`: one flat uint8 buffer, the ONLY place that knows
its layout (pack, unpack, and the timeline <-> payload conversions; `_gather` and the tests go through here).

Layout (all integers little-endian; every column starts at a multiple of 8 bytes)::

    offset 0    8 B    magic  b"AGPURANK"
    offset 8    u32    wire version (`WIRE_VERSION`)
    offset 12   u32    H: length of the header
    offset 16   H B    header: UTF-8 JSON object; its "columns" lists [name, dtype, rows] in buffer order
    pad to 8, then each column's raw bytes (numpy dtype as named, e.g. "<f8"), each padded to 8

A rank's payload carries one scope: the tables (devices, streams, names, clocks, descriptions, host names and
kinds, threads, mark names) in the JSON header and the per-row data as columns::

    device <i2  stream <i4  name <i4  kind |i1  start_ns <f8  end_ns <f8  duration_ns <f8     one row per activity
    issued_ns <f8                                                                   per activity, when any is known
    hr_name <i4  hr_kind <i4  hr_thread <i4  hr_start_ns <i8  hr_end_ns <i8                     one per host range
    mk_name <i4  mk_thread <i4  mk_ns <i8  mk_row <i8                                           one per collective mark

Times are host ``time.perf_counter_ns()`` of the SENDING rank (the root moves them onto its own clock). A
payload is 43 bytes per activity plus the header (35 when no activity has an issue time: the ``issued_ns``
column is then left out, and a payload without it reads as issue times unknown, so payloads of asyncgpu versions
with and without the column read each other): no Python object per record crosses the wire. The merged
result that `gather(..., to_all=True)` sends back uses the same layout with a ``mk_rank <i4`` column and a
``ranks`` entry in its header.

Threads: pure functions, any thread.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, Iterable, Sequence

import numpy as np

from asyncgpu._base.errors import GatherError
from asyncgpu._base.numbers import finite
from asyncgpu._base.records import DeviceClock, HostRange, ScopeInfo, Timeline

__all__ = [
    "MAGIC",
    "WIRE_VERSION",
    "GatherError",
    "HostRanges",
    "Marks",
    "pack",
    "payload_to_timeline",
    "timeline_to_payload",
    "unpack",
]

MAGIC = b"AGPURANK"
WIRE_VERSION = 1
_PREFIX = struct.Struct("<8sII")
ROW_COLUMNS = (
    ("device", "<i2"),
    ("stream", "<i4"),
    ("name", "<i4"),
    ("kind", "|i1"),
    ("start_ns", "<f8"),
    ("end_ns", "<f8"),
    ("duration_ns", "<f8"),
    ("issued_ns", "<f8"),  # (optional: see the module docstring)
)


class Marks:
    """Collective marks of one scope (or of several ranks, merged), as columns: ``names`` (table), ``name``
    (int32 codes), ``ns`` (int64 host ns), ``row`` (int64: how many of the scope's activities had been issued
    when the mark was made), ``thread`` (codes into ``threads``) and, merged, ``rank`` (int32)."""

    __slots__ = ("names", "threads", "name", "thread", "ns", "row", "rank")

    def __init__(
        self, names: Sequence[str], threads: Sequence[str], name: Any, thread: Any, ns: Any, row: Any, rank: Any = None
    ) -> None:
        self.names, self.threads = tuple(names), tuple(threads)
        self.name = np.asarray(name, np.int32)
        self.thread = np.asarray(thread, np.int32)
        self.ns = np.asarray(ns, np.int64)
        self.row = np.asarray(row, np.int64)
        self.rank = None if rank is None else np.asarray(rank, np.int32)

    @classmethod
    def from_tuples(cls, marks: Sequence[tuple[str, int, int, str]]) -> Marks:
        """From ``(name, host_ns, row, thread)`` tuples."""
        names: dict[str, int] = {}
        threads: dict[str, int] = {}
        codes = [(names.setdefault(n, len(names)), threads.setdefault(t, len(threads))) for n, _, _, t in marks]
        return cls(
            tuple(names),
            tuple(threads),
            [c for c, _ in codes],
            [t for _, t in codes],
            [int(ns) for _, ns, _, _ in marks],
            [int(r) for _, _, r, _ in marks],
        )

    def __len__(self) -> int:
        return len(self.ns)


def pack(header: dict, columns: Sequence[tuple[str, np.ndarray]]) -> np.ndarray:
    """One uint8 buffer: prefix, ``header`` (JSON, plus the column list) and ``columns`` (name, array)."""
    cols = [(name, np.ascontiguousarray(arr, arr.dtype.newbyteorder("<"))) for name, arr in columns]
    head = json.dumps({**header, "columns": [[n, a.dtype.str, len(a)] for n, a in cols]}, allow_nan=False).encode()
    offset = _pad8(_PREFIX.size + len(head))
    total = offset + sum(_pad8(a.nbytes) for _, a in cols)
    buf = np.zeros(total, np.uint8)
    buf[: _PREFIX.size] = np.frombuffer(_PREFIX.pack(MAGIC, WIRE_VERSION, len(head)), np.uint8)
    buf[_PREFIX.size : _PREFIX.size + len(head)] = np.frombuffer(head, np.uint8)
    for _, a in cols:
        buf[offset : offset + a.nbytes] = a.view(np.uint8).reshape(-1)
        offset += _pad8(a.nbytes)
    return buf


def unpack(buf: Any, what: str = "payload") -> tuple[dict, dict[str, np.ndarray]]:
    """``(header, {column: array})`` of a buffer made by `pack`; the arrays are views into ``buf`` (no copy).
    Raises `GatherError` naming ``what`` for another version, another format or a truncated buffer."""
    raw = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)
    if raw.size < _PREFIX.size:
        raise GatherError(f"{what} is not an asyncgpu rank payload: {raw.size} bytes, shorter than its prefix")
    magic, version, head_len = _PREFIX.unpack(raw[: _PREFIX.size].tobytes())
    if magic != MAGIC:
        raise GatherError(f"{what} is not an asyncgpu rank payload (it starts with {magic!r}, not {MAGIC!r})")
    if _PREFIX.size + head_len > raw.size:
        raise GatherError(
            f"{what} is truncated: its header ends at byte {_PREFIX.size + head_len}, the buffer has {raw.size}"
        )
    try:
        header = json.loads(raw[_PREFIX.size : _PREFIX.size + head_len].tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        header, problem = {}, f"its header is not JSON ({exc})"
    else:
        problem = ""
    if version != WIRE_VERSION:
        made_by = header.get("asyncgpu_version", "an unknown version") if isinstance(header, dict) else "?"
        raise GatherError(
            f"{what} is rank payload version {version} (made by asyncgpu {made_by}); this asyncgpu "
            f"reads version {WIRE_VERSION}: run the same asyncgpu version on every rank"
        )
    if problem:
        raise GatherError(f"{what} is corrupt: {problem}")
    offset = _pad8(_PREFIX.size + head_len)
    out: dict[str, np.ndarray] = {}
    try:
        for name, dtype, rows in header["columns"]:
            dt = np.dtype(dtype)
            end = offset + dt.itemsize * int(rows)
            if end > raw.size:
                raise GatherError(f"{what} is truncated: column {name} ends at byte {end}, the buffer has {raw.size}")
            out[name] = raw[offset:end].view(dt)
            offset += _pad8(end - offset)
    except (KeyError, TypeError, ValueError) as exc:
        raise GatherError(f"{what} is corrupt: bad column list ({type(exc).__name__}: {exc})") from None
    return header, out


class HostRanges:
    """Host ranges as columns (what travels, and what the root keeps until someone asks for `HostRange`
    objects): tables ``names``, ``kinds``, ``threads``; int32 codes ``name``, ``kind``, ``thread``; int64
    ``start_ns``, ``end_ns``."""

    __slots__ = ("names", "kinds", "threads", "name", "kind", "thread", "start_ns", "end_ns")

    def __init__(
        self,
        names: Iterable[str],
        kinds: Iterable[str],
        threads: Iterable[str],
        name: Any,
        kind: Any,
        thread: Any,
        start_ns: Any,
        end_ns: Any,
    ) -> None:
        self.names, self.kinds, self.threads = tuple(names), tuple(kinds), tuple(threads)
        self.name, self.kind, self.thread = (np.asarray(a, np.int32) for a in (name, kind, thread))
        self.start_ns, self.end_ns = np.asarray(start_ns, np.int64), np.asarray(end_ns, np.int64)

    @classmethod
    def from_ranges(cls, ranges: Sequence[HostRange]) -> HostRanges:
        tables: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
        codes = np.array(
            [
                (
                    tables[0].setdefault(r.name, len(tables[0])),
                    tables[1].setdefault(r.kind, len(tables[1])),
                    tables[2].setdefault(r.thread, len(tables[2])),
                )
                for r in ranges
            ],
            np.int32,
        ).reshape(-1, 3)
        return cls(
            *tables, codes[:, 0], codes[:, 1], codes[:, 2], [r.start_ns for r in ranges], [r.end_ns for r in ranges]
        )

    def ranges(self) -> tuple[HostRange, ...]:
        """As `HostRange` objects (about 150 bytes each)."""
        names, kinds, threads = self.names, self.kinds, self.threads
        return tuple(
            HostRange(names[n], kinds[k], s, e, threads[t])
            for n, k, t, s, e in zip(
                self.name.tolist(),
                self.kind.tolist(),
                self.thread.tolist(),
                self.start_ns.tolist(),
                self.end_ns.tolist(),
            )
        )

    def __len__(self) -> int:
        return len(self.start_ns)


def timeline_to_payload(tl: Timeline, marks: Marks, info: dict, host_ranges: HostRanges | None = None) -> np.ndarray:
    """One scope as a payload; ``info`` (rank, host, pid, backend, ...) goes into the header. ``host_ranges``
    replaces ``tl.host_ranges`` when given (already columns)."""
    hr = HostRanges.from_ranges(tl.host_ranges) if host_ranges is None else host_ranges
    header = {
        **info,
        **_tables(tl),
        "scope_start_ns": int(tl.scope_start_ns),
        "scope_end_ns": int(tl.scope_end_ns),
        "error": tl.error,
        "cancelled": bool(tl.cancelled),
        "hr_names": list(hr.names),
        "hr_kinds": list(hr.kinds),
        "threads": list(hr.threads),
        "mark_names": list(marks.names),
        "mark_threads": list(marks.threads),
    }
    known = bool(np.isfinite(tl.issued_ns).any())
    columns = [(n, getattr(tl, n).astype(dt, copy=False)) for n, dt in ROW_COLUMNS if known or n != "issued_ns"]
    columns += [
        ("hr_name", hr.name),
        ("hr_kind", hr.kind),
        ("hr_thread", hr.thread),
        ("hr_start_ns", hr.start_ns),
        ("hr_end_ns", hr.end_ns),
        ("mk_name", marks.name),
        ("mk_thread", marks.thread),
        ("mk_ns", marks.ns),
        ("mk_row", marks.row),
    ]
    if marks.rank is not None:
        columns.append(("mk_rank", marks.rank))
    return pack(header, columns)


def payload_to_timeline(header: dict, cols: dict[str, np.ndarray]) -> tuple[Timeline, HostRanges, Marks]:
    """An unpacked payload as a `Timeline` WITHOUT host ranges (its columns are views into the payload), the host
    ranges as columns (``HostRanges.ranges()`` makes the objects), and the marks."""
    try:
        hr = HostRanges(
            header["hr_names"],
            header["hr_kinds"],
            header["threads"],
            cols["hr_name"],
            cols["hr_kind"],
            cols["hr_thread"],
            cols["hr_start_ns"],
            cols["hr_end_ns"],
        )
        tl = Timeline(
            header["label"],
            tuple(header["devices"]),
            tuple((int(d), str(s)) for d, s in header["streams"]),
            tuple(header["names"]),
            cols["device"],  # the ROW_COLUMNS, in Timeline's field order
            cols["stream"],
            cols["name"],
            cols["kind"],
            cols["start_ns"],
            cols["end_ns"],
            cols["duration_ns"],
            int(header["scope_start_ns"]),
            int(header["scope_end_ns"]),
            tuple(_clock(c) for c in header["clocks"]),
            (),
            tuple(header["descriptions"]),
            header["error"],
            bool(header["cancelled"]),
            scopes=tuple(ScopeInfo(**sc) for sc in header.get("scopes", ())),
            issued_ns=cols.get("issued_ns", np.zeros(0)),  # (empty: unknown)
        )
        marks = Marks(
            header["mark_names"],
            header["mark_threads"],
            cols["mk_name"],
            cols["mk_thread"],
            cols["mk_ns"],
            cols["mk_row"],
            cols.get("mk_rank"),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise GatherError(f"rank payload is corrupt: {type(exc).__name__}: {exc}") from None
    return tl, hr, marks


def _tables(tl: Timeline) -> dict:
    clocks = tl.clocks
    return {
        "label": tl.label,
        "devices": list(tl.devices),
        "streams": [[d, s] for d, s in tl.streams],
        "names": list(tl.names),
        "descriptions": list(tl.descriptions),
        "clocks": [
            [
                c.device,
                c.aligned,
                finite(c.bound_ns),
                c.offset_ns,
                finite(c.drift_ppm),
                c.reason,
                float(c.overhead_ns),
                c.overhead_source,
            ]
            for c in clocks
        ],
    }


def _clock(c: list) -> DeviceClock:
    device, aligned, bound, offset, drift, reason, overhead, *rest = c  # (payloads before overhead_source: 7)
    return DeviceClock(
        device,
        bool(aligned),
        math.nan if bound is None else float(bound),
        None if offset is None else int(offset),
        drift,
        reason,
        float(overhead),
        str(rest[0]) if rest else "",
    )


def _pad8(n: int) -> int:
    return (n + 7) & ~7
