"""Decoding in-kernel records: numpy only, no Python loop per record (nor per lane).

Two formats: asyncgpu's own (``kernels/asyncgpu_profile_format.h``, read through `asyncgpu._backends.kernels`) and the
one TVM TIRx, flashinfer and warpscope write (`decode_tirx`), so their traces can be read too.

Wrap: a record keeps the low 32 bits of ``%globaltimer`` (4 bytes, not 8: a record is one 8-byte store), and
its lane keeps the full 64-bit stamps of its start and finalize. A record's time is ``start + ((lo - start_lo)
mod 2^32)``, exact whenever the lane lasted less than 4.29 s (its start and end stamps say so); a longer lane
is unwrapped record by record (exact unless two records of one lane lie more than 4.29 s apart, which the end
stamp then reveals as corruption). A region's duration is ``(end_lo - begin_lo) mod 2^32``, wrap or not.

Matching: a begin pairs with the next end of the same stage in the same lane at the same nesting depth.
The fast path (every lane a sequence of begin/end pairs, e.g. a region per stage at a time) works on pairs of
words at once, in cache-sized chunks; anything else (instants, nested or overlapping regions) goes through
sorts (5-10x slower).

Threads: any; pure functions of their inputs.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from asyncgpu._backends.kernels import FORMAT
from asyncgpu._base.errors import KernelRecordsError, KernelRecordsOverflowError

__all__ = ["KernelRecords", "StageSummary", "check_stages", "decode", "decode_tirx"]

_M32 = np.uint64(0xFFFFFFFF)
_U32 = np.uint64(32)
_WRAP_NS = 1 << 32
_EXAMPLES = 3  # lanes named per problem
_CHUNK_PAIRS = 1 << 16  # pairs the fast path decodes per step (its scratch planes: 1 MiB)
ToHost = Callable[[np.ndarray], np.ndarray]  # int64 device ns -> float64 host ns (vectorised)


class StageSummary:
    """Per stage: regions (count), total and mean duration, and the p50 / p99 across blocks of each block's
    total time in that stage (ns). Columns are numpy arrays in stage-id order; stages without regions are
    left out."""

    def __init__(
        self,
        names: tuple[str, ...],
        ids: np.ndarray,
        count: np.ndarray,
        total_ns: np.ndarray,
        blocks: np.ndarray,
        p50_ns: np.ndarray,
        p99_ns: np.ndarray,
        note: str,
    ) -> None:
        self.names, self.ids, self.count, self.total_ns = names, ids, count, total_ns
        self.mean_ns = total_ns / np.maximum(count, 1)
        self.blocks, self.p50_ns, self.p99_ns, self.note = blocks, p50_ns, p99_ns, note

    def __len__(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {
            n: {
                "count": int(c),
                "total_ns": float(t),
                "mean_ns": float(m),
                "blocks": int(b),
                "p50_block_ns": float(p5),
                "p99_block_ns": float(p9),
            }
            for n, c, t, m, b, p5, p9 in zip(
                self.names, self.count, self.total_ns, self.mean_ns, self.blocks, self.p50_ns, self.p99_ns
            )
        }

    def __str__(self) -> str:
        width = max([5, *map(len, self.names)])
        lines = [
            f"{'stage':<{width}} {'count':>9} {'total µs':>11} {'mean µs':>10} {'blocks':>7} "
            f"{'p50/block µs':>13} {'p99/block µs':>13}"
        ]
        for n, c, t, m, b, p5, p9 in zip(
            self.names, self.count, self.total_ns, self.mean_ns, self.blocks, self.p50_ns, self.p99_ns
        ):
            lines.append(
                f"{n:<{width}} {c:>9} {t / 1e3:>11.3f} {m / 1e3:>10.3f} {b:>7} {p5 / 1e3:>13.3f} {p9 / 1e3:>13.3f}"
            )
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


class KernelRecords:
    """The decoded records of one launch, columnar.

    Regions (one row per matched begin/end; rows by lane, then by begin): ``block``, ``group`` (int32),
    ``stage`` (int16, an index into ``stages``), ``start_ns``, ``end_ns`` (float64), ``duration_ns`` (int64,
    exact: a difference of two device stamps). Instants: ``instant_block``, ``instant_group``,
    ``instant_stage``, ``instant_ns``. Per lane (``lane = block * groups + group``): ``dropped`` (records
    a full lane could not keep). ``aligned``: times are host time (``time.perf_counter_ns()``), else ns from
    the kernel's first stamp; ``time_base`` says which and why. ``problems``: what a non-strict decode found.
    """

    def __init__(
        self,
        *,
        name: str,
        device: str | None,
        stages: tuple[str, ...],
        fmt: str,
        groups: int,
        blocks: int,
        lanes: int,
        lanes_started: int,
        block: np.ndarray,
        group: np.ndarray,
        stage: np.ndarray,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
        duration_ns: np.ndarray,
        instant_block: np.ndarray,
        instant_group: np.ndarray,
        instant_stage: np.ndarray,
        instant_ns: np.ndarray,
        dropped: np.ndarray,
        aligned: bool,
        time_base: str,
        problems: tuple[str, ...],
    ) -> None:
        self.name, self.device, self.format = name, device, fmt
        self.groups, self.blocks, self.lanes, self.lanes_started = groups, blocks, lanes, lanes_started
        self.block, self.group, self.stage = block, group, stage
        self.start_ns, self.end_ns, self.duration_ns = start_ns, end_ns, duration_ns
        self.instant_block, self.instant_group = instant_block, instant_group
        self.instant_stage, self.instant_ns = instant_stage, instant_ns
        self.dropped, self.aligned, self.time_base, self.problems = dropped, aligned, time_base, problems
        top = int(max(stage.max(initial=-1), instant_stage.max(initial=-1))) + 1
        self.stages = tuple(stages) + tuple(f"stage{i}" for i in range(len(stages), top))

    @property
    def lane(self) -> np.ndarray:
        """Each region's lane, ``block * groups + group`` (int64)."""
        return self.block.astype(np.int64) * self.groups + self.group

    # -- decoding -------------------------------------------------------------------------------------------
    @classmethod
    def decode(
        cls,
        words: Any,
        stages: Sequence[str] = (),
        *,
        strict: bool = True,
        to_host: ToHost | None = None,
        time_base: str | None = None,
        name: str = "kernel",
        device: str | None = None,
    ) -> KernelRecords:
        """Decode an asyncgpu record buffer (see `decode`)."""
        return decode(words, stages, strict=strict, to_host=to_host, time_base=time_base, name=name, device=device)

    @classmethod
    def decode_tirx(cls, words: Any, stages: Sequence[str] = (), **kw: Any) -> KernelRecords:
        """Decode a TVM TIRx / flashinfer / warpscope buffer (see `decode_tirx`)."""
        return decode_tirx(words, stages, **kw)

    # -- results --------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.stage)

    @property
    def dropped_records(self) -> int:
        """Records that full lanes could not keep (0 unless decoded with ``strict=False``)."""
        return int(self.dropped.sum())

    def summary(self) -> StageSummary:
        """Per stage: count, total, mean, and p50/p99 across blocks of the per-block total (see `StageSummary`)."""
        n_stages = len(self.stages)
        blocks = int(self.block.max(initial=-1)) + 1
        key = self.stage.astype(np.int64) * max(blocks, 1) + self.block
        per_block = np.bincount(key, weights=self.duration_ns, minlength=n_stages * max(blocks, 1))
        present = np.bincount(key, minlength=n_stages * max(blocks, 1)).reshape(n_stages, max(blocks, 1)) > 0
        per_block = per_block.reshape(n_stages, max(blocks, 1))
        count = np.bincount(self.stage, minlength=n_stages)
        total = np.bincount(self.stage, weights=self.duration_ns, minlength=n_stages)
        ids = np.flatnonzero(count)
        p50 = np.array([np.percentile(per_block[s][present[s]], 50) for s in ids]) if ids.size else np.zeros(0)
        p99 = np.array([np.percentile(per_block[s][present[s]], 99) for s in ids]) if ids.size else np.zeros(0)
        note = f"{self.dropped_records} records dropped by full lanes" if self.dropped_records else ""
        return StageSummary(
            tuple(self.stages[s] for s in ids), ids, count[ids], total[ids], present[ids].sum(axis=1), p50, p99, note
        )

    def __str__(self) -> str:
        head = (
            f"{self.name}{' on ' + self.device if self.device else ''}: {len(self)} regions, "
            f"{len(self.instant_ns)} instants from {self.lanes_started} lanes ({self.groups} per block); "
            f"{self.time_base}"
        )
        body = [head, str(self.summary())]
        body += [f"problem: {p}" for p in self.problems]
        return "\n".join(body)

    def __repr__(self) -> str:
        return (
            f"<asyncgpu.KernelRecords {self.name!r}{' ' + self.device if self.device else ''}: {len(self)} "
            f"regions, {len(self.instant_ns)} instants, {self.lanes_started} lanes"
            f"{'' if self.aligned else ', relative time'}{', problems' if self.problems else ''}>"
        )


# -- shared steps -----------------------------------------------------------------------------------------------
class _Findings:
    """Problems found while decoding: raised together at the end when strict, else kept on the result."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.overflow = False

    def add(self, message: str, overflow: bool = False) -> None:
        self.items.append(message)
        self.overflow |= overflow

    def settle(self, strict: bool) -> tuple[str, ...]:
        if strict and self.items:
            cls = KernelRecordsOverflowError if self.overflow else KernelRecordsError
            more = f" (and {len(self.items) - 1} more: see .problems)" if len(self.items) > 1 else ""
            raise cls(self.items[0] + more + "; decode with strict=False to keep the sound records", tuple(self.items))
        return tuple(self.items)


def check_stages(stages: Any, limit: int | None = None) -> tuple[str, ...]:
    """``stages`` as a tuple of names: a sequence (not one string) of distinct strings, one per stage id, at most
    ``limit`` (default: asyncgpu's format, `FORMAT.MAX_STAGES`)."""
    limit = FORMAT.MAX_STAGES if limit is None else limit
    try:
        if isinstance(stages, (str, bytes)):
            raise TypeError
        names = tuple(stages)
    except TypeError:
        raise TypeError(
            f"stages is a sequence of names, one per stage id (stages=('load', 'compute')), not {stages!r}"
        ) from None
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise TypeError(f"stage names are strings: stage {i} is {n!r}")
        if n in names[:i]:
            raise ValueError(
                f"stage names must differ (records are summed per name): {n!r} is stage {names.index(n)} and stage {i}"
            )
    if len(names) > limit:
        raise ValueError(f"at most {limit} stages (ids 0 .. {limit - 1}), not {len(names)}")
    return names


def _words(words: Any) -> np.ndarray:
    a = np.asarray(words)
    if a.size == 0:
        raise KernelRecordsError(
            "the record buffer is empty (0 words): pass the whole buffer the profiler armed "
            "(KernelProfiler.nbytes bytes), and arm it with capacity >= 1"
        )
    if a.dtype.kind not in "iu":
        of = f" of {a.dtype}" if a.dtype.kind != "O" else ""
        raise TypeError(
            "a record buffer is an array of integer words (uint64, as copied from the device: "
            f"DeviceArray.to_numpy, or the pinned copy KernelProfiler.collect decodes), not {type(words).__name__}{of}"
        )
    if not a.flags.c_contiguous or a.nbytes % 8:
        raise KernelRecordsError(
            f"records are whole uint64 words in a contiguous array, not {a.nbytes} bytes of "
            f"{a.dtype}: pass the buffer as copied from the device"
        )
    return a.reshape(-1).view(np.uint64)


def _where(lanes: np.ndarray, groups: int) -> str:
    shown = ", ".join(f"block {int(lane) // groups} group {int(lane) % groups}" for lane in lanes[:_EXAMPLES])
    return shown + (f" and {len(lanes) - _EXAMPLES} more" if len(lanes) > _EXAMPLES else "")


class _Clock:
    """How device stamps become float64 ns: ``h0 + (t - g0) * rate``; host time when ``aligned``."""

    def __init__(self, to_host: ToHost | None, time_base: str | None, origin: int) -> None:
        self.g0 = origin
        if to_host is None:
            self.h0, self.rate, self.aligned = 0.0, 1.0, False
            self.time_base = time_base or "relative: ns from the kernel's first stamp (no clock calibration)"
            return
        probe = np.asarray(to_host(np.array([origin, origin + 1_000_000_000], np.int64)), np.float64)
        self.h0, self.rate, self.aligned = float(probe[0]), float(probe[1] - probe[0]) / 1e9, True
        self.time_base = time_base or "host time"

    def __call__(self, t: np.ndarray) -> np.ndarray:
        out = (t - self.g0).astype(np.float64)
        if self.rate != 1.0:
            out *= self.rate
        out += self.h0
        return out


def _pair(
    lane: np.ndarray,
    kind: np.ndarray,
    stage: np.ndarray,
    t: np.ndarray,
    findings: _Findings,
    groups: int,
    stages: Sequence[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Match begins with ends in flat per-record columns (lane-major, each lane in program order). Returns
    the begin and end indices of each region (sorted by begin) and the indices of the instants."""
    f = FORMAT
    inst = np.flatnonzero(kind == f.KIND_INSTANT)
    n = len(kind)
    if inst.size == 0 and n % 2 == 0:  # every lane a sequence of begin/end pairs?
        b, e = np.arange(0, n, 2), np.arange(1, n, 2)
        if (
            np.all(kind[0::2] == f.KIND_BEGIN)
            and np.all(kind[1::2] == f.KIND_END)
            and np.array_equal(stage[0::2], stage[1::2])
            and np.array_equal(lane[0::2], lane[1::2])
        ):
            return b, e, inst
    idx = np.flatnonzero(kind != f.KIND_INSTANT)
    # No stage nested in itself: per stage (a stable radix sort keeps lanes and program order), begins and ends
    # alternate within each lane.
    by_stage = idx[np.argsort(stage[idx].astype(np.uint16), kind="stable")]
    if by_stage.size % 2 == 0:
        b, e = by_stage[0::2], by_stage[1::2]
        if (
            np.all(kind[b] == f.KIND_BEGIN)
            and np.all(kind[e] == f.KIND_END)
            and np.array_equal(stage[b], stage[e])
            and np.array_equal(lane[b], lane[e])
        ):
            o = np.argsort(b, kind="stable")
            return b[o], e[o], inst
    g = lane[idx].astype(np.int64) * f.MAX_STAGES + stage[idx]
    order = np.lexsort((idx, g))
    gs, ks = g[order], kind[idx][order]
    v = np.where(ks == f.KIND_BEGIN, 1, -1)
    cs = np.cumsum(v)
    first = np.ones(len(gs), bool)
    first[1:] = gs[1:] != gs[:-1]
    group_of = np.cumsum(first) - 1
    depth = cs - (cs - v)[first][group_of]  # depth after each record, from 0 at the start of its (lane, stage)
    level = np.where(ks == f.KIND_BEGIN, depth, depth + 1)
    order2 = np.lexsort((np.arange(len(gs)), level, gs))
    k2, g2, l2 = ks[order2], gs[order2], level[order2]
    hit = (k2[:-1] == f.KIND_BEGIN) & (k2[1:] == f.KIND_END) & (g2[:-1] == g2[1:]) & (l2[:-1] == l2[1:])
    b = idx[order[order2[:-1][hit]]]
    e = idx[order[order2[1:][hit]]]
    unmatched = np.ones(len(gs), bool)
    unmatched[order2[:-1][hit]] = False
    unmatched[order2[1:][hit]] = False
    if unmatched.any():
        um = idx[order[unmatched]]
        kinds = kind[um]
        for k, what in ((f.KIND_BEGIN, "began but never ended"), (f.KIND_END, "ended but never began")):
            sel = um[kinds == k]
            if sel.size:
                names = sorted({stages[s] if s < len(stages) else f"stage{s}" for s in stage[sel].tolist()})
                findings.add(
                    f"{sel.size} regions {what} (stages {', '.join(names)}; "
                    f"{_where(np.unique(lane[sel]), groups)}): pair every begin(stage) with an end(stage) "
                    "in the same (block, group), or use region()"
                )
    o = np.argsort(b, kind="stable")
    return b[o], e[o], inst


def _build(
    name: str,
    device: str | None,
    stages: Sequence[str],
    fmt: str,
    groups: int,
    blocks: int,
    lanes: int,
    started: int,
    lane: np.ndarray,
    kind: np.ndarray,
    stage: np.ndarray,
    t: np.ndarray,
    dropped: np.ndarray,
    findings: _Findings,
    strict: bool,
    to_host: ToHost | None,
    time_base: str | None,
    origin: int | None = None,
) -> KernelRecords:
    """Records from flat per-record columns (the general path of both formats); relative times count from
    ``origin`` (default: the first record)."""
    b, e, inst = _pair(lane, kind, stage, t, findings, groups, stages)
    problems = findings.settle(strict)
    clock = _Clock(to_host, time_base, origin if origin is not None else (int(t.min()) if t.size else 0))
    lb, li = lane[b], lane[inst]
    return KernelRecords(
        name=name,
        device=device,
        stages=tuple(stages),
        fmt=fmt,
        groups=groups,
        blocks=blocks,
        lanes=lanes,
        lanes_started=started,
        block=(lb // groups).astype(np.int32),
        group=(lb % groups).astype(np.int32),
        stage=stage[b].astype(np.int16),
        start_ns=clock(t[b]),
        end_ns=clock(t[e]),
        duration_ns=(t[e] - t[b]).astype(np.int64),
        instant_block=(li // groups).astype(np.int32),
        instant_group=(li % groups).astype(np.int32),
        instant_stage=stage[inst].astype(np.int16),
        instant_ns=clock(t[inst]),
        dropped=dropped,
        aligned=clock.aligned,
        time_base=clock.time_base,
        problems=problems,
    )


# -- asyncgpu's format --------------------------------------------------------------------------------------------
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
    f = FORMAT
    stages = check_stages(stages)
    w = _words(words)
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
    findings = _Findings()
    blocks, no_room, bad_group = h[f.HDR_BLOCKS], h[f.HDR_NO_ROOM], h[f.HDR_BAD_GROUP]
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
    lane_words = w[f.HEADER_WORDS : need].reshape(lanes, f.LANE_WORDS + cap)
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
    bad = np.zeros(lanes, bool)  # lanes left out of the decode
    _check_lanes(findings, groups, cap, started, finalized, fin, start, end, in_use, kept, dropped, bad)
    n_started = int(started.sum())
    kept = np.where(bad, 0, kept)
    span = end - start
    simple = np.where(kept > 0, finalized & (span >= 0) & (span < _WRAP_NS), True)
    origin: int | None  # the earliest start of a lane with records kept
    if np.all(simple) and np.all(kept % 2 == 0):
        origin = int(start[kept > 0].min()) if np.any(kept > 0) else 0
        clock = _Clock(to_host, time_base, origin)
        fast = _decode_pairs(rec, start, kept, cap, groups, clock)
        if fast is not None:
            problems = findings.settle(strict)
            empty = np.zeros(0, np.int32)
            return KernelRecords(
                name=name,
                device=device,
                stages=tuple(stages),
                fmt="asyncgpu",
                groups=groups,
                blocks=blocks,
                lanes=lanes,
                lanes_started=n_started,
                **fast,
                instant_block=empty,
                instant_group=empty,
                instant_stage=empty.astype(np.int16),
                instant_ns=np.zeros(0),
                dropped=dropped,
                aligned=clock.aligned,
                time_base=clock.time_base,
                problems=problems,
            )
    lane, kind, stage, t = _flat_records(findings, rec, start, end, kept, finalized, simple, groups, cap)
    origin = int(start[kept > 0].min()) if np.any(kept > 0) else None
    return _build(
        name,
        device,
        stages,
        "asyncgpu",
        groups,
        blocks,
        lanes,
        n_started,
        lane,
        kind,
        stage,
        t,
        dropped,
        findings,
        strict,
        to_host,
        time_base,
        origin,
    )


def _check_lanes(
    findings: _Findings,
    groups: int,
    cap: int,
    started: np.ndarray,
    finalized: np.ndarray,
    fin: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    in_use: np.ndarray,
    kept: np.ndarray,
    dropped: np.ndarray,
    bad: np.ndarray,
) -> None:
    """Per-lane consistency (vectorised); marks lanes that cannot be trusted in ``bad``."""
    f = FORMAT
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
                f"corrupt lanes ({what}): {_where(lanes_at(mask), groups)}: the buffer was overwritten "
                "(out-of-bounds writes in the kernel?) or is not an asyncgpu record buffer"
            )
            bad |= mask
    reused = finalized & (((fin >> f.FIN_FLAGS_SHIFT) & f.FLAG_REUSED) != 0)
    stale = finalized & ~reused & (in_use > kept)
    if reused.any() or stale.any():
        findings.add(
            f"the buffer was reused without zeroing ({_where(lanes_at(reused | stale), groups)} hold "
            "records of an earlier launch): arm() the profiler before every launch"
        )
        bad |= stale
    holes = finalized & ~reused & (in_use < kept)
    if holes.any():
        findings.add(f"corrupt lanes (empty words among their records): {_where(lanes_at(holes), groups)}")
        bad |= holes
    never = started & ~finalized
    if never.any():
        findings.add(
            f"{int(never.sum())} lanes never called finalize ({_where(lanes_at(never), groups)}): call "
            "prof.finalize() once at the end of the kernel on every leader, on every path that returns "
            "(their records are kept, their end is unknown)"
        )
    if dropped.any():
        worst = int((kept + dropped).max())
        findings.add(
            f"{int(dropped.sum())} records dropped by {int((dropped > 0).sum())} full lanes "
            f"({_where(lanes_at(dropped > 0), groups)}): capacity is {cap} records per lane, the fullest "
            f"lane wanted {worst}: KernelProfiler(..., capacity={worst})",
            overflow=True,
        )
    backwards = finalized & started & (end < start)
    if backwards.any():
        findings.add(f"corrupt lanes (finalized before they started): {_where(lanes_at(backwards), groups)}")
        bad |= backwards


def _decode_pairs(
    rec: np.ndarray, start: np.ndarray, kept: np.ndarray, cap: int, groups: int, clock: _Clock
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
    start_word = (start & 0xFFFFFFFF).astype(np.uint64) << _U32  # each lane's start, as a record's high half
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
            and low_and[1] & _M32 == low_or[1] & _M32 == one  # every end tag is its begin tag + 1
        ):
            return None
        np.right_shift(we, _U32, out=d_out.view(np.uint64))
        # The check leaves the tag's bits 14-15 zero: its low 16 bits are the stage shifted by STAGE_SHIFT (copied
        # out, then shifted in place: faster than one shift with a strided input).
        stage16 = stage[o0:o1].reshape(shape).view(np.uint16)
        np.copyto(stage16, wb.view(np.uint16)[..., 0::4])
        np.right_shift(stage16, np.uint16(f.STAGE_SHIFT), out=stage16)
        np.right_shift(wb, _U32, out=wb)
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


def _flat_records(
    findings: _Findings,
    rec: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    kept: np.ndarray,
    finalized: np.ndarray,
    simple: np.ndarray,
    groups: int,
    cap: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every kept record as flat columns (lane, kind, stage, full device time), lane-major."""
    f = FORMAT
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
            f"{_where(np.unique(lane[wrong]), groups)}: corrupt lanes, left out"
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
        l_sel, lo_sel = lane[sel], lo[sel]
        prev = np.empty_like(lo_sel)
        prev[1:] = lo_sel[:-1]
        first = np.ones(len(l_sel), bool)
        first[1:] = l_sel[1:] != l_sel[:-1]
        prev[first] = start[l_sel[first]] & 0xFFFFFFFF
        step = (lo_sel - prev) & 0xFFFFFFFF
        cs = np.cumsum(step)
        base = (cs - step)[first][np.cumsum(first) - 1]
        t[sel] = start[l_sel] + cs - base
        last = np.zeros(len(rec), np.int64)
        last[l_sel] = t[sel]  # the last record of each lane wins
        gap = finalized[long_lanes] & (
            (last[long_lanes] > end[long_lanes]) | (end[long_lanes] - last[long_lanes] >= _WRAP_NS)
        )
        if gap.any():
            findings.add(
                f"lanes with more than 4.29 s between two records ({_where(long_lanes[gap], groups)}): "
                "their %globaltimer low words are ambiguous; record at least every 4 s"
            )
    kind = (tag & np.uint32(f.KIND_MASK)).astype(np.int8)
    stage = ((tag >> np.uint32(f.STAGE_SHIFT)) & np.uint32(f.STAGE_MASK)).astype(np.int16)
    return lane, kind, stage, t


# -- TVM TIRx / flashinfer / warpscope -------------------------------------------------------------------------------
TIRX_TYPE_BITS, TIRX_EVENT_SHIFT, TIRX_EVENT_BITS, TIRX_GROUP_SHIFT = 2, 2, 10, 12
TIRX_BEGIN, TIRX_END, TIRX_INSTANT, TIRX_FINALIZE = 0, 1, 2, 3


def decode_tirx(
    words: Any,
    stages: Sequence[str] = (),
    *,
    strict: bool = True,
    sm_id: bool = False,
    reference_ns: int | None = None,
    to_host: ToHost | None = None,
    time_base: str | None = None,
    name: str = "kernel",
    device: str | None = None,
) -> KernelRecords:
    """Decode a buffer in the format of TVM TIRx, flashinfer and warpscope: word 0 is ``(num_groups << 32) |
    num_blocks``; record ``k`` of lane ``block * num_groups + group`` is word ``1 + lane + k * num_blocks *
    num_groups``, ``(globaltimer_lo32 << 32) | tag32`` with ``tag32 = (block_group << 12) | (event << 2) |
    type`` (0 begin, 1 end, 2 instant, 3 finalize); a zero word is an empty slot. ``sm_id=True``: the flashinfer
    variant with the SM id in tag bits 24-31 (12 bits of block_group).

    Only the low 32 bits of the clock are kept: ``reference_ns``, a full ``%globaltimer`` reading taken after the
    kernel (within 4.29 s of its records), resolves them to device time (then ``to_host`` can place them);
    without it times are relative. The format counts nothing: a lane that filled every slot may have dropped
    records (reported as a problem), and a record that is all zero cannot be told from an empty slot."""
    stages = check_stages(stages, 1 << TIRX_EVENT_BITS)
    w = _words(words)
    findings = _Findings()
    n_blocks, n_groups = int(w[0]) & 0xFFFFFFFF, int(w[0]) >> 32
    lanes = n_blocks * n_groups
    if lanes == 0 or w.size < 1 + lanes:
        if not w[1:].any():
            raise KernelRecordsError(
                "the TIRx buffer holds no records (its header word is "
                f"{int(w[0]):#x}): the kernel did not run with the profiler on"
            )
        raise KernelRecordsError(
            f"corrupt TIRx header: {n_blocks} blocks x {n_groups} groups in a buffer of {w.size} "
            "words (word 0 must be (num_groups << 32) | num_blocks)"
        )
    slots = (w.size - 1) // lanes
    body = w[1 : 1 + slots * lanes].reshape(slots, lanes).T  # (lanes, slots)
    used = body != 0
    count = used.sum(axis=1)
    prefix = np.arange(slots) < count[:, None]
    holes = np.flatnonzero((used != prefix).any(axis=1))
    bad = np.zeros(lanes, bool)
    if holes.size:
        findings.add(f"corrupt TIRx lanes (empty slots among their records): {_where(holes, n_groups)}, left out")
        bad[holes] = True
    full = np.flatnonzero(count == slots)
    if full.size and slots:
        findings.add(
            f"{full.size} lanes filled all {slots} of their slots ({_where(full, n_groups)}): the format "
            "keeps no count, so records may have been dropped: give the buffer more slots",
            overflow=True,
        )
    keep_n = np.where(bad, 0, count)
    valid = np.arange(slots) < keep_n[:, None]
    rec = body[valid]
    lane = np.repeat(np.arange(lanes, dtype=np.int32), keep_n)
    tag = (rec & _M32).astype(np.int64)
    tirx_type = (tag & ((1 << TIRX_TYPE_BITS) - 1)).astype(np.int8)
    stage = ((tag >> TIRX_EVENT_SHIFT) & ((1 << TIRX_EVENT_BITS) - 1)).astype(np.int16)
    bg = tag >> TIRX_GROUP_SHIFT
    bg = bg & 0xFFF if sm_id else bg & 0xFFFFF
    expect = lane & 0xFFF if sm_id else lane
    wrong = bg != expect
    if wrong.any():
        findings.add(
            f"{int(wrong.sum())} TIRx records sit in the slots of another (block, group) (lanes "
            f"{_where(np.unique(lane[wrong]), n_groups)}): a corrupt buffer, or pass sm_id=True for "
            "flashinfer's variant with the SM id in the tag's top byte"
        )
    fin = tirx_type == TIRX_FINALIZE
    kinds = np.zeros(1 << TIRX_TYPE_BITS, np.int8)
    kinds[[TIRX_BEGIN, TIRX_END, TIRX_INSTANT]] = (FORMAT.KIND_BEGIN, FORMAT.KIND_END, FORMAT.KIND_INSTANT)
    kind = kinds[tirx_type]
    has_fin = np.zeros(lanes, bool)
    has_fin[lane[fin]] = True
    if has_fin.any():
        missing = np.flatnonzero((keep_n > 0) & ~has_fin)
        if missing.size:
            findings.add(
                f"{missing.size} TIRx lanes have no finalize record ({_where(missing, n_groups)}): the "
                "kernel returned early on those leaders"
            )
    lo = (rec >> _U32).astype(np.int64)
    first = np.ones(len(lane), bool)
    first[1:] = lane[1:] != lane[:-1]
    prev = np.empty_like(lo)
    prev[1:] = lo[:-1]
    step = np.where(first, 0, (lo - prev) & 0xFFFFFFFF)
    cs = np.cumsum(step)
    within = cs - cs[first][np.cumsum(first) - 1]  # ns since the lane's first record
    lane_first = lo[first]
    if reference_ns is not None:  # each lane's first stamp: the latest full time with that low word before ref
        ref = int(reference_ns)
        full_first = ref - ((ref - lane_first) & 0xFFFFFFFF)
    else:
        if to_host is not None:
            raise ValueError(
                "to_host needs full device stamps: pass reference_ns (a %globaltimer reading taken "
                "after the kernel) with it"
            )
        rel = ((lane_first - lane_first[0] + (1 << 31)) & 0xFFFFFFFF) - (1 << 31) if lane_first.size else lane_first
        full_first = rel  # lanes within +-2.1 s of the first lane
    t = full_first[np.cumsum(first) - 1] + within if len(lane) else lo
    ok = ~fin
    return _build(
        name,
        device,
        stages,
        "tirx",
        max(n_groups, 1),
        n_blocks,
        lanes,
        int((keep_n > 0).sum()),
        lane[ok],
        kind[ok],
        stage[ok],
        t[ok],
        np.zeros(lanes, np.int64),
        findings,
        strict,
        to_host,
        time_base
        or (
            None
            if reference_ns is not None or to_host
            else "relative: ns from the kernel's first stamp (TIRx keeps 32-bit stamps; pass "
            "reference_ns to resolve them)"
        ),
    )
