"""Choosing devices: `device`, `devices`, and the registry of open workers (one per device and process).

The default backend is CUDA. The host backend is used only when asked for: ``backend="host"``, a ``"host:N"``
name, or ``ASYNCGPU_BACKEND=host`` in the environment. Without a usable GPU, asking for CUDA raises
`NoDeviceError` with the reason and the fix; asyncgpu never falls back on its own.

After ``os.fork()`` the child forgets the parent's workers (their threads do not run there): `device` opens
fresh ones, and a worker object the parent opened raises `ClosedError` naming the fix
(see `DeviceInternal.mark_forked`).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable

from asyncgpu._backends import BACKEND_NAMES, load_backend
from asyncgpu._base.checks import whole
from asyncgpu._base.errors import NoDeviceError, UnknownDeviceError
from asyncgpu._runtime import hooks
from asyncgpu._runtime.device import Device

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "DEFAULT_STREAMS",
    "backend_available",
    "close_all",
    "default_backend",
    "device",
    "devices",
    "opened",
    "prepare_timing_soon",
    "resolve_devices",
]

DEFAULT_STREAMS = 2
DEFAULT_MAX_EVENTS = 1 << 21  #: per pool: a bound that catches leaks, far above any steady state
DEFAULT_HOST_DEVICES = 2

_open: dict[tuple[str, int], Device] = {}
_lock = threading.RLock()


def default_backend() -> str:
    """``$ASYNCGPU_BACKEND`` if set (``cuda`` or ``host``), else ``cuda``."""
    name = os.environ.get("ASYNCGPU_BACKEND", "cuda").strip().lower() or "cuda"
    if name not in BACKEND_NAMES:
        raise UnknownDeviceError(f"ASYNCGPU_BACKEND={name!r} is not a backend: use one of {', '.join(BACKEND_NAMES)}")
    return name


def backend_available(name: str) -> tuple[bool, str]:
    """Whether devices of backend ``name`` can be opened, and why not (probes once; never hangs)."""
    return load_backend(name).available()


def _parse(spec: Any, backend: str | None) -> tuple[str, int]:
    if isinstance(spec, bool):
        raise TypeError("a device is an index, a name like 'cuda:0' or 'host:1', or a Device")
    if isinstance(spec, int):
        return backend or default_backend(), spec
    if isinstance(spec, str):
        name, sep, index = spec.strip().lower().partition(":")
        if name in BACKEND_NAMES and (not sep or index.isdigit()):
            if backend is not None and backend != name:
                raise UnknownDeviceError(f"{spec!r} is not a {backend} device")
            return name, int(index) if sep else 0
        raise UnknownDeviceError(f"unknown device {spec!r}: use an index or a name like 'cuda:0' or 'host:1'")
    raise TypeError(f"a device is an index, a name like 'cuda:0' or 'host:1', or a Device, not {type(spec).__name__}")


def device(
    spec: Any = 0, *, backend: str | None = None, streams: int | None = None, max_events: int | None = None
) -> Device:
    """The worker of one device, opened on first use: ``device(0)``, ``device("cuda:1")``, ``device("host:0")``.

    ``streams`` (default 2) and ``max_events`` (per event pool), whole numbers >= 1, apply when the worker is
    opened; asking an open worker for other values raises `ValueError` (close it first).
    """
    if streams is not None:
        streams = whole("streams", streams, minimum=1, hint="a device needs at least one stream")
    if max_events is not None:
        max_events = whole("max_events", max_events, minimum=1, hint="the bound of each event pool")
    if isinstance(spec, Device):
        spec._internal.check_open()
        return spec
    name, index = _parse(spec, backend)
    with _lock:
        dev = _open.get((name, index))
        if dev is None:
            bd = load_backend(name).open_device(index)
            dev = Device._open(
                bd,
                streams=DEFAULT_STREAMS if streams is None else streams,
                max_events=DEFAULT_MAX_EVENTS if max_events is None else max_events,
                on_close=_forget,
            )
            _open[(name, index)] = dev
            if hooks.holds_everywhere():  # (the kernel history times it already: set up its held launches now)
                prepare_timing_soon(dev)
            return dev
    for key, want in (("streams", streams), ("max_events", max_events)):
        if want is not None and dev.options[key] != want:
            raise ValueError(
                f"{dev.name} is open with {key}={dev.options[key]}: close it (device.close()) before "
                f"opening it with {key}={want}"
            )
    return dev


def prepare_timing_soon(dev: Device) -> None:
    """Queue `DeviceInternal.prepare_timing` (the holds' page, the engine primers) on ``dev``'s worker thread if it
    lacks it, without waiting: its first held launch then finds it done (or waits for the set-up under way, which
    takes the same locks) instead of making it on the launching thread. Any thread; never blocks."""
    internal = dev._internal
    if internal.timing_unprepared():
        internal.worker.call_soon(internal.prepare_timing)


def opened() -> list[Device]:
    """The devices open now (opened by `device` or `devices` and not closed), in opening order. Any thread."""
    with _lock:
        return list(_open.values())


def devices(
    backend: str | None = None, *, count: int | None = None, streams: int | None = None, max_events: int | None = None
) -> list[Device]:
    """Every device of ``backend`` (default: `default_backend`), or the first ``count``.

    CUDA without a usable GPU raises `NoDeviceError` naming the fix. The host backend has as many devices as
    asked for (default 2, at most 64). ``count`` is a whole number >= 1 (more than exist: `UnknownDeviceError`).
    """
    if count is not None:
        count = whole("count", count, minimum=1)
    name = backend or default_backend()
    be = load_backend(name)
    if name == "cuda":
        ok, why = be.available()
        if not ok:
            raise NoDeviceError(
                f"no usable CUDA GPU: {why}. To run on host worker threads instead, pass "
                "backend='host' or set ASYNCGPU_BACKEND=host"
            )
        n = be.device_count() if count is None else count
    else:
        n = DEFAULT_HOST_DEVICES if count is None else count
    if not 0 < n <= be.device_count():
        raise UnknownDeviceError(f"asked for {n} {name} devices; this machine has {be.device_count()}")
    return [device(i, backend=name, streams=streams, max_events=max_events) for i in range(n)]


def resolve_devices(arg: Any) -> list[Device]:
    """``None`` (every default device), a `Device`, an index, a name, or an iterable of those."""
    if arg is None:
        return devices()
    if isinstance(arg, (Device, int, str)):
        return [device(arg)]
    if isinstance(arg, Iterable):
        out: list[Device] = []
        for item in arg:
            d = device(item)
            if d not in out:
                out.append(d)
        return out
    raise TypeError(f"expected devices (a Device, an index, a name, or a list of them), not {type(arg).__name__}")


def _forget(dev: Device) -> None:
    with _lock:
        if _open.get((dev.backend, dev.index)) is dev:
            del _open[(dev.backend, dev.index)]


def close_all() -> None:
    """Close every open worker (tests, the end of a program)."""
    with _lock:
        devs = list(_open.values())
    for d in devs:
        d.close()


def _after_fork_in_child() -> None:
    """``os.fork()``, in the child: the parent's workers have no thread here. Forget them and mark them closed
    (`DeviceInternal.mark_forked`), without taking their locks or the registry's (a parent thread may have held
    them)."""
    global _lock
    _lock = threading.RLock()
    parent = os.getppid()
    for dev in _open.values():
        dev._internal.mark_forked(parent)
    _open.clear()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)
