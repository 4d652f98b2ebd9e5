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

import warnings as _warnings

from . import errors as errors  # noqa: E402  (public submodules, importable as attributes)
from . import kernel as kernel
from . import ranks as ranks
from . import types as types
from ._bench import BenchmarkResult as BenchmarkResult
from ._bench import benchmark as benchmark
from ._core.clock import check_alignment as check_alignment
from ._core.device import Device as Device
from ._core.event import Event as Event
from ._core.graph import Graph as Graph
from ._core.memory import DeviceArray as DeviceArray
from ._core.select import close_all as close_all
from ._core.select import default_backend as default_backend
from ._core.select import device as device
from ._core.select import devices as devices
from ._core.stream import Stream as Stream
from ._errors import AsyncGPUError as AsyncGPUError
from ._errors import BackendError as BackendError
from ._errors import ClosedError as ClosedError
from ._errors import DeviceMismatchError as DeviceMismatchError
from ._errors import NoDeviceError as NoDeviceError
from ._errors import ReleasedError as ReleasedError
from ._errors import ScopeError as ScopeError
from ._errors import TimingDisabledError as TimingDisabledError
from ._export import read_trace as read_trace
from ._export import to_csv as to_csv
from ._export import to_json as to_json
from ._export import write_trace as write_trace
from ._handoff import Channel as Channel
from ._handoff import Handoff as Handoff
from ._handoff import HandoffRecord as HandoffRecord
from ._history import kernel_history as kernel_history
from ._magic import load_ipython_extension as load_ipython_extension
from ._nvtx import profiler_range as profiler_range
from ._public import publish as _publish
from ._records import KINDS as KINDS
from ._records import ActivityRecord as ActivityRecord
from ._records import DeviceClock as DeviceClock
from ._records import Timeline as Timeline
from ._steps import StepTimer as StepTimer
from ._steps import step_timer as step_timer
from ._summary import activity_summary as activity_summary
from ._summary import balance as balance
from ._summary import device_summary as device_summary
from ._timer import Timer as Timer
from ._timer import gpu_timer as gpu_timer
from ._timer import timing_begin as timing_begin
from ._timer import timing_end as timing_end
from ._timer import timing_print as timing_print
from ._version import __version__ as __version__

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

# Names that lived at the top level before 0.2: they still work, with a DeprecationWarning naming the new place.
_MOVED = {
    "capture": ("asyncgpu", "profiler_range"),
    "KernelProfiler": ("asyncgpu.kernel", "KernelProfiler"),
    "KernelRecords": ("asyncgpu.kernel", "KernelRecords"),
    "HostLane": ("asyncgpu.kernel", "HostLane"),
    "KernelRecordsError": ("asyncgpu.errors", "KernelRecordsError"),
    "gather": ("asyncgpu.ranks", "gather"),
    "mark_collective": ("asyncgpu.ranks", "mark_collective"),
    "RankTimeline": ("asyncgpu.ranks", "RankTimeline"),
    "GatherError": ("asyncgpu.errors", "GatherError"),
    "BenchmarkError": ("asyncgpu.errors", "BenchmarkError"),
    "ClockError": ("asyncgpu.errors", "ClockError"),
    "NotReadyError": ("asyncgpu.errors", "NotReadyError"),
    "NotRecordedError": ("asyncgpu.errors", "NotRecordedError"),
    "PoolExhaustedError": ("asyncgpu.errors", "PoolExhaustedError"),
    "UnknownDeviceError": ("asyncgpu.errors", "UnknownDeviceError"),
    "ClockCalibration": ("asyncgpu.types", "ClockCalibration"),
    "PoolStats": ("asyncgpu.types", "PoolStats"),
    "ActivitySummary": ("asyncgpu.types", "ActivitySummary"),
    "DeviceSummary": ("asyncgpu.types", "DeviceSummary"),
    "BalanceReport": ("asyncgpu.types", "BalanceReport"),
}


def __getattr__(name: str) -> object:
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'asyncgpu' has no attribute {name!r}")
    import importlib

    module, attr = moved
    where = f"{module}.{attr}"
    _warnings.warn(
        f"asyncgpu.{name} moved to {where}: import it from there (the old name goes in the next release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), attr)


_publish(__name__, globals(), [n for n in __all__ if n not in _EXCEPTIONS])
