"""The steps both record decoders share (`asyncgpu.kernel.asyncgpu_format`, `asyncgpu.kernel.tirx_format`):
checking what they are given, collecting what they find wrong, unwrapping 32-bit stamps, placing stamps on a
clock, matching begins with ends, and assembling the `KernelRecords`.

Matching: a begin pairs with the next end of the same stage in the same lane at the same nesting depth. Every
lane a sequence of begin/end pairs is recognised at once; anything else (instants, nested or overlapping
regions) goes through sorts.

Threads: any; pure functions of their inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from asyncgpu._backends.kernels import FORMAT
from asyncgpu._base.errors import KernelRecordsError, KernelRecordsOverflowError
from asyncgpu.kernel.records import KernelRecords, ToHost

__all__ = [
    "M32",
    "U32",
    "WRAP_NS",
    "Clock",
    "Findings",
    "Launch",
    "ToHost",
    "as_words",
    "assemble",
    "check_stages",
    "run_starts",
    "unwrap",
    "where",
]

M32 = np.uint64(0xFFFFFFFF)  #: the low half of a uint64 word
U32 = np.uint64(32)  #: the shift to a uint64 word's high half
WRAP_NS = 1 << 32  #: a 32-bit ``%globaltimer`` low word wraps every 2^32 ns (4.29 s)
_EXAMPLES = 3  # lanes named per problem


class Findings:
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


def as_words(words: Any) -> np.ndarray:
    """A record buffer as a flat uint64 view (no copy); `KernelRecordsError` or `TypeError` naming the fix."""
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


def where(lanes: np.ndarray, groups: int) -> str:
    """The first few of ``lanes`` as (block, group) in words, for a problem's message."""
    shown = ", ".join(f"block {int(lane) // groups} group {int(lane) % groups}" for lane in lanes[:_EXAMPLES])
    return shown + (f" and {len(lanes) - _EXAMPLES} more" if len(lanes) > _EXAMPLES else "")


class Clock:
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


# -- runs of equal keys --------------------------------------------------------------------------------------------
def run_starts(keys: np.ndarray) -> np.ndarray:
    """True where a run of equal ``keys`` begins (the records of one lane, of one (lane, stage)...)."""
    first = np.ones(len(keys), bool)
    first[1:] = keys[1:] != keys[:-1]
    return first


def _run_cumsum(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The cumulative sum of ``values`` restarting at every run start (``first``, from `run_starts`)."""
    cs = np.cumsum(values)
    return cs - (cs - values)[first][np.cumsum(first) - 1]


def unwrap(lo: np.ndarray, first: np.ndarray, base_lo: np.ndarray | None = None) -> np.ndarray:
    """ns since the start of each run of records (``first``), from their 32-bit stamps ``lo`` (int64): the
    steps between consecutive records are taken mod 2^32, so exact while they are less than 4.29 s apart. The run
    counts from ``base_lo`` (a low word per run: its lane's start stamp), or from its first record."""
    prev = np.empty_like(lo)
    prev[1:] = lo[:-1]
    if base_lo is None:
        step = np.where(first, 0, (lo - prev) & 0xFFFFFFFF)
    else:
        prev[first] = base_lo
        step = (lo - prev) & 0xFFFFFFFF
    return _run_cumsum(step, first)


# -- matching begins with ends -------------------------------------------------------------------------------------
def _pair(
    lane: np.ndarray,
    kind: np.ndarray,
    stage: np.ndarray,
    findings: Findings,
    groups: int,
    stages: Sequence[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Match begins with ends in flat per-record columns (lane-major, each lane in program order). Returns
    the begin and end indices of each region (sorted by begin) and the indices of the instants."""
    f = FORMAT
    inst = np.flatnonzero(kind == f.KIND_INSTANT)
    if inst.size == 0:
        pairs = _alternating(np.arange(len(kind)), lane, kind, stage)  # every lane a sequence of begin/end pairs?
        if pairs is not None:
            return (*pairs, inst)
    idx = np.flatnonzero(kind != f.KIND_INSTANT)
    # No stage nested in itself: per stage (a stable radix sort keeps lanes and program order), begins and ends
    # alternate within each lane.
    pairs = _alternating(idx[np.argsort(stage[idx].astype(np.uint16), kind="stable")], lane, kind, stage)
    if pairs is not None:
        b, e = pairs
        o = np.argsort(b, kind="stable")
        return b[o], e[o], inst
    b, e = _pair_by_depth(idx, lane, kind, stage, findings, groups, stages)
    o = np.argsort(b, kind="stable")
    return b[o], e[o], inst


def _alternating(
    order: np.ndarray, lane: np.ndarray, kind: np.ndarray, stage: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """``order``'s records taken two at a time: the begin and end indices when every pair is a begin and an end
    of one stage in one lane; None otherwise."""
    if order.size % 2:
        return None
    b, e = order[0::2], order[1::2]
    f = FORMAT
    if (
        np.all(kind[b] == f.KIND_BEGIN)
        and np.all(kind[e] == f.KIND_END)
        and np.array_equal(stage[b], stage[e])
        and np.array_equal(lane[b], lane[e])
    ):
        return b, e
    return None


def _pair_by_depth(
    idx: np.ndarray,
    lane: np.ndarray,
    kind: np.ndarray,
    stage: np.ndarray,
    findings: Findings,
    groups: int,
    stages: Sequence[str],
) -> tuple[np.ndarray, np.ndarray]:
    """The general match: per (lane, stage), each record's nesting depth; a begin pairs with the next end at its
    depth. Begins and ends left over are reported."""
    f = FORMAT
    g = lane[idx].astype(np.int64) * f.MAX_STAGES + stage[idx]
    order = np.lexsort((idx, g))
    gs, ks = g[order], kind[idx][order]
    v = np.where(ks == f.KIND_BEGIN, 1, -1)
    depth = _run_cumsum(v, run_starts(gs))  # depth after each record, from 0 at the start of its (lane, stage)
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
                    f"{where(np.unique(lane[sel]), groups)}): pair every begin(stage) with an end(stage) "
                    "in the same (block, group), or use region()"
                )
    return b, e


# -- the result ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """What a buffer says about the launch that wrote it, and what the caller named."""

    name: str
    device: str | None
    stages: tuple[str, ...]
    fmt: str  #: ``asyncgpu`` or ``tirx``
    groups: int
    blocks: int
    lanes: int
    lanes_started: int

    def records(
        self, clock: Clock, problems: tuple[str, ...], dropped: np.ndarray, **columns: np.ndarray
    ) -> KernelRecords:
        """The `KernelRecords` of this launch with the region and instant ``columns``."""
        return KernelRecords(
            name=self.name,
            device=self.device,
            stages=self.stages,
            fmt=self.fmt,
            groups=self.groups,
            blocks=self.blocks,
            lanes=self.lanes,
            lanes_started=self.lanes_started,
            **columns,
            dropped=dropped,
            aligned=clock.aligned,
            time_base=clock.time_base,
            problems=problems,
        )


def assemble(
    launch: Launch,
    lane: np.ndarray,
    kind: np.ndarray,
    stage: np.ndarray,
    t: np.ndarray,
    dropped: np.ndarray,
    findings: Findings,
    strict: bool,
    to_host: ToHost | None,
    time_base: str | None,
    origin: int | None = None,
) -> KernelRecords:
    """Records from flat per-record columns (the general path of both formats): match begins with ends, settle
    the findings, place the stamps; relative times count from ``origin`` (default: the first record)."""
    groups = launch.groups
    b, e, inst = _pair(lane, kind, stage, findings, groups, launch.stages)
    problems = findings.settle(strict)
    clock = Clock(to_host, time_base, origin if origin is not None else (int(t.min()) if t.size else 0))
    lb, li = lane[b], lane[inst]
    return launch.records(
        clock,
        problems,
        dropped,
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
    )
