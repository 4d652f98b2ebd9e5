"""The exception hierarchy: one root, one class per kind of mistake.

Every message names the fix. Errors raised by a backend (a CUDA driver error, a failed host stream) are
`BackendError`; errors from misuse are the other subclasses.
"""

from __future__ import annotations

__all__ = [
    "AsyncGPUError",
    "BackendError",
    "ClockError",
    "ClosedError",
    "DeviceMismatchError",
    "KernelRecordsError",
    "KernelRecordsOverflowError",
    "NoDeviceError",
    "NotRecordedError",
    "NotReadyError",
    "PoolExhaustedError",
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
    """A device worker (or another resource) was used after ``close()``."""


class PoolExhaustedError(AsyncGPUError):
    """The per-device event pool reached its bound: release events sooner or raise ``max_events``."""


class ScopeError(AsyncGPUError):
    """A timing scope was misused: reused after exit, entered twice, or an activity outside its scope."""


class BackendError(AsyncGPUError, RuntimeError):
    """The backend failed: a CUDA driver error (possibly sticky, poisoning the context) or a host stream failure."""


class ClockError(AsyncGPUError):
    """A device clock could not be aligned to the host clock (the device stayed busy, or lacks stream memory
    operations). Scopes then keep that device's times relative to its own scope start, and say so."""


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
