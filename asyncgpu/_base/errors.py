"""Every exception asyncgpu raises on purpose: one root, one class per kind of mistake or failure.

Every message names the fix. Errors raised by a backend (a CUDA driver error, a failed host stream) are
`BackendError`; errors from misuse are the other subclasses::

    AsyncGPUError
    ├── NoDeviceError                     no usable device of the backend asked for
    ├── UnknownDeviceError (LookupError)  a device index, name or backend that does not exist
    ├── DeviceMismatchError (ValueError)  objects of two devices or backends combined
    ├── NotRecordedError                  an event used before it was recorded
    ├── NotReadyError                     a result read before the device reached it
    ├── TimingDisabledError               elapsed time of an event recorded without timing
    ├── ReleasedError                     an event (or handoff) used after it went back to its pool
    ├── ClosedError                       a device worker, channel or graph used after close
    ├── PoolExhaustedError                the event pool reached its bound
    ├── QueueFullError                    a launch from an event loop's thread onto a full stream
    ├── ScopeError                        a timing scope, capture or block misused
    ├── ClockError                        a device clock could not be aligned to the host clock
    ├── SourceError                       a timing source (CUPTI) cannot be used here
    ├── KernelRecordsError (ValueError)   in-kernel records that cannot be decoded as they are
    │   └── KernelRecordsOverflowError    in-kernel records were dropped (a lane was full)
    ├── BenchmarkError                    the benchmarked function (or its device) failed
    ├── GatherError                       a gather across ranks failed
    └── BackendError (RuntimeError)       the backend failed (a CUDA driver error, sticky or not)

One warning category, outside that tree (a warning is not an error; ``-W error`` turns it into one)::

    BlockingCallWarning (RuntimeWarning)  a call that blocks its thread, made from an event loop's thread
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AsyncGPUError",
    "BackendError",
    "BenchmarkError",
    "BlockingCallWarning",
    "GatherError",
    "ClockError",
    "SourceError",
    "ClosedError",
    "DeviceMismatchError",
    "KernelRecordsError",
    "KernelRecordsOverflowError",
    "NoDeviceError",
    "NotRecordedError",
    "NotReadyError",
    "PoolExhaustedError",
    "QueueFullError",
    "ReleasedError",
    "ScopeError",
    "TimingDisabledError",
    "UnknownDeviceError",
]


class AsyncGPUError(Exception):
    """Root of every error asyncgpu raises on purpose."""


class NoDeviceError(AsyncGPUError):
    """No device of the requested backend is usable (for CUDA: no driver, or no GPU)."""


class UnknownDeviceError(AsyncGPUError, LookupError):
    """A device index or name that does not exist."""


class DeviceMismatchError(AsyncGPUError, ValueError):
    """Objects of two devices (or of two backends) were combined where one device is required."""


class NotRecordedError(AsyncGPUError):
    """An event was queried, waited on or timed before it was ever recorded."""


class NotReadyError(AsyncGPUError):
    """A result was read before the device reached the event that produces it."""


class TimingDisabledError(AsyncGPUError):
    """Elapsed time was asked of an event recorded with ``timing=False``."""


class ReleasedError(AsyncGPUError):
    """An event was used after it went back to its pool (its scope closed, or it was released)."""


class ClosedError(AsyncGPUError):
    """A device worker (or another resource) was used after ``close()``, or a worker the parent process opened
    was used in a child after ``os.fork()`` (its threads do not run there)."""


class PoolExhaustedError(AsyncGPUError):
    """The per-device event pool reached its bound: release events sooner or raise ``max_events``."""


class QueueFullError(AsyncGPUError):
    """A launch or record from an event loop's thread found its stream's queue full: the driver would block the
    loop's thread until the device drains (for ever behind held work). Nothing was enqueued or taken: ``await
    stream.room()`` and launch again."""


class ScopeError(AsyncGPUError):
    """A timing scope was misused: reused after exit, entered twice, or an activity outside its scope."""


class BackendError(AsyncGPUError, RuntimeError):
    """The backend failed: a CUDA driver error (possibly sticky, poisoning the context) or a host stream failure."""


class ClockError(AsyncGPUError):
    """A device clock could not be aligned to the host clock (the device stayed busy, or lacks stream memory
    operations). Scopes then keep that device's times relative to its own scope start, and say so."""


class SourceError(AsyncGPUError):
    """A timing source cannot be used: ``source="cupti"`` without cupti-python, with CUPTI held by another tool
    (torch.profiler, Nsight Systems: one subscriber per process), with a CUPTI that does not match the driver,
    or on the host backend. ``source="auto"`` never raises it: it falls back to events and says why."""


class KernelRecordsError(AsyncGPUError, ValueError):
    """In-kernel records that cannot be decoded as they are: a buffer that is empty, corrupt, of another format,
    not armed or reused without zeroing, a lane whose kernel never called finalize, unmatched begin/end.
    ``problems`` lists every finding (decode with ``strict=False`` to keep what is sound and read them there)."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems) or (message,)


class KernelRecordsOverflowError(KernelRecordsError):
    """In-kernel records were dropped: a lane was full, or the buffer had no lane for some (block, group).
    Raise the profiler's ``capacity``, or arm it with the launch's grid and groups."""


class BenchmarkError(AsyncGPUError):
    """``fn`` raised (or its device failed) during `benchmark`. Raised from the original exception.

    ``result`` holds the repeats every device completed before the failure (possibly none); ``device`` is
    where it happened and ``phase`` when (``"warm-up"`` or ``"repeat N"``, counted from 0)."""

    def __init__(self, message: str, result: Any, device: str, phase: str) -> None:
        super().__init__(message)
        self.result = result  #: the `BenchmarkResult` of the repeats completed before the failure
        self.device = device
        self.phase = phase


class GatherError(AsyncGPUError):
    """`asyncgpu.ranks.gather` failed: ranks that disagree (scope label, device count, backend, asyncgpu
    version), ranks that did not reach the gather in time (``missing_ranks``), no usable process group, or a
    payload that is not one this version reads. The same error is raised on every rank that reached the gather."""

    def __init__(self, message: str, missing_ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.missing_ranks = tuple(missing_ranks)  #: ranks that never checked in (timeouts), in the group's numbering


class BlockingCallWarning(RuntimeWarning):
    """A call that blocks its thread until a device finishes (``event.wait_sync()``, ``device.synchronize()``,
    ``benchmark()``, a plain ``with gpu_timer(...)``, ``device.close()`` with work queued…) was made from a
    thread that runs an event loop: every other task of that loop stalls until it returns. The message names
    the async form (``await event.wait()``, ``async with gpu_timer(...)``, ``await device.aclose()``…).

    Calls whose wait could deadlock the loop (a channel's ``put_sync``/``get_sync``, ``wait_done_sync``: the
    other side may be a task of the same loop) raise `RuntimeError` there instead."""
