"""What a step timer keeps, in constant memory: the last ``keep`` steps in full (`StepRing`, numpy columns) and,
over every step, streaming quantiles (`Quantiles`, a log-bucket histogram) and straggler counts. Pure data: no
device, no thread of its own; the step timer (`asyncgpu._timing.steps`) fills it from its harvest thread under its lock.

The results users get are frozen snapshots: `StepRecord` (one step), `DeviceStep` (one device in it) and
`StepStats` (the aggregates and the recent steps, what the live view draws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, final

import numpy as np

from asyncgpu._analysis.balance import COLLECTOR_FIX, COLLECTOR_NOTE_SHARE, HOST
from asyncgpu._analysis.steps import StepSplit
from asyncgpu._analysis.summary import Plain
from asyncgpu._analysis.text import ms

__all__ = ["DeviceStep", "Quantiles", "StepRecord", "StepRing", "StepStats"]

_NONE = -2  # a straggler code: no step (an empty ring slot)


@final
class Quantiles:
    """Streaming quantiles of positive values (ns) in ``series`` independent columns, in fixed memory: a histogram
    of ``log(value) / log(1 + 2 * rel_error)`` buckets from 1 ns to about 3 hours (values outside are clamped to
    the end buckets, 0 and below go to the first). A quantile is its bucket's geometric middle: within
    ``rel_error`` (default 1 %) of a value of that rank for values in range. Memory: 8 bytes per bucket per series
    (about 1,500 buckets at 1 %). Not thread-safe: one writer at a time (the owner's lock)."""

    __slots__ = ("counts", "rel_error", "_log_ratio", "total", "_base")

    _TOP_NS = 1e13

    def __init__(self, series: int, rel_error: float = 0.01) -> None:
        if not 0 < rel_error < 0.5:
            raise ValueError(f"rel_error is a fraction in (0, 0.5), e.g. 0.01 for 1 %, not {rel_error!r}")
        self.rel_error = rel_error
        self._log_ratio = math.log1p(2 * rel_error)
        buckets = int(math.ceil(math.log(self._TOP_NS) / self._log_ratio)) + 1
        self.counts = np.zeros((series, buckets), np.int64)
        self.total = np.zeros(series, np.int64)
        self._base = np.arange(series, dtype=np.float64) * buckets  # each series' first bucket, flattened

    def add(self, values_ns: np.ndarray) -> None:
        """Count ``values_ns`` ((n, series) or (n,) for one series); NaN values are skipped."""
        v = np.asarray(values_ns, np.float64).reshape(len(values_ns), -1)
        ok = np.isfinite(v)
        buckets = self.counts.shape[1]
        # bucket floor(log(v) / log_ratio), values up to 1 ns in the first, the top clamped (NaN stays NaN and is
        # left out by ``ok``); plus each series' first bucket in the flattened counts
        with np.errstate(invalid="ignore"):
            b = np.minimum(np.log(np.maximum(v, 1.0)) / self._log_ratio, buckets - 1) + self._base[: v.shape[1]]
        # (one bincount over the flattened (series, bucket) index: `np.add.at` with a pair of index arrays took
        # ~0.6 ms a harvest beside a busy loop, under the GIL)
        self.counts += np.bincount(b[ok].astype(np.int64), minlength=self.counts.size).reshape(self.counts.shape)
        self.total += ok.sum(axis=0)

    def quantile(self, q: float | list[float]) -> np.ndarray:
        """(series,) or (len(q), series) quantiles in ns (NaN for a series with no value)."""
        qs = np.atleast_1d(np.asarray(q, np.float64))
        cum = np.cumsum(self.counts, axis=1)
        out = np.full((len(qs), self.counts.shape[0]), np.nan)
        for s in range(self.counts.shape[0]):
            if self.total[s]:
                rank = np.maximum(np.ceil(qs * self.total[s]), 1)
                b = np.searchsorted(cum[s], rank)
                out[:, s] = np.where(b == 0, 0.0, np.exp((b + 0.5) * self._log_ratio))
        return out if np.ndim(q) else out[0]


@final
@dataclass(frozen=True, slots=True)
class DeviceStep:
    """One device in one step. Times in ms; ``start_ns``/``end_ns``/``issued_ns`` absolute, on the host clock
    (``time.perf_counter_ns()``)."""

    device: str
    #: the device reached the step's start: its start event, or the previous step's end event when the step follows
    #: it directly (``chain``); never before the step's entry
    start_ns: float
    end_ns: float  #: the device finished the step's work (its end event)
    issued_ns: float  #: the host had issued all of the step's work to the device (the end event's record)
    busy_ms: float  #: the device's busy block of the step (`asyncgpu._analysis.steps.step_split`)
    span_ms: float  #: start event to end event: busy time's upper bound (gaps inside the step included)
    launch_bound_ms: float  #: idle before the block while the host was still issuing the step
    dependency_ms: float  #: idle before the block with all of it issued (earlier work on the stream, waits)


@final
@dataclass(frozen=True, slots=True)
class StepRecord(Plain):
    """One step: when the host entered and left it, its step time, the straggler and each device's part."""

    index: int
    begin_ns: int  #: host clock, the step's entry
    exit_ns: int  #: host clock, the step's exit (its body done issuing)
    step_ms: float  #: begin to the later of the host's exit and the last device end
    straggler: str  #: the device that bounds the step, or ``"host"``
    devices: tuple[DeviceStep, ...]
    collector_ms: float = 0.0  #: the host's time in Python's garbage collection between entry and exit


@final
@dataclass(frozen=True, slots=True)
class StepStats(Plain):
    """A snapshot of a step timer: aggregates over every step so far (constant memory) and the recent steps.
    Quantiles come from `Quantiles` (within ``quantile_error`` relative); ms."""

    label: str
    devices: tuple[str, ...]
    steps: int  #: steps harvested so far
    pending: int  #: closed steps whose events the devices have not passed yet
    dropped: int  #: steps given up: more than ``max_pending`` waiting, or still unfinished at a cancelled exit
    step_ms: dict[str, float]  #: ``{"p50", "p90", "p99"}`` of step time
    busy_ms: dict[str, dict[str, float]]  #: per device, the same of busy time
    stragglers: dict[str, int]  #: steps each device (or ``"host"``) bounded
    verdict: str  #: host-bound or device-bound, over the recent steps
    recent: tuple[StepRecord, ...]  #: the last steps kept (at most ``keep``), oldest first
    quantile_error: float
    trace_dropped: int = 0  #: steps the trace writer could not take (its queue was full)
    collector_ms: float = 0.0  #: over every step so far, the host's time in Python's garbage collection
    collector_steps: int = 0  #: steps in which the garbage collector ran

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        yield from render_stats(self, options.max_width)


@final
class StepRing:
    """The last ``keep`` steps as numpy columns (a ring: slot ``count % keep``) plus the all-time aggregates. The
    owner serialises writers and snapshots with its lock; `add` and `snapshot` are O(keep · devices)."""

    def __init__(self, devices: tuple[str, ...], keep: int, rel_error: float = 0.01) -> None:
        nd = len(devices)
        self.devices, self.keep = devices, keep
        self.index = np.zeros(keep, np.int64)
        self.begin_ns = np.zeros(keep, np.int64)
        self.exit_ns = np.zeros(keep, np.int64)
        self.step_ns = np.zeros(keep)
        self.straggler = np.full(keep, _NONE, np.int64)
        self.cols = {k: np.zeros((keep, nd)) for k in ("start", "end", "issued", "busy", "span", "launch", "dep")}
        self.count = 0
        self.quantiles = Quantiles(1 + nd, rel_error)
        self.straggler_counts = np.zeros(nd + 1, np.int64)  # devices, then the host
        self.collector_ns = np.zeros(keep)
        self.collector_total_ns, self.collector_steps = 0.0, 0

    def add(
        self,
        index: np.ndarray,
        begin_ns: np.ndarray,
        exit_ns: np.ndarray,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
        issued_ns: np.ndarray,
        split: StepSplit,
        collector_ns: np.ndarray | None = None,
    ) -> None:
        """Steps harvested together (rows in step order); ``collector_ns``: each one's host time in Python's garbage
        collection (none: 0)."""
        n = len(index)
        if not n:
            return
        collected = np.zeros(n) if collector_ns is None else np.asarray(collector_ns, np.float64)
        self.collector_total_ns += float(collected.sum())
        self.collector_steps += int(np.count_nonzero(collected))
        self.quantiles.add(np.column_stack((split.step_ns, split.busy_ns)))
        codes = np.where(split.straggler < 0, len(self.devices), split.straggler)
        self.straggler_counts += np.bincount(codes, minlength=len(self.devices) + 1)
        first = max(0, n - self.keep)  # (more than keep at once: only the newest fit)
        at = (self.count + first) % self.keep
        # the rows go to slots at, at + 1, ... modulo keep: one slice, or two where they wrap (slice assignments
        # cost a harvest less than an index array's, ~15 of them per harvest under the GIL)
        parts = [(slice(at, at + n - first), slice(first, n))]
        if at + n - first > self.keep:
            cut = first + self.keep - at
            parts = [(slice(at, self.keep), slice(first, cut)), (slice(0, n - cut), slice(cut, n))]
        span = end_ns - start_ns
        for dst, src in parts:
            self.index[dst], self.begin_ns[dst], self.exit_ns[dst] = index[src], begin_ns[src], exit_ns[src]
            self.step_ns[dst], self.straggler[dst] = split.step_ns[src], split.straggler[src]
            self.collector_ns[dst] = collected[src]
            for k, v in (
                ("start", start_ns),
                ("end", end_ns),
                ("issued", issued_ns),
                ("busy", split.busy_ns),
                ("span", span),
                ("launch", split.launch_bound_ns),
                ("dep", split.dependency_ns),
            ):
                self.cols[k][dst] = v[src]
        self.count += n

    def recent(self, last: int | None = None) -> list[StepRecord]:
        """The kept steps, oldest first (the last ``last`` of them)."""
        k = min(self.count, self.keep)
        if last is not None:
            k = min(k, last)
        slots = (self.count - k + np.arange(k)) % self.keep
        c = {name: col[slots] for name, col in self.cols.items()}
        out = []
        for j, s in enumerate(slots.tolist()):
            devs = tuple(
                DeviceStep(
                    name,
                    float(c["start"][j, d]),
                    float(c["end"][j, d]),
                    float(c["issued"][j, d]),
                    float(c["busy"][j, d]) / 1e6,
                    float(c["span"][j, d]) / 1e6,
                    float(c["launch"][j, d]) / 1e6,
                    float(c["dep"][j, d]) / 1e6,
                )
                for d, name in enumerate(self.devices)
            )
            code = int(self.straggler[s])
            out.append(
                StepRecord(
                    int(self.index[s]),
                    int(self.begin_ns[s]),
                    int(self.exit_ns[s]),
                    float(self.step_ns[s]) / 1e6,
                    HOST if code < 0 else self.devices[code],
                    devs,
                    float(self.collector_ns[s]) / 1e6,
                )
            )
        return out

    def stats(self, label: str, pending: int, dropped: int, trace_dropped: int, recent: int) -> StepStats:
        q = self.quantiles.quantile([0.5, 0.9, 0.99]) / 1e6
        keys = ("p50", "p90", "p99")
        busy = {name: {k: float(q[j, 1 + d]) for j, k in enumerate(keys)} for d, name in enumerate(self.devices)}
        names = [*self.devices, HOST]
        stragglers = {names[i]: int(n) for i, n in enumerate(self.straggler_counts) if n}
        rec = self.recent(recent)
        return StepStats(
            label,
            self.devices,
            self.count,
            pending,
            dropped,
            {k: float(q[j, 0]) for j, k in enumerate(keys)},
            busy,
            stragglers,
            verdict(rec),
            tuple(rec),
            self.quantiles.rel_error,
            trace_dropped,
            self.collector_total_ns / 1e6,
            self.collector_steps,
        )


def verdict(recent: list[StepRecord]) -> str:
    """Host-bound or device-bound, from the stragglers of ``recent`` steps: what bounded at least half of them, else
    "mixed" with each one's share."""
    if not recent:
        return "no step finished yet"
    counts: dict[str, int] = {}
    for r in recent:
        counts[r.straggler] = counts.get(r.straggler, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    who, n = ranked[0]
    if 2 * n < len(recent):
        shares = ", ".join(f"{w} {k / len(recent):.0%}" for w, k in ranked)
        return f"mixed: no one bounded half of the last {len(recent)} steps ({shares})"
    share = f"{n} of the last {len(recent)} steps"
    if who == HOST:
        return (
            f"host-bound: the host bounded {share} (the devices waited for work to be issued); launch from a "
            "thread per device (await device.run(step)), capture CUDA graphs, or launch fewer, larger kernels"
            + _collector_note([r for r in recent if r.straggler == HOST])
        )
    return f"device-bound: {who} bounded {share}"


def _collector_note(steps: list[StepRecord]) -> str:
    """What Python's garbage collection took of ``steps`` (host-bound ones), when that is at least
    `COLLECTOR_NOTE_SHARE` of their time: "" otherwise."""
    took = sum(r.collector_ms for r in steps)
    total = sum(r.step_ms for r in steps)
    if total <= 0 or took < COLLECTOR_NOTE_SHARE * total:
        return ""
    n = sum(1 for r in steps if r.collector_ms > 0)
    return (
        f". Python's garbage collection took {took / total:.0%} of their time ({ms(took)} ms in {n} of them): "
        + COLLECTOR_FIX
    )


# -- drawn ------------------------------------------------------------------------------------------------------
_SPARK = " ▁▂▃▄▅▆▇█"


def spark(values: list[float], top: float) -> str:
    """One character per value: its height of ``top`` in eighths (blank for 0 or NaN)."""
    out = []
    for v in values:
        if top <= 0 or not v > 0:
            out.append(" ")
        else:
            out.append(_SPARK[max(1, min(8, round(v / top * 8)))])
    return "".join(out)


def render_stats(s: StepStats, max_width: int) -> Iterator[Any]:
    """The step panel: a header line (steps, step time p50/p99), a row per device (its busy share of each recent
    step, one bar character per step; busy p50/p99; the steps it bounded; a flag on the latest step's straggler),
    a row for the host, and the verdict."""
    from rich.table import Table
    from rich.text import Text

    head = (
        f"{s.label}: {s.steps:,} steps, step p50 {ms(s.step_ms['p50'])} ms, p99 {ms(s.step_ms['p99'])} ms"
        f" (±{s.quantile_error:.0%}); pending {s.pending}, dropped {s.dropped}"
    )
    if s.trace_dropped:
        head += f", trace dropped {s.trace_dropped}"
    yield Text(head)
    width = max(8, min(len(s.recent), max_width - 60))
    recent = list(s.recent)[-width:]
    table = Table(show_edge=False)
    table.add_column("device", no_wrap=True, min_width=max(len(d) for d in (*s.devices, "device")))
    table.add_column(f"busy/step, last {len(recent)}", no_wrap=True, min_width=width)
    for h in ("busy p50", "busy p99", "bounded"):
        table.add_column(h, justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    total = max(s.steps, 1)
    last = recent[-1].straggler if recent else None
    for d, name in enumerate(s.devices):
        share = [r.devices[d].busy_ms / r.step_ms if r.step_ms > 0 else 0.0 for r in recent]
        n = s.stragglers.get(name, 0)
        flag = "◀ straggler" if last == name else ""
        table.add_row(
            name,
            spark(share, 1.0),
            ms(s.busy_ms[name]["p50"]),
            ms(s.busy_ms[name]["p99"]),
            f"{n:,} ({n / total:.0%})",
            flag,
        )
    n = s.stragglers.get(HOST, 0)
    table.add_row("host", "", "", "", f"{n:,} ({n / total:.0%})", "◀ straggler" if last == HOST else "")
    yield table
    if s.collector_steps:
        yield Text(f"garbage collection: {ms(s.collector_ms)} ms of the host's time in {s.collector_steps:,} steps")
    yield Text(f"verdict: {s.verdict}")
