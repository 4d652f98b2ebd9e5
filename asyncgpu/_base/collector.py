"""Python's garbage collections on the host clock: a process-wide recorder that step timers and scopes hold while
they run (`acquire`, `release`), so that a step can say how much of its host time the collector took (`pauses_in`)
and a scope can show its body's collections (`pauses_between`).

A collection holds the GIL, so its pause is host time for every thread of the process that runs Python: a loop
that issues a step's work stops issuing, and the step reads launch-bound. The recorder is one entry of
``gc.callbacks``, installed while some user holds it. Per collection it reads ``time.perf_counter_ns`` twice and
keeps the collections of generations 1 and 2, and those of generation 0 that took `MIN_YOUNG_NS` or more (the many
short young ones would only churn the ring), in a ring of the newest `KEEP` (numpy, preallocated: the callback
allocates nothing that could start another collection).

Threads: the callback runs in whichever thread triggered the collection, with the GIL held (a collection's start
and stop are never interleaved with another's). A reader takes the count before it reads the ring, so a collection
that its own allocations start is left out, never half-read.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np

__all__ = ["KEEP", "MIN_YOUNG_NS", "acquire", "pauses_between", "pauses_in", "release", "users"]

KEEP = 4096  #: collections kept (the newest): minutes of a loop's full and middle collections
MIN_YOUNG_NS = 100_000  #: a generation-0 collection is kept when it took this long (ns) or longer

_lock = threading.Lock()  # acquire and release
_users = [0]
_ring = np.zeros((KEEP, 3), np.int64)  # (start ns, end ns on `time.perf_counter_ns`, generation)
_count = [0]  # collections written so far (slot = count % KEEP)
_began = [0]
_clock = time.perf_counter_ns


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _began[0] = _clock()
        return
    end = _clock()
    begin = _began[0]
    generation = info["generation"]
    if generation or end - begin >= MIN_YOUNG_NS:
        k = _count[0]
        _ring[k % KEEP, 0] = begin
        _ring[k % KEEP, 1] = end
        _ring[k % KEEP, 2] = generation
        _count[0] = k + 1


def acquire() -> None:
    """Record collections from now until the matching `release` (shared: the first user installs the callback).
    Any thread."""
    with _lock:
        if not _users[0]:
            gc.callbacks.append(_callback)
        _users[0] += 1


def release() -> None:
    """The end of one `acquire` (the last user removes the callback; the kept collections stay readable). Any
    thread."""
    with _lock:
        if not _users[0]:
            return
        _users[0] -= 1
        if not _users[0] and _callback in gc.callbacks:
            gc.callbacks.remove(_callback)


def users() -> int:
    """How many `acquire` s are not released."""
    return _users[0]


def _kept_since(t_ns: float) -> np.ndarray:
    """The kept collections that end after ``t_ns``, oldest first: int64 ``(start ns, end ns, generation)`` rows.
    A binary search over the ring (collections are kept in time order), then a copy of those rows only: a busy
    process collects hundreds of times a second, and a harvest asks for its last half second, not all `KEEP`."""
    n = _count[0]  # (first: a collection that the copy's allocation starts is not in it)
    lo, hi, item = max(0, n - KEEP), n, _ring.item
    while lo < hi:  # the oldest kept collection that ends after t_ns
        mid = (lo + hi) // 2
        if item(mid % KEEP, 1) > t_ns:
            hi = mid
        else:
            lo = mid + 1
    a, b = lo % KEEP, n % KEEP
    if lo == n:
        return _ring[:0].copy()
    return _ring[a:b].copy() if a < b else np.concatenate((_ring[a:], _ring[:b]))


def pauses_between(begin_ns: int, end_ns: int) -> list[tuple[int, int, int]]:
    """The kept collections that overlap ``[begin_ns, end_ns]`` (host ns), oldest first: ``(start ns, end ns,
    generation)``, not clipped. Walks back from the newest (collections are kept in time order): O(those after
    ``begin_ns``), nothing copied. Any thread."""
    n, item = _count[0], _ring.item
    out = []
    for k in range(n - 1, max(0, n - KEEP) - 1, -1):
        slot = k % KEEP
        end = item(slot, 1)
        if end <= begin_ns:
            break
        start = item(slot, 0)
        if start < end_ns:
            out.append((start, end, item(slot, 2)))
    out.reverse()
    return out


def pauses_in(begin_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each window ``[begin_ns[i], end_ns[i]]`` (host ns, `time.perf_counter_ns`): the collector's time inside
    it (ns, float64) and how many kept collections touched it. Collections older than the newest `KEEP` are gone.
    Any thread; O((windows + collections) · log collections): collections never overlap and are kept in time order,
    so a window's share is the difference of the collector's running total at its two ends."""
    begin = np.asarray(begin_ns, np.float64)
    end = np.asarray(end_ns, np.float64)
    if not len(begin):
        return np.zeros(0), np.zeros(0, np.int64)
    pauses = _kept_since(float(begin.min())).astype(np.float64)
    if not len(pauses):
        return np.zeros(len(begin)), np.zeros(len(begin), np.int64)
    starts, ends = pauses[:, 0], pauses[:, 1]
    before = np.concatenate(([0.0], np.cumsum(ends - starts)))  # the collector's total before each collection

    def total(t: np.ndarray) -> np.ndarray:  # the collector's time before instant t
        k = np.searchsorted(starts, t, side="right")  # collections begun by t
        last = np.maximum(k - 1, 0)
        inside = np.clip(t - starts[last], 0.0, ends[last] - starts[last])
        return np.where(k > 0, before[last] + inside, 0.0)

    took = np.maximum(total(end) - total(begin), 0.0)
    touched = np.searchsorted(starts, end, side="left") - np.searchsorted(ends, begin, side="right")
    return took, np.where(took > 0, touched, 0).astype(np.int64)  # (an empty window touches none)
