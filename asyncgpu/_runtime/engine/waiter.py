"""What a wait is: its states, who waits (kinds), what it waits for (`WaitFor`), one pending wait (`Waiter`), the
queue of a stream's pending waits (`_Queue`), and how a callback wait is called and its failure reported."""

from __future__ import annotations

import sys
from collections import deque
from enum import IntEnum
from types import SimpleNamespace
from typing import Any, NamedTuple

from asyncgpu._runtime import loops


class WaitState(IntEnum):
    """A waiter's state. Ordered: a state ``>= FIRED`` is final (the engine never touches the waiter again)."""

    PENDING = 0  #: parked: the engine resumes its owner
    EARLY = 1  #: its owner, woken early, polls for itself (then `Engine.finish` or `Engine.rearm`)
    FIRED = 2  #: complete, or failed (``error`` set)
    CANCELLED = 3  #: withdrawn by its owner


PENDING, EARLY, FIRED, CANCELLED = WaitState.PENDING, WaitState.EARLY, WaitState.FIRED, WaitState.CANCELLED
KIND_ASYNCIO, KIND_TRIO, KIND_THREAD = loops.ASYNCIO, loops.TRIO, loops.THREAD  # who waits: a loop's task, a thread
KIND_CALLBACK = 3  #: the target is called with the raw event on the waiter thread once it is complete

_NO_LOOP = [0]  # the count cell of waits that no loop owns (plain threads, callbacks)


class WaitFor(NamedTuple):
    """What a wait is for: the event ``raw``, recorded on the stream ``key`` as its ``seq``-th record at
    ``record_ns`` (``time.perf_counter_ns``; 0: unknown), the ``tag`` its work's durations are learned by, and the
    object it came from (``owner``: an `Event`, whose ``_raw``, ``_key`` and ``_seq`` tell whether it still stands;
    None for an internal event nobody re-records)."""

    raw: Any
    key: int
    seq: int
    tag: Any
    record_ns: int
    owner: Any = None


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
        self.state: WaitState = PENDING
        self.error: BaseException | None = None
        self.poll_until_ns = self.sent_ns = self.woke_ns = 0  # a plain thread's early wake: window, sent, woke

    def intact(self) -> bool:
        """Whether this wait's event still stands where it was recorded (not released, not re-recorded): only
        then may its completion tell about the waits around it on its stream."""
        o = self.owner
        return o is None or (o._raw is self.raw and o._seq == self.seq and o._key == self.key)


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


def report_unraisable(exc: BaseException, msg: str, obj: Any) -> None:
    """Report ``exc`` through ``sys.unraisablehook`` (stderr, or pytest): for errors of work a library thread runs
    for nobody who could catch them."""
    sys.unraisablehook(
        SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=exc.__traceback__, err_msg=msg, object=obj)
    )
