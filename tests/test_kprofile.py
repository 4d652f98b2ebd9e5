"""In-kernel records: the wire format agrees between the CUDA header and Python (checked by NVRTC), the decoder
on synthetic buffers (wrap, overflow, corruption, bad input, TIRx), the host backend end to end (arm, record,
gather, decode, place, trace), and the GPU (marked)."""

from __future__ import annotations

import math
import threading
import time

import anyio
import numpy as np
import pytest

import asyncgpu
from asyncgpu._backends import cuda as _cuda
from asyncgpu._backends.kernels import FORMAT, HostLane, format_path, parse_format
from asyncgpu._base.errors import DeviceMismatchError, KernelRecordsError, KernelRecordsOverflowError
from asyncgpu._base.records import Timeline
from asyncgpu._trace.export import trace_dict
from asyncgpu.kernel import KernelRecords, decode, decode_tirx
from asyncgpu.kernel.profiler import INC_LOOP_STAGES, KernelLayer, KernelProfiler

F = FORMAT
M32 = 0xFFFFFFFF
B, E, I = F.KIND_BEGIN, F.KIND_END, F.KIND_INSTANT  # noqa: E741 (the format's kind letters)


# -- helpers: buffers written the way the header writes them (through FORMAT, checked against C below) ---------------
def armed(groups: int, lanes: int, cap: int) -> np.ndarray:
    buf = np.zeros(F.words_for(lanes, cap), np.uint64)
    buf[: F.HEADER_WORDS].view(np.uint32)[:] = F.header(groups, lanes, cap)
    return buf


def lane_words(buf: np.ndarray, lane: int) -> np.ndarray:
    cap = int(buf[: F.HEADER_WORDS].view(np.uint32)[F.HDR_CAPACITY])
    at = F.HEADER_WORDS + lane * (F.LANE_WORDS + cap)
    return buf[at : at + F.LANE_WORDS + cap]


def write_lane(
    buf: np.ndarray,
    lane: int,
    start: int,
    records: list[tuple[int, int, int]],
    end: int | None,
    attempted: int | None = None,
    flags: int = 0,
) -> None:
    """``records``: (kind, stage, full time ns); the lane keeps the low 32 bits, as a leader does."""
    w = lane_words(buf, lane)
    w[F.LANE_START] = start
    for k, (kind, stage, t) in enumerate(records):
        w[F.LANE_WORDS + k] = ((t & M32) << F.TIME_SHIFT) | F.tag(kind, stage)
    if end is not None:
        w[F.LANE_END] = end
        w[F.LANE_FIN] = F.fin_word(len(records) if attempted is None else attempted, flags)


def reference_decode(buf: np.ndarray) -> list[tuple[int, int, int, int]]:
    """A straightforward per-record decode: (lane, stage, begin ns, end ns) sorted, stacks per (lane, stage)."""
    h = [int(x) for x in buf[: F.HEADER_WORDS].view(np.uint32)]
    lanes, cap = h[F.HDR_LANES], h[F.HDR_CAPACITY]
    out = []
    for lane in range(lanes):
        w = [int(x) for x in lane_words(buf, lane)]
        if not w[F.LANE_START]:
            continue
        prev, stacks = w[F.LANE_START], {}
        for k in range(min(w[F.LANE_FIN] & M32, cap)):
            rec = w[F.LANE_WORDS + k]
            t = prev + (((rec >> F.TIME_SHIFT) - prev) & M32)
            prev = t
            kind, stage = rec & F.KIND_MASK, (rec >> F.STAGE_SHIFT) & F.STAGE_MASK
            if kind == B:
                stacks.setdefault(stage, []).append(t)
            elif kind == E:
                out.append((lane, stage, stacks[stage].pop(), t))
    return sorted(out)


def as_tuples(r: KernelRecords, start_base: int) -> list[tuple[int, int, int, int]]:
    return sorted(
        zip(
            r.lane.tolist(),
            r.stage.tolist(),
            (np.rint(r.start_ns) + start_base).astype(np.int64).tolist(),
            (np.rint(r.end_ns) + start_base).astype(np.int64).tolist(),
        )
    )


def placement_slack_ns(dev) -> float:
    """How far in-kernel records (placed by %globaltimer) and the kernel's activity (placed by events, less the
    event pair's overhead) may disagree: both placements' bounds, the overhead, a µs of clock resolution."""
    if dev.backend == "host":
        return 0.0  # one clock
    # the calibration that placed them, never a new one: a re-measure blocks the loop of an async test, and warns
    # (2× H100, run 44: the calibration had aged past `CLOCK_MAX_AGE_S` by then)
    cal = dev.clock(max_age_s=math.inf)
    return cal.bound_ns + cal.globaltimer_bound_ns + cal.bracket_overhead_ns + 1_000


def check_layer_trace(doc: dict) -> list[dict]:
    """The kernel-stage events of a trace: on named device tracks, non-negative, nested per track."""
    names = {
        ev["tid"]: (ev["pid"], ev["args"]["name"])
        for ev in doc["traceEvents"]
        if ev["ph"] == "M" and ev["name"] == "thread_name"
    }
    stage_events = [ev for ev in doc["traceEvents"] if ev.get("cat") == "kernel_stage"]
    tracks: dict[int, list] = {}
    for ev in stage_events:
        assert ev["pid"] >= 2 and names[ev["tid"]][0] == ev["pid"], ev
        assert ev["ts"] >= 0 and ev.get("dur", 0) >= 0
        if ev["ph"] == "X":
            # in whole ns, as a trace reader does: touching regions (one stamp ends A and begins B) must not
            # look overlapping through float sums of µs
            ts_ns, dur_ns = round(ev["ts"] * 1000), round(ev["dur"] * 1000)
            tracks.setdefault(ev["tid"], []).append((ts_ns, ts_ns + dur_ns))
    for spans in tracks.values():
        open_ends: list[float] = []
        for s, e in sorted(spans, key=lambda se: (se[0], -se[1])):
            while open_ends and open_ends[-1] <= s:
                open_ends.pop()
            assert not open_ends or e <= open_ends[-1], "regions on one track must nest"
            open_ends.append(e)
    return stage_events


# -- the format: one definition, read by both sides ------------------------------------------------------------------
def test_format_is_read_from_the_header_only():
    values = parse_format(format_path().read_text())
    assert values == F.values and {"MAGIC", "HEADER_WORDS", "LANE_WORDS", "RECORD_MARK"} <= values.keys()
    with pytest.raises(ValueError, match="integer literal"):
        parse_format("#define AGK_FOO (1 << 3)\n")


def _agreement_source(values: dict[str, int]) -> str:
    lines = ['#include "asyncgpu_profile.cuh"']
    lines += [f'static_assert(AGK_{k} == {v}ull, "AGK_{k}");' for k, v in values.items()]
    for kind, stage in ((B, 0), (E, 7), (I, 4095), (E, 4096 + 5), (3, 1)):
        lines.append(f'static_assert(asyncgpu::profile_tag({kind}u, {stage}u) == {F.tag(kind, stage)}u, "tag");')
    for n, flags in ((0, 0), (5, F.FLAG_REUSED), (M32, 0xFFFF)):
        lines.append(f'static_assert(asyncgpu::profile_fin_word({n}u, {flags}u) == {F.fin_word(n, flags)}ull, "fin");')
    lines.append('extern "C" __global__ void k(unsigned long long* r) { asyncgpu::Profiler p(r); p.finalize(); }')
    return "\n".join(lines)


@pytest.mark.nvrtc
def test_header_and_decoder_agree_checked_by_nvrtc():
    code = _cuda.compile_source(_agreement_source(F.values), "90")
    assert code.code_type == "cubin"
    wrong = dict(F.values, RECORD_MARK=F.RECORD_MARK ^ 1)  # the check can fail: one value off is a compile error
    with pytest.raises(Exception, match="AGK_RECORD_MARK|static assert"):
        _cuda.compile_source(_agreement_source(wrong), "90")


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("source", ["profiled.cu", "profiled_off.cu"])
def test_profiled_kernels_compile_with_nvrtc(arch, source):
    code = _cuda.compile_source((_cuda.kernels_dir() / source).read_text(), arch)
    assert code.code_type == "cubin" and len(code.code) > 1000


USER_KERNEL = """
{switch}
#include "asyncgpu_profile.cuh"
extern "C" __global__ void k(float* x, int n, unsigned long long* records) {{
    {decl}
    for (int i = 0; i < n; ++i) {{
        {region}
        x[threadIdx.x] = x[threadIdx.x] * 0.5f + 1.0f;
    }}
    {instant}
    {fin}
}}
"""


def _user_kernel(switch: str, calls: bool) -> bytes:
    parts = {
        "decl": "asyncgpu::Profiler prof(records, threadIdx.x / 64, threadIdx.x % 64 == 0);",
        "region": "auto r = prof.region(1);",
        "instant": "prof.instant(2);",
        "fin": "prof.finalize();",
    }
    if not calls:
        parts = dict.fromkeys(parts, "")
    return _cuda.compile_source(USER_KERNEL.format(switch=switch, **parts), "90").code


@pytest.mark.nvrtc
def test_switch_off_compiles_to_the_uninstrumented_kernel():
    plain = _user_kernel("", calls=False)
    off = _user_kernel("#define ASYNCGPU_PROFILE 0", calls=True)
    on = _user_kernel("", calls=True)
    assert off == plain  # every call is nothing: the very same cubin
    assert on != plain


# -- decoding asyncgpu buffers ---------------------------------------------------------------------------------------
def test_regions_and_a_wrap_inside_a_region():
    buf = armed(groups=2, lanes=4, cap=8)
    t0 = 7 * (1 << 32) - 1_000  # the low word wraps 1 µs after the lane starts
    write_lane(buf, 0, t0, [(B, 0, t0 + 500), (E, 0, t0 + 3_500), (B, 1, t0 + 4_000), (E, 1, t0 + 4_100)], t0 + 5_000)
    write_lane(buf, 3, t0 + 10, [(B, 1, t0 + 20), (E, 1, t0 + 520)], t0 + 600)
    buf[: F.HEADER_WORDS].view(np.uint32)[F.HDR_BLOCKS] = 2
    r = decode(buf, ("load", "compute"))
    assert r.lanes_started == 2 and r.blocks == 2 and not r.aligned and "relative" in r.time_base
    assert r.block.tolist() == [0, 0, 1] and r.group.tolist() == [0, 0, 1] and r.stage.tolist() == [0, 1, 1]
    assert r.duration_ns.tolist() == [3_000, 100, 500]
    assert r.start_ns.tolist() == [500.0, 4_000.0, 20.0]  # ns from the first stamp (the first lane's start)
    assert (r.end_ns - r.start_ns).tolist() == [3_000.0, 100.0, 500.0]
    s = r.summary()
    assert s.names == ("load", "compute") and s.count.tolist() == [1, 2] and s.total_ns.tolist() == [3_000, 600]
    assert s.blocks.tolist() == [1, 2]
    assert "compute" in str(r) and s.to_dict()["load"]["mean_ns"] == 3_000


def test_host_time_placement_is_affine_and_exact():
    buf = armed(1, 1, 4)
    t0 = (1 << 40) + 123
    write_lane(buf, 0, t0, [(B, 0, t0 + 1_000), (E, 0, t0 + 2_000_000)], t0 + 3_000_000)
    r = decode(buf, to_host=lambda t: 5e12 + (np.asarray(t, np.int64) - (1 << 40)) * 1.00001, time_base="host")
    assert r.aligned and r.time_base == "host"
    assert r.start_ns[0] == pytest.approx(5e12 + (123 + 1_000) * 1.00001, abs=1e-3)
    assert r.end_ns[0] - r.start_ns[0] == pytest.approx(1_999_000 * 1.00001, abs=1e-3)
    assert r.duration_ns[0] == 1_999_000  # device ns, exact


@pytest.mark.parametrize("seed", range(8))
def test_fast_and_general_paths_match_a_reference_decoder(seed, monkeypatch):
    from asyncgpu.kernel import asyncgpu_format as _kdecode

    paths = []
    fast = _kdecode._decode_pairs
    monkeypatch.setattr(_kdecode, "_decode_pairs", lambda *a: paths.append(fast(*a) is not None) or fast(*a))
    monkeypatch.setattr(_kdecode, "_CHUNK_PAIRS", (1, 64, 1 << 16)[seed % 3])  # one lane, some, all per chunk
    rng = np.random.default_rng(seed)
    lanes, cap = 12, 40
    buf = armed(3, lanes, cap)
    nested = seed in (1, 3, 5)  # nested and overlapping regions and instants: the general path
    full = seed >= 6  # every lane full: the fast path's copy-free views
    step_max = 1 << (31 if seed in (4, 5) else 22)  # steps up to 2.1 s: lanes longer than the 4.29 s wrap
    for lane in range(lanes):
        t = start = (int(rng.integers(1, 64)) << 32) - int(rng.integers(0, 1 << 22))  # the low word wraps soon
        recs: list[tuple[int, int, int]] = []
        open_: list[int] = []
        target = cap if full else int(rng.integers(0, cap // 2)) * 2
        while len(recs) + len(open_) < target:
            t += int(rng.integers(1, step_max))
            if nested and open_ and rng.random() < 0.5:
                recs.append((E, open_.pop(int(rng.integers(len(open_)))), t))
            elif nested and rng.random() < 0.2:
                recs.append((I, 9, t))
            else:
                stage = int(rng.integers(0, 5))
                if stage in open_:
                    continue
                recs.append((B, stage, t))
                if nested:
                    open_.append(stage)
                else:
                    t += int(rng.integers(1, step_max))
                    recs.append((E, stage, t))
        while open_:
            t += 1_000
            recs.append((E, open_.pop(), t))
        if recs:
            write_lane(buf, lane, start, recs, t + 1)
    first = min(int(lane_words(buf, ln)[F.LANE_START]) for ln in range(lanes) if lane_words(buf, ln)[0])
    r = decode(buf)
    expected = reference_decode(buf)
    assert as_tuples(r, first) == expected and len(expected) > 0
    assert paths == ([] if nested or seed in (4, 5) else [True])  # the fast path took the simple buffers


def simple_pairs_decode(buf: np.ndarray, to_host) -> dict[str, list]:
    """The fast path's results the simple way: each lane's (begin, end) pairs one at a time, with Python ints and
    floats, in the fast path's order of float operations (start = since * rate + lane start, end = duration * rate
    + start), so that the two agree to the bit."""
    from asyncgpu.kernel.decoding import Clock as _Clock

    h = [int(x) for x in buf[: F.HEADER_WORDS].view(np.uint32)]
    groups, lanes, cap = h[F.HDR_GROUPS], h[F.HDR_LANES], h[F.HDR_CAPACITY]
    words = [[int(x) for x in lane_words(buf, lane)] for lane in range(lanes)]
    origin = min(w[F.LANE_START] for w in words if w[F.LANE_FIN] & M32)
    clock = _Clock(to_host, None, origin)
    out: dict[str, list] = {k: [] for k in ("block", "group", "stage", "start_ns", "end_ns", "duration_ns")}
    for lane, w in enumerate(words):
        start, kept = w[F.LANE_START], min(w[F.LANE_FIN] & M32, cap)
        lane_start = float(start - clock.g0)
        if clock.rate != 1.0:
            lane_start *= clock.rate
        lane_start += clock.h0
        for k in range(0, kept, 2):
            begin, end = w[F.LANE_WORDS + k], w[F.LANE_WORDS + k + 1]
            since = ((begin >> F.TIME_SHIFT) - start) & M32
            duration = ((end >> F.TIME_SHIFT) - (begin >> F.TIME_SHIFT)) & M32
            start_ns = float(since) * clock.rate + lane_start
            out["block"].append(lane // groups)
            out["group"].append(lane % groups)
            out["stage"].append((begin >> F.STAGE_SHIFT) & F.STAGE_MASK)
            out["start_ns"].append(start_ns)
            out["end_ns"].append(float(duration) * clock.rate + start_ns)
            out["duration_ns"].append(duration)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_fast_path_equals_a_simple_decode_bit_for_bit(seed, monkeypatch):
    """Random buffers of begin/end pairs (lanes empty, partly and completely full; stamps wrapping the low word;
    an affine host clock or none), decoded in chunks of one lane, a few lanes and all: every column is the simple
    decode's, value for value and dtype for dtype."""
    from asyncgpu.kernel import asyncgpu_format as _kdecode

    paths = []
    fast = _kdecode._decode_pairs
    monkeypatch.setattr(_kdecode, "_decode_pairs", lambda *a: paths.append(fast(*a) is not None) or fast(*a))
    monkeypatch.setattr(_kdecode, "_CHUNK_PAIRS", (1, 40, 64, 1 << 16)[seed % 4])
    rng = np.random.default_rng(100 + seed)
    groups, lanes, cap = int(rng.integers(1, 4)), int(rng.integers(1, 40)), 2 * int(rng.integers(1, 40))
    buf = armed(groups, lanes, cap)
    full = seed % 3 == 0  # every lane full: the chunks' 2-D planes; else the gathered 1-D ones
    for lane in range(lanes):
        n = cap if full else 2 * int(rng.integers(0, cap // 2 + 1))
        t = start = (int(rng.integers(1, 1 << 20)) << 32) - int(rng.integers(0, 1 << 24))  # wraps soon, or not
        recs = []
        for _ in range(n // 2):
            t += int(rng.integers(0, 1 << 24))
            begin = t
            t += int(rng.integers(0, 1 << 26))
            stage = int(rng.integers(0, F.MAX_STAGES))
            recs += [(B, stage, begin), (E, stage, t)]
        write_lane(buf, lane, start, recs, t + 1)
    if not any(lane_words(buf, ln)[F.LANE_FIN] & M32 for ln in range(lanes)):
        write_lane(buf, 0, 1 << 32, [(B, 3, (1 << 32) + 5), (E, 3, (1 << 32) + 9)], (1 << 32) + 10)
    g0 = int(rng.integers(1, 1 << 40))
    rate = (1.0, 1.0000071, 0.99999)[seed % 3]
    to_host = None if seed % 4 == 1 else (lambda t: 5e12 + (np.asarray(t, np.int64) - g0) * rate)
    r = decode(buf, to_host=to_host)
    assert paths == [True], "the fast path did not take these buffers"
    expected = simple_pairs_decode(buf, to_host)
    dtypes = {"block": np.int32, "group": np.int32, "stage": np.int16, "duration_ns": np.int64}
    for column, values in expected.items():
        got = getattr(r, column)
        assert got.dtype == dtypes.get(column, np.float64), column
        assert np.array_equal(got, np.array(values, got.dtype)), column  # floats too: bit for bit
    assert len(r) == len(expected["stage"]) > 0 and r.instant_ns.size == 0


def test_a_lane_longer_than_the_wrap_is_unwrapped_and_a_long_gap_is_reported():
    buf = armed(1, 2, 16)
    t0 = 3 << 32
    recs = [(B if k % 2 == 0 else E, 0, t0 + k * 1_500_000_000) for k in range(8)]  # 10.5 s in 1.5 s steps
    write_lane(buf, 0, t0, recs, t0 + 11_000_000_000)
    write_lane(buf, 1, t0, [(B, 0, t0 + 1), (E, 0, t0 + 6_000_000_000)], t0 + 6_000_000_001)  # 6 s with no record
    with pytest.raises(KernelRecordsError, match="more than 4.29 s"):
        decode(buf)
    r = decode(buf, strict=False)
    assert r.duration_ns[r.lane == 0].tolist() == [1_500_000_000] * 4


def test_overflow_is_counted_and_never_silent():
    buf = armed(1, 2, 4)
    write_lane(buf, 0, 10, [(B, 0, 11), (E, 0, 12), (B, 0, 13), (E, 0, 14)], 30, attempted=10)
    write_lane(buf, 1, 10, [(B, 0, 11), (E, 0, 12)], 20)
    with pytest.raises(KernelRecordsOverflowError, match=r"6 records dropped .* capacity=10"):
        decode(buf)
    r = decode(buf, strict=False)
    assert r.dropped.tolist() == [6, 0] and r.dropped_records == 6 and len(r) == 3
    assert "dropped" in r.problems[0] and "6 records dropped" in str(r.summary())


def test_a_buffer_too_small_for_the_launch_and_a_bad_group():
    buf = armed(2, 2, 4)  # room for one block of two groups
    for block in range(3):
        for group in range(3):
            lane = HostLane(buf, block, group, blocks=3)
            lane.instant(0)
            lane.finalize()
    with pytest.raises(KernelRecordsOverflowError) as info:
        decode(buf)
    text = " ".join(info.value.problems)
    assert "4 (block, group) lanes found no room" in text and "arm(grid=3)" in text
    assert "groups=3" in text  # group 2 of a profiler armed for 2
    r = decode(buf, strict=False)
    assert r.instant_block.tolist() == [0, 0] and r.instant_group.tolist() == [0, 1]


@pytest.mark.parametrize(
    "words, match",
    [
        (np.zeros(0, np.uint64), "empty"),
        (np.zeros(2, np.uint64), "fewer than its"),
        (np.zeros(64, np.uint64), "all zeros: it was never armed"),
        (np.arange(1, 65, dtype=np.uint64), "without the magic"),
        (np.zeros(3, np.uint8), "whole uint64 words"),
    ],
)
def test_unreadable_buffers_raise_always(words, match):
    with pytest.raises(KernelRecordsError, match=match):
        decode(words, strict=False)


def test_a_corrupt_header_is_caught():
    buf = armed(1, 4, 8)
    buf[: F.HEADER_WORDS].view(np.uint32)[F.HDR_LANES] = 1000
    with pytest.raises(KernelRecordsError, match="corrupt header"):
        decode(buf, strict=False)


def test_reuse_without_zeroing():
    buf = armed(1, 1, 8)
    for n in (3, 1):  # two launches on one arming: the second finds the first's start stamp
        lane = HostLane(buf, 0, blocks=1)
        for _ in range(n):
            with lane.region(0):
                pass
        lane.finalize()
    with pytest.raises(KernelRecordsError, match="reused without zeroing"):
        decode(buf)
    r = decode(buf, strict=False)
    assert len(r) == 1  # the last launch's records only


def test_a_kernel_that_never_calls_finalize():
    buf = armed(1, 2, 8)
    write_lane(buf, 0, 100, [(B, 0, 110), (E, 0, 150), (B, 1, 160)], end=None)
    write_lane(buf, 1, 100, [(B, 0, 120), (E, 0, 130)], 200)
    with pytest.raises(KernelRecordsError, match="1 lanes never called finalize"):
        decode(buf)
    r = decode(buf, strict=False)
    assert sorted(r.duration_ns.tolist()) == [10, 40]
    assert any("began but never ended" in p for p in r.problems)


def test_corrupt_records_leave_their_lane_out():
    buf = armed(1, 2, 8)
    write_lane(buf, 0, 100, [(B, 0, 110), (E, 0, 150)], 200)
    write_lane(buf, 1, 100, [(B, 0, 110), (E, 0, 150)], 200)
    lane_words(buf, 1)[F.LANE_WORDS + 1] ^= np.uint64(1 << 27)  # a flipped bit in the record mark
    with pytest.raises(KernelRecordsError, match="not records"):
        decode(buf)
    r = decode(buf, strict=False)
    assert r.lane.tolist() == [0]
    lane_words(buf, 0)[F.LANE_FIN] = 12345  # a finalize word without its mark
    with pytest.raises(KernelRecordsError, match="corrupt lanes"):
        decode(buf)


def test_stale_records_past_the_count_are_caught():
    buf = armed(1, 1, 8)
    write_lane(buf, 0, 100, [(B, 0, 110), (E, 0, 150), (B, 0, 160), (E, 0, 170)], 200, attempted=2)
    with pytest.raises(KernelRecordsError, match="reused without zeroing"):
        decode(buf)


def test_unmatched_nested_and_overlapping_regions():
    buf = armed(1, 1, 16)
    write_lane(
        buf,
        0,
        100,
        [
            (B, 0, 110),
            (B, 1, 120),
            (B, 0, 125),
            (E, 0, 130),
            (E, 0, 140),
            (E, 1, 150),
            (I, 2, 155),
            (B, 3, 160),
            (E, 4, 170),
        ],
        200,
    )
    with pytest.raises(KernelRecordsError) as info:
        decode(buf, ("outer", "other", "mark", "open", "close"))
    assert "began but never ended (stages open" in str(info.value.problems)
    assert "ended but never began (stages close" in str(info.value.problems)
    r = decode(buf, ("outer", "other", "mark", "open", "close"), strict=False)
    got = sorted(zip(r.stage.tolist(), r.duration_ns.tolist()))
    assert got == [(0, 5), (0, 30), (1, 30)]  # stage 0 nests in itself: inner 125..130, outer 110..140
    assert r.instant_stage.tolist() == [2] and r.instant_ns.tolist() == [55.0]


# -- TIRx / flashinfer / warpscope -----------------------------------------------------------------------------------
def tirx_buffer(
    blocks: int, groups: int, slots: int, lanes_records: dict[int, list[tuple[int, int, int]]], sm: int | None = None
) -> np.ndarray:
    buf = np.zeros(1 + blocks * groups * slots, np.uint64)
    buf[0] = (groups << 32) | blocks
    stride = blocks * groups
    for lane, recs in lanes_records.items():
        for k, (typ, event, t) in enumerate(recs):
            bg = lane & 0xFFF if sm is not None else lane
            tag = (bg << 12) | (event << 2) | typ | ((sm << 24) if sm is not None else 0)
            buf[1 + lane + k * stride] = ((t & M32) << 32) | tag
    return buf


def test_tirx_buffers_decode_with_wrap_and_finalize():
    t0 = (9 << 32) - 300
    buf = tirx_buffer(
        2,
        2,
        6,
        {
            0: [(0, 1, t0), (1, 1, t0 + 1_000), (3, 0, t0 + 1_100)],
            3: [(0, 0, t0 + 50), (2, 2, t0 + 60), (1, 0, t0 + 250), (3, 0, t0 + 260)],
        },
    )
    r = decode_tirx(buf, ("a", "b", "c"))
    assert r.format == "tirx" and not r.aligned
    assert r.block.tolist() == [0, 1] and r.group.tolist() == [0, 1] and r.duration_ns.tolist() == [1_000, 200]
    assert r.start_ns.tolist() == [0.0, 50.0] and r.instant_ns.tolist() == [60.0]
    full = decode_tirx(buf, ("a", "b", "c"), reference_ns=t0 + 5_000, to_host=lambda t: np.asarray(t, float) + 0.5)
    assert full.aligned and full.start_ns.tolist() == [t0 + 0.5, t0 + 50.5]
    sm = decode_tirx(tirx_buffer(1, 1, 3, {0: [(0, 0, 5), (1, 0, 9)]}, sm=77), sm_id=True)
    assert sm.duration_ns.tolist() == [4]
    with pytest.raises(ValueError, match="reference_ns"):
        decode_tirx(buf, to_host=float)


def test_tirx_problems_are_reported():
    buf = tirx_buffer(1, 2, 2, {0: [(0, 0, 5), (1, 0, 9)], 1: [(0, 0, 5)]})
    with pytest.raises(KernelRecordsOverflowError, match="filled all 2 of their slots"):
        decode_tirx(buf)
    wrong = tirx_buffer(1, 2, 3, {0: [(0, 0, 5), (1, 0, 9)]})
    wrong[1 + 0] = wrong[1 + 0] | np.uint64(1 << 12)  # says block_group 1 in lane 0's slot
    with pytest.raises(KernelRecordsError, match="slots of another"):
        decode_tirx(wrong)
    with pytest.raises(KernelRecordsError, match="no records"):
        decode_tirx(np.zeros(8, np.uint64))
    assert len(decode_tirx(buf, strict=False)) == 1


# -- host backend, end to end ----------------------------------------------------------------------------------------
def test_profiler_arguments_and_states():
    dev = asyncgpu.device("host:0")
    with pytest.raises(ValueError, match="zero-length"):
        KernelProfiler(dev, capacity=0)
    with pytest.raises(ValueError, match="groups"):
        KernelProfiler(dev, groups=0)
    prof = KernelProfiler(dev)
    with pytest.raises(KernelRecordsError, match="not armed"):
        prof.pointer  # noqa: B018 (the property raises)
    with pytest.raises(KernelRecordsError, match="nothing to gather"):
        prof.collect_sync()
    with pytest.raises(ValueError, match="grid"):
        prof.arm((4, 0))
    prof.close()
    with pytest.raises(KernelRecordsError, match="closed"):
        prof.arm(1)


def test_a_buffer_of_another_device_is_refused():
    a, b = asyncgpu.devices("host", count=2)
    with KernelProfiler(a) as prof:
        with pytest.raises(DeviceMismatchError, match="host:1"):
            prof.arm(4, stream=b.stream)
        with pytest.raises(DeviceMismatchError, match="host:1"):
            prof.inc_loop(b.alloc(10, np.float32), 1)
    with pytest.raises(TypeError, match="whole uint64 words"):
        HostLane(np.zeros(3, np.uint8), 0, blocks=1)


@pytest.mark.anyio
async def test_inc_loop_records_land_inside_the_kernel_on_every_device(two_devs):
    n = 200_000
    async with asyncgpu.gpu_timer(two_devs, label="k") as t:
        out = {}

        async def one(d):
            a = d.alloc(n, np.float32)
            d.stream.memset(a, 0)
            with KernelProfiler(d, max_tracks=2) as prof:
                prof.inc_loop(a, 5)
                out[d.name] = await prof.collect()
            assert np.all(a.to_numpy() == 5)

        async with anyio.create_task_group() as tg:
            for d in two_devs:
                tg.start_soon(one, d)
    blocks = two_devs[0]._internal.bd.inc_loop_profiled_blocks(n)
    for d in two_devs:
        recs = out[d.name]
        assert recs.aligned and recs.stages == INC_LOOP_STAGES and len(recs) == 3 * blocks
        assert recs.summary().count.tolist() == [blocks] * 3 and np.all(recs.duration_ns >= 0)
        kernel = [r for r in t.records if r.device == d.name and r.kind == "kernel"][0]
        slack = placement_slack_ns(d)
        assert kernel.start_ns - slack <= recs.start_ns.min() and recs.end_ns.max() <= kernel.end_ns + slack
    doc = trace_dict(t)
    events = check_layer_trace(doc)
    assert {ev["pid"] for ev in events} == {2, 3}  # every device's process
    names = [
        ev["args"]["name"]
        for ev in doc["traceEvents"]
        if ev["ph"] == "M" and "inc_loop b" in ev["args"].get("name", "")
    ]
    assert names.count(f"inc_loop b0 g0 [first 2 of {blocks} lanes]") == 2 and len(names) == 4
    assert sum(ev["ph"] == "X" for ev in events) == 2 * 2 * 3


def test_a_users_host_kernel_with_two_groups_handing_over():
    dev = asyncgpu.device("host:0")
    tiles, blocks = 6, 2
    x = np.arange(blocks * tiles * 1000, dtype=np.float64)
    out = np.zeros(blocks)

    def kernel(records):  # per block: a producer thread loads tiles, a consumer thread sums them
        def block(b):
            handoff = [threading.Semaphore(0), threading.Semaphore(2)]
            slots = [None, None]

            def producer():
                lane = HostLane(records, b, 0, blocks=blocks)
                for k in range(tiles):
                    with lane.region(0):
                        handoff[1].acquire()
                    with lane.region(1):
                        slots[k % 2] = x[(b * tiles + k) * 1000 : (b * tiles + k + 1) * 1000].copy()
                    handoff[0].release()
                lane.finalize()

            def consumer():
                lane = HostLane(records, b, 1, blocks=blocks)
                for k in range(tiles):
                    with lane.region(2):
                        handoff[0].acquire()
                    with lane.region(3):
                        out[b] += float(np.sum(slots[k % 2] ** 2))
                    handoff[1].release()
                lane.instant(4)
                lane.finalize()

            threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()

        for b in range(blocks):
            block(b)

    stages = ("wait_empty", "load", "wait_full", "compute", "done")
    with KernelProfiler(dev, stages=stages, groups=2, capacity=64, name="ws") as prof:
        prof.arm(blocks)
        dev.stream.launch(kernel, None, prof.array, name="ws")
        recs = prof.collect_sync()
    assert np.allclose(out, [np.sum(x[b * tiles * 1000 : (b + 1) * tiles * 1000] ** 2) for b in range(blocks)])
    s = recs.summary()
    assert s.names == stages[:4] and s.count.tolist() == [tiles * blocks] * 4 and s.blocks.tolist() == [2] * 4
    assert recs.instant_group.tolist() == [1, 1] and recs.name == "ws"
    for b in range(blocks):  # the consumer computes tile k only after the producer loaded it
        load_end = np.sort(recs.end_ns[(recs.block == b) & (recs.stage == 1)])
        compute_start = np.sort(recs.start_ns[(recs.block == b) & (recs.stage == 3)])
        assert np.all(compute_start >= load_end)


def test_rearming_reuses_or_grows_the_buffer_and_each_gather_is_one_launch():
    dev = asyncgpu.device("host:0")
    small, big = dev.alloc(1000, np.float32), dev.alloc(300_000, np.float32)
    for a in (small, big):
        dev.stream.memset(a, 0)
    with KernelProfiler(dev) as prof:
        prof.inc_loop(small, 1)
        assert len(prof.collect_sync()) == 3
        first_buffer = prof.array
        prof.inc_loop(big, 2)
        assert len(prof.collect_sync()) == 3 * 5 and prof.array is not first_buffer
        grown = prof.array
        prof.inc_loop(small, 1)
        assert len(prof.collect_sync()) == 3 and prof.array is grown  # re-zeroed: nothing of the earlier launch


@pytest.mark.anyio
async def test_a_cancelled_gather_can_be_gathered_again():
    dev = asyncgpu.device("host:0")
    with KernelProfiler(dev) as prof:
        prof.arm(1)
        dev.stream.launch(lambda buf: (time.sleep(0.3), HostLane(buf, 0, blocks=1).finalize()), None, prof.array)
        with anyio.move_on_after(0.02) as scope:
            await prof.collect()
        assert scope.cancelled_caught
        recs = await prof.collect()
        assert recs.lanes_started == 1 and len(recs) == 0


def test_relative_records_are_marked_in_the_trace():
    buf = armed(1, 1, 4)
    write_lane(buf, 0, 1000, [(B, 0, 1100), (E, 0, 1600)], 2000)
    recs = decode(buf, ("work",), device="cuda:0", name="k")
    tl = Timeline.from_arrays(
        devices=["cuda:0"],
        device=[0],
        start_ns=[10_000],
        end_ns=[20_000],
        scope_start_ns=9_000,
        scope_end_ns=30_000,
        layers=(KernelLayer(recs, 4),),
    )
    doc = trace_dict(tl)
    assert doc["otherData"]["origin_ns"] == 9_000
    tracks = [
        ev["args"]["name"] for ev in doc["traceEvents"] if ev["name"] == "thread_name" and " b0 " in ev["args"]["name"]
    ]
    assert tracks == ["k b0 g0 (NOT aligned: relative time)"]
    (stage,) = check_layer_trace(doc)
    assert stage["ts"] == 0.1 and stage["dur"] == 0.5  # relative 100 ns after the scope's start
    other = Timeline.from_arrays(devices=["cuda:1"], device=[0], start_ns=[0], end_ns=[1], layers=tl.layers)
    assert check_layer_trace(trace_dict(other)) == []  # records of a device outside the timeline: not drawn


# -- GPU -------------------------------------------------------------------------------------------------------------
def _compile_user_kernel(dev, body: str, switch: str = ""):
    from cuda.core import Program, ProgramOptions

    src = switch + '\n#include "asyncgpu_profile.cuh"\n' + body
    opts = ProgramOptions(arch=f"sm_{dev._internal.bd.arch}", std="c++17", include_path=[KernelProfiler.include_dir()])
    return Program(src, "c++", opts).compile("cubin")


GPU_KERNEL = """
extern "C" __global__ void two_groups(float* x, int reps, unsigned long long* records) {
    asyncgpu::Profiler prof(records, threadIdx.x / 64, threadIdx.x % 64 == 0);
    float v = x[threadIdx.x];
    for (int r = 0; r < reps; ++r) {
        auto region = prof.region(threadIdx.x / 64);
        for (int k = 0; k < 200; ++k) v = v * 0.999f + 1.0f;
        asm volatile("" : "+f"(v)::"memory");
    }
    prof.instant(2);
    prof.finalize();
    x[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
"""


@pytest.mark.gpu
@pytest.mark.anyio
async def test_gpu_inc_loop_records_are_aligned_inside_the_kernel():
    dev = asyncgpu.device(0)
    n = 1 << 20
    a = dev.alloc(n, np.float32)
    dev.stream.memset(a, 0)
    with KernelProfiler(dev, max_tracks=4) as prof:
        prof.inc_loop(a, 1)  # the first launch also loads the module (lazy loading): not in the scope
        await prof.collect()
        async with asyncgpu.gpu_timer(dev) as t:
            prof.inc_loop(a, 300)
            recs = await prof.collect()
    assert np.all(a.to_numpy() == 301)
    blocks = n // 256
    assert recs.aligned, recs.time_base
    assert len(recs) == 3 * blocks and recs.lanes_started == blocks and recs.blocks == blocks
    kernel = [r for r in t.records if r.kind == "kernel"][0]
    slack = placement_slack_ns(dev)
    assert recs.start_ns.min() >= kernel.start_ns - slack and abs(recs.end_ns.max() - kernel.end_ns) <= slack
    add = recs.summary().to_dict()["add"]
    assert add["mean_ns"] > 300 and add["count"] == blocks
    events = check_layer_trace(trace_dict(t))
    assert len([ev for ev in events if ev["ph"] == "X"]) == 4 * 3


@pytest.mark.gpu
def test_gpu_user_kernel_groups_overflow_and_a_small_buffer():
    from cuda.core import LaunchConfig

    dev = asyncgpu.device(0)
    kernel = _compile_user_kernel(dev, GPU_KERNEL).get_kernel("two_groups")
    x = dev.alloc(8 * 128, np.float32)
    dev.stream.memset(x, 0)
    with KernelProfiler(dev, stages=("g0", "g1", "done"), groups=2, capacity=64) as prof:
        dev.stream.launch(kernel, LaunchConfig(grid=8, block=128), x.ptr, np.int32(10), prof.arm(8))
        recs = prof.collect_sync()
        assert len(recs) == 8 * 2 * 10 and sorted(set(recs.group.tolist())) == [0, 1]
        assert recs.instant_ns.size == 16 and np.all(recs.duration_ns > 0)
        dev.stream.launch(kernel, LaunchConfig(grid=8, block=128), x.ptr, np.int32(40), prof.arm(8))
        with pytest.raises(KernelRecordsOverflowError, match="capacity="):
            prof.collect_sync()
        dev.stream.launch(kernel, LaunchConfig(grid=8, block=128), x.ptr, np.int32(2), prof.arm(3))
        with pytest.raises(KernelRecordsOverflowError, match=r"10 \(block, group\) lanes found no room"):
            prof.collect_sync()
        assert len(prof.collect_sync(strict=False)) == 3 * 2 * 2
    dev.synchronize()  # no sticky error: nothing was written out of bounds


@pytest.mark.gpu
def test_gpu_switch_off_writes_nothing():
    from cuda.core import LaunchConfig

    dev = asyncgpu.device(0)
    kernel = _compile_user_kernel(dev, GPU_KERNEL, switch="#define ASYNCGPU_PROFILE 0").get_kernel("two_groups")
    x = dev.alloc(128, np.float32)
    dev.stream.memset(x, 0)
    with KernelProfiler(dev, groups=2) as prof:
        dev.stream.launch(kernel, LaunchConfig(grid=1, block=128), x.ptr, np.int32(5), prof.arm(1))
        recs = prof.collect_sync()
    assert recs.lanes_started == 0 and len(recs) == 0 and recs.problems == ()


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.anyio
async def test_gpu_two_devices_records_on_each_process():
    devs = asyncgpu.devices(count=2)
    async with asyncgpu.gpu_timer(devs) as t:
        results = {}

        async def one(d):
            a = d.alloc(1 << 18, np.float32)
            d.stream.memset(a, 0)
            with KernelProfiler(d, max_tracks=2) as prof:
                prof.inc_loop(a, 200)
                results[d.name] = await prof.collect()

        async with anyio.create_task_group() as tg:
            for d in devs:
                tg.start_soon(one, d)
    assert all(r.aligned and len(r) == 3 * 1024 for r in results.values())
    events = check_layer_trace(trace_dict(t))
    assert {ev["pid"] for ev in events} == {2, 3}


def test_host_inc_loop_on_uninitialized_memory_raises_nothing():
    """As on a GPU, float math on whatever fresh memory holds (here signaling NaNs) raises no warning on the host
    backend: one did, now and then, under pytest's warnings-as-errors, and poisoned the device."""
    dev = asyncgpu.device("host:0")
    a, b = dev.alloc(1024), dev.alloc(1024)
    for arr in (a, b):
        arr.live()[:4].view(np.uint32)[:] = 0x7F800001
    dev.stream.inc_loop(a, 3)
    prof = KernelProfiler(dev)
    prof.inc_loop(b, 3)
    assert len(prof.collect_sync()) == 3
    prof.close()
    dev.synchronize()
