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


def test_both_walks_hand_the_rest_to_cuptis_walk_at_a_kind_no_layout_sizes():
    b = sample()
    b.raw(OTHER, OTHER_SIZE)
    b.kernel(2000, 2100, 0, 3, 9, "late")
    data = b.data()
    parser = Parser(LAYOUTS, reference_walk)
    for walk in (lambda d: parser._walk_runs(d)[0], parser._walk_plain):
        assert {k: v.tolist() for k, v in walk(data).items() if len(v)} == reference_walk(data)


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
def test_runs_found_in_bulk_give_the_offsets_of_a_record_by_record_walk(seed):
    """Runs of every length around the probe's (a step's kernels are long runs; copies come alone or in short
    ones), a run to the buffer's very end, and records whose inner words look like kinds: the bulk walk finds
    exactly the records a walk one record at a time finds."""
    from asyncgpu._backends.cupti_buffers import _PROBE

    rng = np.random.default_rng(seed)
    b = Buffer()
    corr = 0
    lengths = [1, 2, _PROBE - 1, _PROBE, _PROBE + 1, 4 * _PROBE, 4 * _PROBE + 1, 300, *rng.integers(1, 200, 20)]
    for n in rng.permutation(lengths):
        kind = [KERNEL, KERNEL, MEMSET, MEMCPY, API][int(rng.integers(5))]
        for _ in range(int(n)):
            corr += 1
            if kind == KERNEL:
                b.kernel(10 * corr, 10 * corr + 5, 0, 3, corr, "k")
            elif kind == API:  # (every inner word a kind's number)
                b.parts.append(np.array([API, KERNEL, MEMSET, KERNEL, KERNEL, MEMCPY, KERNEL, KERNEL], "<u4").tobytes())
            else:
                b.copy(kind, 10 * corr, 10 * corr + 5, 0, corr)
    for _ in range(5 * _PROBE):  # a long run to the buffer's end
        corr += 1
        b.kernel(10 * corr, 10 * corr + 5, 0, 3, corr, "k")
    data = b.data()
    parser = Parser(LAYOUTS, reference_walk)
    truth = reference_walk(data)
    for walk in (lambda d: parser._walk_runs(d)[0], parser._walk_plain):
        assert {k: v.tolist() for k, v in walk(data).items() if len(v)} == truth
    assert len(parser.parse(data)) == sum(len(v) for k, v in truth.items() if k in (KERNEL, MEMSET, MEMCPY))


def test_the_walk_goes_record_by_record_while_runs_are_short_and_looks_again_every_few_buffers(monkeypatch):
    from asyncgpu._backends import cupti_buffers

    def buffer(run: int) -> np.ndarray:
        b = Buffer()
        for k in range(10):
            for _ in range(run):
                b.copy(MEMSET, 1, 2, 0, k)
            b.copy(MEMCPY, 1, 2, 0, k)
        return b.data()

    parser = Parser(LAYOUTS, reference_walk)
    by_runs = []
    real = parser._walk_runs
    monkeypatch.setattr(parser, "_walk_runs", lambda d: by_runs.append(1) or real(d))
    short, long = buffer(3), buffer(8 * cupti_buffers._PROBE)
    parser._walk_by_size(short)
    assert len(by_runs) == 1 and not parser._long_runs  # runs of 4: record by record from now on
    for _ in range(cupti_buffers._RECHECK - 1):
        parser._walk_by_size(long)
    assert len(by_runs) == 1  # (not looked at yet)
    parser._walk_by_size(long)
    assert len(by_runs) == 2 and parser._long_runs  # looked again: long runs, walked by runs
    parser._walk_by_size(long)
    assert len(by_runs) == 3
