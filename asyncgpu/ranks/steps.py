"""`watch_steps`: stragglers across ranks, found while the loop runs, with no per-step barrier.

Each rank's step timer (`asyncgpu.step_timer`) hands its finished steps to this watcher on its harvest thread. Every
``every`` steps (by step index: block ``b`` holds steps ``b * every .. (b + 1) * every - 1``), the block's summaries
(per step: entry and exit on the host, each device's end) are exchanged with ``all_gather_object`` over a private
gloo group, from a thread of the watcher's own (``asyncgpu-steps-ranks``): the training loop and its streams never
wait for it, and nothing goes through NCCL. For each step present on every rank, a rank ends at the later of its
host exit and its devices' last end. Its *lateness* is the clock-aligned end minus the earliest rank's end. Which
rank held the block back depends on how the ranks run:
- **Free-running** (no collective in the loop: ranks drift apart): a rank's *excess* is its step time (entry to end)
  minus the other ranks' median step time.
- **In lockstep** (a collective every step, as in data-parallel training: the ranks' step ends agree, within ``slack``
  of the step time or within half the spread of their step times, in most steps): the step ends together everywhere,
  so step times say nothing; the ranks that waited spent their wait inside the step. A rank's excess is then how late
  it came to the collective, behind the other ranks' median: the largest of its entry's lateness (a data loader
  before the step), its host's lateness in issuing the step (`Step.issued`, else the step's exit: slow issuing
  inside the step, where the collective runs on the devices, as NCCL's), and its devices' last end's lateness (their
  work ended last). A collective that the host waits in (gloo, or a ``.item()`` of its result) makes every rank
  issue at its end: call ``step.issued()`` before it, or the rank the others wait for there does not stand out.

Each excess is a median over the block's steps, and 0 at least; measured against the others' median rather than the
first rank, ranks that are only noisy read about 0 (against the first, each of several noisy ranks read a tenth of
a step behind, and the largest was flagged). The block's straggler is the rank with the largest excess, flagged when
that is at least ``slack`` of the median step time, with its own straggler (the device that ended last, or the
host): a straggler is known within ``every`` steps plus one exchange. A slow GPU whose peers wait inside a device
collective (NCCL) ends with them and comes to the work with them: the events source does not tell it from its
peers, whose collective kernels count as busy.

Clocks: times are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC). Ranks on one host share it, so lateness is
clock-aligned there. Across hosts it is not: pass ``clock_offset_ns`` (this rank's clock minus rank 0's, e.g.
`RankInfo.offset_ns` of an `asyncgpu.ranks.gather`, which measures it with pings), else lateness across hosts
holds the hosts' clock offset.

Ordering: every rank must mark the same step indices and create the watcher in the same order relative to other
collectives (``new_group`` is collective). A rank that stops early leaves the others' exchange waiting up to
``timeout_s``; the error is kept (`StepWatch.error`), the loop never sees it. Memory: the queue of blocks waiting to
be exchanged is bounded (``max_blocks``): beyond it the oldest waiting block is sent empty (the exchange still
happens, so ranks stay in step) and counted (`StepWatch.emptied`); the reports kept are the last ``keep``.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, final

import numpy as np

from asyncgpu._analysis.balance import HOST
from asyncgpu._analysis.summary import Plain
from asyncgpu._base.checks import number, whole
from asyncgpu._base.errors import GatherError
from asyncgpu._timing.steps import StepTimer

__all__ = ["RankStepReport", "StepWatch", "watch_steps"]

_STOP = object()


@final
@dataclass(frozen=True, slots=True)
class RankStepReport(Plain):
    """One exchanged block of steps, the same on every rank. Times in ms."""

    block: int  #: steps ``block * every`` to ``(block + 1) * every - 1``
    steps: int  #: steps of the block present on every rank
    straggler_rank: int | None  #: the rank with the largest median excess; None when no step is common
    straggler: str | None  #: that rank's own straggler in most of the block's steps: a device, or ``"host"``
    #: per rank, how much it held the block's steps back (median over them, 0 at least): free-running, its step time
    #: minus the other ranks' median; in lockstep, how late it came to the steps' work (see the module's docstring)
    excess_ms: tuple[float, ...]
    lateness_ms: tuple[float, ...]  #: per rank, its median end minus the earliest rank's end (host clock)
    step_ms: float  #: median step time (entry to end) over ranks and steps
    flagged: bool  #: the straggler's excess is at least ``slack`` of the step time
    lockstep: bool = False  #: the ranks' step ends agreed (a collective every step): see the module's docstring


@final
class StepWatch:
    """A running exchange of step summaries across ranks (see `watch_steps`)."""

    def __init__(
        self,
        timer: StepTimer,
        every: int,
        group: Any,
        slack: float,
        timeout_s: float,
        keep: int,
        max_blocks: int,
        clock_offset_ns: int,
    ) -> None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            raise GatherError(
                "watch_steps needs torch.distributed initialised: call torch.distributed.init_process_group() on "
                "every rank first (torchrun sets up its environment)"
            )
        self._dist = dist
        base = dist.group.WORLD if group is None else group
        self.rank, self.world = dist.get_rank(base), dist.get_world_size(base)
        self._group = dist.new_group(
            list(dist.get_process_group_ranks(base)), timeout=timedelta(seconds=timeout_s), backend="gloo"
        )
        self.every, self.slack, self._offset = every, slack, clock_offset_ns
        self.devices = tuple(d.name for d in timer.devices)
        self.reports: deque[RankStepReport] = deque(maxlen=keep)  #: the latest reports, oldest first
        self.flags: dict[int, int] = {}  #: blocks each rank was flagged in
        self.emptied = 0  #: blocks sent empty because the queue was full
        #: per exchange (the latest ``keep``), this rank's CPU time in it, ms: what the exchange costs the rank (its
        #: wall time also holds the wait for the slowest rank to reach that block)
        self.exchange_cpu_ms: deque[float] = deque(maxlen=keep)
        self.error: BaseException | None = None  #: what stopped the exchange, if anything
        self._buf: dict[int, list] = {}  # block -> [index, begin, exit, ends per device] rows
        self._next = 0  # the next block to send
        self._q: queue.Queue[Any] = queue.Queue()
        self._waiting = 0
        self._max_blocks = max_blocks
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="asyncgpu-steps-ranks", daemon=True)
        self._thread.start()
        timer._listen(self._take, self.close)

    # -- the harvest thread's side -------------------------------------------------------------------------------
    def _take(
        self, index: np.ndarray, begin: np.ndarray, exit_: np.ndarray, end: np.ndarray, issued: np.ndarray, split: Any
    ) -> None:
        for i in range(len(index)):
            row = [int(index[i]), int(begin[i]), int(exit_[i]), end[i].tolist(), int(split.straggler[i])]
            row.append(float(np.nanmax(issued[i])))  # (when its host had issued the step: `Step.issued`, else exit)
            self._buf.setdefault(int(index[i]) // self.every, []).append(row)
        last = int(index[-1]) // self.every
        while self._next < last:  # blocks before the newest step's are complete
            self._send(self._next)

    def _send(self, block: int) -> None:
        rows = self._buf.pop(block, [])
        with self._lock:
            self._waiting += 1
            if self._waiting > self._max_blocks:
                self.emptied += 1
                rows = []
        self._q.put((block, rows))
        self._next = block + 1

    # -- the exchange thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            with self._lock:
                self._waiting -= 1
            if self.error is not None:
                continue
            block, rows = item
            out: list[Any] = [None] * self.world
            cpu0 = time.thread_time_ns()
            try:
                self._dist.all_gather_object(out, (self._offset, self.devices, rows), group=self._group)
            except Exception as exc:  # (a rank gone or late past timeout_s)
                self.error = exc
                continue
            rep = _report(block, out, self.slack)
            self.exchange_cpu_ms.append((time.thread_time_ns() - cpu0) / 1e6)
            self.reports.append(rep)
            if rep.flagged and rep.straggler_rank is not None:
                self.flags[rep.straggler_rank] = self.flags.get(rep.straggler_rank, 0) + 1

    def close(self) -> None:
        """Send the blocks still buffered, then stop and join the exchange thread (blocks until the last exchange
        is done or has timed out). The step timer calls it at its exit. Idempotent."""
        if not self._thread.is_alive():
            return
        if self._buf:
            for block in range(self._next, max(self._buf) + 1):
                self._send(block)
        self._q.put(_STOP)
        self._thread.join()
        if self.error is None:
            self._dist.destroy_process_group(self._group)

    def __repr__(self) -> str:
        return (
            f"<asyncgpu.ranks.StepWatch rank {self.rank}/{self.world} every={self.every} reports={len(self.reports)}>"
        )


def _others_median(x: np.ndarray) -> np.ndarray:
    """For ``x`` (steps, ranks ≥ 2): per step and rank, the median of the other ranks' values. From each step's
    sorted values: the k-th smallest of the others is the k-th of all where the rank sits above it, else the next."""
    s = np.sort(x, axis=1)
    place = np.argsort(np.argsort(x, axis=1, kind="stable"), axis=1)  # each value's index in s
    m = x.shape[1] - 1  # how many others

    def kth(k: int) -> np.ndarray:
        return np.where(place > k, s[:, k : k + 1], s[:, k + 1 : k + 2])

    return (kth((m - 1) // 2) + kth(m // 2)) / 2


def _report(block: int, gathered: list, slack: float) -> RankStepReport:
    """The block's report from every rank's ``(offset, devices, rows)``."""
    per_rank = []
    for offset, devices, rows in gathered:
        # step -> (entry, end, its devices' last end, straggler code, devices, issued), on rank 0's clock
        m = {
            r[0]: (r[1] - offset, max([r[2], *r[3]]) - offset, max(r[3]) - offset, r[4], devices, r[5] - offset)
            for r in rows
        }
        per_rank.append(m)
    common = sorted(set.intersection(*(set(m) for m in per_rank))) if per_rank else []
    world = len(gathered)
    if not common:
        nan = tuple([float("nan")] * world)
        return RankStepReport(block, 0, None, None, nan, nan, float("nan"), False)
    begins, ends, dev_ends, issued = (
        np.array([[m[i][k] for m in per_rank] for i in common], np.float64) for k in (0, 1, 2, 5)
    )
    dur = ends - begins
    step_ms = float(np.median(dur)) / 1e6
    late = np.median(ends - ends.min(axis=1, keepdims=True), axis=0)  # behind the step's first rank

    def behind(x: np.ndarray) -> np.ndarray:
        # per rank, its median over steps of x minus the other ranks' median, 0 at least (module docstring)
        if world < 2:
            return np.zeros(world)
        return np.maximum(np.median(x - _others_median(x), axis=0), 0.0)

    # In lockstep the ends agree within slack of the step, or at least far better than the step times do (a rank
    # slow before its step: its step is the short one). Free-running ranks drift: their ends part step by step.
    spread = float(np.median(ends.max(axis=1) - ends.min(axis=1))) / 1e6
    dur_spread = float(np.median(dur.max(axis=1) - dur.min(axis=1))) / 1e6
    lockstep = world > 1 and spread <= max(slack * step_ms, dur_spread / 2)
    med = np.maximum(np.maximum(behind(begins), behind(issued)), behind(dev_ends)) if lockstep else behind(dur)
    r = int(np.argmax(med))
    who: dict[str, int] = {}
    for i in common:
        code, devices = per_rank[r][i][3], per_rank[r][i][4]
        name = HOST if code < 0 else devices[code]
        who[name] = who.get(name, 0) + 1
    flagged = world > 1 and med[r] / 1e6 >= slack * step_ms and med[r] > 0
    return RankStepReport(
        block,
        len(common),
        r if world > 1 else None,
        max(who.items(), key=lambda kv: kv[1])[0] if world > 1 else None,
        tuple(float(x) / 1e6 for x in med),
        tuple(float(x) / 1e6 for x in late),
        step_ms,
        bool(flagged),
        bool(lockstep),
    )


def watch_steps(
    timer: StepTimer,
    *,
    every: int = 50,
    group: Any = None,
    slack: float = 0.1,
    timeout_s: float = 300.0,
    keep: int = 100,
    max_blocks: int = 16,
    clock_offset_ns: int = 0,
) -> StepWatch:
    """Exchange ``timer``'s step summaries with the other ranks of ``group`` (a torch.distributed process group;
    default the world) every ``every`` steps, off the loop's thread, and flag a straggler rank (and its straggler
    device) whose median excess step time is at least ``slack`` of the step time. Call it on every rank, in the
    same order, with the timer open (it makes a gloo group: a collective). Blocks until that group exists; after
    that nothing here blocks the loop. The timer's exit closes it. See the module docstring for clocks and ordering."""
    if not isinstance(timer, StepTimer):
        raise TypeError(f"watch_steps() watches a step timer (asyncgpu.step_timer(...)), not {timer!r}")
    return StepWatch(
        timer,
        whole("every", every, minimum=1, hint="steps between exchanges"),
        group,
        number("slack", slack, unit="of the step time", minimum=0.0),
        number("timeout_s", timeout_s, unit="seconds", minimum=1.0),
        whole("keep", keep, minimum=1, hint="reports kept"),
        whole("max_blocks", max_blocks, minimum=1, hint="blocks waiting to be exchanged"),
        int(clock_offset_ns),
    )
