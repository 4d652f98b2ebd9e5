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

Waiter states (`WaitState`, ordered): PENDING (parked), EARLY (its owner, woken early, polls for itself), FIRED
(complete, or failed), CANCELLED (withdrawn by its owner).

The parts: `waiter` (what a wait is), `predict` (learning and planning), `queue` (the per-stream queues and the
looks at their heads), `thread` (the waiter thread and its hand-overs), `poller` (the loops' pollers) and `core`
(`Engine`, the parts put together, with the calls loops and threads make).
"""

from __future__ import annotations

from asyncgpu._runtime.engine.core import Engine
from asyncgpu._runtime.engine.poller import _POLLERS, COLLECT_LIMIT, LINGER_NS, RESUME_CHUNK, Poller
from asyncgpu._runtime.engine.predict import (
    DUE_MARGIN_NS,
    INITIAL_DELIVERY_NS,
    LEAD_MARGIN_NS,
    MAX_POLL_NS,
    MIN_ON_THE_WAY_NS,
    MIN_POLL_NS,
    MIN_WINDOW_NS,
    SPIN_MARGIN_NS,
)
from asyncgpu._runtime.engine.thread import COVERED_NAP_NS, MAX_SLEEP_S
from asyncgpu._runtime.engine.waiter import (
    CANCELLED,
    EARLY,
    FIRED,
    KIND_ASYNCIO,
    KIND_CALLBACK,
    KIND_THREAD,
    KIND_TRIO,
    PENDING,
    Waiter,
    WaitFor,
    WaitState,
    _Queue,
    report_unraisable,
)

__all__ = [
    "CANCELLED",
    "COLLECT_LIMIT",
    "COVERED_NAP_NS",
    "DUE_MARGIN_NS",
    "EARLY",
    "FIRED",
    "INITIAL_DELIVERY_NS",
    "KIND_ASYNCIO",
    "KIND_CALLBACK",
    "KIND_THREAD",
    "KIND_TRIO",
    "LEAD_MARGIN_NS",
    "LINGER_NS",
    "MAX_POLL_NS",
    "MAX_SLEEP_S",
    "MIN_ON_THE_WAY_NS",
    "MIN_POLL_NS",
    "MIN_WINDOW_NS",
    "PENDING",
    "RESUME_CHUNK",
    "SPIN_MARGIN_NS",
    "Engine",
    "Poller",
    "WaitFor",
    "WaitState",
    "Waiter",
    "report_unraisable",
    "_POLLERS",
    "_Queue",
]
