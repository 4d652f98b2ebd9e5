"""Every exception asyncgpu raises on purpose (the hierarchy is drawn in `asyncgpu._base.errors`). The common ones are
also at the top level (``asyncgpu.ScopeError``); catch `AsyncGPUError` for all of them. `BlockingCallWarning` is
the one warning category (a `RuntimeWarning`)."""

from __future__ import annotations

from asyncgpu._base.errors import AsyncGPUError as AsyncGPUError
from asyncgpu._base.errors import BackendError as BackendError
from asyncgpu._base.errors import BenchmarkError as BenchmarkError
from asyncgpu._base.errors import BlockingCallWarning as BlockingCallWarning
from asyncgpu._base.errors import ClockError as ClockError
from asyncgpu._base.errors import ClosedError as ClosedError
from asyncgpu._base.errors import DeviceMismatchError as DeviceMismatchError
from asyncgpu._base.errors import GatherError as GatherError
from asyncgpu._base.errors import KernelRecordsError as KernelRecordsError
from asyncgpu._base.errors import KernelRecordsOverflowError as KernelRecordsOverflowError
from asyncgpu._base.errors import NoDeviceError as NoDeviceError
from asyncgpu._base.errors import NotReadyError as NotReadyError
from asyncgpu._base.errors import NotRecordedError as NotRecordedError
from asyncgpu._base.errors import PoolExhaustedError as PoolExhaustedError
from asyncgpu._base.errors import QueueFullError as QueueFullError
from asyncgpu._base.errors import ReleasedError as ReleasedError
from asyncgpu._base.errors import ScopeError as ScopeError
from asyncgpu._base.errors import SourceError as SourceError
from asyncgpu._base.errors import TimingDisabledError as TimingDisabledError
from asyncgpu._base.errors import UnknownDeviceError as UnknownDeviceError
from asyncgpu._base.publish import publish

__all__ = [
    "AsyncGPUError",
    "BackendError",
    "BenchmarkError",
    "BlockingCallWarning",
    "ClockError",
    "SourceError",
    "ClosedError",
    "DeviceMismatchError",
    "GatherError",
    "KernelRecordsError",
    "KernelRecordsOverflowError",
    "NoDeviceError",
    "NotReadyError",
    "NotRecordedError",
    "PoolExhaustedError",
    "QueueFullError",
    "ReleasedError",
    "ScopeError",
    "TimingDisabledError",
    "UnknownDeviceError",
]

publish(__name__, globals(), __all__)
