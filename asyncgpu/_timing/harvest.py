"""Finished activities: their events go back before their scope ends, and at its end they become columns.

A long scope would otherwise hold two events per activity until its exit. Once `_HARVEST_EVERY` activities of a
device wait and its pool runs low, the device's waiter thread is asked (an engine callback on that activity's end
event) to take each finished activity's duration and start, then recycle its events (`ended`, `_harvest`). Each
harvested start is kept as a time on the device's `_Chain` of reference events, so that one event per device places
them all at the scope's end. `_HARVEST_LOCK` orders the harvest against `columns_of`, which turns a scope's activities
into columns on the host time base and gives back the events of those no other open scope reads.

Threads: `ended` runs on the launching thread (hot: a deque append), `_harvest` on the device's waiter thread,
`columns_of` and `trim_all` on the thread that ends the scope (or a worker thread for a large trim).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Sequence, final

import numpy as np

from asyncgpu._base.errors import AsyncGPUError, NotReadyError
from asyncgpu._base.records import KIND_CODES, HostRange
from asyncgpu._runtime.clock import Placement, cut_kind
from asyncgpu._runtime.device import Device
from asyncgpu._runtime.engine import KIND_CALLBACK
from asyncgpu._timing.activity import ROUTER, Activity

__all__ = ["POOL_KEEP", "TRIM_INLINE", "Columns", "columns_of", "ended", "host_ranges", "trim_all"]

_HARVEST_EVERY = 256
POOL_KEEP = 1024  # free events a device's pools keep when a scope ends (`DeviceInternal.trim`)
TRIM_INLINE = 128  # releases and surplus events an async scope's exit goes through on the loop's thread (~0.1 ms)
_UNHARVESTED: dict[Device, deque[Activity]] = {}  # (entries of closed devices go at a scope's end)
_HARVESTING: set[Device] = set()  # devices with a harvest callback pending
_HARVEST_LOCK = threading.Lock()


def ended(act: Activity) -> None:
    """``act``'s end is recorded: keep it for its device's harvest (hot: a deque append), and when enough of the
    device's activities wait, have them harvested once the device passes this one."""
    dev = act.device
    q = _UNHARVESTED.get(dev)
    if q is None:
        q = _UNHARVESTED[dev] = deque()
    q.append(act)
    if len(q) < _HARVEST_EVERY or dev in _HARVESTING or not dev._internal.timing_pool.running_low():
        return  # (a pool with free events to spare: no harvest, no work on the waiter thread)
    _HARVESTING.add(dev)
    s = act.stream
    try:
        dev._internal.engine.add(
            act.end_raw, s.handle, next(s._internal.seqs), None, 0, KIND_CALLBACK, None, lambda _raw: _harvest(dev)
        )
    except AsyncGPUError:
        _HARVESTING.discard(dev)


@final
class _Chain:
    """A device's time line for harvested activities: ``raw``, a start event the device has passed, stands at
    ``t_ns`` (ns) on it; each harvested activity keeps its start as a time on the chain. A new chain starts when the
    device was idle for `_CHAIN_GAP_MS` (event times are float32 milliseconds: a short step between references keeps
    them exact)."""

    __slots__ = ("raw", "t_ns", "refs", "live")

    def __init__(self, raw: Any) -> None:
        self.raw, self.t_ns, self.refs, self.live = raw, 0.0, 0, True


_CHAINS: dict[Device, _Chain] = {}
_CHAIN_STEP_MS = 10.0  # a newer start becomes the chain's reference after this long
_CHAIN_GAP_MS = 1_000.0


def _harvest(dev: Device) -> None:
    """On the device's waiter thread: time the finished activities at the front of its queue (duration, start on
    the device's chain) and give their events back."""
    try:
        q = _UNHARVESTED.get(dev)
        if q is None or dev.closed:
            return
        query, elapsed, pool = dev._internal.query, dev._internal.elapsed_ms, dev._internal.timing_pool
        with _HARVEST_LOCK:
            chain = _CHAINS.get(dev)
            while q:
                act = q[0]
                if act.start_raw is None:  # its scopes have finished it
                    q.popleft()
                    continue
                start, end = act.start_raw, act.end_raw
                if end is None or not query(end):
                    return
                q.popleft()
                step_ms = elapsed(chain.raw, start) if chain is not None else _CHAIN_GAP_MS
                if chain is None or step_ms >= _CHAIN_GAP_MS:  # none yet, or too long ago for float32 steps
                    if chain is not None:
                        _retire(dev, chain)
                    chain = _CHAINS[dev] = _Chain(start)
                    dev._internal.keep(start)
                    step_ms = 0.0
                act.duration_ms = elapsed(start, end)
                act.placed = (chain, chain.t_ns + step_ms * 1e6)
                chain.refs += 1
                act.start_raw = act.end_raw = None
                pool.give(end)
                if start is chain.raw:
                    continue
                if step_ms >= _CHAIN_STEP_MS:  # the newest start becomes the reference
                    old = chain.raw
                    chain.raw, chain.t_ns = start, chain.t_ns + step_ms * 1e6
                    dev._internal.keep(start)
                    dev._internal.keep(old, False)
                else:
                    pool.give(start)
    finally:
        _HARVESTING.discard(dev)


def _retire(dev: Device, chain: _Chain) -> None:
    """``chain`` takes no more activities; its event goes back once no activity refers to it. Under the lock."""
    chain.live = False
    if chain.refs == 0:
        dev._internal.keep(chain.raw, False)


def trim_all(devices: Sequence[Device]) -> None:
    """`DeviceInternal.trim` each open one of ``devices`` to `POOL_KEEP` (a worker thread at an async scope's exit)."""
    for d in devices:
        if not d.closed:
            d._internal.trim(POOL_KEEP)


@final
class Columns:
    """A scope's activities as columns (rows in issue order, then the rows CUPTI adds), with the codes of their
    devices, streams and names."""

    __slots__ = (
        "dev_codes",
        "streams",
        "names",
        "device",
        "stream",
        "name",
        "kind",
        "start",
        "dur",
        "issued",
        "from_cupti",
        "spills",
    )

    def __init__(self, dev_codes: dict[Device, int], acts: list[Activity]) -> None:
        n = len(acts)
        self.dev_codes = dev_codes
        self.streams: dict[Any, int] = {}
        self.names: dict[str, int] = {}
        self.device = np.empty(n, np.int16)
        self.stream = np.empty(n, np.int32)
        self.name = np.empty(n, np.int32)
        self.kind = np.empty(n, np.int8)
        self.start = np.full(n, np.nan)
        self.dur = np.full(n, np.nan)
        self.issued = np.fromiter((a.issued_ns for a in acts), np.float64, n)
        self.from_cupti = np.zeros(n, bool)
        self.spills = np.fromiter((a.spills for a in acts), bool, n)  # launches that spill the device's cache

    def append(self, extra: list) -> None:
        """Add the rows of ``extra`` (device, stream, name, kind, start_ns, duration_ns), timed by CUPTI and issued
        by others (no issue time)."""
        streams, names = self.streams, self.names
        k = len(extra)
        dv, st, nm, kd = np.empty(k, np.int16), np.empty(k, np.int32), np.empty(k, np.int32), np.empty(k, np.int8)
        sc, dc = np.empty(k), np.empty(k)
        for j, (dev, stream, name, kind, start, dur) in enumerate(extra):
            dv[j] = self.dev_codes[dev]
            st[j] = streams.setdefault(stream, len(streams))
            nm[j] = names.setdefault(name, len(names))
            kd[j] = KIND_CODES[kind]
            sc[j], dc[j] = start, dur
        self.device = np.concatenate([self.device, dv])
        self.stream = np.concatenate([self.stream, st])
        self.name = np.concatenate([self.name, nm])
        self.kind = np.concatenate([self.kind, kd])
        self.start = np.concatenate([self.start, sc])
        self.dur = np.concatenate([self.dur, dc])
        self.from_cupti = np.concatenate([self.from_cupti, np.ones(k, bool)])
        self.spills = np.concatenate([self.spills, np.zeros(k, bool)])
        self.issued = np.concatenate([self.issued, np.full(k, np.nan)])

    def trim(self, placements: dict[Device, Placement]) -> None:
        """Take each device's event-pair overhead out of its rows timed by events (`Placement.trim_columns`)."""
        d2d_codes = [c for name, c in self.names.items() if cut_kind("memcpy", name) == "memcpy_d2d"]
        d2d = np.isin(self.name, d2d_codes) if d2d_codes else None  # copies between device buffers
        spills = self.spills if self.spills.any() else None
        for d, code in self.dev_codes.items():
            rows = (self.device == code) & ~self.from_cupti
            placements[d].trim_columns(rows, self.kind, self.start, self.dur, d2d, spills)


def columns_of(acts: list[Activity], dev_codes: dict[Device, int], placements: dict[Device, Placement]) -> Columns:
    """A scope's activities as columns on the host time base (never waits for the devices: a start or duration the
    device has not reached stays NaN), each activity's events given back when no other open scope reads it."""
    cols = Columns(dev_codes, acts)
    streams, names = cols.streams, cols.names
    device_col, stream_col, name_col, kind_col = cols.device, cols.stream, cols.name, cols.kind
    start_col, dur_col = cols.start, cols.dur
    chain_ns: dict[_Chain, float] = {}  # the host time of each chain's reference event
    with _HARVEST_LOCK:  # (waiter threads harvest finished activities meanwhile)
        for i, act in enumerate(acts):
            dev = act.device
            device_col[i] = dev_codes[dev]
            st = streams.get(act.stream)
            if st is None:
                st = streams[act.stream] = len(streams)
            stream_col[i] = st
            nm = names.get(act.name)
            if nm is None:
                nm = names[act.name] = len(names)
            name_col[i] = nm
            kind_col[i] = KIND_CODES[act.kind]
            if act.duration_ms is None and act.end_raw is not None:
                try:
                    act.duration_ms = dev._internal.elapsed_ms(act.start_raw, act.end_raw)
                except NotReadyError:
                    pass
            if act.duration_ms is not None:
                dur_col[i] = act.duration_ms * 1e6
                place = placements[dev]
                if act.placed is not None and act.placed[0] is place.anchor:
                    start_col[i] = act.placed[1]
                elif act.start_raw is None and act.placed is not None:  # harvested: a time on its chain
                    chain, t_ns = act.placed
                    at = chain_ns.get(chain)
                    if at is None:
                        at = chain_ns[chain] = _chain_host_ns(place, chain)
                    start_col[i] = at + (t_ns - chain.t_ns) * place.rate
                elif place.anchor is not None:
                    try:
                        start_col[i] = place.host_ns(act.start_raw)
                    except NotReadyError:
                        pass
                    else:
                        act.placed = (place.anchor, start_col[i])
            act.refs -= 1
            if act.refs == 0:
                _release_activity(act)
        for d in [d for d in _UNHARVESTED if d.closed]:  # (a closed worker destroyed its events)
            del _UNHARVESTED[d]
            _CHAINS.pop(d, None)
    return cols


def host_ranges(raw: list[tuple]) -> tuple[HostRange, ...]:
    """The ranges of a scope's activity blocks, each (name, kind, start_ns, end_ns, thread ident), as `HostRange` s
    named after their threads."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return tuple(HostRange(n, k, t0, t1, names.get(ident, f"thread {ident}")) for n, k, t0, t1, ident in raw)


def _chain_host_ns(place: Placement, chain: _Chain) -> float:
    try:
        return place.host_ns(chain.raw)
    except NotReadyError:  # (cannot happen: harvested events are complete)
        return float("nan")


def _release_activity(act: Activity) -> None:
    """Its last scope is done with ``act``: its events go back, and its chain's reference when that is retired.
    Under `_HARVEST_LOCK`."""
    placed = act.placed
    if placed is not None and isinstance(placed[0], _Chain):
        chain = placed[0]
        chain.refs -= 1
        if chain.refs == 0 and not chain.live:
            act.device._internal.keep(chain.raw, False)
    if act.ext:
        ROUTER.untag(act.ext)
    if act.replay is not None:  # (kept on the activity: a scope reads it after the release)
        target = act.replay[0]
        target.refs -= 1
        if target.refs <= 0:
            ROUTER.untag(target.ext)
    dev = act.device
    if act.start_raw is not None:  # (None: harvested, its events already back)
        dev._internal.recycle_later(act.start_raw)
    if act.end_raw is not None:
        dev._internal.recycle_later(act.end_raw)
    act.start_raw = act.end_raw = None
