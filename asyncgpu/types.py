"""Every type asyncgpu returns, importable from one public place (for annotations and ``isinstance``). The
types of the specialist parts live in their submodules (`asyncgpu.kernel`, `asyncgpu.ranks`)."""

from __future__ import annotations

from asyncgpu._analysis.balance import BalanceReport as BalanceReport
from asyncgpu._analysis.balance import DeviceBalance as DeviceBalance
from asyncgpu._analysis.summary import ActivityStats as ActivityStats
from asyncgpu._analysis.summary import ActivitySummary as ActivitySummary
from asyncgpu._analysis.summary import DeviceStats as DeviceStats
from asyncgpu._analysis.summary import DeviceSummary as DeviceSummary
from asyncgpu._base.publish import publish
from asyncgpu._base.records import ActivityRecord as ActivityRecord
from asyncgpu._base.records import CollectiveMark as CollectiveMark
from asyncgpu._base.records import DeviceClock as DeviceClock
from asyncgpu._base.records import HostRange as HostRange
from asyncgpu._base.records import ScopeInfo as ScopeInfo
from asyncgpu._base.records import Timeline as Timeline
from asyncgpu._handoff.records import HandoffRecord as HandoffRecord
from asyncgpu._runtime.clock import ClockCalibration as ClockCalibration
from asyncgpu._runtime.pool import PoolStats as PoolStats
from asyncgpu._timing.bench import BenchmarkResult as BenchmarkResult
from asyncgpu._timing.history import HistoryRecording as HistoryRecording
from asyncgpu._timing.history import LaunchRecord as LaunchRecord
from asyncgpu._timing.step_stats import DeviceStep as DeviceStep
from asyncgpu._timing.step_stats import StepRecord as StepRecord
from asyncgpu._timing.step_stats import StepStats as StepStats
from asyncgpu._timing.steps import Step as Step

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
