"""asyncgpu: time and orchestrate GPU work across several GPUs from asyncio and trio.

    import asyncgpu

    async with asyncgpu.gpu_timer(asyncgpu.devices()) as t:
        ...                       # launch work on each device's streams
    rich.print(t)                 # activities, totals per kind and per device

    ev = dev.record()             # a pooled event after the work enqueued so far
    await ev.wait()               # resumes when the GPU has passed it; the loop keeps running
"""

from ._device import Device as Device
from ._errors import AsyncGPUError as AsyncGPUError
from ._errors import BackendError as BackendError
from ._errors import ClosedError as ClosedError
from ._errors import DeviceMismatchError as DeviceMismatchError
from ._errors import NoDeviceError as NoDeviceError
from ._errors import NotReadyError as NotReadyError
from ._errors import NotRecordedError as NotRecordedError
from ._errors import PoolExhaustedError as PoolExhaustedError
from ._errors import ReleasedError as ReleasedError
from ._errors import ScopeError as ScopeError
from ._errors import TimingDisabledError as TimingDisabledError
from ._errors import UnknownDeviceError as UnknownDeviceError
from ._event import Event as Event
from ._memory import DeviceArray as DeviceArray
from ._pool import PoolStats as PoolStats
from ._select import close_all as close_all
from ._select import default_backend as default_backend
from ._select import device as device
from ._select import devices as devices
from ._stream import Stream as Stream
from ._timer import ActivityRecord as ActivityRecord
from ._timer import Timer as Timer
from ._timer import gpu_timer as gpu_timer

__version__ = "0.1.0"

__all__ = [
    "ActivityRecord",
    "AsyncGPUError",
    "BackendError",
    "ClosedError",
    "Device",
    "DeviceArray",
    "DeviceMismatchError",
    "Event",
    "NoDeviceError",
    "NotReadyError",
    "NotRecordedError",
    "PoolExhaustedError",
    "PoolStats",
    "ReleasedError",
    "ScopeError",
    "Stream",
    "Timer",
    "TimingDisabledError",
    "UnknownDeviceError",
    "close_all",
    "default_backend",
    "device",
    "devices",
    "gpu_timer",
]
