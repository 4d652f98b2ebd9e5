"""`Engine`: the completion engine of one device, its parts put together (`predict`, `queue`, `thread`), with the
calls loops and threads make: register a wait, withdraw it, finish or re-park an early one, close."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from asyncgpu._backends.contract import BackendDevice
from asyncgpu._base.errors import ClosedError
from asyncgpu._runtime.engine.predict import INITIAL_DELIVERY_NS
from asyncgpu._runtime.engine.thread import WaiterThread
from asyncgpu._runtime.engine.waiter import CANCELLED, EARLY, FIRED, KIND_TRIO, PENDING, Waiter, _Queue


class Engine(WaiterThread):
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

    def cancel(self, w: Waiter) -> bool:
        """Withdraw a wait. True if it was parked and no dispatch will ever reach its owner."""
        with self._lock:
            state = w.state
            if state == PENDING or state == EARLY:
                w.state = CANCELLED
                self._gone_locked(w)
            return state == PENDING

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
