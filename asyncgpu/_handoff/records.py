"""One handoff of a `Channel`: the item both sides hold (`Handoff`: the payload, the producer's event, the
consumer's progress) and the record it leaves once its device times are read (`HandoffRecord`).

Device times are placed on the host clock with the device's last calibration (`host_ns`); `ensure_clock` keeps
that calibration recent at each put and take, never on an event loop's thread.

Threads: a handoff is used by its producer's and its consumer's threads; `Handoff._resolve` runs on the device's
waiter thread (or on the consumer's, for a host-side take). The channel's lock guards the state they share.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable

from asyncgpu._base.checks import timeout_s as check_timeout_s
from asyncgpu._base.errors import AsyncGPUError, ReleasedError
from asyncgpu._handoff.calls import (
    awaitable_in_thread,
    blocking_in_loop,
    check_wait_stream,
    time_limit,
)
from asyncgpu._runtime import loops
from asyncgpu._runtime.clock import CLOCK_MAX_AGE_S, placement
from asyncgpu._runtime.event import Event, block_until, peek_raw
from asyncgpu._runtime.loops import WAITING as _WAITING
from asyncgpu._runtime.loops import WOKEN as _WOKEN
from asyncgpu._runtime.loops import Parked as _Parked
from asyncgpu._runtime.stream import Stream

if TYPE_CHECKING:
    from asyncgpu._handoff.channel import Channel
    from asyncgpu._runtime.device import Device

__all__ = ["Handoff", "HandoffRecord", "ensure_clock", "host_ns"]

_now = time.perf_counter_ns
_THREAD = loops.THREAD


@dataclass(frozen=True, slots=True)
class HandoffRecord:
    """One finished handoff. Times are host time in ns (``time.perf_counter_ns`` base, NaN when unknown:
    an event recorded without timing, a device whose clock could not be aligned)."""

    channel: str
    seq: int  #: 0, 1, 2… in put order
    producer: str  #: the producer event's device (``cuda:0``)
    producer_stream: str  #: its stream's label
    consumer: str  #: a host-side take: the consumer's thread name; a GPU-side take: the consumer's device
    consumer_stream: str | None  #: a GPU-side take: the consumer's stream label; None for a host-side take
    put_ns: int  #: when ``put`` was called
    ready_ns: float  #: when the producer's device passed the event (the work was done)
    get_ns: int  #: when the consumer called ``get``
    take_ns: int  #: when ``get`` returned to the consumer
    wait_start_ns: float  #: GPU-side take: when the consumer's stream reached the wait
    wait_end_ns: float  #: GPU-side take: when the consumer's stream went on past it
    done_ns: float  #: when the consumer said it was done (NaN if it had not when the record was made)

    @property
    def gpu_side(self) -> bool:
        return self.consumer_stream is not None

    @property
    def latency_ns(self) -> float:
        """The handoff's own delay: from the later of "the producer's work is done" and "the consumer is
        waiting for it" to the consumer running. Host-side: ``take - max(ready, get)``; GPU-side:
        ``wait_end - max(ready, wait_start)`` (the consumer's stream). Time the consumer spent busy elsewhere
        is not counted."""
        if self.gpu_side:
            return self.wait_end_ns - max(self.ready_ns, self.wait_start_ns)
        return self.take_ns - max(self.ready_ns, self.get_ns)


class Handoff:
    """One item of a `Channel`: the payload and the producer's event, with the handoff's timing.

    The consumer gets it from `Channel.get` and ends it with `done` (or a ``with`` block); the producer gets
    the same object from `Channel.put` and may wait for the consumer's `done` with `wait_done`.
    """

    __slots__ = (
        "channel",
        "seq",
        "payload",
        "_event",
        "_producer",
        "_producer_stream",
        "_put_ns",
        "_get_ns",
        "_take_ns",
        "_consumer",
        "_consumer_stream",
        "_wait_events",
        "_done_ns",
        "_done_event",
        "_resolved",
        "_ready_ns",
        "_wait_ns",
        "_state",
        "_done_waiters",
        "_recorded_here",
        "__weakref__",
    )
    channel: Channel
    seq: int
    payload: Any
    _event: Event | None
    _producer: str
    _producer_stream: str
    _put_ns: int
    _get_ns: int
    _take_ns: int
    _consumer: str
    _consumer_stream: str | None
    _wait_events: tuple[Event, Event] | None
    _done_ns: float
    _done_event: Event | None
    _resolved: bool
    _ready_ns: float
    _wait_ns: tuple[float, float]
    _state: int
    _done_waiters: list[_Parked]
    _recorded_here: bool

    def __init__(self) -> None:
        raise TypeError("handoffs come from channel.put() and channel.get()")

    @classmethod
    def _create(
        cls, channel: Channel, seq: int, payload: Any, event: Event, recorded_here: bool, stream_label: str
    ) -> Handoff:
        self = object.__new__(cls)
        self.channel, self.seq, self.payload = channel, seq, payload
        self._event = event
        self._recorded_here = recorded_here
        self._producer, self._producer_stream = event.device.name, stream_label
        self._put_ns = _now()
        self._get_ns = self._take_ns = 0
        self._consumer, self._consumer_stream = "", None
        self._wait_events = None
        self._done_ns = math.nan
        self._done_event = None
        self._resolved = False
        self._ready_ns = math.nan
        self._wait_ns = (math.nan, math.nan)
        self._state = 0  # 0 queued, 1 taken, 2 done
        self._done_waiters = []
        return self

    # -- the consumer's side ------------------------------------------------------------------------------
    @property
    def event(self) -> Event:
        """The producer's event (the channel owns it: do not release it). Valid until `done`."""
        ev = self._event
        if ev is None or self._state == 2:
            raise ReleasedError(
                f"handoff #{self.seq} of {self.channel.name!r} is done: its event went back to its pool"
            )
        return ev

    def done(self, stream: Stream | None = None) -> None:
        """The consumer is done with the item. With ``stream``: its use of the payload is what is enqueued on
        ``stream`` so far (an event is recorded there for the producer's `wait_done`). Releases the producer's
        event (once its timing is read). Raises `ReleasedError` if called twice."""
        ch = self.channel
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"done(stream=...) takes the asyncgpu Stream that uses the payload, not {stream!r}")
        done_event = stream.record(timing=False) if stream is not None else None
        with ch._lock:
            if self._state == 2:
                if done_event is not None:
                    done_event.release()
                raise ReleasedError(
                    f"handoff #{self.seq} of {ch.name!r} was already marked done: each item is consumed once"
                )
            if self._state == 0:
                if done_event is not None:
                    done_event.release()
                raise ReleasedError(
                    f"handoff #{self.seq} of {ch.name!r} has not been taken: the consumer "
                    "marks what it got from channel.get() done"
                )
            self._state = 2
            self._done_ns = _now()
            self._done_event = done_event
            waiters = [p for p in self._done_waiters if p.state == _WAITING]
            self._done_waiters = []
            release = self._resolved
            for p in waiters:
                p.state = _WOKEN
        for p in waiters:
            p.wake()
        if release:
            self._release_producer_event()

    def __enter__(self) -> Handoff:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._state != 2:
            self.done()

    # -- the producer's side ------------------------------------------------------------------------------
    @property
    def is_done(self) -> bool:
        """True once the consumer called `done` (its GPU work on the payload may still be running)."""
        return self._state == 2

    def wait_done_sync(self, stream: Stream | None = None, *, timeout_s: float | None = None) -> None:
        """Block the calling plain thread (GIL released) until the consumer is done with the payload, before
        reusing its buffers. With ``stream``: wait on the host only until the consumer called `done`, then make
        ``stream`` wait on the GPU for the end of the consumer's use (no host wait for the GPU). Without: wait on
        the host until the consumer's use has run. `TimeoutError` after ``timeout_s`` seconds."""
        timeout_s = check_timeout_s(timeout_s)
        check_wait_stream(stream)
        kind, loop = loops.current()
        if kind != _THREAD:
            raise blocking_in_loop("Handoff.wait_done_sync()", "await handoff.wait_done()")
        deadline = None if timeout_s is None else _now() + int(timeout_s * 1e9)
        if not self._park_until_done(kind, loop, deadline):
            raise TimeoutError(self._not_done_message(timeout_s))
        self._after_done(stream, deadline, timeout_s)

    def wait_done(self, stream: Stream | None = None, *, timeout_s: float | None = None) -> Awaitable[None]:
        """``await handoff.wait_done(...)``: `wait_done_sync` for a task (the loop keeps running; a checkpoint;
        cancellation withdraws the wait). A plain thread calls `wait_done_sync` (here: `RuntimeError` naming
        it)."""
        timeout_s = check_timeout_s(timeout_s)
        check_wait_stream(stream)
        kind, loop = loops.current()
        if kind == _THREAD:
            raise awaitable_in_thread("Handoff.wait_done()", "Handoff.wait_done_sync()")
        return self._wait_done_async(kind, loop, stream, timeout_s)

    async def _wait_done_async(self, kind: int, loop: Any, stream: Stream | None, timeout_s: float | None) -> None:
        with time_limit(timeout_s, lambda: self._not_done_message(timeout_s)):
            ch = self.channel
            with ch._lock:
                if self._state != 2:
                    p = _Parked(kind, loop)
                    self._done_waiters.append(p)
                else:
                    p = None
            if p is not None:
                await p.wait(ch._lock)
            ev = self._done_event
            if ev is not None:
                if stream is not None:
                    stream.wait(ev)
                else:
                    await ev.wait()

    def _park_until_done(self, kind: int, loop: Any, deadline: int | None) -> bool:
        ch = self.channel
        with ch._lock:
            if self._state == 2:
                return True
            p = _Parked(kind, loop)
            self._done_waiters.append(p)
        return p.block(ch._lock, deadline, _now())

    def _after_done(self, stream: Stream | None, deadline: int | None, timeout_s: float | None) -> None:
        ev = self._done_event
        if ev is None:
            return
        if stream is not None:
            stream.wait(ev)
        elif not block_until(ev, deadline):
            raise TimeoutError(self._not_done_message(timeout_s))

    def _not_done_message(self, timeout_s: float | None) -> str:
        if self._state != 2:
            return f"the consumer of handoff #{self.seq} of {self.channel.name!r} was not done after {timeout_s} s"
        return f"the consumer's use of handoff #{self.seq} of {self.channel.name!r} had not run after {timeout_s} s"

    # -- timing -------------------------------------------------------------------------------------------
    def _resolve(self) -> None:
        """Read the handoff's device times (its events are complete) and log it. Any thread; once."""
        ch = self.channel
        with ch._lock:
            if self._resolved:
                return
            self._resolved = True
        ev = self._event
        self._ready_ns = host_ns(ev) if ev is not None else math.nan
        pair = self._wait_events
        if pair is not None:
            self._wait_ns = (host_ns(pair[0]), host_ns(pair[1]))
            self._wait_events = None
            for e in pair:
                e.release()
        ch._log.append(self._as_record())
        with ch._lock:
            release = self._state == 2
        if release:
            self._release_producer_event()

    def _release_producer_event(self) -> None:
        ev, self._event = self._event, None
        if ev is not None:
            ev.release()

    def _as_record(self) -> HandoffRecord:
        return HandoffRecord(
            self.channel.name,
            self.seq,
            self._producer,
            self._producer_stream,
            self._consumer,
            self._consumer_stream,
            self._put_ns,
            self._ready_ns,
            self._get_ns,
            self._take_ns,
            self._wait_ns[0],
            self._wait_ns[1],
            self._done_ns,
        )

    def __repr__(self) -> str:
        state = ("queued", "taken", "done")[self._state]
        return f"<asyncgpu.Handoff {self.channel.name}#{self.seq} {state} from {self._producer}>"


def host_ns(ev: Event) -> float:
    """A completed timing event on the host time base (NaN without timing or without a calibration). Never
    calibrates: it runs on the device's waiter thread (`ensure_clock` keeps a calibration at put and take)."""
    raw = peek_raw(ev)
    if raw is None or not ev.timing:
        return math.nan
    try:
        return placement(ev.device, refresh=False).host_ns(raw)
    except AsyncGPUError:
        return math.nan


def ensure_clock(dev: Device) -> None:
    """Keep a recent clock calibration for placing handoff times (a refresh pings the device): measured
    here in a plain thread, on the device's worker thread when the caller runs an event loop (never on a loop's
    thread; the handoffs placed meanwhile use the previous calibration)."""
    if not dev._internal.clock_stale(CLOCK_MAX_AGE_S):
        return
    if loops.current()[0] == loops.THREAD:
        _refresh(dev)
    elif dev not in _REFRESHING:  # (one refresh queued per device: the worker may be busy with long jobs)
        _REFRESHING.add(dev)
        if not dev._internal.worker.call_soon(lambda: _refresh(dev, queued=True)):
            _REFRESHING.discard(dev)


_REFRESHING: set[Any] = set()  # devices with a clock refresh queued on their worker thread


def _refresh(dev: Device, queued: bool = False) -> None:
    try:
        dev._internal.calibration()
    except AsyncGPUError:
        pass  # its handoffs get NaN device times; the scope reports why the device is not aligned
    finally:
        if queued:
            _REFRESHING.discard(dev)
