"""A per-device pool of recycled backend events.

Events are created in chunks on demand, up to ``max_events``; in the steady state `take` and `give` only move an
event between a list and the caller. With ``grow_soon`` (the device's waiter thread, on a backend whose events
are costly: `BackendDevice.grows_ahead`, CUDA), a pool running low grows
*ahead* of need on that thread: creating an event costs microseconds (spikes of hundreds), which a loop's thread
must not pay in the middle of a burst of records (a chunk of 64 stalls a 1 ms ticker). An event is
given back only once the device can no longer touch it (the device's queue of releases checks: see
`asyncgpu._runtime.internal.DeviceInternal.recycle`). Thread-safe: `take` and `give` may be called from any thread (list
append/pop are atomic under the GIL; growth and trims take a lock).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from asyncgpu._backends.contract import BackendDevice
from asyncgpu._base.errors import BackendError, PoolExhaustedError

__all__ = ["EventPool", "PoolStats"]

_AHEAD_STEP = 8  #: events a growth ahead creates per hold of the pool's lock
_AHEAD_PAUSE_S = 20e-6  #: and the pause after each step


@dataclass(frozen=True)
class PoolStats:
    """Counters of one pool. In a steady state ``created`` stays flat while ``taken`` grows; `EventPool.trim`
    lowers it once a burst is over."""

    timing: bool
    created: int  #: events alive (created, not destroyed by a trim): the pool grows only when none is free
    free: int  #: events ready to be taken
    in_use: int  #: events held by callers or waiting for the device to pass them
    taken: int  #: total takes (counted without a lock: a close estimate under concurrent takes)
    grows: int  #: times the pool had to create events
    max_events: int
    growing: bool = False  #: a growth ahead of need is under way on the waiter thread (``created`` may still rise)


class EventPool:
    """Recycled events of one kind (timing or not) of one device. ``reclaim(everything, wait)``: gives back
    released events the device has passed (the device's queue of releases); called before the pool grows, and
    with ``everything=True`` when it is at its bound (``wait`` False: not if another reclaim is under way).
    ``wait_released(timing)``: called at the bound when nothing could be reclaimed; None once it has waited for
    a released event of that kind to be passed (where the calling thread may block), else how many released
    events are still ahead of the device (for the error's message)."""

    def __init__(
        self,
        device: BackendDevice,
        *,
        timing: bool,
        max_events: int,
        grow_by: int = 64,
        reclaim: Callable[[bool, bool], int] | None = None,
        grow_soon: Callable[[Callable[[], None]], None] | None = None,
        wait_released: Callable[[bool], int | None] | None = None,
    ) -> None:
        self._device = device
        self._reclaim = reclaim
        self._wait_released = wait_released
        self._grow_soon = grow_soon
        self._low = grow_by // 2  # fewer free than this: grow ahead (with ``grow_soon``)
        self._growing = False  # a growth ahead is queued or running
        self._timing = timing
        self._max = max_events
        self._grow_by = grow_by
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self._created = 0
        self._taken = 0
        self._grows = 0
        self._closed = False

    def take(self) -> Any:
        """A free backend event (hot). When none is free: reclaims released ones the device has passed, else
        grows; at the bound, waits for released events the device has not passed yet where ``wait_released`` may
        block, else raises `PoolExhaustedError`. Running low, it asks ``grow_soon`` to grow ahead."""
        free = self._free
        try:
            raw = free.pop()
        except IndexError:
            raw = self._refill()
        if len(free) < self._low and not self._growing and self._grow_soon is not None and self._created < self._max:
            self._growing = True
            self._grow_soon(self._grow_ahead)
        self._taken += 1
        return raw

    def _grow_ahead(self) -> None:
        """On the waiter thread: reclaim what the device passed, and if the pool is still low, create a chunk of
        events, `_AHEAD_STEP` at a time under the lock: a take that finds the pool empty meanwhile waits for the
        next few rather than make its own chunk. A failing device is left to the takes to report."""
        try:
            if self._reclaim is not None:
                self._reclaim(False, False)  # (skipped if a take is reclaiming meanwhile)
            if len(self._free) >= self._low:
                return
            left, counted = self._grow_by, False
            while left > 0:
                try:
                    n = self._step(left)
                except BackendError:
                    return
                if not n:
                    return
                self._grows += not counted  # (one growth, however many steps)
                counted = True
                left -= n
                time.sleep(_AHEAD_PAUSE_S)  # (the GIL to the others between steps: host events hold it throughout)
        finally:
            self._growing = False

    def _step(self, limit: int) -> int:
        """Create up to `_AHEAD_STEP` events (at most ``limit``) under the lock, and free them: a take meanwhile
        waits for one step, never for a whole growth. Returns how many; 0 when closed or at the bound. A
        `BackendError` is raised once the events made before it are kept."""
        with self._lock:
            n = min(_AHEAD_STEP, limit, self._max - self._created)
            if self._closed or n <= 0:
                return 0
            fresh: list[Any] = []
            try:
                for _ in range(n):
                    fresh.append(self._device.create_event(self._timing))
            finally:
                self._created += len(fresh)
                self._free.extend(fresh)
            return n

    def _refill(self) -> Any:
        reclaim = self._reclaim
        if reclaim is not None and reclaim(False, True):
            try:
                return self._free.pop()
            except IndexError:
                pass  # the reclaimed events were of the other kind
        try:
            return self._grow()
        except PoolExhaustedError:
            if reclaim is None:
                raise
        while True:  # at the bound: what the device has passed, else wait for what it has not (where allowed)
            reclaim(True, True)
            try:
                return self._free.pop()
            except IndexError:
                pass
            ahead = 0 if self._wait_released is None else self._wait_released(self._timing)
            if ahead is not None:
                raise PoolExhaustedError(self._exhausted(ahead))

    def reserve(self, n: int) -> int:
        """Create events until ``n`` are free (at most up to the bound), a `_step` at a time. Returns how many were
        created. A worker thread's job (`Device.prepare`): about 7 µs per event on CUDA."""
        made = 0
        while (k := self._step(n - len(self._free))) > 0:
            made += k
        return made

    def bound(self) -> int:
        """The most events this pool may create (``max_events``)."""
        return self._max

    def free_count(self) -> int:
        """Events ready to be taken now (a snapshot). Hot."""
        return len(self._free)

    def running_low(self) -> bool:
        """Whether fewer events are free than one growth makes (the next takes may create events). Hot."""
        return len(self._free) < self._grow_by

    def give(self, raw: Any) -> None:
        """Return an event the device has passed. After `close` the event is destroyed instead."""
        if self._closed:
            self.discard(raw)
            return
        self._free.append(raw)

    def give_many(self, raws: list[Any]) -> None:
        """`give` each of ``raws`` (a harvest's batch)."""
        if self._closed:
            for raw in raws:
                self.discard(raw)
            return
        self._free.extend(raws)

    def discard(self, raw: Any) -> None:
        """Destroy an event taken from this pool that will not come back (its device is closing or failed):
        ``created`` counts down, so `stats` stays true."""
        with self._lock:
            self._created -= 1
        self._device.destroy_event(raw)

    def _grow(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
            # Where events are costly (CUDA: ~7 µs each) they are made ahead on the waiter thread; a take that
            # finds none makes a step's worth itself (~60 µs), not a whole growth (a loop's thread would stall).
            n = 16 if not self._created else _AHEAD_STEP if self._grow_soon is not None else self._grow_by
            n = min(n, self._max - self._created)
            if n <= 0:
                raise PoolExhaustedError(self._exhausted())
            fresh = [self._device.create_event(self._timing) for _ in range(n)]
            self._created += n
            self._grows += 1
            raw = fresh.pop()
            self._free.extend(fresh)
            return raw

    def trim(self, keep: int) -> int:
        """Destroy free events beyond ``keep``; returns how many. ``created`` counts down by as many."""
        gone = 0
        with self._lock:
            while len(self._free) > keep:
                try:
                    raw = self._free.pop(0)  # the least recently used
                except IndexError:
                    break
                self._device.destroy_event(raw)
                self._created -= 1
                gone += 1
        return gone

    def _exhausted(self, ahead: int = 0) -> str:
        kind = "timing" if self._timing else "non-timing"
        head = f"{self._device.name}: all {self._max} {kind} events are in use"
        if not ahead:
            return (
                f"{head}. Release events you no longer need (event.release(), or let scopes close), or open the "
                "device with a larger max_events"
            )
        synchronize = "`await device.asynchronize()`, or " if self._timing else ""
        return (
            f"{head}, and {ahead} of them are released but still ahead of the device: a released event comes "
            "back only once the device has run past its record, and an event loop's thread does not wait for "
            f"that. In a task, wait for the device before recording more ({synchronize}`await event.wait()` "
            "before `event.release()`), or open the device with a larger max_events"
        )

    def stats(self) -> PoolStats:
        with self._lock:  # (a growth adds to ``created`` and ``free`` together)
            free, created = len(self._free), self._created
        return PoolStats(
            self._timing, created, free, created - free, self._taken, self._grows, self._max, self._growing
        )

    def close(self) -> None:
        """Destroy the free events; events still in use are destroyed as they are given back."""
        with self._lock:
            self._closed = True
            while self._free:
                self._device.destroy_event(self._free.pop())
                self._created -= 1
