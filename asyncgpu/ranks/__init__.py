"""One timing scope gathered from every rank of a torch.distributed process group or an mpi4py communicator,
merged on the root with the ranks' host clocks aligned, and a balance across ranks.

    with asyncgpu.gpu_timer(dev) as t:
        ...
        asyncgpu.ranks.mark_collective("allreduce")      # right before each collective, on every rank
    merged = asyncgpu.ranks.gather(t)                    # a RankTimeline on rank 0, None elsewhere

Stragglers while a loop runs, with no per-step barrier: ``asyncgpu.ranks.watch_steps(step_timer, every=50)``.

See `asyncgpu.ranks.gather` for the protocol, the clock offsets and the threads.
"""

from __future__ import annotations

from asyncgpu._base.publish import publish
from asyncgpu.ranks.balance import CollectivePoint as CollectivePoint
from asyncgpu.ranks.balance import RankBalance as RankBalance
from asyncgpu.ranks.balance import RankDeviceRow as RankDeviceRow
from asyncgpu.ranks.balance import RankRow as RankRow
from asyncgpu.ranks.exchange import gather as gather
from asyncgpu.ranks.exchange import mark_collective as mark_collective
from asyncgpu.ranks.merge import RankInfo as RankInfo
from asyncgpu.ranks.merge import RankTimeline as RankTimeline
from asyncgpu.ranks.steps import RankStepReport as RankStepReport
from asyncgpu.ranks.steps import StepWatch as StepWatch
from asyncgpu.ranks.steps import watch_steps as watch_steps

__all__ = [
    "CollectivePoint",
    "RankBalance",
    "RankDeviceRow",
    "RankInfo",
    "RankRow",
    "RankStepReport",
    "RankTimeline",
    "StepWatch",
    "gather",
    "mark_collective",
    "watch_steps",
]

publish(__name__, globals(), __all__)
