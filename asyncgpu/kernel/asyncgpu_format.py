"""Decoding asyncgpu's own record format (``kernels/asyncgpu_profile_format.h``, read through
`asyncgpu._backends.kernels`): numpy only, no Python loop per record (nor per lane).

Wrap: a record keeps the low 32 bits of ``%globaltimer`` (4 bytes, not 8: a record is one 8-byte store), and
its lane keeps the full 64-bit stamps of its start and finalize. A record's time is ``start + ((lo - start_lo)
mod 2^32)``, exact whenever the lane lasted less than 4.29 s (its start and end stamps say so); a longer lane
is unwrapped record by record (exact unless two records of one lane lie more than 4.29 s apart, which the end
stamp then reveals as corruption). A region's duration is ``(end_lo - begin_lo) mod 2^32``, wrap or not.

The fast path (every lane a sequence of begin/end pairs, e.g. a region per stage at a time) works on pairs of
words at once, in cache-sized chunks; anything else goes through the general path of `asyncgpu.kernel.decoding`.

Threads: any; pure functions of their inputs.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from asyncgpu._backends.kernels import FORMAT
from asyncgpu._base.errors import KernelRecordsError
from asyncgpu.kernel.decoding import (
    M32,
    U32,
    WRAP_NS,
    Clock,
    Findings,
    Launch,
    ToHost,
    as_words,
    assemble,
    check_stages,
    run_starts,
    unwrap,
    where,
)
from asyncgpu.kernel.records import KernelRecords

__all__ = ["decode"]

_CHUNK_PAIRS = 1 << 16  # pairs the fast path decodes per step (its scratch planes: 1 MiB)


def decode(
    words: Any,
    stages: Sequence[str] = (),
    *,
    strict: bool = True,
    to_host: ToHost | None = None,
    time_base: str | None = None,
    name: str = "kernel",
    device: str | None = None,
) -> KernelRecords:
    """Decode an asyncgpu record buffer (uint64 words as copied from the device, see
    ``kernels/asyncgpu_profile_format.h``). ``stages`` names the stage ids. ``to_host`` converts int64 device
    stamps to float64 host ns (`ClockCalibration.globaltimer_to_host_ns`); without it times are relative.

    Always raises `KernelRecordsError` for a buffer that cannot be read (empty, not armed, corrupt header,
    another format). With ``strict`` (default) also for anything that makes the records incomplete or
    doubtful — dropped records (`KernelRecordsOverflowError`), a lane without finalize, a buffer reused without
    zeroing, corrupt lanes, unmatched begin/end; with ``strict=False`` the sound records are kept and those
    findings are listed in ``problems`` (corrupt lanes are left out, never guessed at)."""
    stages = check_stages(stages)
    w = as_words(words)
    header = _read_header(w)
    findings = Findings()
    _check_header(findings, header)
    lanes = _read_lanes(w, header)
    bad = _check_lanes(findings, header, lanes)
    launch = Launch(
        name, device, tuple(stages), "asyncgpu", header.groups, header.blocks, header.lanes, int(lanes.started.sum())
    )
    kept = np.where(bad, 0, lanes.kept)
    span = lanes.end - lanes.start
    simple = np.where(kept > 0, lanes.finalized & (span >= 0) & (span < WRAP_NS), True)  # no unwrapping needed
    if np.all(simple) and np.all(kept % 2 == 0):
        fast = _decode_fast(launch, lanes, kept, header.capacity, findings, strict, to_host, time_base)
        if fast is not None:
            return fast
    lane, kind, stage, t = _flat_records(findings, lanes, kept, simple, header.groups, header.capacity)
    origin = int(lanes.start[kept > 0].min()) if np.any(kept > 0) else None  # the earliest start with records
    return assemble(launch, lane, kind, stage, t, lanes.dropped, findings, strict, to_host, time_base, origin)


# -- the header and the lanes --------------------------------------------------------------------------------------
class _Header(NamedTuple):
    """The buffer's header words."""

    groups: int  #: groups per block the profiler was armed for
    lanes: int
    capacity: int  #: records per lane
    blocks: int  #: blocks of the launch
    no_room: int  #: lanes that found no room
    bad_group: int  #: 1 + a group number beyond ``groups`` that a leader gave (0: none)
    need: int  #: words the header and the lanes take


def _read_header(w: np.ndarray) -> _Header:
    """The header, or `KernelRecordsError` for a buffer that is too short, never armed, of another format, or
    whose header was overwritten."""
    f = FORMAT
    if w.size < f.HEADER_WORDS:
        raise KernelRecordsError(
            f"the record buffer has {w.size} words, fewer than its {f.HEADER_WORDS}-word "
            "header: pass the whole buffer the profiler armed (KernelProfiler.nbytes bytes)"
        )
    h = [int(x) for x in w[: f.HEADER_WORDS].view(np.uint32)]
    if h[f.HDR_MAGIC] != f.MAGIC:
        if not w.any():
            raise KernelRecordsError(
                "the record buffer is all zeros: it was never armed (KernelProfiler.arm() zeroes "
                "it and writes its header on the stream before the launch), or the copy read "
                "another buffer"
            )
        raise KernelRecordsError(
            f"not an asyncgpu record buffer: word 0 is {int(w[0]):#018x}, without the magic "
            f"{f.MAGIC:#010x} (a corrupt header, or another format: TIRx, flashinfer and "
            "warpscope buffers decode with KernelRecords.decode_tirx)"
        )
    groups, lanes, cap = h[f.HDR_GROUPS], h[f.HDR_LANES], h[f.HDR_CAPACITY]
    need = f.words_for(lanes, cap)
    if groups == 0 or lanes == 0 or cap == 0 or need > w.size:
        raise KernelRecordsError(
            f"corrupt header: {groups} groups, {lanes} lanes of {cap} records = {need} words, "
            f"in a buffer of {w.size} words: the header was overwritten (a kernel writing out "
            "of bounds, or another buffer's pointer passed as the records pointer)"
        )
    return _Header(groups, lanes, cap, h[f.HDR_BLOCKS], h[f.HDR_NO_ROOM], h[f.HDR_BAD_GROUP], need)


def _check_header(findings: Findings, header: _Header) -> None:
    """What the header counted as lost: records of a group beyond the armed ones, lanes that found no room."""
    groups, lanes, blocks = header.groups, header.lanes, header.blocks
    no_room, bad_group = header.no_room, header.bad_group
    if bad_group:
        findings.add(
            f"a leader said it is group {bad_group - 1}, but the profiler was armed for {groups} groups per "
            f"block (that group's records were not written): KernelProfiler(..., groups={bad_group})",
            overflow=True,
        )
    if no_room:
        findings.add(
            f"{no_room} (block, group) lanes found no room (their records were dropped): the launch had "
            f"{blocks} blocks x {groups} groups = {blocks * groups} lanes, the buffer holds {lanes}: arm the "
            f"profiler with the launch's grid (arm(grid={blocks}))",
            overflow=True,
        )


class _Lanes(NamedTuple):
    """Per lane (int64 columns): its stamps, its finalize word, and its records."""

    rec: np.ndarray  #: (lanes, capacity) uint64 record words
    start: np.ndarray  #: the full start stamp (0: never started)
    end: np.ndarray  #: the full finalize stamp
    fin: np.ndarray  #: the finalize word: mark, flags, records attempted
    started: np.ndarray  #: bool
    finalized: np.ndarray  #: bool: the finalize word carries its mark
    in_use: np.ndarray  #: words in use (non-zero words where the lane has room left)
    kept: np.ndarray  #: records kept: counted by finalize, else the words in use
    dropped: np.ndarray  #: records attempted beyond the capacity


def _read_lanes(w: np.ndarray, header: _Header) -> _Lanes:
    f = FORMAT
    lanes, cap = header.lanes, header.capacity
    lane_words = w[f.HEADER_WORDS : header.need].reshape(lanes, f.LANE_WORDS + cap)
    start, end, fin = (lane_words[:, k].astype(np.int64) for k in (f.LANE_START, f.LANE_END, f.LANE_FIN))
    rec = lane_words[:, f.LANE_WORDS :]
    started = start != 0
    finalized = (fin >> f.FIN_MARK_SHIFT) & 0xFFFF == f.FIN_MARK
    attempted = np.where(finalized, fin & 0xFFFFFFFF, 0)
    kept = np.where(finalized, np.minimum(attempted, cap), 0)
    in_use = kept.copy()  # words in use; only lanes with room left can differ (stale records, no finalize)
    partial = np.flatnonzero(kept < cap)
    if partial.size:
        in_use[partial] = np.count_nonzero(rec[partial], axis=1)
    kept = np.where(finalized, kept, in_use)
    dropped = attempted - kept
    return _Lanes(rec, start, end, fin, started, finalized, in_use, kept, dropped)


def _check_lanes(findings: Findings, header: _Header, lanes: _Lanes) -> np.ndarray:
    """Per-lane consistency (vectorised): the lanes that cannot be trusted (left out of the decode)."""
    f = FORMAT
    groups, cap = header.groups, header.capacity
    started, finalized, fin, start, end = lanes.started, lanes.finalized, lanes.fin, lanes.start, lanes.end
    in_use, kept, dropped = lanes.in_use, lanes.kept, lanes.dropped
    bad = np.zeros(header.lanes, bool)
    lanes_at = np.flatnonzero
    garbage_fin = (fin != 0) & ~finalized
    no_start = finalized & ~started
    orphan = ~started & ~finalized & (in_use > 0)
    for mask, what in (
        (garbage_fin, "a finalize word without its mark"),
        (no_start, "a finalize word but no start stamp"),
        (orphan, "records but neither a start stamp nor a finalize word"),
    ):
        if mask.any():
            findings.add(
                f"corrupt lanes ({what}): {where(lanes_at(mask), groups)}: the buffer was overwritten "
                "(out-of-bounds writes in the kernel?) or is not an asyncgpu record buffer"
            )
            bad |= mask
    reused = finalized & (((fin >> f.FIN_FLAGS_SHIFT) & f.FLAG_REUSED) != 0)
    stale = finalized & ~reused & (in_use > kept)
    if reused.any() or stale.any():
        findings.add(
            f"the buffer was reused without zeroing ({where(lanes_at(reused | stale), groups)} hold "
            "records of an earlier launch): arm() the profiler before every launch"
        )
        bad |= stale
    holes = finalized & ~reused & (in_use < kept)
    if holes.any():
        findings.add(f"corrupt lanes (empty words among their records): {where(lanes_at(holes), groups)}")
        bad |= holes
    never = started & ~finalized
    if never.any():
        findings.add(
            f"{int(never.sum())} lanes never called finalize ({where(lanes_at(never), groups)}): call "
            "prof.finalize() once at the end of the kernel on every leader, on every path that returns "
            "(their records are kept, their end is unknown)"
        )
    if dropped.any():
        worst = int((kept + dropped).max())
        findings.add(
            f"{int(dropped.sum())} records dropped by {int((dropped > 0).sum())} full lanes "
            f"({where(lanes_at(dropped > 0), groups)}): capacity is {cap} records per lane, the fullest "
            f"lane wanted {worst}: KernelProfiler(..., capacity={worst})",
            overflow=True,
        )
    backwards = finalized & started & (end < start)
    if backwards.any():
        findings.add(f"corrupt lanes (finalized before they started): {where(lanes_at(backwards), groups)}")
        bad |= backwards
    return bad


# -- the fast path -------------------------------------------------------------------------------------------------
def _decode_fast(
    launch: Launch,
    lanes: _Lanes,
    kept: np.ndarray,
    cap: int,
    findings: Findings,
    strict: bool,
    to_host: ToHost | None,
    time_base: str | None,
) -> KernelRecords | None:
    """The records when every lane is a sequence of begin/end pairs (`_decode_pairs`); None otherwise."""
    origin = int(lanes.start[kept > 0].min()) if np.any(kept > 0) else 0  # the earliest start with records
    clock = Clock(to_host, time_base, origin)
    regions = _decode_pairs(lanes.rec, lanes.start, kept, cap, launch.groups, clock)
    if regions is None:
        return None
    problems = findings.settle(strict)
    empty = np.zeros(0, np.int32)
    return launch.records(
        clock,
        problems,
        lanes.dropped,
        **regions,
        instant_block=empty,
        instant_group=empty,
        instant_stage=empty.astype(np.int16),
        instant_ns=np.zeros(0),
    )


def _decode_pairs(
    rec: np.ndarray, start: np.ndarray, kept: np.ndarray, cap: int, groups: int, clock: Clock
) -> dict[str, np.ndarray] | None:
    """The fast path: every lane a sequence of (begin s, end s) pairs. For a sound pair the end's tag is the
    begin's plus one (same mark and stage, END = BEGIN + 1) and the begin's kind and check bits are right. None
    when the records are anything else (instants, nesting, corruption): the general path then finds out which.

    Works through the lanes in chunks of about `_CHUNK_PAIRS` pairs, on whole uint64 words (the format is
    little-endian: a word's low half is its tag, its high half the stamp's low word). Each chunk's begin and end
    words are copied once into two contiguous planes (the only strided pass, into a scratch buffer reused from
    chunk to chunk, so it stays in the CPU's cache); then, in place and with no other temporary:

    * end plane = ``end - begin``: the tags' difference in the low half (1 when sound: no borrow), the duration
      mod 2^32 in the high half, shifted down into the duration column;
    * begin plane = ``begin - (the lane start's low word << 32)``: the begin tag in the low half (the stage, and
      the check), the ns since the lane started mod 2^32 in the high half (wrap or not);
    * the checks: one AND and one OR reduction of both planes (a bit is the same in every word exactly when its
      AND and its OR agree), no boolean arrays;
    * start = since * rate + lane start, end = duration * rate + start: float64, in the output columns.
    """
    f = FORMAT
    lanes, pairs = len(rec), cap // 2
    half = kept // 2
    offsets = np.zeros(lanes + 1, np.int64)
    np.cumsum(half, out=offsets[1:])
    total = int(offsets[-1])
    lane_ids = np.arange(lanes)
    start_word = (start & 0xFFFFFFFF).astype(np.uint64) << U32  # each lane's start, as a record's high half
    lane_base = clock(start)  # each lane's start stamp, converted
    stage, dur = np.empty(total, np.int16), np.empty(total, np.int64)
    start_ns, end_ns = np.empty(total, np.float64), np.empty(total, np.float64)
    check_mask, check_value = np.uint64(f.CHECK_MASK | f.KIND_MASK), np.uint64(f.CHECK_VALUE | f.KIND_BEGIN)
    one = np.uint64(1)
    step = max(1, _CHUNK_PAIRS // max(pairs, 1))
    scratch = np.empty((2, min(step, lanes) * pairs), np.uint64)  # two planes: begin words, end words
    for l0 in range(0, lanes, step):
        l1 = min(lanes, l0 + step)
        o0, o1 = int(offsets[l0]), int(offsets[l1])
        if o0 == o1:
            continue
        h = half[l0:l1]
        chunk = rec[l0:l1, : 2 * pairs].reshape(l1 - l0, pairs, 2)
        planes = scratch[:, : o1 - o0]
        if np.all(h == pairs):  # full lanes: 2-D, per lane
            shape: tuple[int, ...] = (l1 - l0, pairs)
            np.copyto(planes.reshape((2, *shape)), chunk.transpose(2, 0, 1))
            base, lane_word = lane_base[l0:l1, None], start_word[l0:l1, None]
        else:
            shape = (o1 - o0,)
            np.copyto(planes, chunk[np.arange(pairs) < h[:, None]].T)
            base, lane_word = np.repeat(lane_base[l0:l1], h), np.repeat(start_word[l0:l1], h)
        wb, we = (plane.reshape(shape) for plane in planes)
        s_out: np.ndarray
        e_out: np.ndarray
        d_out: np.ndarray
        s_out, e_out, d_out = (col[o0:o1].reshape(shape) for col in (start_ns, end_ns, dur))
        np.subtract(we, wb, out=we)  # low half: end tag - begin tag (1 when sound); high: the duration mod 2^32
        np.subtract(wb, lane_word, out=wb)  # low half: the begin tag; high: ns since the lane started mod 2^32
        low_and, low_or = np.bitwise_and.reduce(planes, axis=1), np.bitwise_or.reduce(planes, axis=1)
        if not (
            low_and[0] & check_mask == low_or[0] & check_mask == check_value  # every begin tag's check and kind
            and low_and[1] & M32 == low_or[1] & M32 == one  # every end tag is its begin tag + 1
        ):
            return None
        np.right_shift(we, U32, out=d_out.view(np.uint64))
        # The check leaves the tag's bits 14-15 zero: its low 16 bits are the stage shifted by STAGE_SHIFT (copied
        # out, then shifted in place: faster than one shift with a strided input).
        stage16 = stage[o0:o1].reshape(shape).view(np.uint16)
        np.copyto(stage16, wb.view(np.uint16)[..., 0::4])
        np.right_shift(stage16, np.uint16(f.STAGE_SHIFT), out=stage16)
        np.right_shift(wb, U32, out=wb)
        np.copyto(s_out, wb.view(np.int64))
        s_out *= clock.rate  # (x * 1.0 is x: no branch for an unscaled clock)
        s_out += base
        np.copyto(e_out, d_out)
        e_out *= clock.rate
        e_out += s_out
    return {
        "block": np.repeat((lane_ids // groups).astype(np.int32), half),
        "group": np.repeat((lane_ids % groups).astype(np.int32), half),
        "stage": stage,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "duration_ns": dur,
    }


# -- the general path ----------------------------------------------------------------------------------------------
def _flat_records(
    findings: Findings, lanes: _Lanes, kept: np.ndarray, simple: np.ndarray, groups: int, cap: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every kept record as flat columns (lane, kind, stage, full device time), lane-major; ``simple`` lanes
    need no unwrapping beyond their start stamp."""
    f = FORMAT
    rec, start, end, finalized = lanes.rec, lanes.start, lanes.end, lanes.finalized
    words = rec.reshape(-1) if np.all(kept == cap) else rec[np.arange(cap) < kept[:, None]]
    halves = words.view(np.uint32)  # little-endian: tag, then the stamp's low word
    tag = halves[0::2]
    lane = np.repeat(np.arange(len(rec), dtype=np.int32), kept)
    wrong = (tag & np.uint32(f.CHECK_MASK)) != np.uint32(f.CHECK_VALUE)
    lo_start = np.repeat((start & 0xFFFFFFFF).astype(np.uint32), kept)
    s = np.repeat(start, kept)
    if wrong.any():
        findings.add(
            f"{int(wrong.sum())} words are not records (no record mark) in lanes "
            f"{where(np.unique(lane[wrong]), groups)}: corrupt lanes, left out"
        )
        keep = ~np.isin(lane, np.unique(lane[wrong]))
        halves, lane, lo_start, s = halves.reshape(-1, 2)[keep].reshape(-1), lane[keep], lo_start[keep], s[keep]
        tag = halves[0::2]
    lo = halves[1::2]
    t = (lo - lo_start).astype(np.int64)  # mod 2^32 in uint32: exact for lanes shorter than 4.29 s
    t += s
    lo = lo.astype(np.int64)
    long_lanes = np.flatnonzero(~simple & (kept > 0))
    if long_lanes.size:  # unwrap record by record: consecutive records of a lane less than 4.29 s apart
        sel = np.isin(lane, long_lanes)
        l_sel = lane[sel]
        first = run_starts(l_sel)
        t[sel] = start[l_sel] + unwrap(lo[sel], first, start[l_sel[first]] & 0xFFFFFFFF)
        last = np.zeros(len(rec), np.int64)
        last[l_sel] = t[sel]  # the last record of each lane wins
        gap = finalized[long_lanes] & (
            (last[long_lanes] > end[long_lanes]) | (end[long_lanes] - last[long_lanes] >= WRAP_NS)
        )
        if gap.any():
            findings.add(
                f"lanes with more than 4.29 s between two records ({where(long_lanes[gap], groups)}): "
                "their %globaltimer low words are ambiguous; record at least every 4 s"
            )
    kind = (tag & np.uint32(f.KIND_MASK)).astype(np.int8)
    stage = ((tag >> np.uint32(f.STAGE_SHIFT)) & np.uint32(f.STAGE_MASK)).astype(np.int16)
    return lane, kind, stage, t
