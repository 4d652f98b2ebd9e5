"""Every type asyncgpu returns, importable from one public place (for annotations and ``isinstance``). The
types of the specialist parts live in their submodules (`asyncgpu.kernel`, `asyncgpu.ranks`)."""

from __future__ import annotations

from ._bench import BenchmarkResult as BenchmarkResult
from ._core.clock import ClockCalibration as ClockCalibration
from ._core.pool import PoolStats as PoolStats
from ._handoff import HandoffRecord as HandoffRecord
from ._history import HistoryRecording as HistoryRecording
from ._history import LaunchRecord as LaunchRecord
from ._public import publish
from ._records import ActivityRecord as ActivityRecord
from ._records import CollectiveMark as CollectiveMark
from ._records import DeviceClock as DeviceClock
from ._records import HostRange as HostRange
from ._records import ScopeInfo as ScopeInfo
from ._records import Timeline as Timeline
from ._steps import Step as Step
from ._stepstats import DeviceStep as DeviceStep
from ._stepstats import StepRecord as StepRecord
from ._stepstats import StepStats as StepStats
from ._summary import ActivityStats as ActivityStats
from ._summary import ActivitySummary as ActivitySummary
from ._summary import BalanceReport as BalanceReport
from ._summary import DeviceBalance as DeviceBalance
from ._summary import DeviceStats as DeviceStats
from ._summary import DeviceSummary as DeviceSummary

__all__ = [
    "ActivityRecord",
    "ActivityStats",
    "ActivitySummary",
    "BalanceReport",
    "BenchmarkResult",
    "ClockCalibration",
    "CollectiveMark",
    "DeviceBalance",
    "DeviceClock",
    "DeviceStats",
    "DeviceStep",
    "DeviceSummary",
    "HandoffRecord",
    "HistoryRecording",
    "HostRange",
    "LaunchRecord",
    "PoolStats",
    "ScopeInfo",
    "Step",
    "StepRecord",
    "StepStats",
    "Timeline",
]

# Types the top level also exports keep ``asyncgpu`` as their public path.
publish(
    __name__,
    globals(),
    [n for n in __all__ if n not in ("ActivityRecord", "BenchmarkResult", "DeviceClock", "HandoffRecord", "Timeline")],
)
