"""Backends: the contract (`contract`), the CUDA backend (`cuda`), the host backend (`host`), and the kernel
sources with their in-kernel record format (`kernels`), which needs no CUDA.

Backends are loaded lazily, by name: ``import asyncgpu`` never imports the CUDA backend module; the first device
of a backend imports it (`load_backend`). This is the bottom layer with `asyncgpu._base.errors` and
`asyncgpu._base.records`: nothing here imports the core or a feature.
"""

from __future__ import annotations

import importlib
import threading

from asyncgpu._backends.contract import Backend, BackendDevice

__all__ = ["BACKEND_NAMES", "Backend", "BackendDevice", "end_open_holds", "load_backend"]

BACKEND_NAMES = ("cuda", "host")

_loaded: dict[str, Backend] = {}
_lock = threading.Lock()


def load_backend(name: str) -> Backend:
    """Import ``asyncgpu._backends.<name>`` on first use and return its single `Backend` instance."""
    if name not in BACKEND_NAMES:
        from asyncgpu._base.errors import UnknownDeviceError

        raise UnknownDeviceError(f"unknown backend {name!r}: use one of {', '.join(BACKEND_NAMES)}")
    with _lock:
        backend = _loaded.get(name)
        if backend is None:
            module = importlib.import_module(f"asyncgpu._backends.{name}")
            backend = _loaded[name] = module.backend_class()
        return backend


def end_open_holds() -> list[str]:
    """`Backend.end_open_holds` of every backend loaded so far (what a test leaked: `asyncgpu._testing`)."""
    with _lock:
        loaded = list(_loaded.values())
    return [line for backend in loaded for line in backend.end_open_holds()]
