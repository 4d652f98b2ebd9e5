"""Handing GPU work from one thread (or task, or event loop) to another: `Channel` and its items, `Handoff`.

A producer enqueues work on a stream and puts the payload with an event recorded after that work; a consumer
takes it once the GPU has passed the event (a host-side take), or makes its own stream wait for the event on
the GPU and goes on at once (a GPU-side take, ``get_sync(stream=...)``, also across GPUs)::

    ch = asyncgpu.Channel(maxsize=4, name="batches")

    # producer: a plain thread (blocks while the channel is full), or a task: ``await ch.put(...)``
    stream.inc_loop(batch, 100)
    h = ch.put_sync(batch, stream=stream)   # records an event after the work enqueued on ``stream``
    h.wait_done_sync(stream=stream)         # before reusing ``batch``: the GPU waits for the consumer's use

    # consumer, host side: returns once the GPU has passed the producer's event
    with ch.get_sync() as h:                # ``with await ch.get() as h:`` in a task
        use(h.payload)

    # consumer, GPU side: ``mine`` waits on the GPU for the producer's event; no host wait
    h = ch.get_sync(stream=mine)
    mine.launch(...)                        # runs after the producer's work
    h.done(stream=mine)                     # the payload is in use until ``mine`` gets here

Calling convention (asyncgpu's, as `Event.wait` / `Event.wait_sync`): ``await ch.put()``, ``await ch.get()``,
``await h.wait_done()`` in a task of an asyncio (uvloop) or trio loop; ``ch.put_sync()``, ``ch.get_sync()``,
``h.wait_done_sync()`` block a plain thread (GIL released) and raise `RuntimeError` in a loop's thread. Producer
and consumer may be any mix of threads and loops. Called from a plain thread, ``put()``, ``get()`` and
``wait_done()`` raise `RuntimeError` naming the ``_sync`` form.

Lifetime: the channel owns the producer's event from ``put`` until the consumer is done with the item
(`Handoff.done`, or the end of its ``with`` block) and the handoff's timing is read; only then does the event go
back to its pool. ``done(stream=...)`` records where the consumer's use of the payload ends, and
``wait_done`` lets the producer wait for that point (on the GPU or on the host) before reusing its buffers.

Cancellation and timeouts: a consumer cancelled (or timed out) while waiting for an item or for the GPU loses
nothing: the item goes back to the head of the channel. A producer cancelled while waiting for room leaves
nothing behind (the event it recorded goes back to its pool). ``await channel.put(...)`` does nothing until it
is awaited: a put that is never awaited records no event. Timeouts (``timeout_s``, seconds) are None (wait for
ever) or a number >= 0; a timeout raises `TimeoutError` saying what did not happen in time.

Timing: every handoff is recorded (`Channel.records`): put time, GPU-ready time (the producer's event on the
host time base), take time, and for GPU-side takes the wait on the consumer's stream. Handoffs made while a
`gpu_timer` scope covering a device of the handoff is open (in the producer's or the consumer's context, or an
``all_threads`` scope) are drawn in its Perfetto trace with a flow arrow from producer to consumer.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections import deque
from typing import Any, Awaitable, Iterator

import numpy as np

from asyncgpu._base.checks import timeout_s as check_timeout_s
from asyncgpu._base.checks import whole
from asyncgpu._base.errors import ClosedError, DeviceMismatchError
from asyncgpu._handoff.calls import awaitable_in_thread, blocking_in_loop, time_limit
from asyncgpu._handoff.layer import HandoffLayer
from asyncgpu._handoff.records import Handoff, HandoffRecord, ensure_clock
from asyncgpu._runtime import hooks, loops
from asyncgpu._runtime.engine import KIND_CALLBACK
from asyncgpu._runtime.event import Event, block_until, peek_raw, raw_of, record_point
from asyncgpu._runtime.loops import WAITING as _WAITING
from asyncgpu._runtime.loops import WOKEN as _WOKEN
from asyncgpu._runtime.loops import Parked as _Parked
from asyncgpu._runtime.stream import Stream

__all__ = ["Channel"]

_now = time.perf_counter_ns
_THREAD = loops.THREAD


class Channel:
    """A bounded channel of GPU work between threads, tasks and event loops (see the module docstring).

    ``maxsize``: how many items may wait in the channel (≥ 1); ``put`` waits for room beyond that.
    ``keep_records``: how many finished handoff records `records` keeps (the oldest are dropped first).
    ``spin``: host-side takes in a plain thread wait with the driver's spin wait (lowest latency, a core per
    waiting consumer) instead of being woken by the device's waiter thread.
    """

    def __init__(
        self, maxsize: int = 4, *, name: str = "channel", keep_records: int = 100_000, spin: bool = False
    ) -> None:
        maxsize = whole("maxsize", maxsize, minimum=1)
        keep_records = whole("keep_records", keep_records)
        if not isinstance(name, str):
            raise TypeError(f"name is the channel's name in records and traces: a str, not {name!r}")
        self.name = name
        self.maxsize = maxsize
        self.spin = bool(spin)
        self._lock = threading.Lock()
        self._items: deque[Handoff] = deque()
        self._getters: deque[_Parked] = deque()
        self._putters: deque[_Parked] = deque()
        self._closed = False
        self._close_error: BaseException | None = None
        self._backend: str | None = None
        self._seqs = itertools.count()
        self._log: deque[HandoffRecord] = deque(maxlen=keep_records)

    # -- producing ----------------------------------------------------------------------------------------
    def put_sync(
        self, payload: Any, *, stream: Stream | None = None, event: Event | None = None, timeout_s: float | None = None
    ) -> Handoff:
        """Put ``payload`` with an event recorded now on ``stream`` (after the work enqueued there), or with
        ``event`` (recorded, with timing for the handoff's times; the channel owns it from now on). Blocks the
        calling plain thread (GIL released) while the channel is full. Returns the `Handoff` (for
        `Handoff.wait_done_sync`). Raises `ClosedError` once the channel is closed, `TimeoutError` after
        ``timeout_s`` seconds without room (nothing is left behind)."""
        timeout_s = check_timeout_s(timeout_s)
        kind, loop = loops.current()
        if kind != _THREAD:
            raise blocking_in_loop("Channel.put_sync()", "await channel.put()")
        h = self._new_item(payload, stream, event)
        try:
            with self._lock:
                p = self._admit_locked(h, kind, loop)
            if p is not None:
                deadline = None if timeout_s is None else _now() + int(timeout_s * 1e9)
                if not p.block(self._lock, deadline, _now()):
                    raise TimeoutError(self._full_message(timeout_s))
                self._after_room(p)
        except BaseException:
            self._abandon(h)
            raise
        return h

    def put(
        self,
        payload: Any,
        *,
        stream: Stream | None = None,
        event: Event | None = None,
        timeout_s: float | None = None,
    ) -> Awaitable[Handoff]:
        """``await channel.put(...)``: `put_sync` for a task (the loop keeps running while the channel is full;
        a checkpoint; cancellation leaves nothing behind). Nothing happens until it is awaited (the arguments are
        checked at once). A plain thread calls `put_sync` (here: `RuntimeError` naming it)."""
        timeout_s = check_timeout_s(timeout_s)
        kind, loop = loops.current()
        if kind == _THREAD:
            raise awaitable_in_thread("Channel.put()", "Channel.put_sync()")
        _check_put(stream, event)
        return self._put_async(payload, stream, event, kind, loop, timeout_s)

    async def _put_async(
        self, payload: Any, stream: Stream | None, event: Event | None, kind: int, loop: Any, timeout_s: float | None
    ) -> Handoff:
        h = self._new_item(payload, stream, event)
        try:
            with time_limit(timeout_s, lambda: self._full_message(timeout_s)):
                with self._lock:
                    p = self._admit_locked(h, kind, loop)
                if p is None:
                    await loops.checkpoint(kind, loop)
                else:
                    await p.wait(self._lock)  # if room came as it was cancelled, the item stays in
                    self._after_room(p)
        except BaseException:
            self._abandon(h)
            raise
        return h

    def _full_message(self, timeout_s: float | None) -> str:
        return f"channel {self.name!r} stayed full for {timeout_s} s"

    def _new_item(self, payload: Any, stream: Stream | None, event: Event | None) -> Handoff:
        _check_put(stream, event)
        if self._closed:
            raise ClosedError(self._closed_message("put"))
        if event is not None:
            dev, recorded_here = event.device, False
        else:
            assert stream is not None  # one of the two, checked above
            dev = stream.device
        backend = dev.backend
        if self._backend is None:
            self._backend = backend
        elif backend != self._backend:
            raise DeviceMismatchError(
                f"channel {self.name!r} carries {self._backend} work; this event is of the "
                f"{backend} backend: use one channel per backend"
            )
        ensure_clock(dev)
        if event is None:
            assert stream is not None
            event, recorded_here, label = stream.record(), True, stream.label
        else:
            label = _stream_label(event)
        h = Handoff._create(self, next(self._seqs), payload, event, recorded_here, label)
        self._claim_scopes(h, dev)
        return h

    def _admit_locked(self, h: Handoff, kind: int, loop: Any) -> _Parked | None:
        """Under the lock: hand ``h`` to a waiting getter, queue it, or park the producer (returned)."""
        if self._closed:
            raise ClosedError(self._closed_message("put"))
        while self._getters:
            g = self._getters.popleft()
            if g.state == _WAITING:
                g.state, g.item = _WOKEN, h
                g.wake()
                return None
        if len(self._items) < self.maxsize:
            self._items.append(h)
            return None
        p = _Parked(kind, loop)
        p.item = h
        self._putters.append(p)
        return p

    def _after_room(self, p: _Parked) -> None:
        if p.item is not None:  # woken without room: the channel was closed
            raise ClosedError(self._closed_message("put"))

    def _abandon(self, h: Handoff) -> None:
        """A put that did not happen: give back the event it recorded (a caller's event stays the caller's)."""
        with self._lock:
            if h._state != 0 or h in self._items:
                return
        if h._recorded_here and h._event is not None:
            h._release_producer_event()

    # -- consuming ----------------------------------------------------------------------------------------
    def get_sync(self, *, stream: Stream | None = None, timeout_s: float | None = None) -> Handoff:
        """Take the next item, blocking the calling plain thread (GIL released). Host-side (no ``stream``):
        returns once the producer's device has passed the item's event. GPU-side (``stream``): makes ``stream``
        wait for that event on the GPU (``cuStreamWaitEvent``; ``stream`` may be on another GPU) and returns at
        once. Raises `ClosedError` when the channel is closed and empty (chained to the producer's error if it
        closed the channel with one), `TimeoutError` after ``timeout_s`` seconds. A timed-out take puts the item
        back at the head."""
        if stream is not None:
            self._check_stream(stream)
        timeout_s = check_timeout_s(timeout_s)
        called_ns = _now()
        kind, loop = loops.current()
        if kind != _THREAD:
            raise blocking_in_loop("Channel.get_sync()", "await channel.get()")
        deadline = None if timeout_s is None else called_ns + int(timeout_s * 1e9)
        with self._lock:
            h, p = self._take_locked(kind, loop)
        if p is not None:
            if not p.block(self._lock, deadline, _now()):
                raise TimeoutError(self._get_timeout_message(None, timeout_s))
            h = self._after_wake(p)
        assert h is not None  # _take_locked returns an item or a parking
        try:
            if stream is not None:
                self._take_on_gpu(h, stream, called_ns)
            else:
                ev = h._event
                assert ev is not None  # the channel holds the producer's event until the item is done
                if self.spin and deadline is None:
                    ev.wait_sync()
                elif not block_until(ev, deadline):
                    raise TimeoutError(self._get_timeout_message(h, timeout_s))
                self._taken_on_host(h, called_ns)
        except BaseException:
            self._put_back(h)
            raise
        return h

    def get(self, *, stream: Stream | None = None, timeout_s: float | None = None) -> Awaitable[Handoff]:
        """``await channel.get(...)``: `get_sync` for a task (the loop keeps running; a checkpoint; a cancelled
        take puts the item back at the head). A plain thread calls `get_sync` (here: `RuntimeError` naming it)."""
        timeout_s = check_timeout_s(timeout_s)
        kind, loop = loops.current()
        if kind == _THREAD:
            raise awaitable_in_thread("Channel.get()", "Channel.get_sync()")
        if stream is not None:
            self._check_stream(stream)
        return self._get_async(kind, loop, stream, timeout_s, _now())

    def _get_timeout_message(self, h: Handoff | None, timeout_s: float | None) -> str:
        if h is None:
            return f"nothing came through channel {self.name!r} in {timeout_s} s"
        return (
            f"handoff #{h.seq} of {self.name!r}: {h._producer} had not finished its work after {timeout_s} s "
            "(the item is back in the channel)"
        )

    async def _get_async(
        self, kind: int, loop: Any, stream: Stream | None, timeout_s: float | None, called_ns: int
    ) -> Handoff:
        h: Handoff | None = None
        with time_limit(timeout_s, lambda: self._get_timeout_message(h, timeout_s)):
            with self._lock:
                h, p = self._take_locked(kind, loop)
            if p is not None:
                try:
                    await p.wait(self._lock)
                except BaseException:
                    with self._lock:
                        got = p.state == _WOKEN and p.item is not None
                    if got:
                        self._put_back(p.item)
                    raise
                h = self._after_wake(p)
            assert h is not None  # _take_locked returns an item or a parking
            try:
                if stream is not None:
                    if p is None:
                        await loops.checkpoint(kind, loop)  # a take is always a checkpoint
                    self._take_on_gpu(h, stream, called_ns)
                else:
                    ev = h._event
                    assert ev is not None  # the channel holds the producer's event until the item is done
                    # A take that parked has been a checkpoint: when the producer's work is done by then, the
                    # task goes on at once (another pass through trio's scheduler is slow while the producers'
                    # threads hold the GIL).
                    if p is None or not ev.query():
                        await ev.wait()
                    self._taken_on_host(h, called_ns)
            except BaseException:
                self._put_back(h)
                raise
        return h

    def _take_locked(self, kind: int, loop: Any) -> tuple[Handoff | None, _Parked | None]:
        if self._items:
            h = self._items.popleft()
            self._room_locked()
            h._state = 1
            return h, None
        if self._closed:
            raise self._closed_error()
        p = _Parked(kind, loop)
        self._getters.append(p)
        return None, p

    def _room_locked(self) -> None:
        """An item left the queue: let the first parked producer in."""
        while self._putters and len(self._items) < self.maxsize:
            p = self._putters.popleft()
            if p.state == _WAITING:
                self._items.append(p.item)
                p.state, p.item = _WOKEN, None
                p.wake()

    def _after_wake(self, p: _Parked) -> Handoff:
        h = p.item
        if h is None:  # woken by close with nothing for us
            with self._lock:
                raise self._closed_error()
        h._state = 1
        return h

    def _put_back(self, h: Handoff) -> None:
        """A take that did not complete: the item goes back to the head (to a waiting getter first)."""
        with self._lock:
            h._state = 0
            while self._getters:
                g = self._getters.popleft()
                if g.state == _WAITING:
                    g.state, g.item = _WOKEN, h
                    g.wake()
                    return
            self._items.appendleft(h)

    def _check_stream(self, stream: Any) -> None:
        if not isinstance(stream, Stream):
            raise TypeError(f"get(stream=...) takes an asyncgpu Stream, not {type(stream).__name__}")
        if self._backend is not None and stream.device.backend != self._backend:
            raise DeviceMismatchError(
                f"channel {self.name!r} carries {self._backend} work; a {stream.device.backend} stream cannot wait "
                "for it on the device: take it on the host with get() (no stream=)"
            )

    def _take_on_gpu(self, h: Handoff, stream: Stream, called_ns: int) -> None:
        ev = h._event
        assert ev is not None  # the channel holds the producer's event until the item is done
        if ev.device.backend != stream.device.backend:
            raise DeviceMismatchError(
                f"a {stream.device.backend} stream cannot wait for a {ev.device.backend} event: take it on the host "
                "with get() (no stream=)"
            )
        ensure_clock(stream.device)
        before = stream.record(tag="handoff")
        stream.wait(ev)
        after = stream.record(tag="handoff")
        h._wait_events = (before, after)
        h._consumer, h._consumer_stream = stream.device.name, stream.label
        h._get_ns, h._take_ns = called_ns, _now()
        self._claim_scopes(h, stream.device, fence=stream)  # the scopes wait for the wait they draw
        dev = stream.device
        key, seq, _, _ = record_point(after)
        assert key is not None  # recorded just above
        try:
            dev._internal.engine.add(
                peek_raw(after), key, seq, None, 0, KIND_CALLBACK, None, lambda _raw, h=h: h._resolve(), after
            )
        except ClosedError:
            h._resolve()

    def _taken_on_host(self, h: Handoff, called_ns: int) -> None:
        h._get_ns, h._take_ns = called_ns, _now()
        h._consumer = threading.current_thread().name
        h._resolve()

    # -- closing ------------------------------------------------------------------------------------------
    def close(self, error: BaseException | None = None) -> None:
        """No more puts (either side may close). Items already in stay available to `get`; then `get` raises
        `ClosedError` (chained to ``error``, when a producer closes because it failed). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed, self._close_error = True, error
            parked = [p for p in (*self._getters, *self._putters) if p.state == _WAITING]
            self._getters.clear()
            self._putters.clear()
            for p in parked:
                p.state = _WOKEN  # getters: item None; putters: item still set (not admitted)
        for p in parked:
            p.wake()

    def drop(self) -> list[Any]:
        """Close the channel and empty it: returns the payloads nobody took (their events go back to their
        pools once their devices pass them). Nothing is dropped silently: this is how a consumer that gives
        up gets the rest back."""
        self.close()
        with self._lock:
            left = list(self._items)
            self._items.clear()
        for h in left:
            h._state = 2
            h._release_producer_event()
        return [h.payload for h in left]

    @property
    def closed(self) -> bool:
        return self._closed

    def qsize(self) -> int:
        """Items waiting in the channel (not yet taken)."""
        return len(self._items)

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        """A producer's ``with channel:`` closes it at the end, passing on what the block raised."""
        self.close(exc)

    def __iter__(self) -> Iterator[Handoff]:
        """Host-side takes until the channel is closed and empty (a plain thread)."""
        while True:
            try:
                yield self.get_sync()
            except ClosedError as exc:
                if exc.__cause__ is not None:
                    raise
                return

    def __aiter__(self) -> Channel:
        return self

    async def __anext__(self) -> Handoff:
        try:
            return await self.get()
        except ClosedError as exc:
            if exc.__cause__ is not None:
                raise
            raise StopAsyncIteration from None

    def _closed_message(self, what: str) -> str:
        return f"channel {self.name!r} is closed: cannot {what} (make a new Channel, or close it only when done)"

    def _closed_error(self) -> ClosedError:
        cause = self._close_error
        if cause is not None:
            err = ClosedError(
                f"channel {self.name!r} was closed by a producer that failed "
                f"({type(cause).__name__}: {cause}); nothing more will come"
            )
            err.__cause__ = cause
            return err
        return ClosedError(f"channel {self.name!r} is closed and empty: nothing more will come")

    def __del__(self) -> None:
        items = getattr(self, "_items", None)
        if items:
            n = len(items)
            for h in list(items):
                h._release_producer_event()
            warnings.warn(
                f"channel {self.name!r} was dropped with {n} item(s) nobody took; call channel.drop() to get them back",
                ResourceWarning,
                stacklevel=2,
            )

    # -- records ------------------------------------------------------------------------------------------
    def records(self) -> list[HandoffRecord]:
        """The finished handoffs (oldest first; at most ``keep_records``)."""
        return list(self._log)

    def latencies_ns(self, gpu_side: bool | None = None) -> np.ndarray:
        """GPU ready → consumer running of each finished handoff (ns; NaN where a time is unknown); ``gpu_side``
        True or False keeps only GPU-side or host-side takes."""
        if gpu_side is not None and not isinstance(gpu_side, bool):
            raise TypeError(f"gpu_side is True, False or None (all takes), not {gpu_side!r}")
        recs = [r for r in self._log if gpu_side is None or r.gpu_side == gpu_side]
        return np.array([r.latency_ns for r in recs], dtype=np.float64)

    def _claim_scopes(self, h: Handoff, device: Any, fence: Stream | None = None) -> list:
        """Hand ``h`` to this channel's layer in every open scope (of the calling context) that covers
        ``device``; ``fence``: the consumer's stream, which those scopes then wait for at their end."""
        layers = hooks.attach(device, lambda: HandoffLayer(self.name), key=("handoff", id(self)), fence=fence)
        for layer in layers:
            layer.add(h)
        return layers

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<asyncgpu.Channel {self.name!r} {state} {len(self._items)}/{self.maxsize}>"


def _check_put(stream: Any, event: Any) -> None:
    """What `Channel.put` accepts (checked before anything is recorded)."""
    if (stream is None) == (event is None):
        raise TypeError(
            "put() needs stream= (an event is recorded there after the work enqueued so far) or "
            "event= (an event you recorded), not both"
        )
    if event is not None:
        if not isinstance(event, Event):
            raise TypeError(f"event must be an asyncgpu Event (device.record()), not {type(event).__name__}")
        raw_of(event)  # NotRecordedError / ReleasedError / ClosedError name the fix
    elif not isinstance(stream, Stream):
        raise TypeError(
            "stream= takes the asyncgpu Stream whose enqueued work makes the payload ready (device.stream, "
            f"device.streams[i], device.adopt_stream(...)), not {stream!r}"
        )


def _stream_label(event: Event) -> str:
    key = record_point(event)[0]
    for s in event.device._internal.owned_streams:
        if s.handle == key:
            return s.label
    return f"{key:#x}" if isinstance(key, int) else "?"
