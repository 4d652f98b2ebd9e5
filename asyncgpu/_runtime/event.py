"""`Event`: a pooled backend event with awaitable completion.

Events come from `Device.record` (recorded at once) or `Device.create_event` (recorded later with
`Event.record` / `Stream.record`). They return to their device's pool on `release()` (or when the ``with``
block or the garbage collector ends them), and only once the device can no longer touch them.

Threads: every method may be called from any thread; ``await wait()`` from any asyncio (uvloop) or trio loop.
An event of a closed worker (`Device.close`, or one the parent opened before ``os.fork()``) raises `ClosedError`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Coroutine, final

from asyncgpu._base.checks import timeout_s as check_timeout_s
from asyncgpu._base.errors import DeviceMismatchError, NotRecordedError, ReleasedError, TimingDisabledError
from asyncgpu._runtime import loops
from asyncgpu._runtime.engine import WaitFor
from asyncgpu._runtime.hooks import check_queue
from asyncgpu._runtime.waiting import await_completion, block_until_complete

if TYPE_CHECKING:
    from asyncgpu._runtime.device import Device
    from asyncgpu._runtime.internal import DeviceInternal
    from asyncgpu._runtime.stream import Stream

__all__ = ["Event", "block", "block_until", "peek_raw", "raw_of", "record_point"]

_now = time.perf_counter_ns


@final
class Event:
    """A point in a stream's work on one device. Create with `Device.record` or `Device.create_event`.

    Holds its device's `DeviceInternal` (``_dev``), not the `Device`: `device` reads it from there."""

    __slots__ = ("timing", "_dev", "_raw", "_key", "_seq", "_record_ns", "_tag", "__weakref__")
    timing: bool
    _dev: DeviceInternal
    _raw: Any
    _key: int | None
    _seq: int
    _record_ns: int
    _tag: Any

    def __init__(self) -> None:
        raise TypeError("events come from device.record() or device.create_event()")

    @classmethod
    def _create(cls, dev: DeviceInternal, raw: Any, timing: bool) -> Event:
        self = object.__new__(cls)
        self._dev = dev
        self.timing = timing
        self._raw = raw
        self._key = None  # the stream it was last recorded on (None: never recorded)
        self._seq = 0
        self._record_ns = 0
        self._tag = None
        return self

    @classmethod
    def _recorded(
        cls, dev: DeviceInternal, raw: Any, timing: bool, key: int, seq: int, record_ns: int, tag: Any
    ) -> Event:
        """An event that ``raw``'s record on stream ``key`` (record number ``seq``) has just made on ``dev``'s device
        (`Device.record`: the hot path, every field set once)."""
        self = object.__new__(cls)
        self._dev, self.timing, self._raw = dev, timing, raw
        self._key, self._seq, self._record_ns, self._tag = key, seq, record_ns, tag
        return self

    @property
    def device(self) -> Device:
        """The `Device` this event belongs to (read-only)."""
        return self._dev.device

    # -- recording ---------------------------------------------------------------------------------------
    def record(self, stream: Stream | Any | None = None, *, tag: Any = None) -> Event:
        """Record (or re-record) on ``stream`` (default: the device's default stream). Returns ``self``.

        ``tag`` names the work before this point (default: the workload launched on that stream since its last
        record, if any); the completion engine learns how long each tag takes to wake waiters just in time.
        """
        raw = self._live()
        s = self._dev.device.stream_of(stream)
        si = s._internal
        if self.timing:
            check_queue(si)  # (a full stream, in a loop's thread: `QueueFullError`, the event untouched)
        si.bd.record(raw, si.raw)
        if self.timing:  # a timing record takes one of the driver's launch slots (a plain one does not)
            si.marked()
        self._key = s.handle
        self._seq = next(si.seqs)
        self._record_ns = _now()
        self._tag = si.tag if tag is None else tag
        si.tag = None  # a second record right behind this one has no work of its own before it
        return self

    @property
    def recorded(self) -> bool:
        return self._key is not None

    # -- completion ---------------------------------------------------------------------------------------
    def query(self) -> bool:
        """True once the device has passed the event. Never blocks."""
        return self._dev.bd.query(self._checked())

    def wait_sync(self, *, timeout_s: float | None = None) -> None:
        """Block the calling thread (GIL released) until the device has passed the event: the blocking form of
        `wait` (asyncgpu's convention: ``await x.verb()`` is async, ``x.verb_sync()`` blocks the thread).

        Without ``timeout_s`` this is the driver's own wait (``cuEventSynchronize``: it spins a core, lowest
        latency). With ``timeout_s`` (seconds) the device's waiter thread wakes this thread (little CPU) and
        `TimeoutError` is raised if the device has not passed the event by then; the event is untouched. Called
        from an event loop's thread on an event the device has not passed, it warns (`BlockingCallWarning`):
        ``await event.wait()`` there.
        """
        raw = self._checked()
        if timeout_s is not None:
            timeout_s = check_timeout_s(timeout_s)
        if self._dev.bd.query(raw):
            return
        loops.warn_blocking("event.wait_sync()", "`await event.wait()`")
        self._block(timeout_s)

    def _block(self, timeout_s: float | None = None) -> None:
        """`wait_sync` without its event-loop check, for asyncgpu's own blocking forms (which warned already,
        or run in a plain thread). ``timeout_s``: checked by the caller."""
        if timeout_s is None:
            self._dev.bd.sync_event(self._checked())
        elif not self._block_until(_now() + int(timeout_s * 1e9)):
            raise TimeoutError(f"{self.device.name} had not passed the event after {timeout_s} s")

    def _block_until(self, deadline_ns: int | None) -> bool:
        """Block this plain thread (GIL released) until the event completes or ``deadline_ns`` passes (False):
        the waiter thread wakes it shortly before the predicted completion; without a deadline it then
        finishes with the driver's spin wait."""
        rt = self._dev
        raw = self._checked()
        key = self._key
        assert key is not None  # checked() raised otherwise
        wait_for = WaitFor(raw, key, self._seq, self._tag, self._record_ns, self)
        return block_until_complete(rt.engine, rt.bd.query, wait_for, deadline_ns, rt.bd.sync_event)

    def wait(self) -> Coroutine[Any, Any, None]:
        """``await event.wait()``: resume the calling task once the device has passed the event; the loop runs
        other tasks meanwhile.

        A checkpoint, even when the event is already complete. Cancellation withdraws the wait at once and
        leaves the event untouched (still recorded, still yours). Raises `BackendError` if the device fails
        (a sticky CUDA error) and `ClosedError` if the device is closed while waiting; a released or never
        recorded event raises at the call. (A plain method that returns the waiting coroutine: one frame less
        for the loop to pass through at every wake, the loop's cost of a burst of completions.)
        """
        raw = self._checked()
        rt = self._dev
        key = self._key
        assert key is not None  # checked() raised otherwise
        return await_completion(rt.engine, rt.bd.query, WaitFor(raw, key, self._seq, self._tag, self._record_ns, self))

    # -- timing -------------------------------------------------------------------------------------------
    def elapsed_ms(self, start: Event) -> float:
        """Milliseconds from ``start`` to this event (same device; both recorded, complete, with timing)."""
        if not isinstance(start, Event):
            raise TypeError(f"elapsed_ms() takes an asyncgpu Event, not {type(start).__name__}")
        if start._dev is not self._dev:  # (one `DeviceInternal` per `Device`)
            raise DeviceMismatchError(
                f"cannot time between {start.device.name} and {self.device.name}: each device has its own clock. "
                "Time events of one device, or compare activity records on the aligned timeline"
            )
        for ev in (start, self):
            if not ev.timing:
                raise TimingDisabledError(
                    "an event recorded with timing=False has no timestamp: record it with device.record(timing=True)"
                )
        return self._dev.bd.elapsed_ms(start._checked(), self._checked())

    def __sub__(self, start: Event) -> float:
        """``end - start``: `elapsed_ms` in milliseconds."""
        return self.elapsed_ms(start)

    # -- lifetime -----------------------------------------------------------------------------------------
    def release(self) -> None:
        """Give the event back to its pool (at once if complete, else once the device passes it). Idempotent."""
        raw = self._raw
        if raw is not None:
            self._raw = None
            self._dev.recycle(raw, self.timing, self._key, self._seq)

    def __enter__(self) -> Event:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        raw = getattr(self, "_raw", None)
        if raw is not None:
            self._raw = None
            self._dev.recycle(raw, self.timing, self._key, self._seq)

    def _live(self) -> Any:
        """The backend event; `ReleasedError` once released, `ClosedError` once its worker is closed."""
        raw = self._raw
        if raw is None:
            raise ReleasedError(
                "this event went back to its pool (released, or its scope closed): take a new one with device.record()"
            )
        dev = self._dev
        if dev.closed:
            raise dev.closed_error("this event")
        return raw

    def _checked(self) -> Any:
        raw = self._live()
        if self._key is None:
            raise NotRecordedError("this event was never recorded: call event.record(stream) first")
        return raw

    def __repr__(self) -> str:
        state = "released" if self._raw is None else ("recorded" if self._key is not None else "unrecorded")
        return f"<asyncgpu.Event {self.device.name} {state}{'' if self.timing else ' timing=False'}>"


# -- the library's side of an event: what other runtime modules and features reach, as functions of the event ------
def raw_of(ev: Event) -> Any:
    """The backend event of the recorded ``ev`` (`ReleasedError`, `NotRecordedError` or `ClosedError` otherwise,
    naming the fix)."""
    return ev._checked()


def peek_raw(ev: Event) -> Any:
    """The backend event of ``ev`` as it is, unchecked: None once released."""
    return ev._raw


def record_point(ev: Event) -> tuple[int | None, int, int, Any]:
    """Where ``ev`` was last recorded: ``(stream key, record number, host ns at the record, tag)``; the key is None
    before the first record."""
    return ev._key, ev._seq, ev._record_ns, ev._tag


def block(ev: Event, timeout_s: float | None = None) -> None:
    """`Event.wait_sync` without its event-loop check, for the library's blocking forms (which warned already, or
    run in a plain thread). ``timeout_s``: checked by the caller."""
    ev._block(timeout_s)


def block_until(ev: Event, deadline_ns: int | None) -> bool:
    """Block this plain thread (GIL released) until ``ev`` completes (True) or ``deadline_ns`` passes (False)."""
    return ev._block_until(deadline_ns)
