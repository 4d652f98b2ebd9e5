"""The completion engine: one waiter thread per device, and the loops' own pollers, resume whoever awaits an event.

No Python ever runs on a CUDA driver callback thread. How completions are found and delivered:

* Pending waits are kept per stream in record order. A stream passes its events in order, so only the oldest
  pending wait of each stream (its *head*) is queried (``cuEventQuery``, never blocks); when it is done, the
  waits behind it are resolved at once: the next is queried (paced completions: one query), then the newest
  (a burst: all done), else a gallop and a binary search find where the done ones end: O(log k) queries for k.
* Each (stream, tag) learns how long its work takes from the moment the stream is free to completion, and how
  much that varies ("fast down, slow up": the estimate tracks the low end). While the spread is large (the work
  changed), the thread does not sleep to the prediction in one go: it looks on the way, halving the rest.
* **Loops poll, the thread plans.** Shortly before a head of an event loop's task is predicted to complete
  (the loop's learned wake-up delay plus a margin plus the learned spread before it), the waiter thread *arms*
  that loop's `Poller`: between the loop's iterations it queries the heads of the device's streams that are due
  (predicted within twice their spread + `DUE_MARGIN_NS`, or not looked at for `MAX_POLL_NS`) and resumes what
  completed, in the loop's own thread, without a thread-to-loop hand-over. It lingers while completions
  keep coming (a burst, or completions paced closer than a wake-up), then disarms; the thread takes over again.
  While a poller covers a loop, the thread leaves that loop's heads alone (a thread that keeps waking would
  contend for the GIL with the very loop that polls) until the poller disarms and kicks it.
* Without an estimate (or once a prediction is missed by more than its window), the thread polls that head
  with a back-off of 1/8 of how late it is (8 µs .. `MAX_POLL_NS`): each head has its own schedule, so one
  wait's age or one missed prediction never sets another's latency. Between looks the thread sleeps in a
  timed wait on a condition (GIL released, timer slack 1 ns); a new wait interrupts it only when it is due
  before the planned look.
* Completions the thread finds are delivered in one batch per loop, through the loop's thread-safe entry point
  (asyncio/uvloop ``call_soon_threadsafe``; trio ``TrioToken.run_sync_soon`` + ``reschedule``), which also arms
  the loop's poller for a short linger (more of the burst may follow). A large batch is resumed
  `RESUME_CHUNK` waiters per loop iteration, so the loop's timers and other tasks run between the chunks; and a
  look pops at most `COLLECT_LIMIT` waits, so a burst's first part is handed over before the rest is popped (the
  loop's poller, armed by that hand-over, pops the rest between its iterations).
* A plain thread blocked in a wait (``Event.wait_sync(timeout_s=...)``, a channel's ``get_sync``) is woken by
  releasing the lock it blocks on; it is woken *early*, shortly before the predicted completion, and finishes
  with the driver's own wait or polls.
* A backend error (a sticky CUDA error) reaches every pending waiter as `BackendError`; nothing hangs.

Waiter states: PENDING (parked), EARLY (its owner, woken early, polls for itself), FIRED (complete, or failed),
CANCELLED (withdrawn by its owner).
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import deque
from functools import partial
from types import SimpleNamespace
from typing import Any, Callable

from asyncgpu._backends.contract import BackendDevice
from asyncgpu._base.errors import BackendError, ClosedError
from asyncgpu._runtime import loops

__all__ = ["Engine", "Poller", "Waiter", "report_unraisable"]

PENDING, EARLY, FIRED, CANCELLED = 0, 1, 2, 3
KIND_ASYNCIO, KIND_TRIO, KIND_THREAD = loops.ASYNCIO, loops.TRIO, loops.THREAD  # who waits: a loop's task, a thread
KIND_CALLBACK = 3  #: the target is called with the raw event on the waiter thread once it is complete

MIN_POLL_NS = 8_000
MAX_POLL_NS = 100_000  #: the longest the thread leaves a head unlooked at whose completion it cannot predict
#: with a prediction, the thread still looks on the way at least every max(this, the estimate / 32): an
#: estimate learned from slower work (a burst after a hold, a shorter run after a longer one) costs at most that
MIN_ON_THE_WAY_NS = 200_000
LEAD_MARGIN_NS = 10_000  #: a poller is armed (learned wake-up delay + this + twice the spread) before completion
INITIAL_DELIVERY_NS = {0: 30_000, 1: 60_000, 2: 20_000}  #: first guesses of the arm-to-first-poll delay (asyncio,
#: trio, a blocked thread)
MIN_WINDOW_NS = 60_000  #: a prediction is missed once it is late by max(this, twice the spread) for a loop's wait
#: (whose poller, or the task itself, polls until then: the loop's CPU), max(this, est/4) for a plain thread
LINGER_NS = 60_000  #: a poller keeps polling this long after the last completion it saw (or was handed)
#: while a loop's poller covers a head, the waiter thread leaves it this long at most (the poller kicks the thread
#: when it disarms): a thread that woke every linger would take the GIL from the very loop that polls
COVERED_NAP_NS = 1_000_000
MIN_SPIN_WINDOW_NS = 50_000
SPIN_MARGIN_NS = 20_000
RESUME_CHUNK = 256  #: waiters resumed per loop iteration when the thread hands a loop a batch
#: a look pops at most about this many completed waits (whole streams' runs, the last one cut): a burst's first
#: waits are handed over while the rest still wait to be popped (0: no limit; benchmarks compare the two)
COLLECT_LIMIT = 256
#: a loop's poller queries a head whose completion the engine predicts only from (twice its spread + this) before
#: the prediction on, or once `MAX_POLL_NS` passed since its last look: a query costs 0.4-2.5 µs of the loop's
#: time (one H200 host: 1,000 waits at 8k/s, 44 -> 27 queries a wait, p99 399 -> 260 µs on asyncio)
DUE_MARGIN_NS = 20_000
POLL_DUE_ONLY = True  #: False: a poller queries every head at every pass (benchmarks compare the two)
MAX_SLEEP_S = 0.5  # a safety net: even if nothing interrupts a sleep, every wait is looked at this often

_now = time.perf_counter_ns
_NO_LOOP = [0]  # the count cell of waits that no loop owns (plain threads, callbacks)


class Waiter:
    """One pending wait. Created by `Engine.add`; the engine thread, pollers and the owner read its fields."""

    __slots__ = (
        "raw",
        "key",
        "seq",
        "tag",
        "record_ns",
        "kind",
        "loop",
        "target",
        "owner",
        "count",
        "state",
        "error",
        "poll_until_ns",
        "sent_ns",
        "woke_ns",
    )

    def __init__(
        self, raw: Any, key: int, seq: int, tag: Any, record_ns: int, kind: int, loop: Any, target: Any, owner: Any
    ) -> None:
        self.raw, self.key, self.seq, self.tag, self.record_ns = raw, key, seq, tag, record_ns
        self.kind, self.loop, self.target, self.owner = kind, loop, target, owner
        self.count: list[int] = _NO_LOOP  # its loop's count of pending waits (`Engine.pending_for`)
        self.state = PENDING
        self.error: BaseException | None = None
        self.poll_until_ns = self.sent_ns = self.woke_ns = 0  # a plain thread's early wake: window, sent, woke

    def intact(self) -> bool:
        """Whether this wait's event still stands where it was recorded (not released, not re-recorded): only
        then may its completion tell about the waits around it on its stream."""
        o = self.owner
        return o is None or (o.raw is self.raw and o.seq == self.seq and o.key == self.key)


def _set_timer_slack_1ns() -> None:
    """Linux: make this thread's timed sleeps overshoot by ~µs instead of the default 50 µs slack."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


class _Queue:
    """The pending waits of one stream, in record order, and what the engine learned of that stream."""

    __slots__ = ("waits", "last_done_ns", "looked_ns", "estimate_ns", "spread_ns", "run")

    def __init__(self) -> None:
        self.waits: deque[Waiter] = deque()
        self.run = 1  # how many waits behind a done head were done the last time: the first guess next time
        self.last_done_ns = 0  # when a wait of this stream was last seen complete
        self.looked_ns = 0  # when a poller last queried this stream's head
        self.estimate_ns: dict[Any, int] = {}  # tag -> how long its work takes once the stream is free
        self.spread_ns: dict[Any, int] = {}  # tag -> how much that varies (mean absolute deviation)


class Engine:
    """The completion engine of one device. `add`, `cancel`, `finish`, `rearm` and `collect` may be called from
    any thread; the waiter thread starts on the first `add`."""

    def __init__(self, device: BackendDevice) -> None:
        self._dev = device
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._queues: dict[int, _Queue] = {}
        self._live = 0
        self._sleeping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._delivery_ns = dict(INITIAL_DELIVERY_NS)
        self._wake_at_ns = 0  # when the sleeping thread plans to look again
        # Keyed by the loop (an asyncio loop or a trio token) itself, not its id: a new loop may get a dead one's id.
        self._per_loop: dict[Any, list[int]] = {}  # loop -> [pending waits of that loop here]
        self.covered_until: dict[Any, int] = {}  #: loop -> until when that loop's poller polls here (ns)
        self._callbacks: deque[Waiter] = deque()  # complete callbacks a poller found: the thread runs them
        self._jobs: deque[Callable[[], None]] = deque()  # housekeeping handed over by `run_soon`
        device.on_progress = self.kick

    # -- called from loops / other threads ----------------------------------------------------------------
    def add(
        self,
        raw: Any,
        key: int,
        seq: int,
        tag: Any,
        record_ns: int,
        kind: int,
        loop: Any,
        target: Any,
        owner: Any = None,
    ) -> Waiter:
        """Register a wait for ``raw`` (recorded on the stream ``key`` as its ``seq``-th record). ``owner``: the
        `Event` it came from (None for an internal event nobody re-records). Raises `ClosedError` after `close`."""
        w = Waiter(raw, key, seq, tag, record_ns, kind, loop, target, owner)
        with self._lock:
            if self._closed:
                raise ClosedError(f"{self._dev.name} is closed: open it again with asyncgpu.device({self._dev.name!r})")
            qs = self._queues.get(key)
            if qs is None:
                qs = self._queues[key] = _Queue()
            q = qs.waits
            while q and q[0].state >= FIRED:  # finished or withdrawn (a thread that finished its own wait)
                q.popleft()
            if not q or q[-1].seq <= seq:
                q.append(w)
            else:  # recorded by another thread meanwhile: keep record order
                i = len(q) - 1
                while i > 0 and q[i - 1].seq > seq:
                    i -= 1
                q.insert(i, w)
            self._live += 1
            if kind <= KIND_TRIO:
                cell = self._per_loop.get(loop)
                if cell is None:
                    cell = self._per_loop[loop] = [0]
                cell[0] += 1
                w.count = cell
            if self._thread is None:
                self._start_locked()
            elif self._sleeping and q[0] is w and self._due_ns(qs, w) < self._wake_at_ns:
                self._cv.notify()
        return w

    def start(self) -> None:
        """Start the waiter thread now if it has not started (`Device.prepare`, from the device's worker thread:
        a thread's start waits for the new thread to run, milliseconds when the GIL is busy, which a loop's
        thread must not pay at its first wait). Any thread."""
        with self._lock:
            if self._thread is None and not self._closed:
                self._start_locked()

    def started(self) -> bool:
        """Whether the waiter thread has been started. Never blocks."""
        return self._thread is not None

    def _start_locked(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"asyncgpu-{self._dev.name}-waiter", daemon=True)
        self._thread.start()

    def run_soon(self, job: Callable[[], None]) -> None:
        """Run ``job()`` on the waiter thread soon: housekeeping that would stall the caller (a pool growing ahead
        of need). Any thread; never blocks. A job that raises is reported as unraisable; jobs still queued at
        `close` are dropped."""
        with self._lock:
            if self._closed:
                return
            self._jobs.append(job)
            if self._thread is None:
                self._start_locked()
            elif self._sleeping:
                self._cv.notify()

    def _due_ns(self, qs: _Queue, w: Waiter) -> int:
        """When the thread should first look at a new head ``w`` (0: at once). Under the lock."""
        est = qs.estimate_ns.get(w.tag)
        if est is None:
            return 0
        predicted = max(w.record_ns, qs.last_done_ns) + est
        if w.kind <= KIND_THREAD:
            return predicted - self._lead_ns(w.kind, qs, w.tag, est)
        return predicted - SPIN_MARGIN_NS - (est >> 4)

    def _lead_ns(self, kind: int, qs: _Queue, tag: Any, est: int) -> int:
        spread = qs.spread_ns.get(tag, est >> 5)
        return self._delivery_ns[kind] + LEAD_MARGIN_NS + min(2 * spread, est >> 3)

    def cancel(self, w: Waiter) -> bool:
        """Withdraw a wait. True if it was parked and no dispatch will ever reach its owner."""
        with self._lock:
            state = w.state
            if state == PENDING or state == EARLY:
                w.state = CANCELLED
                self._gone_locked(w)
            return state == PENDING

    def _gone_locked(self, w: Waiter) -> None:
        self._live -= 1
        w.count[0] -= 1

    def pending_for(self, loop: Any) -> int:
        """How many waits of ``loop`` (an asyncio loop or a trio token) are pending here. Never blocks."""
        cell = self._per_loop.get(loop)
        return cell[0] if cell is not None else 0

    def finish(self, w: Waiter, now_ns: int) -> None:
        """The owner (a plain thread, or a loop's task) of the EARLY waiter ``w`` saw its event complete at
        ``now_ns``."""
        with self._lock:
            if w.state == EARLY:
                w.state = FIRED
                self._gone_locked(w)
                qs = self._queues.get(w.key)
                if qs is not None:
                    self._learn(qs, w, now_ns)
                self._learn_delivery(w.kind, w.woke_ns - w.sent_ns)
                if self._live and self._sleeping:
                    self._cv.notify()

    def rearm(self, w: Waiter, target: Any) -> bool:
        """The owner of the EARLY waiter ``w`` gave up polling: park it again (no second early wake).

        False if the engine already saw the event complete, or failed it (then ``w.error`` is set): the owner
        must not park.
        """
        with self._lock:
            if w.state != EARLY:
                return False
            self._learn_delivery(w.kind, w.woke_ns - w.sent_ns)
            w.state = PENDING
            w.target = target
            w.poll_until_ns = -1  # no second early wake
            if self._sleeping:
                self._cv.notify()
            return True

    def kick(self) -> None:
        """Look now (called by host streams after they complete an event, and by a loop's poller as it disarms)."""
        if self._sleeping:
            with self._lock:
                self._cv.notify()

    def close(self) -> None:
        """Stop the thread. Pending waits fail with `ClosedError`."""
        with self._lock:
            self._closed = True
            self._jobs.clear()
            self._cv.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def pending(self) -> int:
        return self._live

    def estimate_ns(self, key: int, tag: Any) -> int | None:
        qs = self._queues.get(key)
        return None if qs is None else qs.estimate_ns.get(tag)

    def delivery_ns(self, kind: int = KIND_ASYNCIO) -> int:
        """The learned delay from arming a loop's poller (or waking a thread) to its first poll, in ns."""
        return self._delivery_ns[kind]

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

    def _learn(self, qs: _Queue, w: Waiter, now: int) -> None:
        """``w``, the head of its stream, was seen complete at ``now``: a sample of how long its work takes."""
        last = qs.last_done_ns
        if now <= last:
            return
        qs.last_done_ns = now
        if w.kind == KIND_CALLBACK:
            return
        took = now - max(w.record_ns, last)
        tag = w.tag
        est = qs.estimate_ns.get(tag)
        if est is None:
            qs.estimate_ns[tag] = took
            return
        qs.estimate_ns[tag] = took if took < est else est + (took - est) // 8
        spread = qs.spread_ns.get(tag, est >> 5)
        qs.spread_ns[tag] = spread + (abs(took - est) - spread) // 8

    def _learn_delivery(self, kind: int, sample: int) -> None:
        """Track the arm-to-first-poll delay near its upper end: up by a quarter, down by a sixteenth of the
        difference, a sample counting at most twice the current estimate (one stall moves it little)."""
        if sample <= 0:
            return
        est = self._delivery_ns[kind]
        sample = min(sample, 2 * est)
        self._delivery_ns[kind] = est + ((sample - est) >> 2 if sample > est else -((est - sample) >> 4))

    def learn_delivery(self, kind: int, sent_ns: int) -> None:
        """A poller's arm message sent at ``sent_ns`` reached its loop now (called in that loop's thread)."""
        self._learn_delivery(kind, _now() - sent_ns)

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


class Poller:
    """One event loop's poller: while armed for some engines, it runs between the loop's iterations, queries those
    devices' stream heads and resumes what completed, lingering `LINGER_NS` after each completion it sees. Lives
    in its loop's thread only; made by `_arm`.

    asyncio (uvloop): each pass reschedules the next with the loop's ``call_soon``. trio: the passes run in a system
    task of the run (``asyncgpu-poller``) that checkpoints between passes and parks while disarmed. trio's only
    sync "call soon" is the thread-safe ``TrioToken.run_sync_soon``, a socket write and a wake-up through the I/O
    manager per call: too dear for a pass every loop iteration."""

    __slots__ = ("kind", "loop", "engines", "scheduled", "schedule", "task", "parked", "__weakref__")

    def __init__(self, kind: int, loop: Any, schedule: Callable[[Callable[[], None]], None]) -> None:
        self.kind, self.loop, self.schedule = kind, loop, schedule
        self.engines: dict[Engine, int] = {}  # engine -> polls until (ns)
        self.scheduled = False  # passes are under way (asyncio: one is scheduled; trio: the task is not parked)
        self.task: Any = None  # trio: the system task that runs the passes
        self.parked = False  # trio: that task waits for the next `arm`

    def arm(self, engine: Engine, until_ns: int, sent_ns: int) -> None:
        engine.learn_delivery(self.kind, sent_ns)
        if until_ns > self.engines.get(engine, 0):
            self.engines[engine] = until_ns
            engine.covered_until[self.loop] = until_ns
        if not self.scheduled:
            self.scheduled = True
            if self.kind == KIND_TRIO:
                self._wake_trio_task()
            else:
                self.run()

    def run(self) -> None:
        """One pass (asyncio), then the next at the loop's next iteration while any engine stays armed."""
        if self.look():
            self.scheduled = True
            try:
                self.schedule(self.run)
            except RuntimeError:  # the loop is closing: nobody is left to resume
                self.disarm()
        else:
            self.scheduled = False
            if _POLLERS.get(id(self.loop)) is self:
                del _POLLERS[id(self.loop)]

    def look(self) -> bool:
        """One pass over the armed engines (in the loop's thread): resume what completed, disarm the engines whose
        window passed or that have no wait of this loop left. True while any stays armed."""
        lid = self.loop
        for engine, until in list(self.engines.items()):
            try:
                fired = engine.collect(due_only=POLL_DUE_ONLY, limit=COLLECT_LIMIT)
            except BackendError:
                fired = []  # the waiter thread fails every wait of the device
            now = _now()
            if fired:
                until = max(until, now + LINGER_NS)
                engine.dispatch(fired, 0, here=self)
            if now >= until or not engine.pending_for(self.loop):
                del self.engines[engine]
                if engine.covered_until.get(lid, 0) <= until:
                    engine.covered_until.pop(lid, None)
                engine.kick()  # the waiter thread takes the loop's heads back now
            elif until != self.engines[engine]:
                self.engines[engine] = until
                engine.covered_until[lid] = until
        return bool(self.engines)

    def disarm(self) -> None:
        """Stop covering this loop's heads (its loop closes): the waiter thread looks at them again."""
        self.scheduled = False
        for engine in list(self.engines):
            engine.covered_until.pop(self.loop, None)
            engine.kick()
        self.engines.clear()

    def _wake_trio_task(self) -> None:
        lowlevel = sys.modules["trio"].lowlevel
        if self.task is None:
            try:
                lowlevel.spawn_system_task(self._trio_passes, name="asyncgpu-poller")
            except RuntimeError:  # the run is ending: nobody is left to resume
                self.disarm()
        elif self.parked:
            self.parked = False
            lowlevel.reschedule(self.task)

    def _unpark(self, _: Any) -> Any:
        """trio's abort of the parked task (the run ends): it is rescheduled with the cancellation, so no `arm` may
        reschedule it again."""
        self.parked = False
        return sys.modules["trio"].lowlevel.Abort.SUCCEEDED

    async def _trio_passes(self) -> None:
        """The trio run's poller task: passes between the run's scheduling batches while armed, parked between
        arms; cancelled (with the run's other system tasks) when the run ends."""
        lowlevel = sys.modules["trio"].lowlevel
        self.task = lowlevel.current_task()
        try:
            while True:
                try:
                    armed = self.look()
                except Exception as exc:  # noqa: BLE001 - an error here would end the user's trio run
                    report_unraisable(exc, "asyncgpu: a trio poller's pass failed", self)
                    self.disarm()
                    armed = False
                if armed:
                    await lowlevel.checkpoint()
                else:
                    self.scheduled = False
                    self.parked = True
                    await lowlevel.wait_task_rescheduled(self._unpark)
        finally:
            self.task = None
            self.disarm()
            if _POLLERS.get(id(self.loop)) is self:
                del _POLLERS[id(self.loop)]


#: id(loop or trio token) -> its poller while armed; touched only in that loop's thread
_POLLERS: weakref.WeakValueDictionary[int, Poller] = weakref.WeakValueDictionary()


def _tells(w: Waiter) -> bool:
    """Whether querying ``w``'s event tells where the stream stands (not withdrawn, its event intact)."""
    return w.state != CANCELLED and w.intact()


def _call_back(w: Waiter) -> None:
    """Run a completion callback on the waiter thread. A callback that raises is reported as unraisable (to
    stderr, or to pytest) and never stops the thread that serves every wait of the device."""
    if w.error is not None:
        return
    try:
        w.target(w.raw)
    except Exception as exc:  # noqa: BLE001 - the waiter thread must go on
        report_unraisable(exc, "asyncgpu: a completion callback failed on the waiter thread", w.target)


def _run_job(job: Callable[[], None]) -> None:
    """Run a `Engine.run_soon` job on the waiter thread; one that raises never stops the thread."""
    try:
        job()
    except Exception as exc:  # noqa: BLE001 - the waiter thread must go on
        report_unraisable(exc, "asyncgpu: a housekeeping job failed on the waiter thread", job)


def report_unraisable(exc: BaseException, msg: str, obj: Any) -> None:
    """Report ``exc`` through ``sys.unraisablehook`` (stderr, or pytest): for errors of work a library thread runs
    for nobody who could catch them."""
    sys.unraisablehook(
        SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=exc.__traceback__, err_msg=msg, object=obj)
    )


def _resume(kind: int, waiters: list[Waiter], then: Callable[[], None] | None, start: int = 0) -> None:
    """In the loop's thread: resume a batch of its waiters, `RESUME_CHUNK` per loop iteration (the loop's
    timers and other tasks run between chunks of a burst), then ``then`` (arm its poller) after the first."""
    resolve = loops.resolve_here
    end = min(start + RESUME_CHUNK, len(waiters))
    if kind == KIND_ASYNCIO:  # (the common case inline: a call less per wait, the loop's cost of a burst)
        for i in range(start, end):
            w = waiters[i]
            fut = w.target
            if w.error is None:
                if not fut.done():
                    fut.set_result(None)
            else:
                resolve(kind, fut, w.error)
    else:
        for i in range(start, end):
            w = waiters[i]
            resolve(kind, w.target, w.error)
    if end < len(waiters):
        loops.scheduler(kind, waiters[0].loop)(partial(_resume, kind, waiters, None, end))
    if then is not None:
        then()


def _arm(kind: int, loop: Any, engine: Engine, until_ns: int, sent_ns: int) -> None:
    """In the loop's thread: arm its poller for ``engine`` until ``until_ns`` (made on first use)."""
    poller = _POLLERS.get(id(loop))
    if poller is None or poller.loop is not loop:
        poller = _POLLERS[id(loop)] = Poller(kind, loop, loops.scheduler(kind, loop))
    poller.arm(engine, until_ns, sent_ns)
