"""The balance of many steps at once (`step_split`): one busy block per device and step, over whole arrays. The
step timer (`asyncgpu._timing`) and the ranks' steps use it; the rules are `balance`'s, for that case."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["StepSplit", "step_split"]


class StepSplit(NamedTuple):
    """`step_split`'s answer: one row per step, one column per device (ns), and the straggler of each step."""

    step_ns: np.ndarray  #: (steps,) the step's window: its begin to the later of the host's exit and the last end
    busy_ns: np.ndarray  #: (steps, devices) the device's busy block of the step
    launch_bound_ns: np.ndarray  #: (steps, devices) idle before the block, the host still issuing the step
    dependency_ns: np.ndarray  #: (steps, devices) idle before the block, all of it issued (waits, earlier work)
    straggler: np.ndarray  #: (steps,) int: the device index, or -1 for the host (`asyncgpu._analysis.balance.HOST`)


def step_split(
    begin_ns: np.ndarray,
    exit_ns: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    issued_ns: np.ndarray,
    measured: tuple[np.ndarray, np.ndarray] | None = None,
) -> StepSplit:
    """The balance of many steps at once, each step a scope with one busy block per device: the arithmetic of
    `device_summary` and `balance` for that case, over whole arrays (no Python loop per step).

    ``begin_ns``/``exit_ns`` (steps,): the host's entry and exit of each step; ``start_ns``/``end_ns`` (steps,
    devices): the device's step events on the host clock; ``issued_ns`` (steps, devices): when the host had issued
    all of the step's work to the device (its end event's record). The block is ``[max(start, min(end, issued)),
    end]``: one event pair cannot see gaps inside the step, so the part of the span while the host was still issuing
    counts as the host's (the gap before the block is split at ``issued`` as `device_summary` splits gaps: launch-bound
    before it, dependency after). The straggler is `balance`'s: the device that ends last, or the host when its path
    is launch-bound or it ends last only because its work came later (`BalanceReport`). `balance`'s makespan ends at the
    last device's end; a step ends at the later of that and the host's exit, and the host's time after the last
    device end (its tail) counts with the critical device's launch-bound time: the host is the straggler when those
    two make at least half of the step (with no tail, `balance`'s own launch-bound rule).

    ``measured`` = ``(busy_ns, busy_before_issue_ns)`` (steps, devices): the device's work inside its step, as a
    record of each kernel gives it (CUPTI), in all and before ``issued``: then busy is that, and the device's idle
    time of the step is launch-bound while the host was still issuing, dependency after."""
    n, nd = start_ns.shape
    begin = begin_ns[:, None]
    if measured is None:
        lo = np.maximum(start_ns, np.minimum(end_ns, issued_ns))
        lo = np.maximum(lo, begin)
        end = np.maximum(end_ns, lo)
        busy = end - lo
        gap = lo - begin
        launch = np.clip(issued_ns - begin, 0.0, gap)
        dependency = gap - launch
    else:
        end = np.maximum(end_ns, begin)
        window = end - begin
        busy = np.clip(measured[0], 0.0, window)
        idle = window - busy
        launch = np.clip(np.clip(issued_ns - begin, 0.0, window) - measured[1], 0.0, idle)
        dependency = idle - launch
    last = end.max(axis=1) if nd else np.full(n, -np.inf)
    step = np.maximum(exit_ns, last) - begin_ns
    straggler = np.full(n, -1, np.int64)
    if nd:
        order = np.argsort(-end, axis=1, kind="stable")
        rows = np.arange(n)
        c = order[:, 0]
        makespan = end[rows, c] - begin_ns
        tail = np.maximum(exit_ns - last, 0.0)
        host = launch[rows, c] + tail >= 0.5 * (makespan + tail)
        if nd > 1:
            r = order[:, 1]
            lead = launch[rows, c] - launch[rows, r]
            host |= (lead > np.maximum(busy[rows, c] - busy[rows, r], 0.0)) & (lead >= 0.1 * makespan)
        host &= makespan + tail > 0
        straggler = np.where(host, -1, c)
    return StepSplit(step, busy, launch, dependency, straggler)
