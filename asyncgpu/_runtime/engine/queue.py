"""The wait queues: the pending waits of each stream in record order, and finding the completed ones with few
queries (only a stream's head is queried; a done head tells about the waits behind it)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from asyncgpu._backends.contract import BackendDevice
from asyncgpu._runtime.engine.predict import DUE_MARGIN_NS, MAX_POLL_NS, Prediction, _now
from asyncgpu._runtime.engine.waiter import EARLY, FIRED, KIND_TRIO, Waiter, _Queue, _tells


class WaitQueues(Prediction):
    """The engine's queues and their looks (a part of `Engine`; its state is set in `Engine.__init__`)."""

    _dev: BackendDevice
    _lock: threading.Lock
    _cv: threading.Condition
    _live: int  # pending waits (not yet fired or withdrawn)
    _sleeping: bool
    _closed: bool
    _thread: threading.Thread | None
    _wake_at_ns: int
    _per_loop: dict[Any, list[int]]
    covered_until: dict[Any, int]
    _callbacks: deque[Waiter]
    _jobs: deque[Callable[[], None]]

    def _gone_locked(self, w: Waiter) -> None:
        self._live -= 1
        w.count[0] -= 1

    def pending_for(self, loop: Any) -> int:
        """How many waits of ``loop`` (an asyncio loop or a trio token) are pending here. Never blocks."""
        cell = self._per_loop.get(loop)
        return cell[0] if cell is not None else 0

    # -- finding completions ------------------------------------------------------------------------------
    def collect(self, skip_covered: bool = False, due_only: bool = False, limit: int = 0) -> list[Waiter]:
        """Query the head of every stream with pending waits and pop what completed (any thread). Returns the
        waiters to resume (not yet resumed). ``skip_covered``: leave the heads of loops whose poller covers them
        (the waiter thread). ``due_only`` (a loop's poller): leave a head predicted to complete later than
        (twice its spread + `DUE_MARGIN_NS`) from now, unless it was last looked at `MAX_POLL_NS` ago.
        ``limit``: stop once that many are popped (the rest stay at their streams' heads for the next look).
        Raises `BackendError` when the device failed."""
        fired: list[Waiter] = []
        query = self._dev.query
        now = _now()
        covered = self.covered_until if skip_covered else None
        with self._lock:
            for qs in self._queues.values():
                if limit and len(fired) >= limit:
                    break
                q = qs.waits
                while q:
                    w = q[0]
                    if w.state >= FIRED:
                        q.popleft()
                        continue
                    if covered and w.kind <= KIND_TRIO and covered.get(w.loop, 0) > now:
                        break
                    if due_only:
                        est = qs.estimate_ns.get(w.tag)
                        if est is not None and now - qs.looked_ns < MAX_POLL_NS:
                            last = qs.last_done_ns
                            lead = 2 * qs.spread_ns.get(w.tag, est >> 5) + DUE_MARGIN_NS
                            if now < (w.record_ns if w.record_ns > last else last) + est - lead:
                                break
                        qs.looked_ns = now
                    if not query(w.raw):
                        break
                    q.popleft()
                    self._learn(qs, w, now)
                    self._fire_locked(w, fired)
                    self._pop_done(qs, query, fired, limit - len(fired) if limit else -1)
                    break
        return fired

    def _pop_done(self, qs: _Queue, query: Callable[[Any], bool], fired: list[Waiter], most: int = -1) -> None:
        """Pop the waits at the front of ``qs`` that are complete, knowing the one just popped before them was:
        events of one stream complete in record order. The first guess is as many as last time (``qs.run``):
        paced completions cost about two queries per look (that one is done, the next is not), a burst three
        (the newest is done); a wrong guess costs a gallop and a binary search, O(log k) queries for k done. A
        wait whose event was released or re-recorded says nothing of its place: the search stops before it.
        ``most`` >= 0: pop at most that many (what was found done stays the next guess).
        Under the lock."""
        q = qs.waits
        n = len(q)
        if not n:
            return
        if most == 0:  # (the look's limit is reached: the next look starts here)
            qs.looked_ns = 0
            return
        g = min(qs.run, n)
        lo, hi = 0, n  # q[:lo] are done; q[hi:] are not (or cannot tell); n: the end, unknown
        if _tells(q[g - 1]):
            if query(q[g - 1].raw):
                lo = g
            else:
                hi = g - 1
        else:
            hi = g - 1
        if lo == g and g < n:  # the guess was short: is the next done, then the newest?
            if not (_tells(q[g]) and query(q[g].raw)):
                hi = g
            elif n == g + 1 or (_tells(q[-1]) and query(q[-1].raw)):
                lo = n
            else:
                lo, hi, step = g + 1, n - 1, 1
                while lo + step - 1 < hi:  # gallop: 1, 2, 4, ... past the last known done
                    i = lo + step - 1
                    if not (_tells(q[i]) and query(q[i].raw)):
                        hi = i
                        break
                    lo = i + 1
                    step <<= 1
        while lo < hi:  # halve what is left between
            mid = (lo + hi) >> 1
            w = q[mid]
            if not _tells(w):  # go one by one up to it
                while lo < mid and _tells(q[lo]) and query(q[lo].raw):
                    lo += 1
                break
            if query(w.raw):
                lo = mid + 1
            else:
                hi = mid
        done = lo
        if done:
            qs.run = done
        if 0 <= most < done:  # (``most``: how many more to pop at most; -1 all: the rest stay at the head)
            done = most
            qs.looked_ns = 0  # (a poller looks at this head next time, due or not)
        popleft, append = q.popleft, fired.append
        gone = 0
        for _ in range(done):
            w = popleft()
            state = w.state
            if state < FIRED:
                w.state = FIRED
                w.count[0] -= 1
                gone += 1
                if state != EARLY:  # (an owner woken early polls and sees the completion itself)
                    append(w)
        self._live -= gone

    def _fire_locked(self, w: Waiter, fired: list[Waiter]) -> None:
        early = w.state == EARLY  # its owner (a plain thread, or a loop's only wait) polls and sees it itself
        w.state = FIRED
        self._gone_locked(w)
        if not early:
            fired.append(w)
