"""The functional form of a timing scope, for code that cannot wrap its work in a block: `timing_begin` enters a
`Timer` (the blocking form), `timing_end` leaves it and returns its records, `timing_print` prints records.

Threads: `timing_end` blocks the calling thread while it waits for the devices (GIL released).
"""

from __future__ import annotations

from typing import Any, Iterable

from asyncgpu._base.errors import ScopeError
from asyncgpu._base.records import ActivityRecord
from asyncgpu._timing.scope import Timer, gpu_timer

__all__ = ["timing_begin", "timing_end", "timing_print"]

_functional: list[Timer] = []  # begun and not yet ended, oldest first


def timing_begin(
    devices: Any = None,
    *,
    kinds: Iterable[str] | None = None,
    synchronize: bool = False,
    label: str = "timing",
    source: str = "events",
) -> Timer:
    """Start recording (as Warp's ``timing_begin``): activities enqueued from here on, in this context and the
    tasks it starts, are recorded until `timing_end`. Blocking form: call it from plain code or a thread.
    ``source`` as in `gpu_timer`."""
    t = gpu_timer(devices, label=label, synchronize=synchronize, kinds=kinds, source=source)
    t.__enter__()
    _functional.append(t)
    return t


def timing_end(timer: Timer | None = None) -> list[ActivityRecord]:
    """Stop the recording started by `timing_begin` (the latest one by default), wait for its devices (GIL
    released) and return its records. The `Timer` itself is returned by `timing_begin` for the other results."""
    if not _functional:
        raise ScopeError("timing_end() without timing_begin(): call asyncgpu.timing_begin() first")
    if timer is None:
        timer = _functional[-1]
    elif timer not in _functional:
        raise ScopeError("that timer was not started by timing_begin(), or was already ended")
    _functional.remove(timer)
    timer.__exit__(None, None, None)
    return timer.records


def timing_print(records: Iterable[ActivityRecord], indent: str = "") -> None:
    """Print records (what `timing_end` returns, or a `Timer`'s) as the activity and per-device tables (to the
    terminal through rich)."""
    from rich.console import Console

    from asyncgpu._analysis.report import records_report

    if isinstance(records, Timer):
        records = records.records
    rows = list(records) if isinstance(records, Iterable) and not isinstance(records, str) else None
    if rows is None or not all(isinstance(r, ActivityRecord) for r in rows):
        raise TypeError(
            f"timing_print() prints ActivityRecords (what timing_end() returns, or t.records), not {records!r}"
        )
    Console().print(records_report(rows, indent))
