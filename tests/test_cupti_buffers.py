"""CUPTI's activity buffers parsed in bulk (no GPU: a buffer laid out by hand, with record layouts of our own)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from asyncgpu._backends.cupti_buffers import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Parser, RecordBatch
from asyncgpu.errors import SourceError

KERNEL, MEMSET, MEMCPY, EXTERNAL, API, OTHER = 10, 11, 1, 36, 5, 99  # activity kinds (any numbers will do)
KERNEL_DT = np.dtype(
    [
        ("kind", "<u4"),
        ("pad", "<u4"),
        ("start", "<u8"),
        ("end", "<u8"),
        ("device_id", "<u4"),
        ("stream_id", "<u4"),
        ("correlation_id", "<u4"),
        ("pad2", "<u4"),
        ("name", "<u8"),
    ]
)
COPY_DT = np.dtype(  # memsets and memcpys, camelCase as some bindings name them
    [
        ("kind", "<u4"),
        ("pad", "<u4"),
        ("start", "<u8"),
        ("end", "<u8"),
        ("deviceId", "<u4"),
        ("streamId", "<u4"),
        ("correlationId", "<u4"),
        ("pad2", "<u4"),
    ]
)
EXT_DT = np.dtype([("kind", "<u4"), ("external_kind", "<u4"), ("external_id", "<u8"), ("correlation_id", "<u8")])
API_DT = np.dtype([("kind", "<u4"), ("pad", "<u4"), ("start", "<u8"), ("end", "<u8"), ("x", "<u8")])
OTHER_SIZE = 16  # a kind no layout describes
LAYOUTS = {
    KERNEL: (KERNEL_DT, KIND_KERNEL),
    MEMSET: (COPY_DT, KIND_MEMSET),
    MEMCPY: (COPY_DT, KIND_MEMCPY),
    EXTERNAL: (EXT_DT, "external"),
    API: (API_DT, None),
}
SIZES = {KERNEL: KERNEL_DT.itemsize, MEMSET: COPY_DT.itemsize, MEMCPY: COPY_DT.itemsize}
SIZES |= {EXTERNAL: EXT_DT.itemsize, API: API_DT.itemsize, OTHER: OTHER_SIZE}


def reference_walk(data: np.ndarray) -> dict[int, list[int]]:
    """What CUPTI's own walk would say: every record's offset, per kind."""
    out: dict[int, list[int]] = {}
    o = 0
    while o < len(data):
        kind = int(data[o : o + 4].view("<u4")[0])
        out.setdefault(kind, []).append(o)
        o += SIZES[kind]
    return out


class Buffer:
    """Records laid one after another, as CUPTI writes them."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.names: list = []  # (kept alive: records point at them)

    def kernel(self, start: int, end: int, device: int, stream: int, corr: int, name: str) -> None:
        text = ctypes.create_string_buffer(name.encode())
        self.names.append(text)
        rec = np.zeros(1, KERNEL_DT)
        rec[0] = (KERNEL, 0, start, end, device, stream, corr, 0, ctypes.addressof(text))
        self.parts.append(rec.tobytes())

    def copy(self, kind: int, start: int, end: int, device: int, corr: int) -> None:
        rec = np.zeros(1, COPY_DT)
        rec[0] = (kind, 0, start, end, device, 7, corr, 0)
        self.parts.append(rec.tobytes())

    def external(self, ext_kind: int, ext_id: int, corr: int) -> None:
        rec = np.zeros(1, EXT_DT)
        rec[0] = (EXTERNAL, ext_kind, ext_id, corr)
        self.parts.append(rec.tobytes())

    def raw(self, kind: int, size: int) -> None:
        self.parts.append(np.array([kind], "<u4").tobytes() + bytes(size - 4))

    def data(self) -> np.ndarray:
        return np.frombuffer(b"".join(self.parts), np.uint8).copy()


def sample() -> Buffer:
    b = Buffer()
    b.raw(API, API_DT.itemsize)
    b.kernel(100, 250, 0, 3, 1, "gemm")
    b.external(4, 77, 1)
    b.copy(MEMSET, 300, 320, 1, 2)
    b.kernel(400, 450, 1, 5, 3, "relu")
    b.kernel(0, 0, 0, 3, 4, "gemm")  # flushed before it ran: no times
    b.copy(MEMCPY, 500, 900, 0, 5)
    b.kernel(1000, 1100, 0, 3, 6, "gemm")
    return b


def test_a_buffer_parses_into_arrays_of_every_record_with_times():
    b = sample()
    batch = Parser(LAYOUTS, reference_walk).parse(b.data())
    order = np.argsort(batch.start_ns)
    assert batch.start_ns[order].tolist() == [100, 300, 400, 500, 1000]
    assert batch.end_ns[order].tolist() == [250, 320, 450, 900, 1100]
    assert batch.kind[order].tolist() == [KIND_KERNEL, KIND_MEMSET, KIND_KERNEL, KIND_MEMCPY, KIND_KERNEL]
    assert batch.device[order].tolist() == [0, 1, 1, 0, 0]
    assert batch.correlation[order].tolist() == [1, 2, 3, 5, 6]
    assert [batch.names[i] for i in batch.name[order]] == ["gemm", "memset", "relu", "memcpy", "gemm"]
    assert batch.external == [(4, 1, 77)]
    tuples = sorted(batch.tuples(), key=lambda r: r[1])
    assert tuples[0] == ("kernel", 100, 250, 1, 0, 3, "gemm") and tuples[3] == ("memcpy", 500, 900, 5, 0, 7, "memcpy")


def test_a_kind_no_layout_sizes_is_walked_by_cupti_and_skipped():
    b = sample()
    b.raw(OTHER, OTHER_SIZE)
    b.kernel(2000, 2100, 0, 3, 9, "late")
    batch = Parser(LAYOUTS, reference_walk).parse(b.data())
    assert len(batch) == 6 and batch.names[batch.name[np.argmax(batch.start_ns)]] == "late"


def walk(data: np.ndarray) -> dict[int, list[int]]:
    """``data`` walked by a fresh parser: the offsets per kind."""
    return {k: v.tolist() for k, v in Parser(LAYOUTS, reference_walk)._walk_by_size(data).items() if len(v)}


def test_the_walk_hands_the_rest_to_cuptis_walk_at_a_kind_no_layout_sizes():
    b = sample()
    b.raw(OTHER, OTHER_SIZE)
    b.kernel(2000, 2100, 0, 3, 9, "late")
    data = b.data()
    assert walk(data) == reference_walk(data)


def test_sizes_that_disagree_with_cuptis_walk_name_the_fix():
    def wrong(data):  # CUPTI finds its records elsewhere: the dtypes describe another CUPTI
        return {KERNEL: [0, 8]}

    parser = Parser(LAYOUTS, wrong)
    with pytest.raises(SourceError, match="cupti-python of your CUDA version"):
        parser.parse(sample().data())
    checked = Parser(LAYOUTS, reference_walk)
    checked.parse(sample().data())
    assert checked.walk_checked  # once checked, CUPTI's walk is not called again

    def never(data):
        raise AssertionError("walked by CUPTI again")

    checked._walk_by_cupti = never
    assert len(checked.parse(sample().data())) == 5


def test_batches_concatenate_with_their_names_merged_and_round_trip_through_tuples():
    a = RecordBatch.from_tuples([("kernel", 1, 2, 10, 0, 1, "a"), ("memset", 3, 4, 11, 0, 1, "memset")])
    b = RecordBatch.from_tuples([("kernel", 5, 6, 12, 1, 2, "b"), ("kernel", 7, 8, 13, 1, 2, "a")])
    both = RecordBatch.concat([a, RecordBatch.empty(), b])
    assert both.tuples() == a.tuples() + b.tuples()
    assert sorted(both.names) == ["a", "b", "memset"]
    assert len(RecordBatch.concat([])) == 0 and RecordBatch.concat([a]) is a


def test_the_newest_record_version_that_cupti_python_describes_is_read():
    import types

    from asyncgpu._backends.cupti import _newest_dtype

    fake = types.SimpleNamespace(
        activity_kernel9_dtype="k9",
        activity_kernel10_dtype="k10",
        activity_kernel_cdp_dtype="not a version",
        activity_api_dtype="api",
        activity_memcpy6_dtype="m6",
        activity_memcpy_pto_p4_dtype="peer",
    )
    assert _newest_dtype(fake, "activity_kernel") == "k10"
    assert _newest_dtype(fake, "activity_memcpy") == "m6"
    assert _newest_dtype(fake, "activity_api") == "api"
    with pytest.raises(SourceError, match="no memset record"):
        _newest_dtype(fake, "activity_memset")


def test_kernel_names_are_read_once_per_address_and_the_memo_stays_bounded(monkeypatch):
    """CUPTI shares a kernel's name across its records: one read per address; were every record to point at a name
    of its own, the memo of addresses would start again past its bound instead of growing for the run's life."""
    from asyncgpu._backends import cupti_buffers

    b = Buffer()
    for k in range(6):
        b.kernel(100 + k, 200 + k, 0, 3, k, "gemm")  # (each its own buffer here: six addresses)
    parser = Parser(LAYOUTS, reference_walk)
    monkeypatch.setattr(cupti_buffers, "MAX_NAME_ADDRESSES", 4)
    batch = parser.parse(b.data())
    assert [batch.names[i] for i in batch.name] == ["gemm"] * 6
    assert parser.names_read == 6 and len(parser._names) <= 4
    parser.parse(b.data())  # the same addresses again: only those the memo forgot are read
    assert 6 < parser.names_read <= 12 and len(parser._names) <= 4


@pytest.mark.parametrize("seed", range(6))
def test_the_walk_by_runs_gives_the_offsets_of_a_record_by_record_walk(seed):
    """Runs of every length (a step's kernels are long runs; copies come alone or in short ones), a run to the
    buffer's very end, and records whose inner words look like kinds: the walk finds exactly the records a walk one
    record at a time finds."""
    rng = np.random.default_rng(seed)
    b = Buffer()
    corr = 0
    for n in rng.permutation([1, 2, 31, 32, 33, 128, 129, 300, *rng.integers(1, 200, 20)]):
        kind = [KERNEL, KERNEL, MEMSET, MEMCPY, API][int(rng.integers(5))]
        for _ in range(int(n)):
            corr += 1
            if kind == KERNEL:
                b.kernel(10 * corr, 10 * corr + 5, 0, 3, corr, "k")
            elif kind == API:  # (every inner word a kind's number)
                b.parts.append(np.array([API, KERNEL, MEMSET, KERNEL, KERNEL, MEMCPY, KERNEL, KERNEL], "<u4").tobytes())
            else:
                b.copy(kind, 10 * corr, 10 * corr + 5, 0, corr)
    for _ in range(160):  # a long run to the buffer's end
        corr += 1
        b.kernel(10 * corr, 10 * corr + 5, 0, 3, corr, "k")
    data = b.data()
    truth = reference_walk(data)
    assert walk(data) == truth
    parser = Parser(LAYOUTS, reference_walk)
    assert len(parser.parse(data)) == sum(len(v) for k, v in truth.items() if k in (KERNEL, MEMSET, MEMCPY))
    assert parser.kinds_seen == {k: len(v) for k, v in truth.items()}


def test_a_run_of_one_kind_is_one_match_and_a_cut_record_goes_to_cuptis_walk():
    """A step's kernels between single copies: one Python call a run, whatever its length. A record cut short at
    the buffer's end (CUPTI ends buffers at a record's end; a bad size would not) is left to CUPTI's walk."""
    b = Buffer()
    for k, run in enumerate((500, 3, 1, 200)):
        for _ in range(run):
            b.kernel(10, 20, 0, 3, k, "k")
        b.copy(MEMCPY, 1, 2, 0, k)
    data = b.data()
    parser = Parser(LAYOUTS, reference_walk)
    calls = []
    real = parser._runs

    class Counted:
        def match(self, buf, pos):
            calls.append(pos)
            return real.match(buf, pos)

    parser._runs = Counted()
    assert {k: v.tolist() for k, v in parser._walk_by_size(data).items() if len(v)} == reference_walk(data)
    assert len(calls) == 8  # four runs of kernels, four copies
    cut = data[: len(data) - 8]  # the last copy cut short
    seen = []
    parser._walk_by_cupti = lambda rest: seen.append(len(rest)) or {}
    offsets = parser._walk_by_size(cut)
    assert seen == [COPY_DT.itemsize - 8] and len(offsets[MEMCPY]) == 3


def reference_parse(data: np.ndarray) -> tuple[list[tuple], list[tuple[int, int, int]]]:
    """The records of ``data`` read one at a time through their dtypes, the straightforward way: the kept ones as
    ``(kind, start, end, correlation, device, stream, name)`` in buffer order, and the external ids."""
    kind_of = {KERNEL: "kernel", MEMSET: "memset", MEMCPY: "memcpy"}
    recs, ext = [], []
    for kind, offsets in reference_walk(data).items():
        for o in offsets:
            if kind == EXTERNAL:
                r = data[o : o + EXT_DT.itemsize].view(EXT_DT)[0]
                ext.append((o, (int(r["external_kind"]), int(r["correlation_id"]), int(r["external_id"]))))
            elif kind in kind_of:
                dt = KERNEL_DT if kind == KERNEL else COPY_DT
                r = data[o : o + dt.itemsize].view(dt)[0]
                if not 0 < r["start"] < r["end"]:
                    continue
                name = ctypes.string_at(int(r["name"])).decode() if kind == KERNEL else kind_of[kind]
                dev, stream, corr = (int(r[i]) for i in (4, 5, 6))  # (both layouts: kind, pad, start, end, then these)
                recs.append((o, (kind_of[kind], int(r["start"]), int(r["end"]), corr, dev, stream, name)))
    return [r for _, r in sorted(recs)], [e for _, e in sorted(ext)]


@pytest.mark.parametrize("seed", range(8))
def test_a_parse_gives_the_records_a_straightforward_reading_gives(seed):
    """Random buffers of every kind (runs long and short, records flushed before their work ran, start == end,
    external ids, API records, a kind no layout sizes): the same records, kinds and names, each kind in buffer
    order; the same buffer parsed again by the same parser too."""
    rng = np.random.default_rng(seed)
    b = Buffer()
    corr = 0
    for _ in range(40):
        kind = [KERNEL, KERNEL, KERNEL, MEMSET, MEMCPY, EXTERNAL, API][int(rng.integers(7))]
        for _ in range(int(rng.choice([1, 2, 5, 40, 150]))):
            corr += 1
            start = int(rng.choice([0, 10 * corr, 10 * corr]))
            end = start + int(rng.choice([0, 5, 7]))
            if kind == KERNEL:
                b.kernel(start, end, int(rng.integers(4)), 3, corr, f"k{rng.integers(19)}")
            elif kind == EXTERNAL:
                b.external(int(rng.integers(3)), 1000 + corr, corr)
            elif kind == API:
                b.raw(API, API_DT.itemsize)
            else:
                b.copy(kind, start, end, int(rng.integers(4)), corr)
    if seed % 2:
        b.raw(OTHER, OTHER_SIZE)  # (the rest: CUPTI's walk)
        b.kernel(5, 9, 0, 3, corr + 1, "late")
    data = b.data()
    want, want_ext = reference_parse(data)
    by_kind = {k: [r for r in want if r[0] == k] for k in ("kernel", "memset", "memcpy")}
    parser = Parser(LAYOUTS, reference_walk)
    for _ in range(2):
        batch = parser.parse(data)
        got = batch.tuples()
        assert {k: [r for r in got if r[0] == k] for k in by_kind} == by_kind
        assert sorted(batch.external) == sorted(want_ext) and len(got) == len(want)


def test_an_empty_buffer_and_one_whose_records_all_lack_times_give_no_records():
    parser = Parser(LAYOUTS, reference_walk)
    assert len(parser.parse(np.zeros(0, np.uint8))) == 0
    b = Buffer()
    b.kernel(0, 0, 0, 3, 1, "gemm")  # flushed before it ran
    b.copy(MEMSET, 5, 5, 0, 2)  # (start == end: no time either)
    batch = parser.parse(b.data())
    assert len(batch) == 0 and batch.external == []
    assert parser.kinds_seen == {KERNEL: 1, MEMSET: 1}


def test_what_cupti_may_still_write_into_or_call_outlives_the_interpreter():
    """At exit, the buffers CUPTI still holds and the callbacks it calls get a reference that is never dropped: the
    interpreter's teardown frees none of them (CUPTI may complete a buffer in its own teardown, later)."""
    import sys
    import threading

    from asyncgpu._backends.cupti_buffers import Buffers

    b = Buffers.__new__(Buffers)  # (no libcupti here: only what `outlive_interpreter` reads)
    b._lock = threading.Lock()
    b.requested, b.completed = object(), object()
    lent = np.empty(64, np.uint8)
    b._lent = {lent.ctypes.data: lent}
    before = [sys.getrefcount(x) for x in (lent, b.requested, b.completed)]
    kept = b.outlive_interpreter()
    del kept
    assert [sys.getrefcount(x) for x in (lent, b.requested, b.completed)] == [n + 1 for n in before]


@pytest.mark.parametrize("refused", [0, 7])
def test_at_exit_cupti_is_detached_after_every_buffer_came_back(refused):
    """The interpreter's exit: a forced flush, the buffers dropped, then cuptiFinalize (CUPTI then calls no callback
    into the finalized interpreter); where CUPTI refuses, the buffers and callbacks outlive the interpreter."""
    import threading

    from asyncgpu._backends.cupti_buffers import Buffers

    calls = []

    class Lib:
        def cuptiActivityFlushAll(self, forced):
            calls.append(("flush", forced))
            b._done.append((addr, 0))  # (CUPTI hands the lent buffer back)

        def cuptiFinalize(self):
            calls.append(("finalize",))
            return refused

    b = Buffers.__new__(Buffers)
    b._lock = threading.Lock()
    b.lib, b.requested, b.completed, b._idle, b._done = Lib(), object(), object(), [], []
    lent = np.empty(64, np.uint8)
    addr = lent.ctypes.data
    b._lent = {addr: lent}
    kept = []
    b.outlive_interpreter = lambda: kept.append(True) or []
    assert b.detach() == refused
    assert calls == [("flush", 1), ("finalize",)] and not b._lent and not b._done
    assert kept == ([True] if refused else [])


def test_the_completed_buffers_are_parsed_as_one_and_lent_again():
    """Several completed buffers: their records in one batch, in order (one parse of their records one after
    another); every buffer back in the idle pool up to its bound; an empty buffer and an unknown address skipped."""
    import threading

    from asyncgpu._backends import cupti_buffers
    from asyncgpu._backends.cupti_buffers import Buffers

    b = Buffers.__new__(Buffers)
    b._lock = threading.Lock()
    b._idle, b._done, b._lent = [], [], {}
    b.parser = Parser(LAYOUTS, reference_walk)
    contents = [sample(), Buffer(), sample()]
    contents[2].kernel(5000, 5100, 1, 5, 9, "last")
    for content in contents:
        data = content.data()
        arr = np.zeros(len(data) + 64, np.uint8)
        addr = arr.ctypes.data + (-arr.ctypes.data % 8)
        arr[addr - arr.ctypes.data :][: len(data)] = data
        b._lent[addr] = arr
        b._done.append((addr, len(data)))
    b._done.append((12345, 64))  # (not ours: skipped)
    batch = b.take()
    assert len(batch) == 11 and sorted(batch.correlation.tolist()) == sorted([1, 2, 3, 5, 6] * 2 + [9])
    assert batch.names[batch.name[np.argmax(batch.start_ns)]] == "last"
    assert len(b._idle) == 3 and not b._lent and not b._done
    assert len(b.take()) == 0  # (nothing completed since)
    more = np.zeros(64, np.uint8)
    b._idle = [np.zeros(8, np.uint8)] * cupti_buffers.POOL_MAX
    b._lent = {more.ctypes.data: more}
    b._done = [(more.ctypes.data, 0)]
    b.take()
    assert len(b._idle) == cupti_buffers.POOL_MAX  # (the pool stays bounded)
