"""`CudaBackend`: probes the driver once, opens devices, and refuses the driver in a child forked after the
parent initialized it."""

from __future__ import annotations

import os
import threading
import weakref

from asyncgpu._backends.contract import Backend
from asyncgpu._backends.cuda import unheld
from asyncgpu._backends.cuda.device import CudaDevice
from asyncgpu._backends.cuda.driver import _Driver
from asyncgpu._base.errors import NoDeviceError, UnknownDeviceError

__all__ = ["CudaBackend", "backend_class"]


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self) -> None:
        self._probe: tuple[bool, str] | None = None
        self._drv: _Driver | None = None
        self._count = 0
        self._lock = threading.Lock()
        _BACKENDS.add(self)

    def forked(self, parent_pid: int) -> None:
        """In a child process right after ``os.fork()``: a driver the parent initialized cannot be used here, so
        from now on the backend says so (naming the fix) and never calls it. A parent that never initialized
        CUDA leaves the child free to."""
        self._lock = threading.Lock()  # (a parent thread may have held it at the fork)
        if self._drv is not None:
            self._drv, self._count = None, 0
            self._probe = (
                False,
                f"CUDA was initialized in the parent process (pid {parent_pid}) before os.fork(), and a forked "
                "child cannot use it: start worker processes with the 'spawn' method "
                "(multiprocessing.get_context('spawn'), torch.multiprocessing.spawn)",
            )

    def available(self) -> tuple[bool, str]:
        with self._lock:
            if self._probe is None:
                self._probe = self._do_probe()
            return self._probe

    def _do_probe(self) -> tuple[bool, str]:
        try:
            drv = _Driver()
            err = drv.d.cuInit(0)[0]
        except Exception as exc:  # cuda.pathfinder.DynamicLibNotFoundError and friends: no driver library
            return False, f"no CUDA driver: {type(exc).__name__}"
        if err is not drv.SUCCESS:
            return False, f"cuInit failed: {err}"
        err, count = drv.d.cuDeviceGetCount()
        if err is not drv.SUCCESS or count == 0:
            return False, "the CUDA driver sees no GPU"
        drv.load_ctypes()
        self._drv, self._count = drv, count
        return True, f"{count} CUDA device(s)"

    def device_count(self) -> int:
        return self._count if self.available()[0] else 0

    def open_device(self, index: int) -> CudaDevice:
        ok, why = self.available()
        if not ok:
            raise NoDeviceError(
                f"CUDA is not usable here: {why}. Use the host backend: asyncgpu.devices('host') "
                "or ASYNCGPU_BACKEND=host"
            )
        if not 0 <= index < self._count:
            raise UnknownDeviceError(f"no device cuda:{index}: this machine has cuda:0..cuda:{self._count - 1}")
        assert self._drv is not None
        return CudaDevice(self._drv, index)

    def end_open_holds(self) -> list[str]:
        found = unheld.open_holds()
        if found:
            unheld.release_all()
        return [f"cuda:{i}: hold word {w} at {v}, its latest hold {latest}" for i, w, v, latest in found]


backend_class = CudaBackend
_BACKENDS: weakref.WeakSet[CudaBackend] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    parent = os.getppid()
    for backend in list(_BACKENDS):
        backend.forked(parent)


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)
