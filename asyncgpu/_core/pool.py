"""A per-device pool of recycled backend events.

Events are created in chunks on demand, up to ``max_events``; in the steady state `take` and `give` only move an
event between a list and the caller. An event is given back only once the device can no longer touch it (the
caller guarantees this: see `asyncgpu._event.Event.release`). Thread-safe: `take` and `give` may be called from
any thread (list append/pop are atomic under the GIL; growth takes a lock).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from .._backends.contract import BackendDevice
from .._errors import PoolExhaustedError

__all__ = ["EventPool", "PoolStats"]


@dataclass(frozen=True)
class PoolStats:
    """Counters of one pool. ``created`` only grows: in a steady state it stays flat while ``taken`` grows."""

    timing: bool
    created: int  #: events created so far: the high-water mark (the pool grows only when none is free)
    free: int  #: events ready to be taken
    in_use: int  #: events held by callers or waiting for the device to pass them
    taken: int  #: total takes (counted without a lock: a close estimate under concurrent takes)
    grows: int  #: times the pool had to create events
    max_events: int


class EventPool:
    def __init__(
        self,
        device: BackendDevice,
        *,
        timing: bool,
        max_events: int,
        grow_by: int = 64,
        reclaim: Callable[[], None] | None = None,
    ) -> None:
        self._device = device
        self._reclaim = reclaim  # at the bound: give back released events the device has passed, then retry
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
        """A free backend event (hot). Grows the pool when empty; raises `PoolExhaustedError` at the bound."""
        try:
            raw = self._free.pop()
        except IndexError:
            try:
                raw = self._grow()
            except PoolExhaustedError:
                if self._reclaim is None:
                    raise
                self._reclaim()  # releases the waiter thread has not looked at yet
                try:
                    raw = self._free.pop()
                except IndexError:
                    raise PoolExhaustedError(self._exhausted()) from None
        self._taken += 1
        return raw

    def give(self, raw: Any) -> None:
        """Return an event the device has passed. After `close` the event is destroyed instead."""
        if self._closed:
            self._device.destroy_event(raw)
            return
        self._free.append(raw)

    def _grow(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
            n = min(self._grow_by if self._created else 16, self._max - self._created)
            if n <= 0:
                raise PoolExhaustedError(self._exhausted())
            fresh = [self._device.create_event(self._timing) for _ in range(n)]
            self._created += n
            self._grows += 1
            raw = fresh.pop()
            self._free.extend(fresh)
            return raw

    def _exhausted(self) -> str:
        kind = "timing" if self._timing else "non-timing"
        return (
            f"{self._device.name}: all {self._max} {kind} events are in use. Release events you no longer need "
            "(event.release(), or let scopes close), or open the device with a larger max_events"
        )

    def stats(self) -> PoolStats:
        free = len(self._free)
        return PoolStats(self._timing, self._created, free, self._created - free, self._taken, self._grows, self._max)

    def close(self) -> None:
        """Destroy the free events; events still in use are destroyed as they are given back."""
        self._closed = True
        while self._free:
            self._device.destroy_event(self._free.pop())
