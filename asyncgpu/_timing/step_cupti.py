"""A step timer's CUPTI source: every kernel, memset and memcpy of its devices as CUPTI records it, attributed to
steps by time.

The timer's channel is records-only (`asyncgpu._backends.cupti.STEPS`): nothing is pushed around launches, so a
launch costs the loop nothing beyond CUPTI's own instrumentation, and no API record is made while no other channel
is open. The harvest thread flushes the channel at its own cadence (never the loop's thread), converts the records
to host time in bulk (numpy), and for each finished step and device gives the time the device was busy inside its
step window (the union of the records' intervals between the step's two events) and the part of it before the host
had issued the step. Records are kept until the steps they may belong to are harvested, at most `MAX_RECORDS`.
Kernel names are counted per device (the `MAX_NAMES` busiest, the rest as ``"(other)"``).

Threads: the harvest thread only; the name totals are read from any thread under `StepRecords.names_lock`.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from asyncgpu._backends import cupti

__all__ = ["StepRecords"]

MAX_RECORDS = 1_000_000  #: records kept between harvests, all devices together (past it the oldest go)
MAX_NAMES = 256  #: distinct kernel names counted per device
_OFFSET_AGE_NS = 1_000_000_000  # CUPTI's clock against the host's: measured again after this long


class StepRecords:
    """The records of the devices with CUDA ordinals ``ordinals`` (one column each, in the timer's order)."""

    def __init__(self, ordinals: list[int]) -> None:
        self._col = {o: c for c, o in enumerate(ordinals)}
        n = len(ordinals)
        self._start = [np.empty(0) for _ in range(n)]  # host ns, per column
        self._end = [np.empty(0) for _ in range(n)]
        #: per column: kernel name -> [count, total ns] (memsets and memcpys under their kind)
        self.names: list[dict[str, list[float]]] = [{} for _ in range(n)]
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
        cols = np.full(n, -1, np.int64)
        for ordinal, c in self._col.items():
            cols[batch.device == ordinal] = c
        start = batch.start_ns.astype(np.float64) - self._offset_ns
        end = batch.end_ns.astype(np.float64) - self._offset_ns
        for c in range(len(self._start)):
            m = cols == c
            if not m.any():
                continue
            self._start[c] = np.concatenate([self._start[c], start[m]])
            self._end[c] = np.concatenate([self._end[c], end[m]])
            which = batch.name[m]
            counts = np.bincount(which, minlength=len(batch.names))
            total_ns = np.bincount(which, weights=end[m] - start[m], minlength=len(batch.names))
            names = self.names[c]
            with self.names_lock:
                for i in np.flatnonzero(counts).tolist():
                    key = batch.names[i]
                    slot = names.get(key)
                    if slot is None:
                        if len(names) >= MAX_NAMES:
                            key = "(other)"
                        slot = names.setdefault(key, [0, 0.0])
                    slot[0] += int(counts[i])
                    slot[1] += float(total_ns[i])
        self.records += n
        share = MAX_RECORDS // len(self._start)
        for c in range(len(self._start)):
            extra = len(self._start[c]) - share
            if extra > 0:  # (steps that never finish: keep the newest)
                self.lost += extra
                self._start[c], self._end[c] = self._start[c][extra:], self._end[c][extra:]
        return n

    def measured(
        self, start_ns: np.ndarray, end_ns: np.ndarray, issued_ns: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For step windows ``[start, end]`` (steps, columns; host ns), the time each device's records cover inside
        the window, and inside ``[start, min(issued, end)]``: ``(busy_ns, busy_before_issue_ns)``."""
        busy = np.zeros(start_ns.shape)
        before = np.zeros(start_ns.shape)
        for c in range(start_ns.shape[1]):
            lo, hi = _merged(self._start[c], self._end[c])
            a, b = start_ns[:, c], end_ns[:, c]
            busy[:, c] = _covered(lo, hi, b) - _covered(lo, hi, a)
            before[:, c] = _covered(lo, hi, np.clip(issued_ns[:, c], a, b)) - _covered(lo, hi, a)
        return busy, before

    def forget_before(self, ns: np.ndarray) -> None:
        """Drop each column's records that ended before ``ns[column]`` (host ns): no later step can hold them."""
        for c in range(len(self._start)):
            keep = self._end[c] >= ns[c]
            self._start[c], self._end[c] = self._start[c][keep], self._end[c][keep]


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
