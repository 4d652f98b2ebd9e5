"""The waiter thread: looks at the stream heads nobody else covers, sleeps until the next is worth a look (arming
loops' pollers and waking plain threads early on the way), runs completion callbacks and housekeeping jobs, and
hands what completed to its owners (`dispatch`)."""

from __future__ import annotations

import sys
from functools import partial
from typing import Any, Callable

from asyncgpu._base.errors import BackendError, ClosedError
from asyncgpu._runtime import loops
from asyncgpu._runtime.engine.poller import COLLECT_LIMIT, LINGER_NS, _arm, _resume
from asyncgpu._runtime.engine.predict import (
    MAX_POLL_NS,
    MIN_ON_THE_WAY_NS,
    MIN_POLL_NS,
    MIN_WINDOW_NS,
    SPIN_MARGIN_NS,
    _now,
)
from asyncgpu._runtime.engine.queue import WaitQueues
from asyncgpu._runtime.engine.waiter import (
    _NO_LOOP,
    EARLY,
    FIRED,
    KIND_CALLBACK,
    KIND_THREAD,
    KIND_TRIO,
    PENDING,
    Waiter,
    _call_back,
    report_unraisable,
)

#: while a loop's poller covers a head, the waiter thread leaves it this long at most (the poller kicks the thread
#: when it disarms): a thread that woke every linger would take the GIL from the very loop that polls
COVERED_NAP_NS = 1_000_000
MAX_SLEEP_S = 0.5  # a safety net: even if nothing interrupts a sleep, every wait is looked at this often


def _set_timer_slack_1ns() -> None:
    """Linux: make this thread's timed sleeps overshoot by ~µs instead of the default 50 µs slack."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def _run_job(job: Callable[[], None]) -> None:
    """Run a `Engine.run_soon` job on the waiter thread; one that raises never stops the thread."""
    try:
        job()
    except Exception as exc:  # noqa: BLE001 - the waiter thread must go on
        report_unraisable(exc, "asyncgpu: a housekeeping job failed on the waiter thread", job)


class WaiterThread(WaitQueues):
    """The engine's waiter thread and its hand-overs (a part of `Engine`)."""

    def kick(self) -> None:
        """Look now (called by host streams after they complete an event, and by a loop's poller as it disarms)."""
        if self._sleeping:
            with self._lock:
                self._cv.notify()

    def _run(self) -> None:
        _set_timer_slack_1ns()
        try:
            while self._step():
                pass
        except BaseException as exc:  # noqa: BLE001 - never leave a task hanging if the engine dies
            self._fail_all(BackendError(f"asyncgpu's waiter thread for {self._dev.name} died: {exc!r}"))
            raise

    def _step(self) -> bool:
        callbacks, jobs = self._callbacks, self._jobs
        while callbacks:
            _call_back(callbacks.popleft())
        while jobs:
            _run_job(jobs.popleft())
        with self._lock:
            while self._live == 0 and not callbacks and not jobs:
                self._queues = {k: qs for k, qs in self._queues.items() if qs.estimate_ns}  # what it learned stays
                self._per_loop.clear()
                if self._closed:
                    return False
                self._sleeping = True
                self._wake_at_ns = 1 << 62
                self._cv.wait()
                self._sleeping = False
            if self._closed:
                self._fail_all_locked(ClosedError(f"{self._dev.name} was closed while a task waited on it"))
                return True
            if not self._live:
                return True  # (callbacks or jobs to run)
        try:
            fired = self.collect(skip_covered=True, limit=COLLECT_LIMIT)
        except BackendError as err:
            self._fail_all(err)
            return True
        if fired:
            self.dispatch(fired, LINGER_NS)
            if COLLECT_LIMIT and len(fired) >= COLLECT_LIMIT:
                return True  # more may be done: look again at once (a loop handed the first part polls the rest)
        self._pause()
        return True

    def _pause(self) -> None:
        """Sleep until the next head is worth looking at; arm pollers and wake plain threads early on the way."""
        now = _now()
        wake_at = now + int(MAX_SLEEP_S * 1e9)
        arm: dict[Any, tuple[int, Any, int]] = {}  # loop -> (kind, loop, until)
        early: list[Waiter] = []
        covered_until = self.covered_until
        with self._lock:
            for qs in self._queues.values():
                q = qs.waits
                if not q:
                    continue
                w = q[0]
                if w.state >= FIRED:
                    wake_at = now  # a finished head: look again at once
                    continue
                if w.state == EARLY:
                    continue  # its owner polls, then calls finish() or rearm()
                kind = w.kind
                lid = w.loop
                covered = covered_until.get(lid, 0) if kind <= KIND_TRIO else 0
                est = qs.estimate_ns.get(w.tag)
                ready = max(w.record_ns, qs.last_done_ns)
                predicted = ready + (est or 0)
                if kind <= KIND_TRIO and est is not None:  # a loop polls in its window: keep it tight
                    missed = predicted + max(MIN_WINDOW_NS, 2 * qs.spread_ns.get(w.tag, est >> 5))
                else:
                    missed = predicted + max(MIN_WINDOW_NS, (est or 0) >> 2)
                if est is None or now > missed or (kind == KIND_THREAD and w.poll_until_ns < 0):
                    if covered > now:  # its loop's poller looks at it (and kicks this thread when it disarms)
                        t = now + COVERED_NAP_NS
                    else:
                        late = now - (ready if est is None else predicted)
                        t = now + min(max(late >> 3, MIN_POLL_NS), MAX_POLL_NS)
                elif kind <= KIND_THREAD:
                    start = predicted - self._lead_ns(kind, qs, w.tag, est)
                    if now < start:
                        # An unsteady estimate (its spread over an eighth of it) may be far too long: look on the
                        # way, halving the rest each time, rather than sleep past a completion that came sooner.
                        # And whatever the estimate, look at least every max(200 µs, est/32).
                        step = start - now
                        if qs.spread_ns.get(w.tag, 0) > est >> 3:
                            step = max(MIN_POLL_NS, step >> 1)
                        t = now + min(step, max(MIN_ON_THE_WAY_NS, est >> 5))
                    elif kind == KIND_THREAD or (w.count[0] == 1 and w.poll_until_ns >= 0 and covered <= now):
                        # a plain thread, or its loop's only wait here: its owner polls it (no hand-over at the end)
                        w.state = EARLY
                        w.poll_until_ns, w.sent_ns = missed, now
                        early.append(w)
                        continue
                    elif covered >= missed:
                        t = now + COVERED_NAP_NS
                    else:  # arm (or extend) the loop's poller to this head's window
                        if arm.get(lid, (0, 0, 0))[2] < missed:
                            arm[lid] = (kind, w.loop, missed)
                        covered_until[lid] = missed
                        t = missed
                elif now < predicted - SPIN_MARGIN_NS - (est >> 4):
                    t = predicted - SPIN_MARGIN_NS - (est >> 4)
                else:
                    t = now + MIN_POLL_NS  # a callback's completion is due: look often, without spinning
                if t < wake_at:
                    wake_at = t
            timeout = (wake_at - now) / 1e9
            if not (arm or early or timeout <= 0 or self._closed or self._callbacks or self._jobs):
                self._sleeping = True
                self._wake_at_ns = wake_at
                self._cv.wait(min(timeout, MAX_SLEEP_S))
                self._sleeping = False
        for w in early:  # the owner reads w.state (EARLY) and polls until w.poll_until_ns
            if w.kind == KIND_THREAD:
                w.target.release()
            else:
                loops.post(w.kind, w.loop, loops.resolve_here, w.kind, w.target, None, True)
        sent = _now()
        for kind, loop, until in arm.values():
            loops.post(kind, loop, _arm, kind, loop, self, until, sent)

    # -- waking --------------------------------------------------------------------------------------------
    def _fail_all(self, err: BaseException) -> None:
        with self._lock:
            self._fail_all_locked(err)

    def _fail_all_locked(self, err: BaseException) -> None:
        fired = []
        for qs in self._queues.values():
            for w in qs.waits:
                if w.state < FIRED:
                    parked = w.state == PENDING  # an EARLY owner is polling: it reads w.error on rearm
                    w.state = FIRED
                    w.error = err
                    if parked:
                        fired.append(w)
            qs.waits.clear()
        self._live = 0
        self._per_loop.clear()
        if fired:
            self.dispatch(fired, 0)  # takes no engine lock: safe here

    def dispatch(self, waiters: list[Waiter], linger_ns: int, here: Any = None) -> None:
        """Resume ``waiters`` (popped by `collect`): plain threads by their lock, callbacks on the waiter thread, each
        loop's tasks in one batch through its thread-safe entry point (arming its poller for ``linger_ns``) —
        except those of ``here`` (the calling loop's poller), which it resumes itself."""
        by_loop: dict[int, tuple[int, Any, list]] = {}
        mine = here.loop if here is not None else None
        last_loop: Any = _NO_LOOP  # (no waiter's loop: plain threads and callbacks have None)
        items: list[Waiter] = []
        own: list[Waiter] = []  # those of ``here``
        for w in waiters:
            loop = w.loop
            if loop is last_loop:  # (a batch is mostly one loop's)
                items.append(w)
                continue
            kind = w.kind
            if kind == KIND_THREAD:
                w.target.release()  # the blocked thread reads w.state, w.error
            elif kind == KIND_CALLBACK:
                if here is None:
                    _call_back(w)
                else:  # found by a loop's poller: callbacks run on the waiter thread, never in a loop
                    with self._lock:
                        self._callbacks.append(w)
                        self._cv.notify()
            elif loop is mine:
                last_loop, items = loop, own
                items.append(w)
            else:
                entry = by_loop.get(id(loop))
                if entry is None:
                    entry = by_loop[id(loop)] = (kind, loop, [])
                last_loop, items = loop, entry[2]
                items.append(w)
        if own and here is not None:
            _resume(here.kind, own, None)  # (a burst's rest in chunks, at the loop's next iterations)
        now = _now()
        for kind, loop, items in by_loop.values():
            then = None
            if linger_ns and self.pending_for(loop):
                until = now + linger_ns
                if self.covered_until.get(loop, 0) < until:
                    self.covered_until[loop] = until
                then = partial(_arm, kind, loop, self, until, now)
            loops.post(kind, loop, _resume, kind, items, then)
