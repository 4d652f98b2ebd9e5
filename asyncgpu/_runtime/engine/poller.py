"""The loops' pollers: between an event loop's iterations, query the device's stream heads that are due and resume
what completed in the loop's own thread; and the loop-side halves of a hand-over (`_resume`, `_arm`)."""

from __future__ import annotations

import sys
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from asyncgpu._base.errors import BackendError
from asyncgpu._runtime import loops
from asyncgpu._runtime.engine.predict import _now
from asyncgpu._runtime.engine.waiter import KIND_ASYNCIO, KIND_TRIO, Waiter, report_unraisable

if TYPE_CHECKING:
    from asyncgpu._runtime.engine.thread import WaiterThread as Engine  # (its part that pollers use)

LINGER_NS = 60_000  #: a poller keeps polling this long after the last completion it saw (or was handed)
RESUME_CHUNK = 256  #: waiters resumed per loop iteration when the thread hands a loop a batch
#: a look pops at most about this many completed waits (whole streams' runs, the last one cut): a burst's first
#: waits are handed over while the rest still wait to be popped (0: no limit)
COLLECT_LIMIT = 256


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
                fired = engine.collect(due_only=True, limit=COLLECT_LIMIT)
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
