"""A step timer's CUPTI source: every kernel, memset and memcpy of its devices as CUPTI records it, attributed to
steps by time.

The timer's channel is records-only (`asyncgpu._backends.cupti.STEPS`): nothing is pushed around launches, so a
launch costs the loop nothing beyond CUPTI's own instrumentation, and no API record is made while no other channel
is open. The harvest thread flushes the channel at its own cadence (never the loop's thread), converts the records
to host time in bulk (numpy), and for each finished step and device gives the time the device was busy inside its
step window (the union of the records' intervals between the step's two events) and the part of it before the host
had issued the step. Records of asyncgpu's own streams (the clock's calibration: `own`) are not the user's work and
are dropped. Records are kept until the steps they may belong to are harvested, at most `MAX_RECORDS`.
Kernel names are counted per device (the `MAX_NAMES` busiest, the rest as ``"(other)"``).

Threads: the harvest thread only; the name totals are read from any thread under `StepRecords.names_lock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from asyncgpu._backends import cupti
from asyncgpu._backends.cupti_buffers import RecordBatch
from asyncgpu._backends.kernels import CLOCK_KERNEL_PREFIX

__all__ = ["StepRecords"]

MAX_RECORDS = 1_000_000  #: records kept between harvests, all devices together (past it the oldest go)
MAX_NAMES = 256  #: distinct kernel names counted per device
_OFFSET_AGE_NS = 1_000_000_000  # CUPTI's clock against the host's: measured again after this long


class StepRecords:
    """The records of the devices with CUDA ordinals ``ordinals`` (one column each, in the timer's order).

    Every column's records are kept in one set of arrays, and each harvest attributes them with a handful of numpy
    calls over all columns at once: each call over thousands of records lets go of the GIL, and the harvest thread
    then takes it back from the loop's threads (4 H100s, run 35: the harvests' parse and attribution cost the loop
    ~2 % of its time), so their number, not the records', is what a harvest costs the loop."""

    def __init__(self, ordinals: list[int], own: Callable[[], list[tuple[int, int, int]]] | None = None) -> None:
        """``own``: the ``(CUDA ordinal, context handle, stream handle)`` of each stream asyncgpu's own work runs on
        now (called at each `take`: the clock's stream may be made after the timer starts)."""
        self._ordinals = np.asarray(ordinals, np.int64)
        self._own = own
        self._own_ids: dict[tuple[int, int, int], int | None] = {}  # `own`'s triple -> ordinal << 32 | CUPTI's id
        self.seen_own: set[int] = set()  #: ``ordinal << 32 | stream id`` of the streams clock kernels were seen on
        self._order = np.argsort(self._ordinals)  # (to find a record's column by its device's ordinal)
        self._ncols = len(ordinals)
        self._start = np.empty(0)  # host ns
        self._end = np.empty(0)
        self._col = np.empty(0, np.int64)  # each record's column
        #: per column: kernel name -> [count, total ns] (memsets and memcpys under their kind)
        self.names: list[dict[str, list[float]]] = [{} for _ in range(self._ncols)]
        self.names_lock = threading.Lock()  #: held while `take` updates ``names`` (readers take it too)
        self.records = 0  #: records taken in all
        self.lost = 0  #: records dropped past `MAX_RECORDS`
        self._offset_ns, self._offset_at = 0, 0

    def take(self) -> int:
        """Flush the channel (blocks while CUPTI hands its buffers over and they are parsed) and keep what it held,
        in bulk (no Python per record). Returns how many."""
        batch, _ = cupti.flush_batch(cupti.STEPS)
        n = len(batch)
        if not n:
            return 0
        now = time.perf_counter_ns()
        if now - self._offset_at > _OFFSET_AGE_NS:
            self._offset_ns, self._offset_at = cupti.host_offset_ns(), now
        at = np.searchsorted(self._ordinals, batch.device, sorter=self._order)
        cols = self._order[np.minimum(at, self._ncols - 1)]
        mine = self._ordinals[cols] == batch.device  # (records of devices the timer does not time: dropped)
        own = self._own_keys(batch)
        if len(own):
            mine &= ~np.isin((batch.device.astype(np.int64) << 32) | batch.stream, own)
        cols = cols[mine]
        start = batch.start_ns[mine].astype(np.float64) - self._offset_ns
        end = batch.end_ns[mine].astype(np.float64) - self._offset_ns
        self._start = np.concatenate([self._start, start])
        self._end = np.concatenate([self._end, end])
        self._col = np.concatenate([self._col, cols])
        width = max(len(batch.names), 1)
        key = cols * width + batch.name[mine]
        counts = np.bincount(key, minlength=self._ncols * width)
        total_ns = np.bincount(key, weights=end - start, minlength=self._ncols * width)
        with self.names_lock:
            for k in np.flatnonzero(counts).tolist():
                names, name = self.names[k // width], batch.names[k % width]
                slot = names.get(name)
                if slot is None:
                    if len(names) >= MAX_NAMES:
                        name = "(other)"
                    slot = names.setdefault(name, [0, 0.0])
                slot[0] += int(counts[k])
                slot[1] += float(total_ns[k])
        self.records += n
        extra = len(self._start) - MAX_RECORDS
        if extra > 0:  # (steps that never finish: keep the newest)
            self.lost += extra
            self._start, self._end, self._col = self._start[extra:], self._end[extra:], self._col[extra:]
        return n

    def _own_keys(self, batch: RecordBatch) -> np.ndarray:
        """``ordinal << 32 | CUPTI's stream id`` of asyncgpu's own streams, as the records key them: every one seen
        while the timer ran (a flush after a device closed still holds its calibration's records). Two ways, as
        neither alone is enough:

        - CUPTI's id of each stream `own` names, asked at each flush until CUPTI gives one (a stream made before
          the session may have none at first);
        - the streams that ``batch``'s clock kernels (`CLOCK_KERNEL_PREFIX`) ran on: only the calibration's stream
          runs them. On 4 H100s (run 44) CUPTI named one own stream and the clock's ping kernel still came
          through as the user's: either the id CUPTI gave and the one its records carry differ, or the kernel ran
          on a calibration stream `own` did not name (not shown which)."""
        if self._own is not None:
            for key in self._own():
                if self._own_ids.get(key) is None:
                    ordinal, context, handle = key
                    sid = cupti.stream_id(context, handle)
                    self._own_ids[key] = None if sid is None else (ordinal << 32) | sid
        clock = [i for i, name in enumerate(batch.names) if name.startswith(CLOCK_KERNEL_PREFIX)]
        if clock:
            hit = np.isin(batch.name, clock)
            self.seen_own.update(np.unique((batch.device[hit].astype(np.int64) << 32) | batch.stream[hit]).tolist())
        return np.array(sorted({k for k in self._own_ids.values() if k is not None} | self.seen_own), np.int64)

    def measured(
        self, start_ns: np.ndarray, end_ns: np.ndarray, issued_ns: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For step windows ``[start, end]`` (steps, columns; host ns), the time each device's records cover inside
        the window, and inside ``[start, min(issued, end)]``: ``(busy_ns, busy_before_issue_ns)``. All columns at
        once: each column's times are shifted onto a stretch of the time axis of its own (``span`` apart, wider than
        every record and window), where one union and one search serve them all."""
        shape = start_ns.shape
        if not len(self._start):
            return np.zeros(shape), np.zeros(shape)
        a = np.asarray(start_ns, np.float64)
        b = np.asarray(end_ns, np.float64)
        c = np.clip(issued_ns, a, b)
        placed = np.isfinite(a) & np.isfinite(b)  # (a device whose clock is not aligned has NaN windows: NaN here)
        base = min(float(self._start.min()), float(a[placed].min()) if placed.any() else np.inf) - 1.0
        span = max(float(self._end.max()), float(b[placed].max()) if placed.any() else -np.inf) - base + 1.0
        shift = np.arange(self._ncols, dtype=np.float64) * span - base  # per column (exact while < 2**53 ns)
        lo, hi = _merged(self._start + shift[self._col], self._end + shift[self._col])
        cov = _covered(lo, hi, np.concatenate([a + shift, b + shift, c + shift]).ravel())
        ca, cb, cc = cov.reshape(3, *shape)
        return cb - ca, cc - ca

    def forget_before(self, ns: np.ndarray) -> None:
        """Drop each column's records that ended before ``ns[column]`` (host ns): no later step can hold them."""
        keep = self._end >= np.asarray(ns, np.float64)[self._col]
        self._start, self._end, self._col = self._start[keep], self._end[keep], self._col[keep]


def _merged(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals ``[start, end]`` as sorted, disjoint intervals."""
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    first = np.empty(len(s), bool)
    first[0] = True
    first[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(first)
    return s[heads], np.maximum.reduceat(e, heads)


def _covered(lo: np.ndarray, hi: np.ndarray, x: np.ndarray) -> np.ndarray:
    """How much of the disjoint sorted intervals ``[lo, hi]`` lies before each ``x``."""
    if not len(lo):
        return np.zeros(np.shape(x))
    cum = np.concatenate([[0.0], np.cumsum(hi - lo)])
    j = np.searchsorted(lo, x, side="right")  # intervals that start before x
    last = np.maximum(j - 1, 0)
    over = np.where(j > 0, np.maximum(hi[last] - x, 0.0), 0.0)  # the part of the last one after x
    return cum[j] - over


def totals(names: dict[str, list[float]], top: int) -> list[tuple[str, int, float]]:
    """The ``top`` names by total time: ``(name, count, total ms)``."""
    rows = sorted(names.items(), key=lambda kv: -kv[1][1])[:top]
    return [(k, int(v[0]), v[1] / 1e6) for k, v in rows]
