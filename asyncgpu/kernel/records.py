"""What decoding in-kernel records returns: `KernelRecords` (the regions and instants of one launch, columnar)
and its per-stage `StageSummary`.

The decoders live beside it: `asyncgpu.kernel.asyncgpu_format` (asyncgpu's own format) and
`asyncgpu.kernel.tirx_format` (TVM TIRx, flashinfer, warpscope); `KernelRecords.decode` and
`KernelRecords.decode_tirx` import them when called, as they build `KernelRecords`.

Threads: any; a `KernelRecords` is not changed after it is made.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["KernelRecords", "StageSummary"]

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
        from asyncgpu.kernel.asyncgpu_format import decode

        return decode(words, stages, strict=strict, to_host=to_host, time_base=time_base, name=name, device=device)

    @classmethod
    def decode_tirx(cls, words: Any, stages: Sequence[str] = (), **kw: Any) -> KernelRecords:
        """Decode a TVM TIRx / flashinfer / warpscope buffer (see `decode_tirx`)."""
        from asyncgpu.kernel.tirx_format import decode_tirx

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
