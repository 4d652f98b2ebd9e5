"""`BenchmarkResult`: what `asyncgpu.benchmark` measured, its statistics and how it is shown (one line as CuPy's
``str``, a rich table, a JSON-ready dict)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, final

import numpy as np

__all__ = ["BenchmarkResult"]


@final
@dataclass(frozen=True, eq=False)
class BenchmarkResult:
    """What `benchmark` measured. Times in ms; rows follow `labels`: ``CPU`` then one per device.

    ``cpu_times_ms[i]``: host wall time of repeat ``i``'s calls, from the first device's call starting to the
    last one returning (with one device: the call's host time, as CuPy's ``cpu_times``).
    ``gpu_times_ms[d, i]``: device ``d``'s time for its call in repeat ``i``, from `source`: the time between
    the events around the call, less the pair's own latency (``"events"``), or the span of CUPTI's records of
    the work the call launched (``"cupti"``).
    """

    name: str
    devices: tuple[str, ...]  #: device names, one per row of `gpu_times_ms`
    cpu_times_ms: np.ndarray  #: float64 ``(n_repeat,)``
    gpu_times_ms: np.ndarray  #: float64 ``(n_devices, n_repeat)``
    n_warmup: int  #: warm-up calls per device before the timed repeats
    stop_reason: str  #: ``n_repeat``, ``max_duration``, ``max_noise``, or ``error`` (partial result)
    elapsed_s: float  #: host wall time of the timed repeats (from the first start to the last completion)
    streams: tuple[str, ...] = ()  #: the stream label used on each device
    source: str = "events"  #: where `gpu_times_ms` come from: ``"cupti"`` or ``"events"``
    source_note: str = ""  #: why ``source="auto"`` fell back to events, or which calls CUPTI did not see

    @property
    def n_repeat(self) -> int:
        """Timed repeats (complete on every device)."""
        return int(self.cpu_times_ms.shape[0])

    @property
    def labels(self) -> tuple[str, ...]:
        return ("CPU", *self.devices)

    @property
    def times_ms(self) -> np.ndarray:
        """CuPy's layout: ``(1 + n_devices, n_repeat)``, the CPU row first."""
        return np.vstack([self.cpu_times_ms[None, :], self.gpu_times_ms])

    @cached_property
    def _stats(self) -> np.ndarray:
        """``(rows, 6)``: mean, std, min, median, max, relative std per row (NaN with no repeats)."""
        t = self.times_ms
        if t.shape[1] == 0:
            return np.full((t.shape[0], 6), np.nan)
        mean = t.mean(axis=1)
        std = t.std(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            rsd = np.where(mean > 0, std / mean, np.nan)
        return np.column_stack([mean, std, t.min(axis=1), np.median(t, axis=1), t.max(axis=1), rsd])

    @property
    def mean_ms(self) -> np.ndarray:
        """Per row (`labels`): mean."""
        return self._stats[:, 0]

    @property
    def std_ms(self) -> np.ndarray:
        """Per row: standard deviation (population, as numpy's and CuPy's)."""
        return self._stats[:, 1]

    @property
    def min_ms(self) -> np.ndarray:
        return self._stats[:, 2]

    @property
    def median_ms(self) -> np.ndarray:
        return self._stats[:, 3]

    @property
    def max_ms(self) -> np.ndarray:
        return self._stats[:, 4]

    @property
    def rsd(self) -> np.ndarray:
        """Per row: relative standard deviation (std / mean), the quantity ``max_noise`` bounds."""
        return self._stats[:, 5]

    def to_dict(self, times: bool = False) -> dict:
        """The statistics per row (JSON-ready); with ``times``, every repeat's times too."""
        stats = self._stats
        rows = {
            label: {
                key: _nan_to_none(stats[r, c])
                for c, key in enumerate(("mean_ms", "std_ms", "min_ms", "median_ms", "max_ms", "rsd"))
            }
            for r, label in enumerate(self.labels)
        }
        out = {
            "name": self.name,
            "devices": list(self.devices),
            "streams": list(self.streams),
            "n_repeat": self.n_repeat,
            "n_warmup": self.n_warmup,
            "stop_reason": self.stop_reason,
            "elapsed_s": self.elapsed_s,
            "source": self.source,
            "source_note": self.source_note,
            "rows": rows,
        }
        if times:
            out["times_ms"] = self.times_ms.tolist()
        return out

    def __str__(self) -> str:
        """One line, as CuPy's: ``name : CPU: mean us +/- std (min / median / max) us   cuda:0: ...``."""
        stats = self._stats
        items = []
        for r, label in enumerate(self.labels):
            mean, std, lo, med, hi = stats[r, :5] * 1e3
            if self.n_repeat == 0:
                items.append(f"{label}: no complete repeat")
            elif self.n_repeat == 1:
                items.append(f"{label}: {mean:9.3f} us")
            else:
                items.append(
                    f"{label}: {mean:9.3f} us +/- {std:7.3f} (min: {lo:9.3f} / median: {med:9.3f} / max: {hi:9.3f}) us"
                )
        return f"{self.name:<20s}: " + "    ".join(items) + f"    (GPU times: {self.source})"

    def __repr__(self) -> str:
        return (
            f"<asyncgpu.BenchmarkResult {self.name!r} {self.n_repeat} repeats on {', '.join(self.devices)} "
            f"stopped by {self.stop_reason}>"
        )

    def __rich_console__(self, console: Any, options: Any) -> Any:
        """A header line, a table in µs (one row for the CPU, one per device) and what the rows mean."""
        from rich.table import Table
        from rich.text import Text

        stats = self._stats
        where = ", ".join(f"{d}/{s}" for d, s in zip(self.devices, self.streams)) or ", ".join(self.devices)
        yield Text(
            f"benchmark {self.name!r}: {self.n_repeat:,} repeats after {self.n_warmup:,} warm-up on {where} "
            f"(stopped by {self.stop_reason}; {self.elapsed_s:,.3f} s; GPU times from {self.source})"
        )
        table = Table(show_edge=False)
        table.add_column("", justify="left")
        for header in ("mean (µs)", "± std", "min", "median", "max", "rsd"):
            table.add_column(header, justify="right")
        for r, label in enumerate(self.labels):
            rsd = stats[r, 5]
            table.add_row(label, *[_us_from_ms(v) for v in stats[r, :5]], "—" if math.isnan(rsd) else f"{rsd:.2%}")
        yield table
        device_rows = (
            "the span of CUPTI's records of the work its call launched"
            if self.source == "cupti"
            else "time between the events around its call on its stream, less the pair's own latency"
        )
        note = f" ({self.source_note})" if self.source_note else ""
        yield Text(
            f"CPU: host time of each repeat's calls (first start to last return); each device: {device_rows}"
            f"{note}. std: population standard deviation.",
            style="dim",
        )


def _us_from_ms(ms: float) -> str:
    """A time in ms as µs text, three decimals; ``—`` for NaN."""
    return "—" if math.isnan(ms) else f"{ms * 1e3:,.3f}"


def _nan_to_none(x: float) -> float | None:
    """A statistic for `BenchmarkResult.to_dict`: NaN (not defined, as with no repeats) as None. Unlike
    `asyncgpu._base.numbers.finite`, an infinity stays a float."""
    return None if math.isnan(x) else float(x)
