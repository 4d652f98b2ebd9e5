"""CUPTI activity records through NVIDIA's ``cupti-python``: the only module that imports it.

What the features that time with CUPTI need (``source="cupti"`` on `gpu_timer`, `benchmark` and
`kernel_history.recording`): `choose`, the one answer to "which source does this user get", the device's own
start and end of every kernel, memset and memcpy, and, for each, the external correlation id that the feature
pushed on the launching thread (`push` / `pop`), so that a `Router` hands it to the right activity, repeat or
launch. Each feature has a *channel* of its own (`TIMER`, `BENCH`, `HISTORY`: CUPTI's external correlation kinds
CUSTOM0..2), so that a launch timed by a scope and recorded by the kernel history at once carries both ids, and a
flush hands each channel every record (`flush` takes only the caller's channel). CUPTI emits the ids only for API
records (no EXTERNAL_CORRELATION record comes without the DRIVER kind), so the driver and runtime API kinds are on
while a channel that pushes ids is open (`TIMER`, `BENCH`, `HISTORY`; the records-only channels need none), for
launch, copy and set calls only (`_quiet_apis`); their records are dropped in the buffer callback.

One CUPTI subscriber per process: `acquire` claims it (``cuptiSubscribe``) and fails with `SourceError` when
torch.profiler, Nsight Systems or another tool holds it. The session is shared by every user of every channel
(counted); the last `release` flushes, disables the kinds and unsubscribes.

Threads: `push`/`pop` on the launching thread (CUPTI keeps one stack per thread and kind). CUPTI's buffers are
handed over raw and parsed in bulk by whichever thread flushes (`asyncgpu._backends.cupti_buffers`: CUPTI's own
thread only queues them). `flush` blocks (CUPTI hands its buffers over without the GIL; then numpy parses them),
so async callers run it in a worker thread. Timestamps are ns on CUPTI's own clock, shared by every
device: `host_offset_ns` places them on the host's.
"""

from __future__ import annotations

import atexit
import itertools
import threading
from typing import Any, Iterable, Sequence, final

from asyncgpu._backends.cupti_buffers import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Buffers, RecordBatch, find_libcupti
from asyncgpu._base.errors import SourceError

__all__ = [
    "BENCH",
    "CALIBRATION",
    "HISTORY",
    "SOURCES",
    "STEPS",
    "TIMER",
    "CuptiRecord",
    "RecordBatch",
    "Router",
    "acquire",
    "available",
    "check_source",
    "choose",
    "flush",
    "flush_batch",
    "host_offset_ns",
    "pop",
    "push",
    "release",
    "span",
    "users",
]

BUFFER_BYTES = 8 << 20
SOURCES = ("auto", "cupti", "events")  #: what ``source=`` accepts, wherever it is accepted
TIMER, BENCH, HISTORY = 0, 1, 2  #: channels: `gpu_timer` scopes, `benchmark` runs, the kernel history
#: records-only channels (no external ids: never `push`ed): a device's clock calibration measures what an event pair
#: adds to its work against CUPTI's own records of it; a step timer attributes records to steps by their times
CALIBRATION, STEPS = 3, 4
_CHANNELS = 5
_RECORDS_ONLY = (CALIBRATION, STEPS)  # while only these are open, no API record is made (each costs a parse)
#: ``(kind, start_ns, end_ns, correlation_id, device_id, stream_id, name)``; kind: "kernel", "memset", "memcpy"
CuptiRecord = tuple

_lock = threading.Lock()  # the session (subscriber, users, kinds); CUPTI may be called while it is held
# The records (inboxes, external ids). CUPTI's buffer callbacks (inside its own calls: enabling kinds, flushing,
# unsubscribing; on the caller's thread or its own) take only the buffers' lock, and no CUPTI call is ever made
# while this one is held.
_records_lock = threading.Lock()
_parse_lock = threading.Lock()  # one thread parses the completed buffers at a time (then hands them to every channel)
_users = 0  # users of every channel
_channel_users = [0] * _CHANNELS
_inbox: list[list[RecordBatch]] = [[] for _ in range(_CHANNELS)]  # records not flushed yet, per open channel
_external: list[dict[int, int]] = [{} for _ in range(_CHANNELS)]  # per channel: correlation id -> external id
_subscriber: Any = None
_kinds: tuple = ()  # the activity kinds enabled now
_api_kinds: tuple = ()  # the kinds that carry external ids (API calls, correlations): on while a channel needs them
_ext_kinds: tuple = ()  # CUPTI's external correlation kind of each channel
_channel_of: dict[int, int] = {}  # and back
_api: Any = None  # the ``cupti`` module, once a session was opened
_buffers: Buffers | None = None  # the buffers lent to CUPTI (made with the process's first session)
_why_not: str | None = None  # why CUPTI cannot be used in this process, once known


def users() -> int:
    """How many users (of every channel) hold the process's CUPTI session now. Any thread."""
    return _users


def check_source(source: Any) -> None:
    """`ValueError` naming the choices unless ``source`` is one of `SOURCES`."""
    if not isinstance(source, str) or source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(map(repr, SOURCES))}, not {source!r}")


def choose(source: str, devices: Sequence[Any] | None, channel: int, what: str) -> tuple[str, str]:
    """Which source a user of ``channel`` gets for ``source`` (one of `SOURCES`): ``("cupti", "")`` with the
    session acquired (the caller `release` s it), or ``("events", why)``: ``why`` is empty for ``"events"`` and
    says why ``"auto"`` fell back. ``devices``: the devices timed (each with ``name`` and ``backend``), or None
    for every device of the process (the kernel history). ``what`` names the user in messages ("this scope").
    `SourceError` naming the fix when ``"cupti"`` cannot be had. Blocks briefly (`acquire`)."""
    check_source(source)
    if source == "events":
        return "events", ""
    if devices is None:
        from asyncgpu._backends import load_backend

        ok, why_no_cuda = load_backend("cuda").available()
        why = "" if ok else f"CUPTI times CUDA devices only, and {what} has none ({why_no_cuda})"
    else:
        others = [d.name for d in devices if d.backend != "cuda"]
        why = f"CUPTI times CUDA devices only, and {what} covers {', '.join(others)}" if others else ""
    if why:
        if source == "cupti":
            raise SourceError(f"source='cupti': {why}: use source='events' (or 'auto', which picks it)")
        return "events", why
    try:
        acquire(channel)
    except SourceError as exc:
        if source == "cupti":
            raise
        return "events", f"events, because {exc}"
    return "cupti", ""


def span(records: Iterable[tuple]) -> tuple[int, int] | None:
    """``(first start, last end)`` in ns of records routed by a `Router` (None when there are none)."""
    start = end = None
    for _kind, s, e, *_ in records:
        if start is None or s < start:
            start = s
        if end is None or e > end:
            end = e
    return None if start is None or end is None else (start, end)


@final
class Router:
    """One feature's external ids and the CUPTI records routed to them. `tag` gives a target (any object with a
    ``cupti`` attribute, None at first) an id to `push` around its launches; `collect` flushes the feature's
    channel and appends each record, ``(kind, start_ns, end_ns, device_id, stream_id, name)``, to the list in
    its target's ``cupti``; `untag` forgets the target. Records whose correlation is not known yet wait for the
    next collect (up to `MAX_UNROUTED`). `tag` and `untag` from any thread; `collect` blocks (`flush`)."""

    MAX_UNROUTED = 100_000

    def __init__(self, channel: int) -> None:
        self.channel = channel
        self.targets: dict[int, Any] = {}  # external id -> target, until untagged
        self._ids = itertools.count(1)
        self._unrouted: list[CuptiRecord] = []
        self._ext_map: dict[int, int] = {}  # CUPTI correlation id -> external id, kept while it may be used
        self._lock = threading.Lock()

    def tag(self, target: Any) -> int:
        """A new external id for ``target``."""
        ext = next(self._ids)
        self.targets[ext] = target
        return ext

    def untag(self, ext: int) -> None:
        self.targets.pop(ext, None)

    def collect(self) -> tuple[int, str]:
        """Flush the channel and route its records. Returns CUPTI's clock minus the host's (`host_offset_ns`)
        and "", or, when the flush failed, ``(0, why)``: the users' event times then stand, and they say why."""
        try:
            self.route(*flush(self.channel))
            return host_offset_ns(), ""
        except Exception as exc:  # noqa: BLE001 - the caller keeps the events' times and says why
            return 0, f"events, because the CUPTI flush failed ({exc})"

    def route(self, records: list[CuptiRecord], ext_map: dict[int, int]) -> None:
        """Hand ``records`` to their targets (by external id); keep the ones not placeable yet. Any thread."""
        with self._lock:
            self._ext_map.update(ext_map)
            keep = []
            for rec in (*self._unrouted, *records):
                kind, start, end, corr, dev_id, stream_id, name = rec
                ext = self._ext_map.get(corr)
                target = self.targets.get(ext) if ext is not None else None
                if target is None:
                    if ext is None:
                        keep.append(rec)  # its correlation record may come with the next buffer
                    continue
                if target.cupti is None:  # (the id stays mapped: a graph replay's nodes all share one correlation)
                    target.cupti = []
                target.cupti.append((kind, start, end, dev_id, stream_id, name))
            self._unrouted[:] = keep[-self.MAX_UNROUTED :]
            if len(self._ext_map) > self.MAX_UNROUTED:  # ids of work nobody times any more
                for corr in list(self._ext_map)[: len(self._ext_map) - self.MAX_UNROUTED]:
                    del self._ext_map[corr]


def _cupti() -> Any:
    """The ``cupti`` module, or `SourceError` naming the fix."""
    try:
        from cupti import cupti
    except ImportError as exc:
        raise SourceError(
            f"source='cupti' needs NVIDIA's cupti-python ({exc}): pip install 'asyncgpu[cupti]' (cupti-python "
            "13.x for CUDA 13 drivers, 12.x for CUDA 12), or use source='events'"
        ) from None
    except OSError as exc:  # libcupti missing or not loadable
        raise SourceError(
            f"cupti-python is installed but CUPTI cannot be loaded ({exc}): install the nvidia-cuda-cupti wheel "
            "of your CUDA version (pip install 'nvidia-cuda-cupti-cu12' for CUDA 12), or use source='events'"
        ) from None
    return cupti


def available() -> tuple[bool, str]:
    """Whether a session could be opened now, and why not. Tries to subscribe (and unsubscribes at once) when
    no session is open: a profiler may hold CUPTI for the rest of the process (torch.profiler does, once used)."""
    if _subscriber is not None:
        return True, ""
    if _why_not is not None:
        return False, _why_not
    try:
        cupti = _cupti()
    except SourceError as exc:
        return False, str(exc)
    with _lock:
        if _subscriber is not None:
            return True, ""
        try:
            handle = cupti.subscribe(_noop, None)
        except cupti.cuptiError as exc:
            return False, f"CUPTI cannot subscribe: {exc}"
        except RuntimeError as exc:  # cupti-python's NotSupportedError: no CUDA driver it can load
            return False, f"CUPTI cannot start: {exc}"
        cupti.unsubscribe(handle)
    return True, ""


_KEEP_APIS = ("Launch", "Memcpy", "Memset")  # the API calls whose records carry an external id asyncgpu reads


def _quiet_apis(cupti: Any, enable: int) -> None:
    """Record API calls only for launches, copies and sets (``enable=0``), or every call again (``enable=1``):
    CUPTI emits external ids only with API records, and recording every driver call (each event record and
    query) would multiply the records a flush has to hand over."""
    for domain, switch in (
        (cupti.driver_api_trace_cbid, cupti.activity_enable_driver_api),
        (cupti.runtime_api_trace_cbid, cupti.activity_enable_runtime_api),
    ):
        for name, cbid in domain.__members__.items():
            if name in ("INVALID", "SIZE", "FORCE_INT") or any(word in name for word in _KEEP_APIS):
                continue
            try:
                switch(cbid, enable)
            except cupti.cuptiError:
                pass  # an API this CUPTI does not trace


def _noop(*_: Any) -> None:  # the subscriber's callback: asyncgpu subscribes only to claim CUPTI
    return None


def acquire(channel: int) -> None:
    """Open (or share) the process's CUPTI session for a user of ``channel``. `SourceError` when CUPTI is
    missing, held by another tool, or does not match the driver. Any thread; blocks briefly (enabling the
    activity kinds)."""
    global _users, _subscriber, _kinds, _why_not, _ext_kinds, _channel_of, _api, _api_kinds
    cupti = _cupti()
    with _lock:
        if _users:
            if channel not in _RECORDS_ONLY and not set(_api_kinds) <= set(_kinds):
                _enable_api_kinds(cupti)
            _users += 1
            _channel_users[channel] += 1
            return
        try:
            _subscriber = cupti.subscribe(_noop, None)
        except cupti.cuptiError as exc:
            if getattr(exc, "status", None) == cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
                raise SourceError(
                    "CUPTI is already taken in this process (torch.profiler, Nsight Systems or another tool "
                    "subscribed first; CUPTI allows one subscriber): end that profiler's session first, or use "
                    "source='events' (source='auto' falls back to it by itself)"
                ) from None
            _why_not = f"CUPTI cannot subscribe ({exc}): is cupti-python's major version your driver's CUDA major?"
            fix = " pip install 'cupti-python==<CUDA major>.*', or use source='events'"
            raise SourceError(_why_not + fix) from None
        except RuntimeError as exc:  # cupti-python's NotSupportedError: no CUDA driver it can load
            _why_not = f"CUPTI cannot start ({exc})"
            raise SourceError(_why_not + ": use source='events' on this machine") from None
        k = cupti.ActivityKind
        kinds = (k.CONCURRENT_KERNEL, k.MEMSET, k.MEMCPY)
        if channel not in _RECORDS_ONLY:
            kinds += _id_kinds(k)
        enabled: list = []
        try:
            buffers = _buffers or _make_buffers(cupti)
            # Every time: a profiler that ran in between (torch.profiler) registered its own callbacks.
            buffers.register()
            for kind in kinds:
                cupti.activity_enable(kind)
                enabled.append(kind)
        except (cupti.cuptiError, SourceError) as exc:
            for kind in enabled:
                cupti.activity_disable(kind)
            cupti.unsubscribe(_subscriber)
            _subscriber = None
            if isinstance(exc, SourceError):
                raise
            _why_not = f"CUPTI refused its activity kinds ({exc}): the CUPTI library may not match the driver"
            raise SourceError(
                _why_not + "; install the cupti-python of your driver's CUDA major, or use source='events'"
            ) from None
        _quiet_apis(cupti, 0)
        ek = cupti.ExternalCorrelationKind
        _api, _ext_kinds = cupti, (ek.CUSTOM0, ek.CUSTOM1, ek.CUSTOM2)
        _channel_of = {int(kind): channel for channel, kind in enumerate(_ext_kinds)}
        _kinds = kinds
        _api_kinds = _id_kinds(k)
        _users = 1
        _channel_users[channel] += 1


def _make_buffers(cupti: Any) -> Buffers:
    """The process's `Buffers` (once libcupti is loaded: after the first ``subscribe``), with the layout of each
    kind of record asyncgpu enables, from cupti-python's dtypes."""
    global _buffers
    k = cupti.ActivityKind
    layouts = {
        k.CONCURRENT_KERNEL: (_newest_dtype(cupti, "activity_kernel"), KIND_KERNEL),
        k.MEMSET: (_newest_dtype(cupti, "activity_memset"), KIND_MEMSET),
        k.MEMCPY: (_newest_dtype(cupti, "activity_memcpy"), KIND_MEMCPY),
        k.EXTERNAL_CORRELATION: (_newest_dtype(cupti, "activity_external_correlation"), "external"),
        k.DRIVER: (_newest_dtype(cupti, "activity_api"), None),
        k.RUNTIME: (_newest_dtype(cupti, "activity_api"), None),
    }
    _buffers = Buffers(find_libcupti(), BUFFER_BYTES, layouts)
    atexit.register(_detach_at_exit)
    return _buffers


def _detach_at_exit() -> None:
    """At the interpreter's exit (``atexit``: Python still runs), end a session still open (a timer never closed)
    as its last user would, then detach CUPTI from the process (`Buffers.detach`): its own teardown, after the
    interpreter's, must not call the buffer callbacks (Python) into a finalized interpreter."""
    for channel in range(_CHANNELS):
        while _channel_users[channel]:
            release(channel)
    if _buffers is not None:
        with _parse_lock:
            _buffers.detach()


def _newest_dtype(cupti: Any, stem: str) -> Any:
    """cupti-python's numpy dtype of the newest version of a record (``activity_kernel10_dtype`` over
    ``activity_kernel9_dtype``; ``activity_api_dtype`` when unversioned): the version its CUPTI writes."""
    found = [(0, getattr(cupti, f"{stem}_dtype"))] if hasattr(cupti, f"{stem}_dtype") else []
    for name in dir(cupti):
        version = name[len(stem) : -len("_dtype")]
        if name.startswith(stem) and name.endswith("_dtype") and version.isdigit():
            found.append((int(version), getattr(cupti, name)))
    if not found:
        raise SourceError(
            f"this cupti-python describes no {stem.removeprefix('activity_')} record ({stem}*_dtype): install "
            "cupti-python 12.8 or newer of your CUDA major, or use source='events'"
        )
    return max(found, key=lambda vd: vd[0])[1]


def _id_kinds(k: Any) -> tuple:
    """The kinds that carry external ids: CUPTI emits them only with API records (DRIVER, RUNTIME)."""
    return (k.EXTERNAL_CORRELATION, k.DRIVER, k.RUNTIME)


def _enable_api_kinds(cupti: Any) -> None:
    """A channel that pushes external ids joins a records-only session: turn the API kinds on (under `_lock`)."""
    global _kinds
    for kind in _api_kinds:
        if kind not in _kinds:
            cupti.activity_enable(kind)
            _kinds += (kind,)


def release(channel: int) -> None:
    """A user of ``channel`` leaves the session (that channel's unflushed records go once it has no user); the
    last user of all disables the kinds, flushes and unsubscribes, under the session's lock (CUPTI's buffer
    callbacks take only the buffers' lock, so CUPTI may call them meanwhile): an `acquire` racing it waits and
    opens a new session.
    Never raises."""
    global _users, _subscriber, _kinds
    with _lock:
        if _users == 0 or _channel_users[channel] == 0:
            return
        _users -= 1
        _channel_users[channel] -= 1
        if not _channel_users[channel]:
            with _records_lock:
                _inbox[channel].clear()
                _external[channel].clear()
        if _users or _subscriber is None:
            return
        from cupti import cupti

        try:
            for kind in _kinds:  # first: no record may open a buffer after the flush below
                cupti.activity_disable(kind)
            # Forced: every buffer CUPTI holds comes back through our callback now, even a partly filled one. A
            # buffer left behind would be completed later to whichever profiler registered its callbacks after
            # us (torch.profiler's: "bufferCompleted called with unknown buffer", then a double free at exit).
            if _buffers is not None:
                _buffers.flush_all(forced=True)
        finally:
            _quiet_apis(cupti, 1)  # as found: a profiler after us (torch.profiler) sees every API again
            cupti.unsubscribe(_subscriber)
            _subscriber, _kinds = None, ()
            if _buffers is not None:
                with _parse_lock:
                    _buffers.drop()
            with _records_lock:
                for c in range(_CHANNELS):
                    _inbox[c].clear()
                    _external[c].clear()


def push(external_id: int, channel: int) -> None:
    """Attribute what this thread launches from now on to ``external_id`` of ``channel`` (until `pop`). Only
    while the caller holds the session (`acquire`); the hot path of CUPTI-timed launches."""
    _api.activity_push_external_correlation_id(_ext_kinds[channel], external_id)


def pop(channel: int) -> None:
    _api.activity_pop_external_correlation_id(_ext_kinds[channel])


def stream_id(context: int, handle: int) -> int | None:
    """CUPTI's id of the stream whose driver handle is ``handle``, of context ``context`` (the ``stream`` of its
    records), or None where CUPTI cannot tell (a closed stream). Needs the CUPTI session (`acquire`); any thread;
    never blocks."""
    from cupti import cupti

    try:
        return int(cupti.get_stream_id_ex(context, handle, 0))
    except cupti.cuptiError:
        return None


def host_offset_ns(samples: int = 16) -> int:
    """CUPTI's timestamp minus ``time.perf_counter_ns()`` (ns): CUPTI puts every device's times on one clock of
    its own (not the devices' ``%globaltimer``, which may be ~0.1 ms off it), so this one offset places them on
    the host time base. The best of ``samples`` host-bracketed reads (one read: ~0.2 µs); any thread."""
    import time

    from cupti import cupti

    best_rtt, offset = None, 0
    for _ in range(samples):
        h0 = time.perf_counter_ns()
        c = cupti.get_timestamp()
        h1 = time.perf_counter_ns()
        if best_rtt is None or h1 - h0 < best_rtt:
            best_rtt, offset = h1 - h0, c - (h0 + h1) // 2
    return offset


def flush_batch(channel: int) -> tuple[RecordBatch, dict[int, int]]:
    """Every record CUPTI holds for work that has completed since ``channel``'s last flush, as one `RecordBatch`,
    and the channel's correlation -> external id map; both are taken (a later flush returns newer ones only; other
    channels keep theirs). Blocks the calling thread while CUPTI hands its buffers over (without the GIL) and while
    they are parsed (numpy, no Python per field). `SourceError` when CUPTI's records are not the ones cupti-python
    describes."""
    buffers = _buffers
    if buffers is not None:
        buffers.flush_all(forced=True)
        with _parse_lock:
            batch = buffers.take()
            if len(batch) or batch.external:
                with _records_lock:
                    for c in range(_CHANNELS):
                        if _channel_users[c]:
                            _inbox[c].append(batch)
                    for kind, correlation, external in batch.external:
                        to = _channel_of.get(kind)
                        if to is not None and _channel_users[to]:
                            _external[to][correlation] = external
    with _records_lock:
        batches, ext = _inbox[channel], _external[channel]
        _inbox[channel], _external[channel] = [], {}
    return RecordBatch.concat(batches), ext


def flush(channel: int) -> tuple[list[CuptiRecord], dict[int, int]]:
    """`flush_batch`, the records as ``(kind, start_ns, end_ns, correlation, device, stream, name)`` tuples (kind
    ``"kernel"``, ``"memset"`` or ``"memcpy"``): for callers that route records one by one."""
    batch, ext = flush_batch(channel)
    return batch.tuples(), ext
