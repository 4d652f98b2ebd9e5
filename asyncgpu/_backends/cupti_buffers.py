"""CUPTI's activity buffers, handed over raw and parsed in bulk with numpy.

cupti-python hands each completed buffer to a Python callback as one Python object per record, each field read
through numpy scalar access: per record, that is slower than the kernel launch it describes, and a host-bound loop
spends more time there than in its steps (benchmarks/HISTORY.md, run 31). Here CUPTI gets plain C callbacks
(ctypes) into libcupti:
``requested`` lends it a buffer from a small pool, ``completed`` only queues the buffer's address and valid size
(no parsing on CUPTI's thread). `Buffers.take` then walks the queued buffers on the flushing thread to find where
records start (each record's size follows from its kind, its first word): a run of records of one kind (a step's
kernels, or a copy between them) is one match of a regular expression (`_run_pattern`), which ``re`` walks in C,
a record a 4-byte compare and a jump; one Python call a run. Then every field of every record of a kind at once,
through the record's numpy dtype as cupti-python declares it.

The walk by sizes is checked once per process against CUPTI's own ``cuptiActivityGetNextRecord`` on a real
buffer: when they disagree, the records are not the ones cupti-python describes, and `take` raises `SourceError`
(naming the fix) rather than read fields at the wrong places. A kind of record that no dtype sizes (one that
asyncgpu did not enable) makes CUPTI's call walk the rest of that buffer.

Lifetime: CUPTI keeps a lent buffer until it completes it, and may complete it late: to another profiler that
registered its callbacks since (torch.profiler's kineto: "bufferCompleted called with unknown buffer"), or in its
own teardown when the process exits, after the interpreter's. The callbacks are Python (ctypes): called into a
finalized interpreter, they crash the process at exit (SIGSEGV, seen with torch loaded). So at the interpreter's exit
`Buffers.detach` hands every buffer back and detaches CUPTI from the process (``cuptiFinalize``, the session's owner
`asyncgpu._backends.cupti` calls it from ``atexit``); where CUPTI refuses, `Buffers.outlive_interpreter` keeps the
buffers and callbacks alive instead, so that whatever CUPTI writes lands in memory that is still its buffer.

Threads: CUPTI calls ``requested`` and ``completed`` on its own thread or inside ``cuptiActivityFlushAll`` on the
flushing one; they take one short lock. `flush_all` lets go of the GIL while CUPTI flushes. `take` from any
thread (callers serialize it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncgpu._base.errors import SourceError

__all__ = [
    "KIND_KERNEL",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "KIND_NAMES",
    "Buffers",
    "Parser",
    "RecordBatch",
    "find_libcupti",
]

KIND_KERNEL, KIND_MEMSET, KIND_MEMCPY = 0, 1, 2  #: `RecordBatch.kind` codes
KIND_NAMES = ("kernel", "memset", "memcpy")
POOL_MAX = 4  #: idle buffers kept for CUPTI's next requests (each `Buffers.nbytes`)
MAX_NAME_ADDRESSES = 65_536  #: kernel name addresses remembered (past it the memo starts again)
_ALIGN = 8  # CUPTI wants 8-byte aligned buffers

_REQUESTED = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_COMPLETED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


@dataclass
class RecordBatch:
    """Records of work on the devices, one entry per record, as arrays: ``kind`` (`KIND_KERNEL`, `KIND_MEMSET`,
    `KIND_MEMCPY`), ``start_ns``/``end_ns`` (CUPTI's clock), ``correlation``, ``device``, ``stream``, ``name``
    (an index into ``names``; memsets and memcpys name their kind). ``external``: (external kind, correlation id,
    external id) of the EXTERNAL_CORRELATION records."""

    kind: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    correlation: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    name: np.ndarray
    names: list[str]
    external: list[tuple[int, int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.kind)

    @staticmethod
    def empty() -> RecordBatch:
        z = np.zeros(0, np.int64)
        return RecordBatch(z.astype(np.int8), z, z, z, z, z, z, [])

    @staticmethod
    def from_tuples(records: Iterable[tuple]) -> RecordBatch:
        """From ``(kind, start_ns, end_ns, correlation, device, stream, name)`` tuples (kind and name as text)."""
        recs = list(records)
        if not recs:
            return RecordBatch.empty()
        names: dict[str, int] = {}
        cols = list(zip(*recs))
        start, end, correlation, device, stream = (np.array(c, np.int64) for c in cols[1:6])
        return RecordBatch(
            np.array([KIND_NAMES.index(k) for k in cols[0]], np.int8),
            start,
            end,
            correlation,
            device,
            stream,
            np.array([names.setdefault(n, len(names)) for n in cols[6]], np.int64),
            list(names),
        )

    @staticmethod
    def concat(batches: list[RecordBatch]) -> RecordBatch:
        """One batch of ``batches`` (their names merged)."""
        batches = [b for b in batches if len(b) or b.external]
        if not batches:
            return RecordBatch.empty()
        if len(batches) == 1:
            return batches[0]
        names: dict[str, int] = {}
        remapped = []
        for b in batches:
            table = np.array([names.setdefault(n, len(names)) for n in b.names] or [0], np.int64)
            remapped.append(table[b.name] if len(b) else b.name)
        kind, start, end, correlation, device, stream = (
            np.concatenate([getattr(b, f) for b in batches]) for f in _ARRAYS[:-1]
        )
        return RecordBatch(
            kind,
            start,
            end,
            correlation,
            device,
            stream,
            np.concatenate(remapped),
            list(names),
            [e for b in batches for e in b.external],
        )

    def tuples(self) -> list[tuple]:
        """The records as ``(kind, start_ns, end_ns, correlation, device, stream, name)`` tuples (kind and name as
        text): for callers that route records one by one."""
        names = self.names
        return [
            (KIND_NAMES[k], s, e, c, d, st, names[n])
            for k, s, e, c, d, st, n in zip(
                self.kind.tolist(),
                self.start_ns.tolist(),
                self.end_ns.tolist(),
                self.correlation.tolist(),
                self.device.tolist(),
                self.stream.tolist(),
                self.name.tolist(),
            )
        ]


_ARRAYS = ("kind", "start_ns", "end_ns", "correlation", "device", "stream", "name")


def find_libcupti() -> str:
    """The path of the libcupti this process loaded (cupti-python loads it), else one the linker finds."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if "/libcupti.so" in path:
                    return path
    except OSError:
        pass
    found = ctypes.util.find_library("cupti")
    if found:
        return found
    raise SourceError(
        "CUPTI's library (libcupti) is not loaded and cannot be found: install the nvidia-cuda-cupti wheel of your "
        "CUDA version, or use source='events'"
    )


class _Layout:
    """Where the fields asyncgpu reads sit in one kind of record (from cupti-python's numpy dtype)."""

    def __init__(self, dtype: np.dtype, code: Any) -> None:
        self.dtype, self.size, self.code = dtype, dtype.itemsize, code
        self._fields: dict[tuple[str, ...], tuple[np.dtype, int]] = {}  # names asked for -> (field dtype, offset)

    def field(self, *names: str) -> tuple[np.dtype, int]:
        """The dtype and offset of the field called one of ``names`` (looked up once per ``names``)."""
        found = self._fields.get(names)
        if found is None:
            fields: dict[str, Any] = dict(self.dtype.fields or {})
            name = next((n for n in names if n in fields), None)
            if name is None:
                raise SourceError(f"CUPTI's records have no field {' or '.join(names)}: update cupti-python")
            sub = fields[name][0]
            found = self._fields[names] = (sub.newbyteorder("=") if sub.byteorder == "|" else sub, fields[name][1])
        return found

    def column(self, data: np.ndarray, offsets: np.ndarray, *names: str, words: _Words | None = None) -> np.ndarray:
        """The field called one of ``names`` of the records at ``offsets`` of ``data`` (bytes): one gather of
        that field only (records are hundreds of bytes; asyncgpu reads a few dozen of them). ``words``: the
        records' indices as 4- and 8-byte words, where every offset and ``len(data)`` are multiples of 8."""
        sub, at = self.field(*names)
        width = sub.itemsize
        if width in (4, 8) and not at % width:
            if words is not None:
                return data.view(sub)[(words.at4 if width == 4 else words.at8) + at // width]
            if not (offsets % width).any() and len(data) % width == 0:  # aligned: one index per record
                return data.view(sub)[(offsets + at) // width]
        pos = offsets + at
        return data[pos[:, None] + np.arange(width)].view(sub).ravel()


class _Words:
    """Records' offsets (multiples of 8) as indices of 4-byte and of 8-byte words: computed once for all fields."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.at4, self.at8 = offsets >> 2, offsets >> 3


class Parser:
    """Records out of a buffer's bytes. ``layouts``: CUPTI activity kind -> ``(numpy dtype, code)`` where code is
    `KIND_KERNEL`, `KIND_MEMSET`, `KIND_MEMCPY`, ``"external"`` (an EXTERNAL_CORRELATION record) or None (a record
    to step over, such as an API call's). ``walk``: CUPTI's own walk (`Buffers.walk_by_cupti`): record offsets per
    kind, for the check and for kinds that no dtype sizes."""

    def __init__(
        self, layouts: dict[int, tuple[np.dtype, Any]], walk: Callable[[np.ndarray], dict[int, list[int]]]
    ) -> None:
        self.layouts = {int(k): _Layout(np.dtype(dt), code) for k, (dt, code) in layouts.items()}
        self._sizes = {k: lay.size for k, lay in self.layouts.items()}
        self._kinds = list(self._sizes)  # group i + 1 of `_runs` matches a run of self._kinds[i]
        self._runs = _run_pattern(self._sizes)
        self._walk_by_cupti = walk
        self._names: dict[int, str] = {}  # a kernel name's address (CUPTI keeps it) -> the name
        self.names_read = 0  #: kernel names read from CUPTI's memory so far (each a ctypes call: ~1 µs)
        self.walk_checked = False  # True once walking by sizes agreed with CUPTI's own walk on a real buffer
        self.kinds_seen: dict[int, int] = {}  #: records seen so far per CUPTI activity kind (skipped kinds too)

    def parse(self, data: np.ndarray) -> RecordBatch:
        """The records in ``data`` (a buffer's valid bytes, 8-byte aligned)."""
        offsets = self._walk_by_size(data)
        seen = self.kinds_seen
        for kind, offs in offsets.items():
            if len(offs):
                seen[kind] = seen.get(kind, 0) + len(offs)
        if not self.walk_checked:  # once per process, on a real buffer: are cupti-python's sizes CUPTI's?
            theirs = self._walk_by_cupti(data)
            ours = {k: v.tolist() for k, v in offsets.items() if len(v)}
            if ours != theirs:
                raise SourceError(
                    "CUPTI's activity records are laid out differently from cupti-python's description of them "
                    f"(record kinds {sorted(theirs)}): install the cupti-python of your CUDA version, or use "
                    "source='events'"
                )
            self.walk_checked = True
        parts: list[RecordBatch] = []
        external: list[tuple[int, int, int]] = []
        for kind, offs in offsets.items():
            lay = self.layouts.get(kind)
            if lay is None or lay.code is None or not len(offs):
                continue
            o = offs
            if lay.code == "external":
                ek = lay.column(data, o, "external_kind", "externalKind").tolist()
                ei = lay.column(data, o, "external_id", "externalId").tolist()
                ci = lay.column(data, o, "correlation_id", "correlationId").tolist()
                external += zip(ek, ci, ei)
                continue
            parts.append(self._batch(lay, data, o))
        out = RecordBatch.concat(parts)
        out.external = external
        return out

    def _batch(self, lay: _Layout, data: np.ndarray, o: np.ndarray) -> RecordBatch:
        words = _Words(o) if len(data) % 8 == 0 and not (o & 7).any() else None  # (usual: every record aligned)
        start = lay.column(data, o, "start", words=words).astype(np.int64)
        end = lay.column(data, o, "end", words=words).astype(np.int64)
        keep = (start > 0) & (start < end)  # flushed before the work completed (a cancelled scope): no times
        if not keep.all():
            o, start, end = o[keep], start[keep], end[keep]
            words = _Words(o) if words is not None else None
        n = len(o)
        if lay.code == KIND_KERNEL:
            ptrs = lay.column(data, o, "name", words=words).astype(np.uint64)
            uniq, index = np.unique(ptrs, return_inverse=True)
            names = [self._name(int(p)) for p in uniq]
        else:
            index, names = np.zeros(n, np.int64), [KIND_NAMES[lay.code]]
        return RecordBatch(
            np.full(n, lay.code, np.int8),
            start,
            end,
            lay.column(data, o, "correlation_id", "correlationId", words=words).astype(np.int64),
            lay.column(data, o, "device_id", "deviceId", words=words).astype(np.int64),
            lay.column(data, o, "stream_id", "streamId", words=words).astype(np.int64),
            np.asarray(index, np.int64).reshape(n),
            names,
        )

    def _name(self, ptr: int) -> str:
        name = self._names.get(ptr)
        if name is None:
            if len(self._names) >= MAX_NAME_ADDRESSES:  # (CUPTI shares a kernel's name across its records; if
                self._names.clear()  # a driver gave every record its own, the cache would otherwise grow)
            name = self._names[ptr] = ctypes.string_at(ptr).decode("utf-8", "replace") if ptr else "(unnamed)"
            self.names_read += 1
        return name

    def _walk_by_size(self, data: np.ndarray) -> dict[int, np.ndarray]:
        """Record offsets per kind, each record's size from its kind (the first word of every record): one match of
        `_runs` per run of records of one kind, in C; from a kind that no layout sizes on, CUPTI's own walk."""
        buf, valid, o = data.data, len(data), 0  # (a contiguous byte array: its memoryview, no copy)
        kinds, sizes, match = self._kinds, self._sizes, self._runs.match
        starts: list[list[int]] = [[] for _ in kinds]  # per kind: where each of its runs starts
        counts: list[list[int]] = [[] for _ in kinds]  # and how many records it holds
        while o < valid:
            m = match(buf, o)
            if m is None:  # (a kind no layout sizes, or a record cut short: CUPTI's walk from here)
                break
            i, end = (m.lastindex or 1) - 1, m.end()  # (the one group that matched)
            starts[i].append(o)
            counts[i].append((end - o) // sizes[kinds[i]])
            o = end
        runs = {k: _ragged(starts[i], counts[i], sizes[k]) for i, k in enumerate(kinds)}
        return _joined(runs, self._rest_by_cupti(data, o))

    def _rest_by_cupti(self, data: np.ndarray, o: int) -> dict[int, np.ndarray]:
        """The offsets per kind of the records from ``o`` on (none at the buffer's end), by CUPTI's own walk: what a
        walk by sizes does from a kind that cupti-python's dtypes do not size."""
        if o >= len(data):
            return {}
        return {k: o + np.asarray(offs, np.int64) for k, offs in self._walk_by_cupti(data[o:]).items()}


def _run_pattern(sizes: dict[int, int]) -> re.Pattern[bytes]:
    """A regular expression whose group ``i + 1`` matches a run of records of the ``i``-th kind of ``sizes`` (kind ->
    record size, bytes): the kind as a native 32-bit word, then the record's other bytes (``.{n}`` with DOTALL:
    ``re`` skips them at once), repeated. A record of another kind ends the run: its first word differs."""
    alts = [b"((?:" + re.escape(struct.pack("=I", k)) + b".{%d})+)" % (n - 4) for k, n in sizes.items()]
    return re.compile(b"|".join(alts), re.DOTALL)


def _ragged(starts: list[int], counts: list[int], size: int) -> np.ndarray:
    """The offsets of runs of records of ``size`` bytes, run ``r`` of ``counts[r]`` records from ``starts[r]``."""
    if not starts:
        return np.empty(0, np.int64)
    n = np.asarray(counts, np.int64)
    run = np.repeat(np.arange(len(n)), n)  # each record's run
    first = np.cumsum(n) - n  # each run's first record
    return np.asarray(starts, np.int64)[run] + (np.arange(len(run)) - first[run]) * size


def _joined(runs: dict[int, np.ndarray], rest: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Per kind, the offsets in ``runs`` and then those in ``rest``, as one array."""
    out = dict(runs)
    for k, offs in rest.items():
        out[k] = np.concatenate([out[k], offs]) if k in out else offs
    return out


class Buffers:
    """The buffers lent to CUPTI and the completed ones waiting to be parsed (`Parser`, with ``layouts``)."""

    def __init__(self, lib_path: str, nbytes: int, layouts: dict[int, tuple[np.dtype, Any]]) -> None:
        self.lib = ctypes.CDLL(lib_path)
        self.lib.cuptiActivityRegisterCallbacks.argtypes = (_REQUESTED, _COMPLETED)
        self.lib.cuptiActivityFlushAll.argtypes = (ctypes.c_uint32,)
        self.lib.cuptiFinalize.argtypes = ()
        self.lib.cuptiActivityGetNextRecord.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
        )
        self.nbytes = nbytes
        self._lock = threading.Lock()
        self._lent: dict[int, np.ndarray] = {}  # address -> the array CUPTI writes into
        self._idle: list[np.ndarray] = []
        self._done: list[tuple[int, int]] = []  # (address, valid bytes) of completed buffers, in order
        self.requested = _REQUESTED(self._on_requested)  # (kept alive: CUPTI calls them until the process ends)
        self.completed = _COMPLETED(self._on_completed)
        self.parser = Parser(layouts, self.walk_by_cupti)

    def detach(self) -> int:
        """At the interpreter's exit, once no session is open: every buffer back (forced flush, dropped unread),
        then ``cuptiFinalize``, after which CUPTI calls no callback (see the module's "Lifetime"). Returns CUPTI's
        error code (0: detached); on an error the buffers and callbacks are made immortal
        (`outlive_interpreter`)."""
        self.flush_all(forced=True)
        self.drop()
        err = int(self.lib.cuptiFinalize())
        if err:
            self.outlive_interpreter()
        return err

    def outlive_interpreter(self) -> list[Any]:
        """Make the buffers CUPTI still holds, the callbacks and this object immortal (one more reference each,
        never dropped), so that the interpreter's teardown frees none of what CUPTI may still write into or call
        (see the module's "Lifetime"). Returns what it kept."""
        with self._lock:
            kept: list[Any] = [self, self.requested, self.completed, *self._lent.values()]
        for obj in kept:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
        return kept

    # -- CUPTI's side (its thread, or the flushing one) -------------------------------------------------------
    def _on_requested(self, buffer: Any, size: Any, max_records: Any) -> None:
        with self._lock:
            arr = self._idle.pop() if self._idle else np.empty(self.nbytes + _ALIGN, np.uint8)
            addr = arr.ctypes.data
            addr += -addr % _ALIGN
            self._lent[addr] = arr
        buffer[0] = addr
        size[0] = self.nbytes
        max_records[0] = 0

    def _on_completed(self, _ctx: Any, _stream: int, buffer: int | None, _size: int, valid: int) -> None:
        if buffer:
            with self._lock:
                self._done.append((int(buffer), int(valid)))

    # -- the library's side -----------------------------------------------------------------------------------
    def register(self) -> None:
        """Make CUPTI use these buffers (again: another profiler may have registered its own since)."""
        err = self.lib.cuptiActivityRegisterCallbacks(self.requested, self.completed)
        if err:
            raise SourceError(f"cuptiActivityRegisterCallbacks failed (CUPTI error {err}): use source='events'")

    def flush_all(self, forced: bool = True) -> None:
        """``cuptiActivityFlushAll``: CUPTI hands back every buffer with records (``forced``: partly filled ones
        too). Blocks the calling thread, without the GIL."""
        self.lib.cuptiActivityFlushAll(1 if forced else 0)

    def take(self) -> RecordBatch:
        """Parse every completed buffer (then lend it again) into one batch. Several buffers are parsed as one
        copy of their records, one after another (CUPTI ends a buffer at a record's end): the parse makes a few
        dozen numpy calls whatever its size, each of which lets go of the GIL and takes it back from the loop's
        threads, and CUPTI completes a buffer per device at each forced flush."""
        with self._lock:
            done, self._done = self._done, []
        taken: list[np.ndarray] = []
        parts: list[np.ndarray] = []
        try:
            for addr, valid in done:
                with self._lock:
                    arr = self._lent.pop(addr, None)
                if arr is None:
                    continue
                taken.append(arr)
                if valid:
                    parts.append(arr[addr - arr.ctypes.data :][:valid])
            if not parts:
                return RecordBatch.empty()
            return self.parser.parse(parts[0] if len(parts) == 1 else np.concatenate(parts))
        finally:
            with self._lock:
                room = POOL_MAX - len(self._idle)
                self._idle += taken[: max(room, 0)]

    def drop(self) -> None:
        """Forget the completed buffers unread (the session ends)."""
        with self._lock:
            for addr, _valid in self._done:
                self._lent.pop(addr, None)
            self._done = []

    def walk_by_cupti(self, data: np.ndarray) -> dict[int, list[int]]:
        """Record offsets per kind by ``cuptiActivityGetNextRecord`` (one call per record)."""
        base = data.ctypes.data
        rec = ctypes.c_void_p(None)
        nxt, valid = self.lib.cuptiActivityGetNextRecord, len(data)
        words = memoryview(data[: len(data) & ~3].data).cast("I")
        out: dict[int, list[int]] = {}
        while nxt(base, valid, ctypes.byref(rec)) == 0 and rec.value:
            o = rec.value - base
            out.setdefault(words[o >> 2], []).append(o)
        return out
