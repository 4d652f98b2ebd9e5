"""Device clocks on the host time base: calibration, and a ground-truth check of the alignment.

Host time is ``time.perf_counter_ns()``. CUDA event timestamps can only be subtracted from each other, and each
GPU's ``%globaltimer`` is offset from the host clock and from the other GPUs (tens of µs), so every device is
calibrated by a host ping-pong:

- **Events.** The device's calibration stream waits (``cuStreamWaitValue32``, no SM involved) for a value the
  host writes into mapped pinned memory, records a timing event, and writes an acknowledgement. The host reads
  its clock before the write (h0) and after it sees the acknowledgement (h1): the event's timestamp lies in
  [h0, h1]. Of ``samples`` pings the one with the smallest round trip becomes the *anchor*, placed by the
  intersection of every ping's bracket (each shifted by its event's time after the anchor); any event of the
  device is then placed at ``anchor_host_ns + elapsed(anchor, event)``, within ± half that intersection.
- **%globaltimer.** One thread of ``kernels/clock.cu`` answers the same pings with ``%globaltimer`` stamps, each
  stamp its own acknowledgement (one posted write). Each ping bounds the offset (stamp − host instant) to
  [stamp − h1, stamp − h0] by causality alone; the intersection over the pings is the offset, and its half width
  the bound, with no assumption that the two directions take equally long (its floor is an SM's read of a host
  word over PCIe, about a microsecond, plus the host's Python loop). In-kernel records use it. An
  event recorded right after that kernel lies between the kernel's last stamp and the host seeing the device
  pass it. The delay from the kernel's exit to that event is the device front end's, the same each time, while the
  host's sight of it comes late by however long the host took: so the event lies within the narrowest such
  brackets the device has shown lately (a low quantile of its last `EXIT_WINDOW`), not just this calibration's
  own, which a slow look would widen and shift (half of the host's delay, different on every device). When that
  bracket is tighter than the events' own, that event becomes the anchor, at its middle.
- **Drift.** Between two calibrations at least a second apart, the globaltimer's rate against the host clock.

Threads: `calibrate` blocks the calling thread for the ping-pong (about 0.1 ms per device; at most the timeout).
It runs on its own stream and page, so it never waits for the user's work — unless the device's hardware queues
are all busy, in which case it gives up with `ClockError` and scopes fall back to device-relative time. Tasks
measure off their loop's thread: ``await device.aclock()`` (the device's worker thread), and an async scope's exit
re-measures stale clocks in worker threads, all devices at once, before it places its events.
"""

from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, cast, final

import numpy as np

from asyncgpu._base.checks import whole
from asyncgpu._base.errors import AsyncGPUError, ClockError, NoDeviceError
from asyncgpu._base.records import KIND_CODES, DeviceClock
from asyncgpu._runtime.hooks import engine_of

if TYPE_CHECKING:
    from asyncgpu._backends.cuda import CudaDevice
    from asyncgpu._runtime.device import Device
    from asyncgpu._runtime.internal import DeviceInternal

__all__ = [
    "CLOCK_MAX_AGE_S",
    "UNKNOWN_DRIFT_MAX_AGE_S",
    "ClockCalibration",
    "Placement",
    "calibrate",
    "check_alignment",
    "extrapolation_error_ns",
    "placement",
    "stale",
]

#: The one age policy: a calibration older than this (seconds) is measured again before it places events.
CLOCK_MAX_AGE_S = 0.25
#: ... and, while its drift is not known yet (the device's first second: `_MIN_DRIFT_SPAN_NS`), older than this.
#: The clocks drift apart by some ppm (5-15 measured on H100 and H200 hosts, benchmarks/HISTORY.md): unmeasured,
#: that is 0.75 µs at 15 ppm over this age, within a calibration's own bound; over `CLOCK_MAX_AGE_S` it would not be.
UNKNOWN_DRIFT_MAX_AGE_S = 0.05
DEFAULT_SAMPLES = 16
TIMEOUT_NS = 5_000_000
#: A calibration measures the device's drift from the newest earlier one at least this old (s; the oldest kept
#: before there is one): the drift moves with the GPU's load and temperature, so a recent slope extrapolates better
#: than one from the device's first calibration. One H100 calibrated every 0.25 s, idle then busy then idle (37 to
#: 43 °C): drift −7.5, −9.1, −10.2 ppm; points predicted 0.25 s ahead were off 0.33-0.39 µs p50 with the drift
#: since the first calibration, 0.10-0.15 with this window; 2 s ahead 2.8-3.0 against 0.2-0.4
#: (`dev/diag_clock_drift.py`, benchmarks/HISTORY.md run 51). A shorter window's slope carries more of the points'
#: own error (~1 µs each): 0.5 ppm over 2 s, 0.1 µs at `CLOCK_MAX_AGE_S`.
DRIFT_WINDOW_S = 2.0
_MIN_DRIFT_SPAN_NS = 1_000_000_000
#: A calibration whose best round trip is over this many times the best its device has had in this process is
#: measured again once, and the tighter of the two kept: a host or link slowed down for the pings' fraction of a
#: millisecond (a 13.5 µs best round trip where 4.7 is usual: one H100 of a 2-GPU machine, benchmarks/HISTORY.md
#: run 41) would otherwise place the events of the next `CLOCK_MAX_AGE_S` within a bound three times as wide. On a
#: link that stays slow (heavy copies to and from the host) every calibration then costs two rounds of pings.
SLOW_PINGS_RATIO = 2.0
_BEST_RTT_NS: dict[str, float] = {}  # device name -> the best round trip of its calibrations in this process
#: How many of a device's latest kernel-exit brackets (ns from the calibration kernel's exit stamp to the host seeing
#: the write after the event that follows it) place its anchor: their `EXIT_QUANTILE` is the bracket's width. Over
#: 4× H100 the anchor at the middle of each calibration's own bracket put one instant's events on two GPUs 0.52 µs
#: apart p50, 1.70 max (sd 0.70), where the same instant's %globaltimer stamps were 0.68 / 1.38 (sd 0.52; run 47).
EXIT_WINDOW = 32
EXIT_QUANTILE = 20  # percent: low, not the minimum (a bracket's lower end carries the offset's own error)
_EXITS_NS: dict[str, list[float]] = {}  # device name -> its latest kernel-exit brackets, oldest first


@dataclass(frozen=True, eq=False, kw_only=True)
class ClockCalibration:
    """How one device's clocks map to host time (``time.perf_counter_ns()``), measured at ``taken_ns``."""

    device: str
    host_ns: int  #: host time of the anchor event (the best sample): the middle of the pings' intersection
    bound_ns: float  #: ± error bound of ``host_ns`` (half the intersection's width; 0 on the host backend)
    samples: int  #: pings used
    rtt_ns: float  #: the best round trip (ns)
    taken_ns: int  #: host time of the calibration
    globaltimer_offset_ns: int | None = None  #: ``%globaltimer`` − host time (CUDA): the pings' intersection
    globaltimer_bound_ns: float | None = None  #: its ± bound
    naive_offset_ns: int | None = None  #: the offset a single (first) sample gives, for comparison
    drift_ppm: float | None = None  #: globaltimer rate − host rate, in ppm, when measurable (≥ 1 s of history)
    anchor_source: str = "pings"  #: ``pings`` (the stream's own pings) or ``kernel`` (the event after the kernel)
    kernel_anchor_bound_ns: float | None = None  #: the bound the event after the kernel would have had
    #: this calibration's own bracket (ns) from the kernel's exit stamp to the host seeing the event after it passed
    #: (the anchor takes the device's narrow ones: `EXIT_WINDOW`)
    kernel_exit_ns: float | None = None
    bracket_overhead_ns: float = 0.0  #: what a pair of events adds to one kernel's time (ns), measured once
    anchor: Any = field(default=None, repr=False)  # the anchor's raw event (owned by the device)
    gt_point: tuple[int, float] | None = field(default=None, repr=False)  # (stamp, host midpoint) of the best
    #: how ``bracket_overhead_ns`` was measured: against CUPTI's record of the kernel, or (without CUPTI) against the
    #: kernel's own ``%globaltimer`` span, which leaves its launch and exit out (durations then read ~1 µs short)
    bracket_overhead_source: str = ""
    #: what a pair adds per kind of work, ns (``"kernel"`` = ``bracket_overhead_ns``; ``"memset"``, ``"memcpy"``
    #: where CUPTI measured them): kinds not listed take the kernel's
    bracket_overhead_by_kind_ns: Mapping[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Host ns per device ns (1 when no drift was measured)."""
        return 1.0 if self.drift_ppm is None else 1.0 / (1.0 + self.drift_ppm * 1e-6)

    def globaltimer_to_host_ns(self, stamps_ns: Any) -> np.ndarray:
        """Convert ``%globaltimer`` stamps (ns, int or array) to host time (float64 ns)."""
        if self.gt_point is None:
            raise ClockError(
                f"{self.device} has no %globaltimer calibration (the host backend has no such clock, "
                "or the calibration kernel could not run)"
            )
        g0, h0 = self.gt_point
        return h0 + (np.asarray(stamps_ns, dtype=np.int64) - g0).astype(np.float64) * self.rate

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "host_ns": self.host_ns,
            "bound_ns": self.bound_ns,
            "samples": self.samples,
            "rtt_ns": self.rtt_ns,
            "taken_ns": self.taken_ns,
            "globaltimer_offset_ns": self.globaltimer_offset_ns,
            "globaltimer_bound_ns": self.globaltimer_bound_ns,
            "naive_offset_ns": self.naive_offset_ns,
            "drift_ppm": self.drift_ppm,
            "anchor_source": self.anchor_source,
            "kernel_anchor_bound_ns": self.kernel_anchor_bound_ns,
            "kernel_exit_ns": self.kernel_exit_ns,
            "bracket_overhead_ns": self.bracket_overhead_ns,
            "bracket_overhead_source": self.bracket_overhead_source,
            "bracket_overhead_by_kind_ns": dict(self.bracket_overhead_by_kind_ns),
        }


# Kinds whose event pairs lose the bracket overhead (measured per kind: `CudaDevice.bracket_overhead`); work timed
# in a user block is not corrected.
_LAUNCH_KINDS = ("kernel", "graph", "memset", "memcpy")
_LAUNCH_CODES = np.array([KIND_CODES[k] for k in _LAUNCH_KINDS], np.int8)
#: measured apart (a graph's pair is a kernel's); ``memcpy_d2d``: copies between device buffers; ``*_spill``: memsets,
#: such copies and kernels that spill the device's cache (`cut_kind`)
_PAIR_KINDS = ("kernel", "memset", "memcpy", "memcpy_d2d", "memset_spill", "memcpy_d2d_spill", "kernel_spill")
_SPILLING = {"memset": "memset_spill", "memcpy_d2d": "memcpy_d2d_spill", "kernel": "kernel_spill"}


def cut_kind(kind: str, name: str | None, spills: bool = False) -> str:
    """Which of the pair overheads a launch of ``kind`` called ``name`` loses: its kind, but ``"memcpy_d2d"``
    for a copy between device buffers (another copy engine, primed every time: `hooks.engine_of`); and for a
    memset, such a copy or a kernel that ``spills`` the device's cache behind other work
    (`asyncgpu._runtime.stream._spills`), the overhead measured for such work (``"memset_spill"``,
    ``"memcpy_d2d_spill"``, ``"kernel_spill"``): around work that spills the L2 on a busy stream, the pair costs the
    stream a different time, by machine (run 45, `dev/diag_spill.py`: +0.35 µs on one H100, −0.45 µs on 2× H200)."""
    base = "memcpy_d2d" if kind == "memcpy" and engine_of(kind, name) == "copy_d2d" else kind
    return _SPILLING.get(base, base) if spills else base


@final
class Placement:
    """The one answer to "where on the host time base is this event of this device": made by `placement` for
    one pass over a device's finished events (a scope's end, a read of the kernel history, a handoff), so that
    every feature places and trims alike.

    ``clock`` says how: aligned (host time, within ``clock.bound_ns``), or not (``clock.reason``), in which case
    events are placed relative to a fallback anchor (a scope's start mark) or not at all (NaN).
    """

    __slots__ = ("device", "anchor", "anchor_ns", "rate", "overhead_ns", "cuts", "clock", "calibration")

    def __init__(
        self,
        device: Device,
        anchor: Any,
        anchor_ns: float,
        rate: float,
        overhead_ns: Mapping[str, float],
        clock: DeviceClock,
        calibration: ClockCalibration | None,
    ) -> None:
        """``overhead_ns``: what the pair adds per kind of work (ns); a kernel's is taken for graphs and for kinds
        not given."""
        self.device, self.anchor, self.anchor_ns, self.rate = device, anchor, anchor_ns, rate
        self.clock, self.calibration = clock, calibration
        kernel = float(overhead_ns.get("kernel", 0.0))
        #: the kernel's overhead (ns): what `DeviceClock.overhead_ns` reports
        self.overhead_ns = kernel
        #: per kind of work that loses the pair's overhead (`cut_kind`), ns
        self.cuts = {k: float(overhead_ns.get(k, kernel)) for k in _LAUNCH_KINDS + _PAIR_KINDS}
        self.cuts["graph"] = kernel
        if "memcpy_d2d" not in overhead_ns:
            self.cuts["memcpy_d2d"] = self.cuts["memcpy"]
        for base, spill in _SPILLING.items():  # (not measured: the work's own kind's)
            if spill not in overhead_ns:
                self.cuts[spill] = self.cuts[base]

    def host_ns(self, raw_event: Any) -> float:
        """The host time (ns) of a completed timing event of the device (NaN without an anchor). Raises
        `NotReadyError` while the event is pending. Any thread."""
        if self.anchor is None:
            return math.nan
        return self.anchor_ns + self.device._internal.bd.elapsed_ms(self.anchor, raw_event) * 1e6 * self.rate

    def host_ns_many(self, raw_events: Sequence[Any]) -> np.ndarray:
        """`host_ns` of each of ``raw_events`` (float64 ns, the same arithmetic): one driver call per event, the
        Python around them once. Raises `NotReadyError` if any is pending. Any thread."""
        if self.anchor is None:
            return np.full(len(raw_events), math.nan)
        ms = self.device._internal.bd.elapsed_since_ms(self.anchor, raw_events)
        return self.anchor_ns + ms * 1e6 * self.rate

    def trim(
        self, kind: str, start_ns: float, duration_ns: float, name: str | None = None, spills: bool = False
    ) -> tuple[float, float]:
        """What the event pair added, taken out of a kernel, graph, memset or memcpy (called ``name``, ``spills``:
        `cut_kind`): half from the start, all of it from the duration (never below zero). Other kinds are returned
        as they are."""
        cut = self.cuts.get(cut_kind(kind, name, spills), 0.0)
        if cut <= 0:
            return start_ns, duration_ns
        cut = min(duration_ns, cut)
        return start_ns + cut / 2, duration_ns - cut

    def trim_columns(
        self,
        rows: np.ndarray,
        kind_col: np.ndarray,
        start_col: np.ndarray,
        dur_col: np.ndarray,
        d2d_rows: np.ndarray | None = None,
        spill_rows: np.ndarray | None = None,
    ) -> None:
        """`trim`, in place, on the rows of the columns selected by the boolean mask ``rows``; ``d2d_rows``
        marks the copies between device buffers, ``spill_rows`` the memsets, such copies and kernels that spill
        the device's cache (`cut_kind`)."""
        for kind, code in zip(_LAUNCH_KINDS, _LAUNCH_CODES):
            m = rows & (kind_col == code)
            parts = [(kind, m)]
            if kind == "memcpy" and d2d_rows is not None:
                parts = [(kind, m & ~d2d_rows), ("memcpy_d2d", m & d2d_rows)]
            if spill_rows is not None:  # (the spilling rows of a kind that has a spilling cut take it)
                spilling = [(_SPILLING[k], mask & spill_rows) for k, mask in parts if k in _SPILLING]
                parts = [(k, mask & ~spill_rows if k in _SPILLING else mask) for k, mask in parts] + spilling
            for k, mask in parts:
                ns = self.cuts[k]
                if ns > 0:
                    cut = np.minimum(dur_col[mask], ns)
                    start_col[mask] += cut / 2
                    dur_col[mask] -= cut

    def globaltimer_to_host_ns(self, stamps_ns: Any) -> np.ndarray:
        """``%globaltimer`` stamps (ns) as host time; `ClockError` when the device has no such calibration."""
        if self.calibration is None:
            raise ClockError(f"{self.device.name}'s clock is not aligned: {self.clock.reason}")
        return self.calibration.globaltimer_to_host_ns(stamps_ns)


def placement(
    device: Device,
    *,
    max_age_s: float = CLOCK_MAX_AGE_S,
    subtract_overhead: bool = True,
    fallback: tuple[Any, float] | None = None,
    refresh: bool = True,
) -> Placement:
    """The `Placement` of ``device``'s events now: through its clock calibration (re-measured when older than
    ``max_age_s``; that blocks the calling thread about 0.1 ms, without a warning: an async scope's exit
    re-measures in worker threads beforehand, `asyncgpu._runtime.device.refresh_clocks`; ``refresh=False`` never
    measures and uses the last calibration, for threads that must not block, such as the waiter thread). When
    the clock cannot be aligned, events are placed relative to ``fallback`` = ``(raw timing event, host ns it
    stands for)`` (a scope's start mark), or not at all, and the placement's `DeviceClock` says why.
    ``subtract_overhead`` False keeps raw event times (no `Placement.trim`)."""
    try:
        cal = device._internal.calibration(max_age_s) if refresh else device._internal.last_clock()
        if cal is None:
            raise ClockError(f"{device.name} has no clock calibration yet")
    except AsyncGPUError as exc:
        clock = DeviceClock(device.name, False, math.nan, reason=f"clock calibration failed ({exc})")
        anchor, anchor_ns = fallback if fallback is not None else (None, 0.0)
        return Placement(device, anchor, float(anchor_ns), 1.0, {}, clock, None)
    cuts: dict[str, float] = {}
    how = ""
    if subtract_overhead:  # learned on this device's own work where a CUPTI scope has run here, else the calibration's
        cuts = dict(cal.bracket_overhead_by_kind_ns) or {"kernel": cal.bracket_overhead_ns}
        learned = [k for k in _PAIR_KINDS if device._internal.pair_excess_ns(k) is not None]
        for k in learned:
            cuts[k] = cast(float, device._internal.pair_excess_ns(k))
        how = cal.bracket_overhead_source
        if learned:
            n = sum(len(device._internal.pair_excess_samples[k]) for k in learned)
            how = f"learned against CUPTI on this device's work ({n} launches, 20th percentile)" + (
                f"; the other kinds {how}" if set(learned) != set(_PAIR_KINDS) and how else ""
            )
        others = [f"{k.replace('_', ' ')} {cuts[k] / 1e3:.2f} µs" for k in _PAIR_KINDS[1:] if k in cuts]
        if others and how:
            how += f"; {', '.join(others)}"
    overhead = cuts.get("kernel", 0.0)
    clock = DeviceClock(
        device.name,
        True,
        cal.bound_ns,
        cal.globaltimer_offset_ns,
        cal.drift_ppm,
        overhead_ns=overhead,
        overhead_source=how if overhead else "",
    )
    return Placement(
        device, cal.anchor, float(cal.host_ns), cal.rate, cuts, clock, cal if cal.gt_point is not None else None
    )


def _intersect(bd: Any, anchor: Any, raws: list, brackets: np.ndarray) -> tuple[int, float]:
    """The host time of ``anchor`` (one of ``raws``, events whose host brackets ``[h0, h1]`` are ``brackets``) and
    its ± bound, ns. Each ping puts the anchor in ``[h0 - e, h1 - e]`` (``e``: its event's time after the anchor,
    which events measure to 32 ns): the intersection over the pings, at least as tight as the best ping's own
    bracket and with no assumption that a ping's two directions take equally long. Pings that disagree (beyond
    the events' resolution) leave the best ping's midpoint."""
    best = next(k for k, raw in enumerate(raws) if raw is anchor)
    mid, half = int((brackets[best, 0] + brackets[best, 1]) // 2), float(brackets[best, 1] - brackets[best, 0]) / 2
    try:
        after = np.array([bd.elapsed_ms(anchor, raw) * 1e6 for raw in raws])
    except AsyncGPUError:
        return mid, half
    least, most = float((brackets[:, 0] - after).max()), float((brackets[:, 1] - after).min())
    if most < least:
        return mid, half
    return int((least + most) / 2), (most - least) / 2


def extrapolation_error_ns(old: ClockCalibration, new: ClockCalibration) -> float | None:
    """How far ``old``, extrapolated with its drift, placed the instant that the later ``new`` measured: the host
    time ``old`` gives ``new``'s best ``%globaltimer`` stamp minus the host time ``new`` measured for it (ns,
    signed); None where either has no ``%globaltimer`` point. It holds both calibrations' own errors (each within
    its ``globaltimer_bound_ns``) beside the extrapolation's. Never blocks."""
    if old.gt_point is None or new.gt_point is None:
        return None
    stamp, host = new.gt_point
    return float(old.globaltimer_to_host_ns(stamp)) - host


def stale(cal: ClockCalibration | None, max_age_s: float) -> bool:
    """The age policy: whether ``cal`` is missing or older than ``max_age_s`` (`UNKNOWN_DRIFT_MAX_AGE_S` while its
    drift is not known: its ``%globaltimer`` was measured, its rate not yet). An infinite ``max_age_s`` never makes a
    calibration stale (`Device.clock`'s "never re-measure": the one that placed earlier records). Never blocks."""
    if cal is None:
        return True
    if math.isinf(max_age_s):
        return False
    if cal.gt_point is not None and cal.drift_ppm is None:
        max_age_s = min(max_age_s, UNKNOWN_DRIFT_MAX_AGE_S)
    return time.perf_counter_ns() - cal.taken_ns > max_age_s * 1e9


def calibrate(
    device: DeviceInternal,
    samples: int = DEFAULT_SAMPLES,
    *,
    previous: ClockCalibration | None = None,
    timeout_ns: int = TIMEOUT_NS,
) -> ClockCalibration:
    """Measure ``device``'s clocks against the host (see the module docstring). ``previous`` (an older
    calibration of the same device) gives the drift and the pair overheads. Raises `ClockError` if the device
    does not answer.

    A device's first calibration also measures the pair overheads (`bracket_overhead`: the process's first CUPTI
    session, up to about a second). The clocks drift apart by some ppm and this calibration cannot know by how
    much yet, so the pings are taken again after it: the calibration stands for the instant it returns. Pings whose
    best round trip is over `SLOW_PINGS_RATIO` times the device's best so far are taken again once."""
    if samples < 1:
        raise ValueError(f"a calibration needs at least one sample, not {samples}")
    pings = _pings(device, samples, timeout_ns, previous)
    by_kind: Mapping[str, float] = {}
    overhead_source = ""
    if previous is not None and previous.bracket_overhead_ns:
        by_kind, overhead_source = previous.bracket_overhead_by_kind_ns, previous.bracket_overhead_source
    elif pings.gt_offset is not None:  # the calibration kernel ran, so SMs are free for this one too
        try:
            by_kind, overhead_source = device.bd.bracket_overhead()
        except ClockError:
            pass
        else:  # (that took long: ping again)
            device.clock_events.append(pings.anchor)
            pings = _pings(device, samples, timeout_ns, previous)
    best = _BEST_RTT_NS.get(device.name, math.inf)
    if 0 < best < math.inf and pings.rtt_ns > SLOW_PINGS_RATIO * best:  # (a slow moment: once more, keep the tighter)
        again = _pings(device, samples, timeout_ns, previous)
        if again.bound_ns < pings.bound_ns:
            pings, again = again, pings
        device.clock_events.append(again.anchor)
    _BEST_RTT_NS[device.name] = min(best, pings.rtt_ns)
    return ClockCalibration(
        device=device.name,
        host_ns=pings.host_ns,
        bound_ns=pings.bound_ns,
        samples=samples,
        rtt_ns=pings.rtt_ns,
        taken_ns=pings.taken_ns,
        globaltimer_offset_ns=pings.gt_offset,
        globaltimer_bound_ns=pings.gt_bound,
        naive_offset_ns=pings.naive,
        drift_ppm=pings.drift,
        anchor_source=pings.source,
        kernel_anchor_bound_ns=pings.k_bound,
        kernel_exit_ns=pings.exit_ns,
        bracket_overhead_ns=by_kind.get("kernel", 0.0),
        anchor=pings.anchor,
        gt_point=pings.gt_point,
        bracket_overhead_source=overhead_source,
        bracket_overhead_by_kind_ns=dict(by_kind),
    )


@dataclass
class _Pings:
    """What one round of a calibration's pings measured (`_pings`); the fields as in `ClockCalibration`."""

    anchor: Any
    host_ns: int
    bound_ns: float
    rtt_ns: float
    taken_ns: int
    source: str = "pings"
    gt_offset: int | None = None
    gt_bound: float | None = None
    naive: int | None = None
    drift: float | None = None
    k_bound: float | None = None
    exit_ns: float | None = None
    gt_point: tuple[int, float] | None = None


def _pings(device: DeviceInternal, samples: int, timeout_ns: int, previous: ClockCalibration | None) -> _Pings:
    """The events' pings, then the ``%globaltimer`` kernel's (see the module docstring); the anchor event is the
    caller's to keep or give back to ``device.clock_events``."""
    bd, spare = device.bd, device.clock_events
    raws = [spare.pop() if spare else bd.create_event(True) for _ in range(samples)]
    try:
        brackets = bd.calibrate_events(raws, timeout_ns)
    except BaseException:
        spare.extend(raws)  # re-recording an event that is still queued is allowed: reuse them next time
        raise
    rtt = brackets[:, 1] - brackets[:, 0]
    best = int(np.argmin(rtt))
    anchor = raws[best]
    host_ns, bound_ns = _intersect(bd, anchor, raws, brackets)
    spare.extend(raw for raw in raws if raw is not anchor)
    out = _Pings(anchor, host_ns, bound_ns, float(rtt[best]), int(brackets[best, 1]))
    after_kernel = spare.pop() if spare else bd.create_event(True)
    try:
        gt = bd.calibrate_globaltimer(samples, timeout_ns, after_kernel)
    except ClockError:
        gt = None  # events are aligned by the pings above; in-kernel stamps are not (reported as None)
    if gt is not None:
        pings, (exit_stamp, exit_seen_ns) = gt
        mid = (pings[:, 1] + pings[:, 2]) // 2  # int64: %globaltimer counts ns since 1970 (1.8e18), keep it exact
        g_rtt = pings[:, 2] - pings[:, 1]
        b = int(np.argmin(g_rtt))
        # Each ping puts the offset in [stamp - h1, stamp - h0] by causality alone: the pings' intersection is
        # the estimate, its half width a bound that assumes nothing about the two directions' latencies (at
        # least as tight as the best ping's; pings that disagree, as a preempted host would make them, leave the
        # best ping's).
        lo, hi = int((pings[:, 0] - pings[:, 2]).max()), int((pings[:, 0] - pings[:, 1]).min())
        if hi >= lo:
            out.gt_offset, out.gt_bound = (lo + hi) // 2, (hi - lo) / 2
        else:
            out.gt_offset, out.gt_bound = int(pings[b, 0] - mid[b]), float(g_rtt[b]) / 2
        out.naive = int(pings[0, 0] - mid[0])
        gt_point = (int(pings[b, 0]), float(pings[b, 0] - out.gt_offset))
        out.gt_point = gt_point
        if previous is not None and previous.gt_point is not None:
            pg, ph = previous.gt_point
            span = gt_point[1] - ph
            out.drift = ((gt_point[0] - pg) / span - 1.0) * 1e6 if span >= _MIN_DRIFT_SPAN_NS else previous.drift_ppm
        # The event right after the kernel lies between the kernel's last stamp and the host seeing the write
        # that follows it: usually a tighter placement than the front end's own pings.
        rate = 1.0 if out.drift is None else 1.0 / (1.0 + out.drift * 1e-6)
        lo = gt_point[1] + (exit_stamp - gt_point[0]) * rate
        if exit_seen_ns is not None and exit_seen_ns >= lo - out.gt_bound:
            out.exit_ns = max(float(exit_seen_ns - lo), 0.0)
            width = _exit_width(device.name, out.exit_ns)
            out.k_bound = width / 2 + out.gt_bound
            if out.k_bound < out.bound_ns:
                spare.append(out.anchor)
                out.anchor, after_kernel = after_kernel, out.anchor
                out.host_ns, out.bound_ns, out.source = int(lo + width / 2), out.k_bound, "kernel"
    if after_kernel is not out.anchor:
        spare.append(after_kernel)
    return out


def _exit_width(name: str, exit_ns: float) -> float:
    """The width (ns) of the bracket that places the event after the calibration kernel: the `EXIT_QUANTILE` of
    the device's latest `EXIT_WINDOW` kernel-exit brackets, this one included (the calling thread: a calibration's)."""
    seen = _EXITS_NS.setdefault(name, [])
    seen.append(exit_ns)
    del seen[: max(len(seen) - EXIT_WINDOW, 0)]
    return float(np.percentile(seen, EXIT_QUANTILE))


def check_alignment(devices: Iterable[Device], trials: int = 30, samples: int = DEFAULT_SAMPLES) -> dict[str, Any]:
    """Ground truth for the alignment of several GPUs: each trial calibrates every device (as `Device.clock` with
    ``refresh=True``: the calibration timelines use), then makes every device stamp ONE physical instant
    (all spin on the same pinned host flag; the host flips it once) with ``%globaltimer`` in a kernel, and with a
    timing event recorded right after that kernel; then compares the devices' stamps on the host time base.

    Returns per-trial disagreements (ns) between the first device and each other one: ``raw`` (globaltimer
    stamps as read), ``aligned`` (after each device's calibration), ``naive`` (after a single-sample
    calibration), and ``events_aligned`` (the events placed with the device's anchor), plus a summary
    (median and max absolute values). Needs CUDA devices; blocks (GIL released only in driver calls).

    Each GPU *sees* the flag's flip after its own read of host memory, so those disagreements hold how much later
    one GPU saw it than another, as well as the calibrations' errors. Where the first device and another can access
    each other's memory (NVLink, PCIe peer to peer; the access is granted, as a copy between them would), each trial
    also pings between the two GPUs through their own memory (`PeerPings`: their clocks' offset with no host link in
    the way, ± ``peer_bound``) and reports against it: ``peer_aligned``, how far apart the calibrations place two
    kernels' exit stamps beyond what that offset says (asyncgpu's own error across GPUs); ``peer_events_aligned``,
    the same for the events recorded right after those kernels, placed as timelines place events; and ``peer_seen``,
    how much later the other GPU saw the flag's flip than the first (the reading's physics: ``aligned`` ≈
    −``peer_seen`` − ``peer_aligned``, up to the clocks' drift over the milliseconds between the flip and the
    pings). ``peer_pairs`` names the devices so compared."""
    trials = whole("trials", trials, minimum=1)
    samples = whole("samples", samples, minimum=1, hint="pings per calibration")
    devs = list(devices)
    if not all(isinstance(getattr(d, "backend", None), str) for d in devs):  # (Devices: the core's cycle stays lazy)
        raise TypeError(f"check_alignment() takes a list of Devices (asyncgpu.devices('cuda')), not {devs!r}")
    if len(devs) < 2 or any(d.backend != "cuda" for d in devs):
        raise NoDeviceError(
            "check_alignment compares the clocks of two or more CUDA GPUs: pass asyncgpu.devices('cuda') on a "
            f"machine with two (given: {', '.join(d.name for d in devs) or 'none'}; the host backend has one clock)"
        )
    bds = [cast("CudaDevice", d._internal.bd) for d in devs]
    page = bds[0].alloc_mapped(4096)
    words = page.words
    streams = [bd.create_stream() for bd in bds]
    flag_off = 0  # the one word every device's kernel spins on
    per = 64  # bytes per device: the started word, then (at 16) the ping's stamp and the exit stamp
    rows: dict[str, list] = {
        k: [] for k in ("raw", "aligned", "naive", "events_aligned", "peer_aligned", "peer_events_aligned", "peer_seen")
    }
    rows["peer_bound"] = []
    events = [d._internal.timing_pool.take() for d in devs]
    peers: dict[int, Any] = {}  # device index in devs -> its `PeerPings` with the first device
    try:
        for i in range(1, len(devs)):
            pp = bds[0].peer_pings(bds[i])
            if pp is not None:
                peers[i] = pp
        for trial in range(1, trials + 1):
            # Each device calibrated as its timelines' placements calibrate it (`DeviceInternal.calibration`: its
            # drift from its recent calibrations, its pair overheads from its first), every device at once, right
            # before the instant. A calibration from scratch would measure the pair overheads again (CUPTI rounds,
            # up to a second) and ignore the drift: on 4× H100 (-20 ppm) the first device's offset was then stale by
            # the others' calibrations and read the instant 0.9 µs apart on average, 1.5 µs p50 against the peer
            # pings.
            cals = [d._internal.calibration(refresh=True, samples=samples) for d in devs]
            places = [placement(d, refresh=False, subtract_overhead=False) for d in devs]  # (events, as timelines)
            for i, bd in enumerate(bds):
                base = bd.device_pointer(page)
                off = 256 + i * per
                ctypes.memset(page.ptr + off + 16, 0, 16)  # (its stamps: zero before it runs)
                bd.launch_pingpong(streams[i], base + flag_off, base + off, base + off + 16, trial, 1)
                bd.record(events[i], streams[i])  # lands when the kernel ends, just after it saw the flag
            deadline = time.perf_counter_ns() + 1_000_000_000
            while any(words[(256 + i * per) // 4] != trial for i in range(len(devs))):
                if time.perf_counter_ns() > deadline:
                    raise ClockError("a device did not start the ground-truth kernel within 1 s")
            words[flag_off // 4] = trial  # one store: the physical instant every device stamps
            for i, bd in enumerate(bds):
                bd.sync_stream(streams[i])
            stamps = np.array(
                [np.frombuffer(page.view, np.uint64, 1, 256 + i * per + 16)[0] for i in range(len(devs))],  # type: ignore[call-overload]
                dtype=np.int64,
            )
            aligned = [cals[i].globaltimer_to_host_ns(stamps[i]) for i in range(len(devs))]
            naive = [stamps[i] - cals[i].naive_offset_ns for i in range(len(devs))]
            ev_host = [place.host_ns(raw) for place, raw in zip(places, events)]
            for i in range(1, len(devs)):
                rows["raw"].append(float(stamps[0] - stamps[i]))
                rows["aligned"].append(float(aligned[0] - aligned[i]))
                rows["naive"].append(float(naive[0] - naive[i]))
                rows["events_aligned"].append(float(ev_host[0] - ev_host[i]))
            for i, pp in peers.items():
                offset, bound, exit0, exit_i = pp.measure()
                later = (exit_i - offset) - exit0  # (ns on the first GPU's clock: how much later GPU i's kernel exited)
                c0, ci = cals[0], cals[i]
                placed = float(ci.globaltimer_to_host_ns(exit_i) - c0.globaltimer_to_host_ns(exit0))
                ev0, evi = places[0].host_ns(pp.events[0]), places[i].host_ns(pp.events[1])
                rows["peer_aligned"].append(placed - later)
                rows["peer_events_aligned"].append(float(evi - ev0) - later)
                rows["peer_seen"].append(float((stamps[i] - offset) - stamps[0]))
                rows["peer_bound"].append(bound)
    finally:
        words[flag_off // 4] = trials + 1
        for bd, s in zip(bds, streams):
            bd.sync_stream(s)
            bd.close_stream(s)
        for d, raw in zip(devs, events):
            d._internal.timing_pool.give(raw)
        for pp in peers.values():
            pp.close()
        page.free()
    out: dict[str, Any] = {k: np.asarray(v) for k, v in rows.items()}
    out["summary"] = {
        k: {
            "median_abs_ns": float(np.median(np.abs(v))),
            "max_abs_ns": float(np.max(np.abs(v))),
            "mean_ns": float(np.mean(v)),
        }
        for k, v in out.items()
        if len(v)
    }
    out["devices"] = [d.name for d in devs]
    out["peer_pairs"] = [f"{devs[0].name}-{devs[i].name}" for i in peers]
    out["trials"] = trials
    return out
