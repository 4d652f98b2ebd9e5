"""How to split work across devices (or ranks) so that they end together: the spread of busy time, the split in
proportion to throughput, and the arithmetic under `balance`'s wall model. `balance` and `asyncgpu.ranks` use it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["BusySplit", "BusySpread", "busy_split", "busy_spread", "round_whole", "suggest_split", "water_fill"]


class BusySpread(NamedTuple):
    """`busy_spread`'s answer."""

    mean_ms: float  #: the mean busy time (0.0 for none)
    max_ms: float  #: the longest busy time (0.0 for none)
    imbalance: float | None  #: max / mean (1.0: even); None without busy time
    busiest: int | None  #: the index of the longest busy time (the first of equal ones); None without busy time


def busy_spread(busy_ms: np.ndarray) -> BusySpread:
    """How evenly busy time is spread over devices (or ranks): `balance`'s imbalance and busiest device, and the
    ones `asyncgpu.ranks` reports across ranks and across every (rank, device)."""
    mean = float(busy_ms.mean()) if busy_ms.size else 0.0
    top = float(busy_ms.max()) if busy_ms.size else 0.0
    return BusySpread(mean, top, top / mean if mean > 0 else None, int(busy_ms.argmax()) if busy_ms.any() else None)


class BusySplit(NamedTuple):
    """`busy_split`'s answer, per device (or rank)."""

    throughput: np.ndarray  #: units per busy ms (0 where not measured)
    measured: np.ndarray  #: has both busy time and units
    share: np.ndarray  #: suggested fraction of all the units
    amount: np.ndarray  #: suggested units (whole when integral)
    predicted_ms: float | None  #: the longest busy time with ``amount``; None: nothing measured


def busy_split(units: np.ndarray, busy_ms: np.ndarray, integral: bool) -> BusySplit:
    """The split of ``units`` in proportion to units per busy ms, which ends every busy time together; devices
    (or ranks) without busy time or units keep theirs. The busy-time model `balance` falls back to, and the one
    `asyncgpu.ranks` uses across ranks."""
    measured = (busy_ms > 0) & (units > 0)
    throughput = np.where(measured, units / np.where(busy_ms > 0, busy_ms, 1.0), 0.0)
    share, amount = suggest_split(units, throughput, measured, integral)
    predicted = float((amount[measured] / throughput[measured]).max()) if throughput.any() else None
    return BusySplit(throughput, measured, share, amount, predicted)


def suggest_split(
    units: np.ndarray, throughput: np.ndarray, measured: np.ndarray, integral: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(share, amount)``: devices without a throughput keep their units; the rest of the units are split in
    proportion to throughput (whole units by largest remainder when ``integral``)."""
    total = units.sum()
    amount = units.copy()
    if throughput.any():
        rest = total - units[~measured].sum()
        quota = rest * throughput[measured] / throughput[measured].sum()
        amount[measured] = round_whole(quota, rest) if integral else quota
    return (amount / total if total > 0 else np.zeros_like(units)), amount


def round_whole(quota: np.ndarray, total: float) -> np.ndarray:
    """``quota`` in whole numbers that add up to ``total``: floors, then one more for the largest remainders."""
    whole = np.floor(quota)
    order = np.argsort(-(quota - whole), kind="stable")
    whole[order[: round(total - whole.sum())]] += 1
    return whole


def water_fill(start: np.ndarray, rate: np.ndarray, total: float) -> np.ndarray:
    """Units per device so that every device that gets some ends at one level: ``(level - start) * rate``, the
    level where they add up to ``total`` (a device starting at or after the level gets none)."""
    order = np.argsort(start, kind="stable")
    s, r = start[order], rate[order]
    level = (total + np.cumsum(r * s)) / np.cumsum(r)  # the level if the first k + 1 devices take part
    k = int(np.argmax(level <= np.append(s[1:], np.inf)))
    out = np.zeros_like(start)
    out[order] = np.maximum(level[k] - s, 0.0) * r
    return out
