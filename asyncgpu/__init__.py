"""asyncgpu: time and orchestrate GPU work across several GPUs from asyncio and trio.

    import asyncgpu

    async with asyncgpu.gpu_timer(asyncgpu.devices()) as t:
        ...                       # launch work on each device's streams
    rich.print(t)                 # activities, totals per kind and per device

    ev = dev.record()             # a pooled event after the work enqueued so far
    await ev.wait()               # resumes when the GPU has passed it; the loop keeps running
"""

from ._bench import BenchmarkError as BenchmarkError
from ._bench import BenchmarkResult as BenchmarkResult
from ._bench import benchmark as benchmark
from ._clock import ClockCalibration as ClockCalibration
from ._clock import check_alignment as check_alignment
from ._device import Device as Device
from ._errors import AsyncGPUError as AsyncGPUError
from ._errors import BackendError as BackendError
from ._errors import ClockError as ClockError
from ._errors import ClosedError as ClosedError
from ._errors import DeviceMismatchError as DeviceMismatchError
from ._errors import KernelRecordsError as KernelRecordsError
from ._errors import NoDeviceError as NoDeviceError
from ._errors import NotReadyError as NotReadyError
from ._errors import NotRecordedError as NotRecordedError
from ._errors import PoolExhaustedError as PoolExhaustedError
from ._errors import ReleasedError as ReleasedError
from ._errors import ScopeError as ScopeError
from ._errors import TimingDisabledError as TimingDisabledError
from ._errors import UnknownDeviceError as UnknownDeviceError
from ._event import Event as Event
from ._export import read_trace as read_trace
from ._export import to_csv as to_csv
from ._export import to_json as to_json
from ._export import write_trace as write_trace
from ._gather import GatherError as GatherError
from ._gather import RankTimeline as RankTimeline
from ._gather import gather as gather
from ._gather import mark_collective as mark_collective
from ._graph import Graph as Graph
from ._handoff import Channel as Channel
from ._handoff import Handoff as Handoff
from ._handoff import HandoffRecord as HandoffRecord
from ._history import kernel_history as kernel_history
from ._kdecode import KernelRecords as KernelRecords
from ._kformat import HostLane as HostLane
from ._kprofile import KernelProfiler as KernelProfiler
from ._magic import load_ipython_extension as load_ipython_extension
from ._memory import DeviceArray as DeviceArray
from ._nvtx import capture as capture
from ._pool import PoolStats as PoolStats
from ._select import close_all as close_all
from ._select import default_backend as default_backend
from ._select import device as device
from ._select import devices as devices
from ._stream import Stream as Stream
from ._records import KINDS as KINDS
from ._records import ActivityRecord as ActivityRecord
from ._records import Timeline as Timeline
from ._summary import ActivitySummary as ActivitySummary
from ._summary import BalanceReport as BalanceReport
from ._summary import DeviceSummary as DeviceSummary
from ._summary import activity_summary as activity_summary
from ._summary import balance as balance
from ._summary import device_summary as device_summary
from ._timer import Timer as Timer
from ._timer import gpu_timer as gpu_timer
from ._timer import timing_begin as timing_begin
from ._timer import timing_end as timing_end
from ._timer import timing_print as timing_print

__version__ = "0.1.0"

__all__ = [
    "ActivityRecord",
    "ActivitySummary",
    "AsyncGPUError",
    "BackendError",
    "BalanceReport",
    "BenchmarkError",
    "BenchmarkResult",
    "Channel",
    "ClockCalibration",
    "ClockError",
    "ClosedError",
    "Device",
    "DeviceArray",
    "DeviceMismatchError",
    "DeviceSummary",
    "Event",
    "GatherError",
    "Graph",
    "Handoff",
    "HandoffRecord",
    "HostLane",
    "KINDS",
    "KernelProfiler",
    "KernelRecords",
    "KernelRecordsError",
    "NoDeviceError",
    "NotReadyError",
    "NotRecordedError",
    "PoolExhaustedError",
    "PoolStats",
    "RankTimeline",
    "ReleasedError",
    "ScopeError",
    "Stream",
    "Timeline",
    "Timer",
    "TimingDisabledError",
    "UnknownDeviceError",
    "activity_summary",
    "balance",
    "benchmark",
    "capture",
    "check_alignment",
    "close_all",
    "default_backend",
    "device",
    "device_summary",
    "devices",
    "gather",
    "gpu_timer",
    "kernel_history",
    "load_ipython_extension",
    "mark_collective",
    "read_trace",
    "timing_begin",
    "timing_end",
    "timing_print",
    "to_csv",
    "to_json",
    "write_trace",
]
