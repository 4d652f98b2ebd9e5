"""The completion engine: one waiter thread per device resumes the tasks that await that device's events.

No Python ever runs on a CUDA driver callback thread. The waiter thread works like this:

* Pending waits are kept per stream, ordered by record sequence. A stream passes its events in order, so only
  the oldest pending event of each stream is queried (``cuEventQuery``, GIL released); when it is done, the
  ones behind it are checked at once.
* Each (stream, tag) pair learns how long its work takes from the moment the stream is free to completion
  ("fast down, slow up", so the estimate tracks the low end).
* With an estimate, the thread sleeps (timer slack 1 ns) until shortly before the predicted completion. A task
  awaiting from an event loop is then woken *early*: it polls the event itself between loop iterations for a
  bounded window (``Event.wait``), which removes the thread-to-loop wake from the critical path. How early is
  learned per loop kind: the measured delay from dispatch to the task's first poll (tracked near its upper
  end), plus a margin. Waits that cannot poll (deferred releases) are polled every 8 µs near their
  predicted completion. The thread never spins: it would hold the GIL the loop needs.
* Without an estimate (or after a missed early window) the thread polls with a back-off of 1/8 of the age of
  the wait (8 µs .. 1 ms), so the added latency stays a small fraction of the work's own duration.
* Every sleep is a timed wait on a condition. A new wait interrupts it only when it is due before the planned
  wake-up (a wait queued behind another on its stream never does), and a task that finishes polling only when
  other waits are pending: each needless wake-up costs the event loop a GIL hand-over.
* Woken tasks are resumed through their loop's own thread-safe entry point, batched per loop: asyncio (and
  uvloop) ``loop.call_soon_threadsafe``; trio ``TrioToken.run_sync_soon`` + ``reschedule``. A plain thread
  blocked in a wait (``Event.wait_sync(timeout_s=...)``, a channel's ``get``) is woken by releasing the lock it blocks
  on; it is woken early too, and polls with ``sched_yield`` between queries.
* A backend error (a sticky CUDA error) reaches every pending waiter as `BackendError`; nothing hangs.

Waiter states: PENDING (parked: the owner waits for a dispatch), EARLY (dispatched early, the owner polls),
FIRED (complete, or failed), CANCELLED (withdrawn by its owner).
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time
from typing import Any

from .._backends.contract import BackendDevice
from .._errors import BackendError, ClosedError
from . import loops

__all__ = ["Engine", "Waiter"]

PENDING, EARLY, FIRED, CANCELLED = 0, 1, 2, 3
KIND_ASYNCIO, KIND_TRIO, KIND_THREAD = loops.ASYNCIO, loops.TRIO, loops.THREAD  # who waits: a loop's task, a thread
KIND_RELEASE = 3  #: a deferred release: the target is called with the raw event on the waiter thread
RELEASE_LAST = 1 << 62  #: the ``seq`` of a deferred release that queues behind every real wait of its stream

MIN_POLL_NS = 8_000
MAX_POLL_NS = 1_000_000
LEAD_MARGIN_NS = 10_000  #: an early wake comes (learned delivery delay + this + est/32) before completion
INITIAL_DELIVERY_NS = {0: 30_000, 1: 60_000, 2: 20_000}  #: first guesses of the dispatch-to-poll delay (asyncio,
#: trio, a blocked thread)
MIN_WINDOW_NS = 60_000  #: a woken task polls until predicted + max(this, est/4), then parks again
MIN_SPIN_WINDOW_NS = 50_000
SPIN_MARGIN_NS = 20_000
EARLY_MAX = 4  #: at most this many tasks poll at once; other waits are resumed when the thread sees them done
MAX_SLEEP_S = 0.5  # a safety net: even if nothing interrupts a sleep, every wait is looked at this often

_now = time.perf_counter_ns


class Waiter:
    """One pending wait. Created by `Engine.add`; the engine thread and the owner's loop read its fields."""

    __slots__ = (
        "raw",
        "key",
        "seq",
        "tag",
        "record_ns",
        "kind",
        "loop",
        "target",
        "state",
        "error",
        "early_ok",
        "poll_until_ns",
        "dispatch_ns",
        "woke_ns",
    )

    def __init__(
        self, raw: Any, key: int, seq: int, tag: Any, record_ns: int, kind: int, loop: Any, target: Any
    ) -> None:
        self.raw, self.key, self.seq, self.tag, self.record_ns = raw, key, seq, tag, record_ns
        self.kind, self.loop, self.target = kind, loop, target
        self.state = PENDING
        self.error: BaseException | None = None
        self.early_ok = kind <= KIND_THREAD
        self.poll_until_ns = self.dispatch_ns = self.woke_ns = 0  # woke_ns: set by the owner's first poll


def _set_timer_slack_1ns() -> None:
    """Linux: make this thread's timed sleeps overshoot by ~µs instead of the default 50 µs slack."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


class Engine:
    """The waiter thread of one device. `add`, `cancel`, `finish` and `rearm` may be called from any thread."""

    def __init__(self, device: BackendDevice) -> None:
        self._dev = device
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._heaps: dict[int, list] = {}
        self._live = 0
        self._early = 0  # waiters in state EARLY
        self._tiebreak = itertools.count()
        self._sleeping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._estimate_ns: dict[tuple, int] = {}
        self._last_done_ns: dict[int, int] = {}
        self._delivery_ns = dict(INITIAL_DELIVERY_NS)
        self._wake_at_ns = 0  # when the sleeping thread plans to look again
        device.on_progress = self.kick

    # -- called from loops / other threads ----------------------------------------------------------------
    def add(self, raw: Any, key: int, seq: int, tag: Any, record_ns: int, kind: int, loop: Any, target: Any) -> Waiter:
        """Register a wait. Raises `ClosedError` after `close`."""
        w = Waiter(raw, key, seq, tag, record_ns, kind, loop, target)
        with self._lock:
            if self._closed:
                raise ClosedError(f"{self._dev.name} is closed: open it again with asyncgpu.device({self._dev.name!r})")
            heap = self._heaps.get(key)
            if heap is None:
                heap = self._heaps[key] = []
            while heap and heap[0][2].state >= FIRED:  # finished or withdrawn: drop, so the head is live
                heapq.heappop(heap)
            heapq.heappush(heap, (seq, next(self._tiebreak), w))
            self._live += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"asyncgpu-{self._dev.name}-waiter", daemon=True)
                self._thread.start()
            elif self._sleeping and heap[0][2] is w and self._due_ns(w) < self._wake_at_ns:
                self._cv.notify()
        return w

    def _due_ns(self, w: Waiter) -> int:
        """When the thread should first look at a new head ``w`` (0: at once). Under the lock."""
        est = self._estimate_ns.get((w.key, w.tag))
        if est is None:
            return 0
        predicted = max(w.record_ns, self._last_done_ns.get(w.key, 0)) + est
        if w.early_ok:
            return predicted - self._delivery_ns[w.kind] - LEAD_MARGIN_NS - (est >> 5)
        return predicted - SPIN_MARGIN_NS - (est >> 4)

    def cancel(self, w: Waiter) -> bool:
        """Withdraw a wait. True if it was parked and no dispatch will ever reach its owner."""
        with self._lock:
            state = w.state
            if state == PENDING or state == EARLY:
                w.state = CANCELLED
                self._live -= 1
                self._early -= state == EARLY
            return state == PENDING

    def finish(self, w: Waiter, now_ns: int) -> None:
        """The owner of an EARLY waiter saw its event complete at ``now_ns``."""
        with self._lock:
            if w.state == EARLY:
                w.state = FIRED
                self._live -= 1
                self._early -= 1
                self._learn(w, now_ns)
                self._learn_delivery(w)
                if self._live and self._sleeping:
                    self._cv.notify()

    def rearm(self, w: Waiter, target: Any) -> bool:
        """The owner of an EARLY waiter gave up polling: park it again (no second early wake).

        False if the engine already saw the event complete, or failed it (then ``w.error`` is set): the owner
        must not park.
        """
        with self._lock:
            if w.state != EARLY:
                return False
            self._learn_delivery(w)
            w.state = PENDING
            self._early -= 1
            w.early_ok = False
            w.target = target
            if self._sleeping:
                self._cv.notify()
            return True

    def kick(self) -> None:
        """Look now (called by host streams after they complete an event)."""
        if self._sleeping:
            with self._lock:
                self._cv.notify()

    def close(self) -> None:
        """Stop the thread. Pending waits fail with `ClosedError`."""
        with self._lock:
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def collect_now(self) -> None:
        """Query pending waits from the calling thread and resume what completed (a pool at its bound uses
        this so that releases the waiter thread has not looked at yet are not counted as in use)."""
        with self._lock:
            keys = list(self._heaps)
        try:
            fired = self._collect(keys)
        except BackendError:
            return  # the waiter thread reports it to every waiter
        if fired:
            self._dispatch(fired, False)

    @property
    def pending(self) -> int:
        return self._live

    def estimate_ns(self, key: int, tag: Any) -> int | None:
        return self._estimate_ns.get((key, tag))

    # -- the waiter thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        _set_timer_slack_1ns()
        try:
            while self._step():
                pass
        except BaseException as exc:  # noqa: BLE001 - never leave a task hanging if the engine dies
            self._fail_all(BackendError(f"asyncgpu's waiter thread for {self._dev.name} died: {exc!r}"))
            raise

    def _step(self) -> bool:
        with self._lock:
            while self._live == 0:
                self._heaps.clear()
                if self._closed:
                    return False
                self._sleeping = True
                self._wake_at_ns = 1 << 62
                self._cv.wait()
                self._sleeping = False
            if self._closed:
                self._fail_all_locked(ClosedError(f"{self._dev.name} was closed while a task waited on it"))
                return True
            keys = list(self._heaps)
        try:
            fired = self._collect(keys)
        except BackendError as err:
            self._fail_all(err)
            return True
        if fired:
            self._dispatch(fired, False)
        early = self._pause()
        if early:
            self._dispatch(early, True)
        return True

    def _collect(self, keys: list[int]) -> list[Waiter]:
        """Query the head of each stream; pop what completed. Returns the waiters to resume."""
        fired: list[Waiter] = []
        query = self._dev.query
        for key in keys:
            done_raw = None
            while True:
                with self._lock:
                    heap = self._heaps.get(key)
                    if not heap:
                        break
                    w = heap[0][2]
                    if w.state >= FIRED:
                        heapq.heappop(heap)
                        continue
                    if w.raw is done_raw:  # several waits on one event
                        heapq.heappop(heap)
                        self._fire_locked(w, fired)
                        continue
                if not query(w.raw):
                    break
                now = _now()
                with self._lock:
                    if heap and heap[0][2] is w and w.state < FIRED:
                        heapq.heappop(heap)
                        self._learn(w, now)
                        self._fire_locked(w, fired)
                        done_raw = w.raw
        return fired

    def _fire_locked(self, w: Waiter, fired: list[Waiter]) -> None:
        early = w.state == EARLY  # its owner is polling and sees the completion itself
        w.state = FIRED
        self._live -= 1
        if early:
            self._early -= 1
        else:
            fired.append(w)

    def _learn(self, w: Waiter, now: int) -> None:
        key = w.key
        ready = max(w.record_ns, self._last_done_ns.get(key, 0))
        if now <= self._last_done_ns.get(key, 0):
            return
        self._last_done_ns[key] = now
        if w.kind == KIND_RELEASE:
            return
        sample = now - ready
        k = (key, w.tag)
        est = self._estimate_ns.get(k)
        self._estimate_ns[k] = sample if est is None or sample < est else est + (sample - est) // 8

    def _learn_delivery(self, w: Waiter) -> None:
        """Track the dispatch-to-first-poll delay near its upper end (fast up, slow down)."""
        if w.woke_ns <= w.dispatch_ns:
            return
        sample = w.woke_ns - w.dispatch_ns
        est = self._delivery_ns[w.kind]
        self._delivery_ns[w.kind] = est + ((sample - est) >> 2 if sample > est else -((est - sample) >> 5))

    def delivery_ns(self, kind: int = KIND_ASYNCIO) -> int:
        """The learned delay from an early dispatch to the task's first poll, in ns."""
        return self._delivery_ns[kind]

    def _pause(self) -> list[Waiter]:
        """Sleep until the next head is worth looking at; returns heads to wake early instead."""
        now = _now()
        wake_at = now + int(MAX_SLEEP_S * 1e9)
        early: list[Waiter] = []
        with self._lock:
            heads = [h[0][2] for h in self._heaps.values() if h]
            for w in heads:
                if w.state >= FIRED:
                    return early  # a finished head: look again at once
                ready = max(w.record_ns, self._last_done_ns.get(w.key, 0))
                age = now - ready
                backoff = now + min(max(age >> 3, MIN_POLL_NS), MAX_POLL_NS)
                est = self._estimate_ns.get((w.key, w.tag))
                if w.state == EARLY:
                    t = now + int(MAX_SLEEP_S * 1e9)  # its owner polls, then calls finish() or rearm()
                elif est is None:
                    t = backoff
                else:
                    predicted = ready + est
                    if w.early_ok and self._early < EARLY_MAX:
                        wake = predicted - self._delivery_ns[w.kind] - LEAD_MARGIN_NS - (est >> 5)
                        if now >= wake:
                            w.state = EARLY
                            self._early += 1
                            w.dispatch_ns = now
                            w.poll_until_ns = max(predicted, now) + max(MIN_WINDOW_NS, est >> 2)
                            early.append(w)
                            t = now + int(MAX_SLEEP_S * 1e9)
                        else:
                            t = wake
                    elif now < predicted - SPIN_MARGIN_NS - (est >> 4):
                        t = predicted - SPIN_MARGIN_NS - (est >> 4)
                    elif now < predicted + max(MIN_SPIN_WINDOW_NS, est >> 2):
                        t = now + MIN_POLL_NS  # the completion is due: look often, without spinning
                    else:
                        t = backoff
                if t < wake_at:
                    wake_at = t
            timeout = (wake_at - now) / 1e9
            if early or timeout <= 0 or self._closed:
                return early
            self._sleeping = True
            self._wake_at_ns = wake_at
            self._cv.wait(min(timeout, MAX_SLEEP_S))
            self._sleeping = False
        return early

    # -- waking tasks -------------------------------------------------------------------------------------
    def _fail_all(self, err: BaseException) -> None:
        with self._lock:
            self._fail_all_locked(err)

    def _fail_all_locked(self, err: BaseException) -> None:
        fired = []
        for heap in self._heaps.values():
            for _, _, w in heap:
                if w.state < FIRED:
                    parked = w.state == PENDING  # an EARLY owner is polling: it reads w.error on rearm
                    w.state = FIRED
                    w.error = err
                    if parked:
                        fired.append(w)
            heap.clear()
        self._live = self._early = 0
        if fired:
            self._dispatch(fired, False)  # takes no engine lock: safe here

    def _dispatch(self, waiters: list[Waiter], early: bool) -> None:
        by_loop: dict[int, tuple[Any, int, list]] = {}
        for w in waiters:
            if w.kind == KIND_RELEASE:
                if w.error is None:
                    w.target(w.raw)
                continue
            if w.kind == KIND_THREAD:
                w.target.release()  # a lock the blocked thread waits on (GIL released); it reads w.state, w.error
                continue
            entry = by_loop.get(id(w.loop))
            if entry is None:
                entry = by_loop[id(w.loop)] = (w.loop, w.kind, [])
            entry[2].append((w.target, early, w.error))
        for loop, kind, items in by_loop.values():
            loops.deliver(kind, loop, items)
