"""asyncgpu: time and orchestrate GPU work across several GPUs from asyncio and trio.

    import asyncgpu

    async with asyncgpu.gpu_timer(asyncgpu.devices()) as t:
        ...                       # launch work on each device's streams
    rich.print(t)                 # activities, totals per kind and per device

    ev = dev.record()             # a pooled event after the work enqueued so far
    await ev.wait()               # resumes when the GPU has passed it; the loop keeps running
    await dev.run(step, batch)    # step(stream, batch) on the device's own worker thread: one per GPU
    host = await dev.aalloc_pinned(n)   # blocking calls have awaitable forms: an `a` in front of the name

The top level holds what most programs use. Specialist parts are public submodules: `asyncgpu.kernel`
(in-kernel records), `asyncgpu.ranks` (gather across ranks), `asyncgpu.errors` (every exception) and
`asyncgpu.types` (every type the library returns). ``ARCHITECTURE.md`` describes the layers behind them.
"""

from asyncgpu import errors as errors  # (public submodules, importable as attributes)
from asyncgpu import kernel as kernel
from asyncgpu import ranks as ranks
from asyncgpu import types as types
from asyncgpu._analysis.balance import balance as balance
from asyncgpu._analysis.summary import activity_summary as activity_summary
from asyncgpu._analysis.summary import device_summary as device_summary
from asyncgpu._base.errors import AsyncGPUError as AsyncGPUError
from asyncgpu._base.errors import BackendError as BackendError
from asyncgpu._base.errors import ClosedError as ClosedError
from asyncgpu._base.errors import DeviceMismatchError as DeviceMismatchError
from asyncgpu._base.errors import NoDeviceError as NoDeviceError
from asyncgpu._base.errors import ReleasedError as ReleasedError
from asyncgpu._base.errors import ScopeError as ScopeError
from asyncgpu._base.errors import TimingDisabledError as TimingDisabledError
from asyncgpu._base.publish import publish as _publish
from asyncgpu._base.records import KINDS as KINDS
from asyncgpu._base.records import ActivityRecord as ActivityRecord
from asyncgpu._base.records import DeviceClock as DeviceClock
from asyncgpu._base.records import Timeline as Timeline
from asyncgpu._handoff.channel import Channel as Channel
from asyncgpu._handoff.records import Handoff as Handoff
from asyncgpu._handoff.records import HandoffRecord as HandoffRecord
from asyncgpu._integrations.ipython import load_ipython_extension as load_ipython_extension
from asyncgpu._runtime.clock import check_alignment as check_alignment
from asyncgpu._runtime.device import Device as Device
from asyncgpu._runtime.event import Event as Event
from asyncgpu._runtime.graph import Graph as Graph
from asyncgpu._runtime.memory import DeviceArray as DeviceArray
from asyncgpu._runtime.select import close_all as close_all
from asyncgpu._runtime.select import default_backend as default_backend
from asyncgpu._runtime.select import device as device
from asyncgpu._runtime.select import devices as devices
from asyncgpu._runtime.stream import Stream as Stream
from asyncgpu._timing.bench import BenchmarkResult as BenchmarkResult
from asyncgpu._timing.bench import benchmark as benchmark
from asyncgpu._timing.functional import timing_begin as timing_begin
from asyncgpu._timing.functional import timing_end as timing_end
from asyncgpu._timing.functional import timing_print as timing_print
from asyncgpu._timing.history import kernel_history as kernel_history
from asyncgpu._timing.nvtx import profiler_range as profiler_range
from asyncgpu._timing.scope import Timer as Timer
from asyncgpu._timing.scope import gpu_timer as gpu_timer
from asyncgpu._timing.steps import StepTimer as StepTimer
from asyncgpu._timing.steps import step_timer as step_timer
from asyncgpu._trace.export import read_trace as read_trace
from asyncgpu._trace.export import to_csv as to_csv
from asyncgpu._trace.export import to_json as to_json
from asyncgpu._trace.export import write_trace as write_trace
from asyncgpu._version import __version__ as __version__

__all__ = [
    "KINDS",
    "ActivityRecord",
    "AsyncGPUError",
    "BackendError",
    "BenchmarkResult",
    "Channel",
    "ClosedError",
    "Device",
    "DeviceArray",
    "DeviceClock",
    "DeviceMismatchError",
    "Event",
    "Graph",
    "Handoff",
    "HandoffRecord",
    "NoDeviceError",
    "ReleasedError",
    "ScopeError",
    "StepTimer",
    "Stream",
    "Timeline",
    "Timer",
    "TimingDisabledError",
    "activity_summary",
    "balance",
    "benchmark",
    "check_alignment",
    "close_all",
    "default_backend",
    "device",
    "device_summary",
    "devices",
    "gpu_timer",
    "kernel_history",
    "load_ipython_extension",
    "profiler_range",
    "read_trace",
    "step_timer",
    "timing_begin",
    "timing_end",
    "timing_print",
    "to_csv",
    "to_json",
    "write_trace",
]

_EXCEPTIONS = {n for n in __all__ if n.endswith("Error")}  # their public path is asyncgpu.errors

# Names that lived at the top level before 0.2, removed in 0.3 (CHANGELOG.md): the error names their new place.
_MOVED = {
    "capture": "asyncgpu.profiler_range",
    "KernelProfiler": "asyncgpu.kernel.KernelProfiler",
    "KernelRecords": "asyncgpu.kernel.KernelRecords",
    "HostLane": "asyncgpu.kernel.HostLane",
    "KernelRecordsError": "asyncgpu.errors.KernelRecordsError",
    "gather": "asyncgpu.ranks.gather",
    "mark_collective": "asyncgpu.ranks.mark_collective",
    "RankTimeline": "asyncgpu.ranks.RankTimeline",
    "GatherError": "asyncgpu.errors.GatherError",
    "BenchmarkError": "asyncgpu.errors.BenchmarkError",
    "ClockError": "asyncgpu.errors.ClockError",
    "NotReadyError": "asyncgpu.errors.NotReadyError",
    "NotRecordedError": "asyncgpu.errors.NotRecordedError",
    "PoolExhaustedError": "asyncgpu.errors.PoolExhaustedError",
    "UnknownDeviceError": "asyncgpu.errors.UnknownDeviceError",
    "ClockCalibration": "asyncgpu.types.ClockCalibration",
    "PoolStats": "asyncgpu.types.PoolStats",
    "ActivitySummary": "asyncgpu.types.ActivitySummary",
    "DeviceSummary": "asyncgpu.types.DeviceSummary",
    "BalanceReport": "asyncgpu.types.BalanceReport",
}


def __getattr__(name: str) -> object:
    where = _MOVED.get(name)
    if where is None:
        raise AttributeError(f"module 'asyncgpu' has no attribute {name!r}")
    raise AttributeError(f"asyncgpu.{name} is {where} (the old name was removed in 0.3): import it from there")


_publish(__name__, globals(), [n for n in __all__ if n not in _EXCEPTIONS])
