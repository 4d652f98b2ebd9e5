"""NVTX ranges for scopes and activities, in the ``asyncgpu`` domain, for Nsight Systems.

Ranges are started and ended with ``start_range``/``end_range`` (not push/pop): push/pop nest per OS thread
and mis-nest across ``await``. Without a profiler attached the nvtx package hands out a no-op domain, so a
range costs about 0.1 µs. `sink` lets tests observe ranges without a profiler.
"""

from __future__ import annotations

from typing import Any, Callable

import nvtx

__all__ = ["start", "end", "KIND_COLORS"]

KIND_COLORS = {"scope": "green", "user": "blue", "kernel": "orange", "memcpy": "purple", "memset": "yellow",
               "graph": "red"}

_domain = nvtx.get_domain("asyncgpu")
_attributes: dict[tuple[str, str], Any] = {}

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
        attrs = _attributes[key] = _domain.get_event_attributes(message=message, color=KIND_COLORS.get(kind, "gray"))
    return _domain.start_range(attrs)


def end(rid: Any) -> None:
    """Close a range opened by `start` (from any thread or task)."""
    if sink is not None:
        sink("end", rid)
        return
    _domain.end_range(rid)
