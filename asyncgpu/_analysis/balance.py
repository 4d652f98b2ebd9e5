"""The balance of a scope's work across its devices (`balance`): what bounded the wall makespan (a device, the
host, dependencies), how evenly the work was spread, and a re-split of it; `BalanceReport` draws itself with rich.

The split arithmetic (`asyncgpu._analysis.split`) is shared with `asyncgpu.ranks`, which applies it across ranks.
Times are in ms, from the scope's start, as in `device_summary`, which this builds on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any, NamedTuple, final

import numpy as np

from asyncgpu._analysis.split import BusySplit, busy_split, busy_spread, round_whole, water_fill
from asyncgpu._analysis.summary import DeviceStats, DeviceSummary, Plain, as_timeline, device_summary
from asyncgpu._analysis.text import BAR_WIDTH, bar, ms
from asyncgpu._base.records import Timeline

__all__ = ["HOST", "BalanceReport", "DeviceBalance", "balance", "device_note"]

HOST = "host"  #: `BalanceReport.straggler` when the host bounds the makespan
_REMEDY = (
    "launch each device's work from a thread of its own (its worker: await device.run(step)), capture repeated "
    "steps as CUDA graphs (asyncgpu.Graph), or launch fewer and larger kernels"
)


@final
@dataclass(frozen=True, slots=True)
class DeviceBalance:
    """One device in a `BalanceReport`. Times in ms, from the scope's start unless said otherwise."""

    device: str
    busy_ms: float
    last_end_ms: float | None
    wait_ms: float | None  #: the last device's last end minus this one's (≥ 0); None: no activity, not comparable
    units: int  #: the work units given (1 each when none were)
    throughput: float | None  #: units per busy ms; None without busy time or without units
    share: float  #: suggested fraction of all the units
    suggested_units: int | None  #: the share in whole units (when work units were given)
    note: str
    first_start_ms: float | None
    start_offset_ms: float | None  #: first start minus the earliest first start of the devices
    launch_bound_ms: float | None  #: idle before its next activity had been issued (`DeviceStats`)
    dependency_ms: float | None  #: idle with its next activity issued and not started (`DeviceStats`)
    issue_rate: float | None  #: activities the host issued per ms, between its first and last issue
    predicted_end_ms: float | None  #: wall end with the suggested split; None: no work, or no model


@final
@dataclass(frozen=True, slots=True)
class BalanceReport(Plain):
    """What bounded the scope's wall makespan, how evenly the work was spread, and a re-split of it. Make one
    with `balance`; ``rich.print`` it for the table and the verdict.

    The critical path: the device that ends last, its time from the scope's start to its last end split into
    busy time (the device), launch-bound time (the host had not issued its next work yet) and dependency time
    (issued, not started: waits on other devices or events, handoffs, launch latency). The straggler is the host
    when that path is mostly host time, or when the device ends last because its work came later, not because
    it had more; then the verdict says so and names what would help, and the split is left as it is.

    The model of the re-split: device i ends at ``start_i + shift_i + units_i / rate_i``: ``start_i`` its first
    start, ``rate_i`` its units per ms from its first start to its last end (busy time and the gaps inside,
    launch-bound ones included). ``shift_i`` models a host that issued the devices one after another: where
    device j's issuing ended before device i's began, i starts later by j's extra units over j's issue rate. The
    suggested split makes the devices that get work end together (a device whose start comes after that gets
    none). Without aligned clocks the model is busy time alone: units in proportion to units per busy ms.
    """

    label: str
    rows: tuple[DeviceBalance, ...]
    verdict: str  #: what bounded the makespan, in words
    straggler: str | None  #: what bounds the wall makespan: a device, or ``"host"``; None without activity
    critical_device: str | None  #: the device whose last end is the makespan; None when not comparable
    critical_path: dict[str, float]  #: ms of the makespan: ``{device: busy, "host", "dependency", "unknown"}``
    makespan_ms: float  #: wall: scope start to the last end (the longest busy time when clocks are not aligned)
    predicted_makespan_ms: float | None  #: the same with the suggested split
    busy_makespan_ms: float  #: the longest busy time now
    predicted_busy_ms: float | None  #: the longest busy time with the suggested split
    mean_busy_ms: float  #: over every device of the timeline
    imbalance: float | None  #: max busy / mean busy (1.0: even); None without busy time
    comparable: bool  #: every clock is aligned to the host, so wall times compare across devices
    units_given: bool  #: False: one unit per device was assumed
    total_units: int
    notes: tuple[str, ...]

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        """The table (columns left out, least needed first, where the console is too narrow) and the verdict."""
        yield from _render(self)


def balance(source: Timeline | DeviceSummary, work_units: Any = None) -> BalanceReport:
    """What bounded the wall makespan (a device, the host, dependencies), and a split of the work that the model
    in `BalanceReport` predicts ends soonest. ``work_units``: per device (a dict keyed by device or device name,
    or a sequence in the timeline's device order) the whole units of work it got (items, batches, rows); default
    one unit each, and the suggestion is then in fractions only. Devices without busy time keep their units.
    ``source`` may be a `DeviceSummary` already made from the timeline (or a finished `Timer`)."""
    ds = source if isinstance(source, DeviceSummary) else device_summary(as_timeline(source, "balance"))
    rows = ds.rows
    units = _work_units([r.device for r in rows], work_units)
    integral = work_units is not None
    busy = np.array([r.busy_ms for r in rows])
    spread = busy_spread(busy)
    fit = busy_split(units, busy, integral)
    active = [r.count > 0 and r.last_end_ms is not None for r in rows]
    if any(active) and all(r.aligned for r, a in zip(rows, active) if a):
        wall = _wall(rows, units, fit, integral)
    else:
        wall = _busy_only(rows, units, fit)
    amount = wall.amount
    share = amount / units.sum() if units.sum() > 0 else np.zeros_like(units)
    m = fit.measured
    out = [
        DeviceBalance(
            r.device,
            r.busy_ms,
            r.last_end_ms,
            _wait(rows, i, wall.reference),
            int(units[i]),
            float(fit.throughput[i]) if fit.measured[i] else None,
            float(share[i]),
            int(amount[i]) if integral else None,
            device_note(r, ("ends last" if wall.straggler == HOST else "straggler") if i == wall.reference else ""),
            r.first_start_ms,
            wall.offsets[i],
            r.launch_bound_ms,
            r.dependency_ms,
            _issue_rate(r),
            wall.ends[i],
        )
        for i, r in enumerate(rows)
    ]
    return BalanceReport(
        ds.label,
        tuple(out),
        wall.verdict + (_collector_note(ds.collector_ms, wall.makespan_ms) if wall.straggler == HOST else ""),
        wall.straggler,
        wall.critical,
        wall.path,
        wall.makespan_ms,
        wall.predicted_ms,
        spread.max_ms,
        float((amount[m] / fit.throughput[m]).max()) if m.any() else None,
        spread.mean_ms,
        spread.imbalance,
        all(r.aligned for r in rows),
        integral,
        int(units.sum()),
        _notes(ds, fit.measured, all(r.aligned for r in rows)) + wall.notes,
    )


def _issue_rate(r: DeviceStats) -> float | None:
    """Activities the host issued to the device per ms, between its first and last issue."""
    first, last = r.first_issued_ms, r.last_issued_ms
    return (r.issued - 1) / (last - first) if first is not None and last is not None and last > first else None


def _work_units(names: list[str], work_units: Any) -> np.ndarray:
    if work_units is None:
        return np.ones(len(names))
    if isinstance(work_units, Mapping):
        given = {getattr(k, "name", k): v for k, v in work_units.items()}
        unknown = [str(k) for k in given if k not in names]
        if unknown:
            raise ValueError(
                f"work_units names {', '.join(unknown)}, not in this timeline: use some of {', '.join(names)}"
            )
        missing = [n for n in names if n not in given]
        if missing:
            raise ValueError(
                f"work_units has no entry for {', '.join(missing)}: give every device of the timeline "
                "(0 for a device that got no work)"
            )
        values = [given[n] for n in names]
    elif isinstance(work_units, (str, bytes)) or not isinstance(work_units, Iterable):
        raise TypeError(
            f"work_units is a dict {{device: units}} or one count per device in the timeline's order "
            f"({', '.join(names)}), not {work_units!r}"
        )
    else:
        values = list(work_units)
        if len(values) != len(names):
            raise ValueError(
                f"work_units has {len(values)} values for {len(names)} devices ({', '.join(names)}): "
                "give one per device in that order, or a dict {device: units}"
            )
    bad = [f"{n}={v!r}" for n, v in zip(names, values) if not _whole_units(v)]
    if bad:
        raise ValueError(
            f"work units must be whole numbers from 0 to 2**53 (items, batches, rows), not {', '.join(bad)}"
        )
    return np.asarray(values, dtype=np.float64)


def _whole_units(v: Any) -> bool:
    """A count of work units: a real number (not a string or a bool), whole, 0 .. 2**53 (exact in float64)."""
    if isinstance(v, bool) or not isinstance(v, Real):
        return False
    x = float(v)
    return math.isfinite(x) and 0 <= x <= 2**53 and x == int(x)


class _Wall(NamedTuple):
    """The balance's model part (wall times or, without aligned clocks, busy times alone)."""

    amount: np.ndarray  #: suggested units per device
    offsets: list[float | None]  #: first start minus the earliest one (ms)
    ends: list[float | None]  #: predicted wall ends (ms)
    reference: int | None  #: the device the others' waits are measured to
    critical: str | None
    straggler: str | None
    path: dict[str, float]
    makespan_ms: float
    predicted_ms: float | None
    verdict: str
    notes: tuple[str, ...]


def _busy_only(rows: tuple[DeviceStats, ...], units: np.ndarray, fit: BusySplit) -> _Wall:
    """Without aligned clocks: the busiest device, and the busy-time split."""
    busy = np.array([r.busy_ms for r in rows])
    spread = busy_spread(busy)
    ref = spread.busiest
    none: list[float | None] = [None] * len(rows)
    if ref is None:
        return _Wall(fit.amount, none, none, None, None, None, {}, 0.0, None, "no device has busy time", ())
    verdict = (
        f"{rows[ref].device} has the most busy time ({_short(busy[ref])} ms); the clocks are not all aligned to "
        "the host, so wall times are not compared and the split is by busy time"
    )
    return _Wall(fit.amount, none, none, ref, None, rows[ref].device, {}, spread.max_ms, fit.predicted_ms, verdict, ())


def _wall(rows: tuple[DeviceStats, ...], units: np.ndarray, fit: BusySplit, integral: bool) -> _Wall:
    """The critical path, the straggler and the wall-model split (see `BalanceReport`)."""
    model = _Model(rows, units, fit.measured)
    act = np.flatnonzero(model.active)
    c = int(act[np.nanargmax(model.end[act])])
    makespan = float(model.end[c])
    offsets = [float(model.start[i] - np.nanmin(model.start)) if model.active[i] else None for i in range(len(rows))]
    others = [int(j) for j in act if j != c]
    runner = max(others, key=lambda j: model.end[j]) if others else None
    bound = _bound(rows, c, runner, makespan)
    path = {rows[c].device: rows[c].busy_ms}
    host, dependency = rows[c].launch_bound_ms, rows[c].dependency_ms
    if host is not None and dependency is not None:
        path[HOST], path["dependency"] = host, dependency
    if makespan - sum(path.values()) > 1e-6:  # (a ns)
        path["unknown"] = makespan - sum(path.values())
    notes: list[str] = []
    amount = units.copy()
    if bound:
        notes.append("not re-split: the host bounds the makespan (a re-split moves host work, it does not remove it)")
    else:
        amount = model.split(integral)
        ends = model.ends(amount)
        if np.isfinite(ends).any() and np.nanmax(ends) > makespan + 1e-9:  # (rounding, or a model not settled)
            amount = units.copy()
    ends = model.ends(amount)
    predicted = float(np.nanmax(ends)) if np.isfinite(ends).any() else None
    idle = [rows[i].device for i in act if model.measured[i] and amount[i] == 0 and units[i] > 0]
    if idle:
        notes.append(f"the suggested split gives {_names(idle)} no work: it starts after the others would end")
    if all(r.launch_bound_ms is None for r in rows):
        notes.append(
            "no issue times (Timeline.issued_ns is NaN: synthetic data, or a trace of an older asyncgpu): idle "
            "time is not split into launch-bound and dependency, and the model keeps each device's start as measured"
        )
    verdict = _verdict(rows, model, c, runner, bound, makespan, offsets, predicted)
    return _Wall(
        amount,
        offsets,
        [None if not np.isfinite(e) else float(e) for e in ends],
        c,
        rows[c].device,
        HOST if bound else rows[c].device,
        path,
        makespan,
        predicted,
        verdict,
        tuple(notes),
    )


class _Model:
    """The wall model of `BalanceReport`, over the devices with activity (ms from the scope's start)."""

    def __init__(self, rows: tuple[DeviceStats, ...], units: np.ndarray, measured: np.ndarray) -> None:
        def column(values: Iterable[float | None]) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in values], np.float64)

        self.units = units
        self.active = np.array([r.count > 0 and r.last_end_ms is not None for r in rows])
        self.start = column(r.first_start_ms if a else None for r, a in zip(rows, self.active))
        self.end = column(r.last_end_ms if a else None for r, a in zip(rows, self.active))
        span = np.nan_to_num(self.end - self.start)
        self.measured = measured & (span > 0)
        self.rate = np.where(self.measured, units / np.where(span > 0, span, 1.0), 0.0)  # units per active ms
        first = column(r.first_issued_ms for r in rows)
        last = column(r.last_issued_ms for r in rows)
        k = np.array([r.issued for r in rows])
        issue_ms = np.where(k > 1, np.nan_to_num(last - first) * k / np.maximum(k - 1, 1), 0.0)
        self.issue_per_unit = np.where(self.measured, issue_ms / np.where(units > 0, units, 1.0), 0.0)
        with np.errstate(invalid="ignore"):  # (NaN: no issue times, never before)
            self.before = (last[None, :] <= first[:, None]) & ~np.eye(len(rows), dtype=bool)  # [i, j]: j's first

    def ends(self, amount: np.ndarray) -> np.ndarray:
        """Each device's wall end with ``amount`` units (NaN: no activity, or no units given to it)."""
        start = self.start + self.before @ ((amount - self.units) * self.issue_per_unit)
        out = np.where(self.measured, start + amount / np.where(self.rate > 0, self.rate, 1.0), self.end)
        out[self.measured & (amount <= 0)] = np.nan
        return out

    def split(self, integral: bool) -> np.ndarray:
        """The units that end the measured devices together: water-filling over their starts, which depend on
        the split where the host issued the devices one after another (a damped fixed point)."""
        m = self.measured
        total = float(self.units[m].sum())
        u = self.units.astype(np.float64)
        if not m.any():
            return u
        for _ in range(200):
            start = self.start + self.before @ ((u - self.units) * self.issue_per_unit)
            new = u.copy()
            new[m] = water_fill(start[m], self.rate[m], total)
            settled = np.abs(new - u).max(initial=0.0) <= 1e-12 * max(total, 1.0)
            u = new if settled else (u + new) / 2
            if settled:
                break
        if integral:
            u[m] = round_whole(u[m], total)
        return u


def _collector_note(collected_ms: float, makespan_ms: float) -> str:
    """What Python's garbage collection took of a host-bound scope, from `COLLECTOR_NOTE_SHARE` of its makespan."""
    if makespan_ms <= 0 or collected_ms < COLLECTOR_NOTE_SHARE * makespan_ms:
        return ""
    return (
        f" Python's garbage collection took {_short(collected_ms)} ms of the host's time in the scope (it stops "
        f"every thread): {COLLECTOR_FIX}."
    )


#: the share of host-bound time spent in garbage collection from which a verdict names it (here and in steps)
COLLECTOR_NOTE_SHARE = 0.05
#: what helps when the collector holds the host up
COLLECTOR_FIX = "gc.freeze() after start-up, a higher gc.set_threshold(), or fewer objects made per step"


def _bound(rows: tuple[DeviceStats, ...], c: int, runner: int | None, makespan: float) -> str:
    """Why the host bounds the makespan: ``"launch"`` (the critical device's path is mostly launch-bound),
    ``"stagger"`` (it ends last because its work came later, by at least a tenth of the makespan, rather than
    because it had more), or ``""`` (it does not)."""
    host = rows[c].launch_bound_ms
    if host is None or makespan <= 0:
        return ""
    if host >= 0.5 * makespan:
        return "launch"
    if runner is None or rows[runner].launch_bound_ms is None:
        return ""
    lead = host - rows[runner].launch_bound_ms  # type: ignore[operator]  # (checked above)
    return "stagger" if lead > max(rows[c].busy_ms - rows[runner].busy_ms, 0.0) and lead >= 0.1 * makespan else ""


def _verdict(
    rows: tuple[DeviceStats, ...],
    model: _Model,
    c: int,
    runner: int | None,
    bound: str,
    makespan: float,
    offsets: list[float | None],
    predicted: float | None,
) -> str:
    r = rows[c]
    act = [int(i) for i in np.flatnonzero(model.active)]
    spread = max(o for o in offsets if o is not None)
    stagger = ""
    if len(act) > 1 and spread >= 0.05 * makespan and spread > 0:
        by_issue = sorted(act, key=lambda i: rows[i].first_issued_ms or 0.0)
        serial = all(
            rows[a].last_issued_ms is not None
            and rows[b].first_issued_ms is not None
            and rows[a].last_issued_ms <= rows[b].first_issued_ms  # type: ignore[operator]
            for a, b in zip(by_issue, by_issue[1:])
        )
        names = _names([rows[i].device for i in by_issue])
        how = (
            f"the host issued work for {names} one after another"
            if serial
            else "the devices' work came at different times"
        )
        starts = ", ".join(_short(offsets[i] or 0.0) for i in sorted(act, key=lambda i: offsets[i] or 0.0))
        stagger = f"{how}, and the devices started {starts} ms apart"
    if bound == "launch":
        text = (
            f"the host bounds the makespan: {r.device} was idle {_short(r.launch_bound_ms or 0.0)} ms of its "
            f"{_short(makespan)} ms because its next work had not been issued yet (launch-bound)"
        )
        return text + (f"; {stagger}" if stagger else "") + f". A re-split would not help: {_REMEDY}."
    if bound == "stagger":
        j = rows[runner]  # type: ignore[index]  # (a stagger needs a runner-up)
        lead = (r.launch_bound_ms or 0.0) - (j.launch_bound_ms or 0.0)
        return (
            f"the host's stagger bounds the makespan: {stagger or 'the devices started at different times'}; "
            f"{r.device} ends last because its work came {_short(lead)} ms later than {j.device}'s, not because "
            f"it had more (busy {_short(r.busy_ms)} ms, {j.device} {_short(j.busy_ms)} ms). A re-split would not "
            f"help: {_REMEDY}."
        )
    text = f"{r.device} bounds the makespan: busy {_short(r.busy_ms)} ms of its {_short(makespan)} ms"
    if r.dependency_ms is not None and r.dependency_ms >= 0.25 * makespan:
        text += (
            f", {_short(r.dependency_ms)} ms with its work issued and not started (waits on other devices or "
            "events, handoffs, launch latency)"
        )
    if stagger:
        text += f"; {stagger} (the model keeps that)"
    if predicted is not None and predicted < makespan * (1 - 1e-9):
        text += f"; the suggested split predicts {_short(predicted)} ms"
    return text + "."


def _names(names: list[str]) -> str:
    """``cuda:0..3`` for numbered names in a run, ``a and b`` for two, else a list."""
    parts = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if len(names) > 2 and all(parts) and len({p.group(1) for p in parts if p}) == 1:
        nums = [int(p.group(2)) for p in parts if p]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            return f"{names[0][: -len(str(nums[0]))]}{nums[0]}..{nums[-1]}"
    return " and ".join(names) if len(names) == 2 else ", ".join(names)


def _short(value: float) -> str:
    """ms in words: 0, 0.123, 2.35, 21.4, 1,234."""
    a = abs(value)
    if a == 0:
        return "0"
    return f"{value:,.{0 if a >= 100 else 1 if a >= 10 else 2 if a >= 0.1 else 3}f}"


def _wait(rows: tuple[DeviceStats, ...], i: int, ref: int | None) -> float | None:
    """The reference device's last end minus device ``i``'s (≥ 0); None without activity, or across unaligned
    clocks."""
    if ref is None or rows[i].last_end_ms is None:
        return None
    if i != ref and not (rows[i].aligned and rows[ref].aligned):
        return None
    return max(0.0, rows[ref].last_end_ms - rows[i].last_end_ms)  # type: ignore[operator]


def device_note(r: DeviceStats, role: str = "") -> str:
    """A device row's note: its ``role`` in the balance (``straggler``, ``ends last``, ``busiest``; none when
    empty), then ``no activity`` and ``clock not aligned`` where they hold (in `balance` and `asyncgpu.ranks`)."""
    parts = [role] if role else []
    if r.busy_ms == 0:
        parts.append("no activity")
    if not r.aligned:
        parts.append("clock not aligned")
    return ", ".join(parts)


def _notes(ds: DeviceSummary, measured: np.ndarray, comparable: bool) -> tuple[str, ...]:
    notes = []
    if not comparable:
        off = ", ".join(f"{r.device} ({r.note})" if r.note else r.device for r in ds.rows if not r.aligned)
        notes.append(
            f"not aligned to the host clock: {off}; wait times across devices are not comparable (busy times are)"
        )
    idle = [r.device for r in ds.rows if r.busy_ms == 0]
    if idle and measured.any():
        notes.append(
            f"no finished activity on {', '.join(idle)}: throughput unknown, the split leaves their units as they are"
        )
    if not measured.any():
        notes.append("no device has both busy time and work units: no split to suggest")
    unfinished = sum(r.unfinished for r in ds.rows)
    if unfinished:
        notes.append(f"{unfinished} unfinished {'activity is' if unfinished == 1 else 'activities are'} not counted")
    if ds.error:
        notes.append(f"the scope raised {ds.error} (the figures cover the work enqueued before it)")
    return tuple(notes)


# -- the balance, drawn -------------------------------------------------------------------------------------
def _render(b: BalanceReport) -> Iterator[Any]:
    """`BalanceReport.__rich_console__`: a `FitTable` of the devices (the least needed columns left out when the
    console is too narrow: numbers are never cut), then the verdict, the critical path and the notes."""
    from rich.text import Text  # (rich is loaded only to draw: importing asyncgpu does not need it)

    from asyncgpu._analysis.table import Column, FitTable, number

    top = max((r.busy_ms for r in b.rows), default=0.0)
    split = (
        [
            (number("units"), [f"{r.units:,}" for r in b.rows]),
            (number("suggested"), [f"{r.suggested_units:,}" for r in b.rows]),
        ]
        if b.units_given
        else [(number("share"), [f"{r.share:.1%}" for r in b.rows])]
    )
    columns = [  # (a column's drop: the order in which a narrow console leaves it out, highest first)
        (Column("device", wrap=False), [r.device for r in b.rows]),
        (number("busy"), [ms(r.busy_ms) for r in b.rows]),
        (Column("", wrap=False, drop=6, min_width=BAR_WIDTH), [bar(r.busy_ms, top) for r in b.rows]),
        (
            number("launch-bound", 1, "launch-bound: idle before its next work was issued"),
            [ms(r.launch_bound_ms) for r in b.rows],
        ),
        (
            number("dependency", 3, "dependency: idle with it issued and not started"),
            [ms(r.dependency_ms) for r in b.rows],
        ),
        (number("start", 5), [ms(r.first_start_ms) for r in b.rows]),
        (number("end", 2), [ms(r.last_end_ms) for r in b.rows]),
        (number("wait", 7, "wait: until the last device's end"), [ms(r.wait_ms) for r in b.rows]),
        *split,
        (
            number("predicted\nend", 4, "predicted end: with the suggested split"),
            [ms(r.predicted_end_ms) for r in b.rows],
        ),
        (Column("", min_width=1), [r.note for r in b.rows]),  # (the notes: the one column that wraps)
    ]
    # A column of numbers with no value in any row ("—" in each) is not drawn, nor named as left out.
    kept = [(c, cells) for k, (c, cells) in enumerate(columns) if k == 0 or c.wrap or any(x != "—" for x in cells)]
    yield FitTable(
        "balance: busy time per device",
        [c for c, _ in kept],
        "times in ms from the scope's start",
        [cells for _, cells in kept],
        caption_separator="; ",
        too_narrow="wide",
    )
    yield Text("\n".join(_lines(b)))


def _lines(b: BalanceReport) -> list[str]:
    lines = [f"verdict: {b.verdict}"]
    if b.critical_path:
        total = b.makespan_ms or 1.0
        parts = ", ".join(f"{k} {ms(v)} ms ({v / total:.0%})" for k, v in b.critical_path.items())
        lines.append(f"critical path over the {ms(b.makespan_ms)} ms makespan ({b.critical_device}): {parts}")
    if b.imbalance is not None:
        lines.append(
            f"imbalance {b.imbalance:.3f} = max busy {ms(b.busy_makespan_ms)} ms / mean busy {ms(b.mean_busy_ms)} "
            f"ms; straggler {b.straggler}"
        )
    what = "split" if b.units_given else "shares (one unit of work per device assumed)"
    if b.predicted_makespan_ms is not None and b.critical_device is not None:
        lines.append(
            f"makespan (wall): {ms(b.makespan_ms)} ms now, {ms(b.predicted_makespan_ms)} ms predicted with the "
            f"suggested {what}; busy {ms(b.busy_makespan_ms)} ms now, {ms(b.predicted_busy_ms)} ms predicted"
        )
    elif b.predicted_makespan_ms is not None:
        lines.append(
            f"makespan (busy): {ms(b.makespan_ms)} ms now, {ms(b.predicted_makespan_ms)} ms predicted "
            f"with the suggested {what}"
        )
    return lines + [f"note: {n}" for n in b.notes]
