"""CUPTI activity records through NVIDIA's ``cupti-python``: the only module that imports it.

What `asyncgpu._timer` needs for ``gpu_timer(source="cupti")``: the device's own start and end of every kernel,
memset and memcpy, and, for each, the external correlation id that asyncgpu pushed on the launching thread
(`push` / `pop`), so that it lands on the right activity. CUPTI emits the id only for API records (measured on
H200: no EXTERNAL_CORRELATION record without the DRIVER kind), so the driver and runtime API kinds are on while a
session is open, for launch, copy and set calls only (`_quiet_apis`); their records are dropped in the buffer
callback.

One CUPTI subscriber per process: `acquire` claims it (``cuptiSubscribe``) and fails with `SourceError` when
torch.profiler, Nsight Systems or another tool holds it. The session is shared by every open scope (counted);
the last `release` flushes, disables the kinds and unsubscribes.

Threads: `push`/`pop` on the launching thread (CUPTI keeps one stack per thread). CUPTI hands full buffers to
`_completed` on a thread of its own: it only filters and appends tuples (no asyncgpu code, no locks held long).
`flush` blocks (CUPTI walks its buffers: ~0.1 ms per hundred records), so async callers run it in a worker thread.
Timestamps are ns on CUPTI's own clock, shared by every device: `host_offset_ns` places them on the host's.
"""

from __future__ import annotations

import threading
from typing import Any

from .._errors import SourceError

__all__ = ["CuptiRecord", "acquire", "available", "flush", "host_offset_ns", "pop", "push", "release"]

BUFFER_BYTES = 8 << 20
#: ``(kind, start_ns, end_ns, correlation_id, device_id, stream_id, name)``; kind: "kernel", "memset", "memcpy"
CuptiRecord = tuple

_lock = threading.Lock()
_users = 0
_subscriber: Any = None
_records: list[CuptiRecord] = []
_external: dict[int, int] = {}  # CUPTI correlation id -> asyncgpu's external id
_kinds: tuple = ()
_why_not: str | None = None  # why CUPTI cannot be used in this process, once known


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
        cupti.unsubscribe(handle)
    return True, ""


def _completed(activities: Any) -> None:
    """CUPTI's buffer-completed callback (a CUPTI thread, or the flushing one): keep what asyncgpu reads."""
    from cupti import cupti

    kinds = cupti.ActivityKind
    kernel, memset, memcpy, ext = kinds.CONCURRENT_KERNEL, kinds.MEMSET, kinds.MEMCPY, kinds.EXTERNAL_CORRELATION
    out, corr = [], {}
    for a in activities:
        k = a.kind
        if k in (kernel, memset, memcpy) and not 0 < a.start < a.end:
            continue  # flushed before the work completed (a cancelled scope): CUPTI has no times for it
        if k == kernel:
            out.append(("kernel", a.start, a.end, a.correlation_id, a.device_id, a.stream_id, a.name))
        elif k == memset:
            out.append(("memset", a.start, a.end, a.correlation_id, a.device_id, a.stream_id, "memset"))
        elif k == memcpy:
            out.append(("memcpy", a.start, a.end, a.correlation_id, a.device_id, a.stream_id, "memcpy"))
        elif k == ext:
            corr[a.correlation_id] = a.external_id
    with _lock:
        _records.extend(out)
        _external.update(corr)


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


def _requested() -> tuple[int, int]:
    return BUFFER_BYTES, 0


def _noop(*_: Any) -> None:  # the subscriber's callback: asyncgpu subscribes only to claim CUPTI
    return None


def acquire() -> None:
    """Open (or share) the process's CUPTI session. `SourceError` when CUPTI is missing, held by another tool,
    or does not match the driver. Any thread; blocks briefly (enabling the activity kinds)."""
    global _users, _subscriber, _kinds, _why_not
    cupti = _cupti()
    with _lock:
        if _users:
            _users += 1
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
        k = cupti.ActivityKind
        kinds = (k.CONCURRENT_KERNEL, k.MEMSET, k.MEMCPY, k.EXTERNAL_CORRELATION, k.DRIVER, k.RUNTIME)
        enabled: list = []
        try:
            # Every time: a profiler that ran in between (torch.profiler) registered its own callbacks.
            cupti.activity_register_callbacks(_requested, _completed)
            for kind in kinds:
                cupti.activity_enable(kind)
                enabled.append(kind)
        except cupti.cuptiError as exc:
            for kind in enabled:
                cupti.activity_disable(kind)
            cupti.unsubscribe(_subscriber)
            _subscriber = None
            _why_not = f"CUPTI refused its activity kinds ({exc}): the CUPTI library may not match the driver"
            raise SourceError(
                _why_not + "; install the cupti-python of your driver's CUDA major, or use source='events'"
            ) from None
        _quiet_apis(cupti, 0)
        _kinds = kinds
        _users = 1


def release() -> None:
    """Leave the session; the last user flushes, disables the kinds and unsubscribes. Never raises."""
    global _users, _subscriber
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users:
            return
    from cupti import cupti

    try:
        cupti.activity_flush_all(1)
    finally:
        with _lock:
            if _users == 0 and _subscriber is not None:
                for kind in _kinds:
                    cupti.activity_disable(kind)
                _quiet_apis(cupti, 1)  # as found: a profiler after us (torch.profiler) sees every API again
                cupti.unsubscribe(_subscriber)
                _subscriber = None
                _records.clear()
                _external.clear()


def push(external_id: int) -> None:
    """Attribute what this thread launches from now on to ``external_id`` (until `pop`)."""
    from cupti import cupti

    cupti.activity_push_external_correlation_id(cupti.ExternalCorrelationKind.CUSTOM0, external_id)


def pop() -> None:
    from cupti import cupti

    cupti.activity_pop_external_correlation_id(cupti.ExternalCorrelationKind.CUSTOM0)


def host_offset_ns(samples: int = 16) -> int:
    """CUPTI's timestamp minus ``time.perf_counter_ns()`` (ns): CUPTI puts every device's times on one clock of
    its own (not the devices' ``%globaltimer``, which is ~0.1 ms off on H200), so this one offset places them on
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


def flush() -> tuple[list[CuptiRecord], dict[int, int]]:
    """Every record CUPTI holds for work that has completed, and the correlation -> external id map; both are
    taken (a later flush returns newer ones only). Blocks the calling thread while CUPTI hands its buffers over."""
    from cupti import cupti

    cupti.activity_flush_all(1)
    with _lock:
        records, ext = list(_records), dict(_external)
        _records.clear()
        _external.clear()
    return records, ext
