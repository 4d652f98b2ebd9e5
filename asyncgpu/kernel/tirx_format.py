"""Decoding the record format of TVM TIRx, flashinfer and warpscope (`decode_tirx`), so their traces can be read
too: numpy only, no Python loop per record (nor per lane). Begins and ends are matched, and the records built, by
the steps `asyncgpu.kernel.decoding` shares with asyncgpu's own format.

Threads: any; pure functions of their inputs.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from asyncgpu._backends.kernels import FORMAT
from asyncgpu._base.errors import KernelRecordsError
from asyncgpu.kernel.decoding import (
    M32,
    U32,
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

__all__ = ["decode_tirx"]

# A record's tag: (block_group << TIRX_GROUP_SHIFT) | (event << TIRX_EVENT_SHIFT) | type.
TIRX_TYPE_BITS, TIRX_EVENT_SHIFT, TIRX_EVENT_BITS, TIRX_GROUP_SHIFT = 2, 2, 10, 12
TIRX_BEGIN, TIRX_END, TIRX_INSTANT, TIRX_FINALIZE = 0, 1, 2, 3  # its types


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
    w = as_words(words)
    findings = Findings()
    n_blocks, n_groups = _read_header(w)
    lanes = n_blocks * n_groups
    body, keep_n = _read_lanes(findings, w, lanes, n_groups)
    rec = body[np.arange(body.shape[1]) < keep_n[:, None]]
    lane = np.repeat(np.arange(lanes, dtype=np.int32), keep_n)
    kind, stage, fin = _read_tags(findings, rec, lane, sm_id, n_groups)
    _check_finalize(findings, lane, fin, keep_n, n_groups)
    t = _device_times(rec, lane, reference_ns, to_host)
    ok = ~fin
    launch = Launch(name, device, tuple(stages), "tirx", max(n_groups, 1), n_blocks, lanes, int((keep_n > 0).sum()))
    return assemble(
        launch,
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


def _read_header(w: np.ndarray) -> tuple[int, int]:
    """``(blocks, groups)`` from word 0, or `KernelRecordsError` for a buffer without records or too short."""
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
    return n_blocks, n_groups


def _read_lanes(findings: Findings, w: np.ndarray, lanes: int, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The slots as ``(lanes, slots)`` words, and the records to keep per lane (its used slots; none for a lane
    with empty slots among its records)."""
    slots = (w.size - 1) // lanes
    body = w[1 : 1 + slots * lanes].reshape(slots, lanes).T  # (lanes, slots)
    used = body != 0
    count = used.sum(axis=1)
    prefix = np.arange(slots) < count[:, None]
    holes = np.flatnonzero((used != prefix).any(axis=1))
    bad = np.zeros(lanes, bool)
    if holes.size:
        findings.add(f"corrupt TIRx lanes (empty slots among their records): {where(holes, n_groups)}, left out")
        bad[holes] = True
    full = np.flatnonzero(count == slots)
    if full.size and slots:
        findings.add(
            f"{full.size} lanes filled all {slots} of their slots ({where(full, n_groups)}): the format "
            "keeps no count, so records may have been dropped: give the buffer more slots",
            overflow=True,
        )
    return body, np.where(bad, 0, count)


def _read_tags(
    findings: Findings, rec: np.ndarray, lane: np.ndarray, sm_id: bool, n_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each record's kind (asyncgpu's `FORMAT` kinds), stage, and whether it is a finalize record; records in
    another lane's slots are reported."""
    tag = (rec & M32).astype(np.int64)
    tirx_type = (tag & ((1 << TIRX_TYPE_BITS) - 1)).astype(np.int8)
    stage = ((tag >> TIRX_EVENT_SHIFT) & ((1 << TIRX_EVENT_BITS) - 1)).astype(np.int16)
    bg = tag >> TIRX_GROUP_SHIFT
    bg = bg & 0xFFF if sm_id else bg & 0xFFFFF
    expect = lane & 0xFFF if sm_id else lane
    wrong = bg != expect
    if wrong.any():
        findings.add(
            f"{int(wrong.sum())} TIRx records sit in the slots of another (block, group) (lanes "
            f"{where(np.unique(lane[wrong]), n_groups)}): a corrupt buffer, or pass sm_id=True for "
            "flashinfer's variant with the SM id in the tag's top byte"
        )
    kinds = np.zeros(1 << TIRX_TYPE_BITS, np.int8)
    kinds[[TIRX_BEGIN, TIRX_END, TIRX_INSTANT]] = (FORMAT.KIND_BEGIN, FORMAT.KIND_END, FORMAT.KIND_INSTANT)
    return kinds[tirx_type], stage, tirx_type == TIRX_FINALIZE


def _check_finalize(findings: Findings, lane: np.ndarray, fin: np.ndarray, keep_n: np.ndarray, n_groups: int) -> None:
    """When the kernel writes finalize records: the lanes with records and without one returned early."""
    has_fin = np.zeros(len(keep_n), bool)
    has_fin[lane[fin]] = True
    if has_fin.any():
        missing = np.flatnonzero((keep_n > 0) & ~has_fin)
        if missing.size:
            findings.add(
                f"{missing.size} TIRx lanes have no finalize record ({where(missing, n_groups)}): the "
                "kernel returned early on those leaders"
            )


def _device_times(rec: np.ndarray, lane: np.ndarray, reference_ns: int | None, to_host: ToHost | None) -> np.ndarray:
    """Each record's time (int64 ns): unwrapped within its lane; each lane's first stamp is resolved against
    ``reference_ns`` (device time), else made relative to the first lane's (lanes within ±2.1 s of it)."""
    lo = (rec >> U32).astype(np.int64)
    first = run_starts(lane)
    within = unwrap(lo, first)  # ns since the lane's first record
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
    return full_first[np.cumsum(first) - 1] + within if len(lane) else lo
