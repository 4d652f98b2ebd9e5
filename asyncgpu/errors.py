"""Every exception asyncgpu raises on purpose (the hierarchy is drawn in `asyncgpu._errors`). The common ones are
also at the top level (``asyncgpu.ScopeError``); catch `AsyncGPUError` for all of them. `BlockingCallWarning` is
the one warning category (a `RuntimeWarning`)."""

from __future__ import annotations

from ._errors import AsyncGPUError as AsyncGPUError
from ._errors import BackendError as BackendError
from ._errors import BenchmarkError as BenchmarkError
from ._errors import BlockingCallWarning as BlockingCallWarning
from ._errors import ClockError as ClockError
from ._errors import ClosedError as ClosedError
from ._errors import DeviceMismatchError as DeviceMismatchError
from ._errors import GatherError as GatherError
from ._errors import KernelRecordsError as KernelRecordsError
from ._errors import KernelRecordsOverflowError as KernelRecordsOverflowError
from ._errors import NoDeviceError as NoDeviceError
from ._errors import NotReadyError as NotReadyError
from ._errors import NotRecordedError as NotRecordedError
from ._errors import PoolExhaustedError as PoolExhaustedError
from ._errors import QueueFullError as QueueFullError
from ._errors import ReleasedError as ReleasedError
from ._errors import ScopeError as ScopeError
from ._errors import SourceError as SourceError
from ._errors import TimingDisabledError as TimingDisabledError
from ._errors import UnknownDeviceError as UnknownDeviceError
from ._public import publish

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
