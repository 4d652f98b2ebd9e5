"""Kernels compiled at run time with NVRTC (once per process, source and architecture), and the engine primers
built from them (`CudaDevice.prime`)."""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from asyncgpu._backends.cuda.driver import LIBCUDA
from asyncgpu._backends.cuda.unheld import releasing_holds
from asyncgpu._backends.kernels import kernels_dir
from asyncgpu._base.errors import BackendError

if TYPE_CHECKING:
    from asyncgpu._backends.cuda.hotpath import CudaDeviceBase

_KERNEL_SOURCES = {
    "asyncgpu_spin": "workloads.cu",
    "asyncgpu_inc_loop": "workloads.cu",
    "asyncgpu_prime": "workloads.cu",
    "asyncgpu_clock_pingpong": "clock.cu",
    "asyncgpu_clock_bracket": "clock.cu",
    "asyncgpu_clock_peer_ping": "clock.cu",
    "asyncgpu_inc_loop_profiled": "profiled.cu",
    "asyncgpu_kp_bench": "profiled.cu",
    "asyncgpu_inc_loop_profiled_off": "profiled_off.cu",
    "asyncgpu_kp_bench_off": "profiled_off.cu",
}


def compile_source(source: str, arch: str, include_path: list[str] | None = None) -> Any:
    """Compile CUDA C++ with NVRTC to a cubin (cuda.core ObjectCode). Needs no GPU and no driver."""
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(arch=f"sm_{arch}", std="c++17", include_path=include_path or [str(kernels_dir())])
    try:
        program = Program(source, "c++", options)
    except RuntimeError as exc:
        if "nvrtc" in str(exc).lower():
            raise BackendError(_nvrtc_missing(exc)) from exc
        raise
    return program.compile("cubin")


_nvrtc_probe: tuple[bool, str] | None = None


def nvrtc_available() -> tuple[bool, str]:
    """Whether NVRTC (which compiles the CUDA sources at run time) loads here, and why not: it comes with the
    ``cu13`` / ``cu12`` extra. Loads the library only (no driver, no GPU needed); probed once. Any thread."""
    global _nvrtc_probe
    if _nvrtc_probe is None:
        try:
            from cuda.bindings import nvrtc

            _, major, minor = nvrtc.nvrtcVersion()
        except Exception as exc:  # noqa: BLE001 - cuda.pathfinder's DynamicLibNotFoundError and friends
            _nvrtc_probe = (False, _nvrtc_missing(exc))
        else:
            _nvrtc_probe = (True, f"NVRTC {major}.{minor}")
    return _nvrtc_probe


def _nvrtc_missing(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (
        f"NVRTC is missing ({first}): install asyncgpu[cu13] (CUDA 13 driver) or asyncgpu[cu12] (CUDA 12 driver), "
        "which bring it"
    )


_compile_lock = threading.Lock()
_compiled_by_arch: dict[tuple[str, str], Any] = {}


def _compiled(arch: str, source: str) -> Any:
    """A kernel source compiled for ``sm_<arch>``, compiled once per process, source and architecture."""
    with _compile_lock:
        code = _compiled_by_arch.get((arch, source))
        if code is None:
            text = (kernels_dir() / source).read_text()
            code = _compiled_by_arch[(arch, source)] = compile_source(text, arch)
        return code


class _Primer:
    """One device's engine primers (`CudaDevice.prime`): the empty one-thread kernel ``asyncgpu_prime`` for the
    compute engine, a 4-byte device-to-host copy for the copy engine, and a 4-byte copy between device buffers for
    copies between device buffers (profilers show each); all called through libcuda directly (a launch through
    cuda.core costs several times as much host time)."""

    def __init__(self, dev: CudaDeviceBase) -> None:
        d = dev._drv.d
        dev.make_current()
        kernel = dev._kernel("asyncgpu_prime")
        dev.prepare_kernel(kernel)
        func = kernel.handle
        if isinstance(func, d.CUkernel):
            err, func = d.cuKernelGetFunction(func)
            if err is not dev._drv.SUCCESS:
                raise dev._drv.error(err, "cuKernelGetFunction")
        dev.make_current()
        err, self._dptr = d.cuMemAlloc(64)
        if err is not dev._drv.SUCCESS:
            raise dev._drv.error(err, "cuMemAlloc")
        self._drv = dev._drv
        self._host = dev.alloc_pinned(16, np.uint32)
        lib = ctypes.CDLL(LIBCUDA)
        launch, copy, d2d = lib.cuLaunchKernel, lib.cuMemcpyDtoHAsync_v2, lib.cuMemcpyDtoDAsync_v2
        launch.restype = copy.restype = d2d.restype = ctypes.c_int
        launch.argtypes = (
            (ctypes.c_void_p,) + (ctypes.c_uint,) * 7 + (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        )
        copy.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
        d2d.argtypes = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
        func_c, host, src = ctypes.c_void_p(int(func)), self._host.ctypes.data, int(self._dptr)
        #: engine -> (enqueue on a raw CUstream handle, the driver call's name for errors)
        self.calls: dict[str, tuple[Callable[[Any], int], str]] = {
            "compute": (lambda stream: launch(func_c, 1, 1, 1, 1, 1, 1, 0, stream, None, None), "cuLaunchKernel"),
            "copy": (lambda stream: copy(host, src, 4, stream), "cuMemcpyDtoHAsync"),
            "copy_d2d": (lambda stream: d2d(src + 32, src, 4, stream), "cuMemcpyDtoDAsync"),
        }

    def close(self) -> None:
        with releasing_holds():  # (cuMemFree waits for the GPU)
            self._drv.d.cuMemFree(self._dptr)  # (the stream-ordered primers ahead of a close are done or dropped)


_PRIMER_LOCK = threading.Lock()
