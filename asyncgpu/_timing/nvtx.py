"""NVTX ranges for scopes and activities, in the ``asyncgpu`` domain, for Nsight Systems, and `profiler_range`,
the capture range for ``nsys profile --capture-range=cudaProfilerApi`` (called ``capture`` before 0.2; a graph
capture is `Stream.capture`).

Ranges are started and ended with ``start_range``/``end_range`` (not push/pop): push/pop nest per OS thread
and mis-nest across ``await``. Without a profiler attached the nvtx package hands out a no-op domain, so a
range costs about 0.1 µs. `sink` lets tests observe ranges without a profiler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, final

import nvtx

from asyncgpu._base.errors import ScopeError

if TYPE_CHECKING:
    from asyncgpu._runtime.device import Device

__all__ = ["ACTIVE", "KIND_COLORS", "end", "profiler_range", "start"]

#: Range colour per kind: activity kinds, ``scope`` and ``capture`` (names the nvtx package knows).
KIND_COLORS = {
    "scope": "green",
    "user": "blue",
    "kernel": "orange",
    "memcpy": "purple",
    "memset": "yellow",
    "graph": "red",
    "capture": "cyan",
}

_domain = nvtx.get_domain("asyncgpu")
_attributes: dict[tuple[str, str], Any] = {}
#: Whether a tool (Nsight Systems…) receives ranges: without one the nvtx package hands out a no-op domain, and
#: the launch path skips the calls altogether.
ACTIVE = type(_domain).__name__ != "DummyDomain"

#: When set, called as ``sink("start"|"end", message_or_id)`` for every range (tests).
sink: Callable[[str, Any], None] | None = None


def start(message: str, kind: str) -> Any:
    """Open a range; returns the id to pass to `end`. Any thread."""
    if sink is not None:
        rid = object()
        sink("start", (message, rid))
        return rid
    key = (message, kind)
    attrs = _attributes.get(key)
    if attrs is None:
        attrs = _attributes[key] = _domain.get_event_attributes(message=message, color=KIND_COLORS[kind])
    return _domain.start_range(attrs)


def end(rid: Any) -> None:
    """Close a range opened by `start` (from any thread or task)."""
    if sink is not None:
        sink("end", rid)
        return
    _domain.end_range(rid)


@final
class _ProfilerRange:
    """``with profiler_range(...)`` / ``async with profiler_range(...)``: see `profiler_range`."""

    __slots__ = ("_devices", "_active", "_started", "_rid")

    def __init__(self, devices: Any, active: bool) -> None:
        self._devices, self._active = devices, bool(active)
        self._started: list[Device] | None = None
        self._rid: Any = None

    def __enter__(self) -> _ProfilerRange:
        if self._started is not None:
            raise ScopeError(
                "this profiler_range() block is already open: make a new capture range, "
                "profiler_range(...), for each block"
            )
        if not self._active:
            return self
        from asyncgpu._runtime.select import resolve_devices

        self._started = []
        try:
            for d in resolve_devices(self._devices):
                d._internal.profiler_start()
                self._started.append(d)
        except BaseException:
            self.__exit__()
            raise
        self._rid = start("capture", "capture")
        return self

    def __exit__(self, *exc: object) -> None:
        started, self._started = self._started, None
        if started is None:
            return
        if self._rid is not None:
            end(self._rid)
            self._rid = None
        errors = []
        for d in reversed(started):
            try:
                d._internal.profiler_stop()
            except Exception as e:  # stop every device, then report the first failure
                errors.append(e)
        if errors:
            raise errors[0]

    async def __aenter__(self) -> _ProfilerRange:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


def profiler_range(devices: Any = None, *, active: bool = True) -> _ProfilerRange:
    """A profiler capture range around a block, for ``nsys profile --capture-range=cudaProfilerApi``: starts the
    profiler (``cuProfilerStart``) on ``devices`` (default: every device of the default backend) on entry,
    stops it on exit, even when the block raises, and marks the block with an NVTX range ``"capture"``.
    A no-op on the host backend, and wholly (no device is even opened) when ``active`` is false, so that
    ``with profiler_range(active=(step == 10)):`` captures one iteration of a loop. Sync and async forms; neither is a
    checkpoint. Any thread."""
    return _ProfilerRange(devices, active)
