"""The CUDA backend: the only module that imports cuda.core / cuda.bindings.

Threads: every method may be called from any thread. Methods that create resources (streams, events, buffers,
modules) make the device current in the calling thread first, as cuda.core requires. The hot methods
(`record`, `query`) call libcuda's ``cuEventRecord``/``cuEventQuery`` through ctypes function pointers with
pre-extracted integer handles. ``cuEventQuery`` never blocks, so it keeps the GIL: releasing and re-taking the
GIL per query convoys the waiter thread behind a busy event loop (measured: 10,000 waits in flight woke
~250 ms late). ``cuEventRecord`` may block on a full push buffer, so it releases the GIL.
``ASYNCGPU_HOTPATH=bindings`` uses cuda.bindings for both instead.

Without a driver, `CudaBackend.available` probes ``cuInit`` once and nothing else is ever called.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ._backend import Backend, BackendDevice
from ._errors import BackendError, DeviceMismatchError, NoDeviceError, NotReadyError, UnknownDeviceError

__all__ = ["CudaBackend", "CudaDevice", "backend_class"]

_KERNEL_SOURCE = "workloads.cu"
_INC_BLOCK = 256


def kernels_dir() -> Path:
    """Where the CUDA sources live: ``asyncgpu/_kernels`` in a wheel, ``<repo>/kernels`` in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_kernels", here.parent / "kernels"):
        if (candidate / _KERNEL_SOURCE).is_file():
            return candidate
    raise FileNotFoundError(f"asyncgpu's CUDA sources ({_KERNEL_SOURCE}) are missing: reinstall asyncgpu")


def compile_source(source: str, arch: str, include_path: list[str] | None = None) -> Any:
    """Compile CUDA C++ with NVRTC to a cubin (cuda.core ObjectCode). Needs no GPU and no driver."""
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(arch=f"sm_{arch}", std="c++17", include_path=include_path or [str(kernels_dir())])
    try:
        program = Program(source, "c++", options)
    except RuntimeError as exc:
        if "nvrtc" in str(exc).lower():
            raise BackendError(f"NVRTC is missing ({exc}): install asyncgpu[cu13] (CUDA 13 driver) or "
                               "asyncgpu[cu12] (CUDA 12 driver)") from exc
        raise
    return program.compile("cubin")


class _Driver:
    """The raw driver binding and the result codes the hot paths compare against (by identity)."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.d = driver
        self.SUCCESS = driver.CUresult.CUDA_SUCCESS
        self.NOT_READY = driver.CUresult.CUDA_ERROR_NOT_READY
        self.record_c = self.query_c = None  # ctypes entry points, set by `load_ctypes`

    def load_ctypes(self) -> None:
        """Resolve libcuda's cuEventRecord/cuEventQuery for the hot paths (after cuInit succeeded)."""
        if os.environ.get("ASYNCGPU_HOTPATH", "ctypes") != "ctypes":
            return
        name = "libcuda.so.1" if os.name != "nt" else "nvcuda.dll"
        try:
            record, query = ctypes.CDLL(name).cuEventRecord, ctypes.PyDLL(name).cuEventQuery
        except (OSError, AttributeError):
            return
        record.restype = query.restype = ctypes.c_int  # arguments: ctypes.c_void_p made once per handle
        self.record_c, self.query_c = record, query

    def error(self, err: Any, call: str) -> BackendError:
        _, name = self.d.cuGetErrorName(err)
        _, text = self.d.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(err)
        text = text.decode() if isinstance(text, bytes) else ""
        return BackendError(
            f"{call} failed: {name} ({text}). If this is a sticky error (illegal address, launch failure), the "
            "device's context is unusable: fix the kernel at fault and restart the process."
        )


def _ctypes_hot_paths(drv: _Driver) -> tuple:
    """``record`` and ``query`` as plain closures over libcuda's entry points (integer handles)."""
    record_c, query_c, result = drv.record_c, drv.query_c, drv.d.CUresult

    def record(raw_event: Any, raw_stream: Any) -> None:
        err = record_c(raw_event[3], raw_stream[3])
        if err:
            raise drv.error(result(err), "cuEventRecord")

    def query(raw_event: Any) -> bool:
        err = query_c(raw_event[3])
        if not err:
            return True
        if err == 600:  # CUDA_ERROR_NOT_READY
            return False
        raise drv.error(result(err), "cuEventQuery")

    return record, query


class CudaDevice(BackendDevice):
    backend = "cuda"

    def __init__(self, drv: _Driver, index: int) -> None:
        from cuda.core import Device

        self._drv = drv
        self._dev = Device(index)
        self._dev.set_current()
        self.index = index
        self.name = f"cuda:{index}"
        self.arch = self._dev.arch
        self.description = f"{self._dev.name} (sm_{self.arch})"
        self._kernels: dict[str, Any] = {}
        self._kernel_lock = threading.Lock()
        self._pinned_mr = None
        self._marker: Any = None  # an idle stream for `mark`
        if drv.record_c is not None:
            self.record, self.query = _ctypes_hot_paths(drv)

    # -- streams and events ------------------------------------------------------------------------------
    def _current(self) -> None:
        self._dev.set_current()

    def create_stream(self) -> Any:
        from cuda.core import StreamOptions

        self._current()
        s = self._dev.create_stream(options=StreamOptions(nonblocking=True))
        return (s, s.handle, int(s.handle), ctypes.c_void_p(int(s.handle)))

    def adopt_stream(self, obj: Any) -> Any:
        self._current()
        if not hasattr(obj, "__cuda_stream__"):
            raise TypeError(f"cannot adopt {type(obj).__name__}: a CUDA stream must implement __cuda_stream__")
        s = self._dev.create_stream(obj)
        if s.device.device_id != self.index:
            raise DeviceMismatchError(f"that stream belongs to cuda:{s.device.device_id}, not {self.name}: adopt it "
                                      f"with asyncgpu.device({s.device.device_id})")
        return (s, s.handle, int(s.handle), ctypes.c_void_p(int(s.handle)))

    def stream_handle(self, raw_stream: Any) -> int:
        return raw_stream[2]

    def close_stream(self, raw_stream: Any) -> None:
        raw_stream[0].close()

    def close(self) -> None:
        if self._marker is not None:
            self.close_stream(self._marker)
            self._marker = None

    def create_event(self, timing: bool) -> Any:
        from cuda.core import EventOptions

        self._current()
        e = self._dev.create_event(EventOptions(timing_enabled=timing, blocking_sync=False))
        return (e, e.handle, int(e.handle), ctypes.c_void_p(int(e.handle)))

    def destroy_event(self, raw_event: Any) -> None:
        raw_event[0].close()

    # Hot paths through cuda.bindings; replaced per instance by `_ctypes_hot_paths` when libcuda loads.
    def record(self, raw_event: Any, raw_stream: Any) -> None:
        err = self._drv.d.cuEventRecord(raw_event[1], raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuEventRecord")

    def mark(self, raw_event: Any) -> int:
        marker = self._marker
        if marker is None:
            with self._kernel_lock:
                if self._marker is None:
                    self._marker = self.create_stream()
            marker = self._marker
        self.record(raw_event, marker)
        return marker[2]

    def query(self, raw_event: Any) -> bool:
        err = self._drv.d.cuEventQuery(raw_event[1])[0]
        if err is self._drv.SUCCESS:
            return True
        if err is self._drv.NOT_READY:
            return False
        raise self._drv.error(err, "cuEventQuery")

    def sync_event(self, raw_event: Any) -> None:
        err = self._drv.d.cuEventSynchronize(raw_event[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuEventSynchronize")

    def elapsed_ms(self, start: Any, end: Any) -> float:
        err, ms = self._drv.d.cuEventElapsedTime(start[1], end[1])
        if err is self._drv.NOT_READY:
            raise NotReadyError("the device has not reached that event yet: await event.wait() first")
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuEventElapsedTime")
        return float(ms)

    def wait_event(self, raw_stream: Any, raw_event: Any) -> None:
        err = self._drv.d.cuStreamWaitEvent(raw_stream[1], raw_event[1], 0)[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuStreamWaitEvent")

    def sync_stream(self, raw_stream: Any) -> None:
        err = self._drv.d.cuStreamSynchronize(raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuStreamSynchronize")

    def sync_device(self) -> None:
        self._current()
        err = self._drv.d.cuCtxSynchronize()[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuCtxSynchronize")

    # -- memory and workloads ---------------------------------------------------------------------------
    def alloc(self, n: int, dtype: Any, raw_stream: Any) -> Any:
        self._current()
        return self._dev.allocate(max(1, n * np.dtype(dtype).itemsize), stream=raw_stream[0])

    def alloc_pinned(self, n: int, dtype: Any) -> Any:
        from cuda.core import LegacyPinnedMemoryResource

        self._current()
        if self._pinned_mr is None:
            self._pinned_mr = LegacyPinnedMemoryResource()
        nbytes = max(1, n * np.dtype(dtype).itemsize)
        buf = self._pinned_mr.allocate(nbytes)
        cbuf = (ctypes.c_char * nbytes).from_address(int(buf.handle))
        cbuf._asyncgpu_owner = buf  # the numpy view keeps the pinned allocation alive
        return np.frombuffer(cbuf, dtype=dtype, count=n)

    def _kernel(self, name: str) -> Any:
        with self._kernel_lock:
            kernel = self._kernels.get(name)
            if kernel is None:
                code = _compiled(self.arch)
                self._current()
                for k in ("asyncgpu_spin", "asyncgpu_inc_loop"):
                    self._kernels[k] = code.get_kernel(k)
                kernel = self._kernels[name]
            return kernel

    def launch(self, raw_stream: Any, kernel: Any, config: Any, args: tuple) -> None:
        from cuda.core import launch

        self._current()
        launch(raw_stream[0], config, kernel, *args)

    def spin(self, raw_stream: Any, duration_ns: int) -> None:
        from cuda.core import LaunchConfig

        self.launch(raw_stream, self._kernel("asyncgpu_spin"), LaunchConfig(grid=1, block=1), (np.uint64(duration_ns),))

    def inc_loop(self, raw_stream: Any, array: Any, n: int, iterations: int) -> None:
        from cuda.core import LaunchConfig

        config = LaunchConfig(grid=max(1, (n + _INC_BLOCK - 1) // _INC_BLOCK), block=_INC_BLOCK)
        args = (int(array.handle), np.uint64(n), np.int32(iterations))
        self.launch(raw_stream, self._kernel("asyncgpu_inc_loop"), config, args)

    def memset(self, raw_stream: Any, array: Any, nbytes: int, byte: int) -> None:
        err = self._drv.d.cuMemsetD8Async(int(array.handle), byte, nbytes, raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuMemsetD8Async")

    def copy_to_host(self, raw_stream: Any, array: Any, host: Any, nbytes: int) -> None:
        err = self._drv.d.cuMemcpyDtoHAsync(host.ctypes.data, int(array.handle), nbytes, raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuMemcpyDtoHAsync")

    def to_numpy(self, array: Any, n: int, dtype: Any) -> Any:
        out = np.empty(n, dtype=dtype)
        self._current()
        err = self._drv.d.cuMemcpyDtoH(out.ctypes.data, int(array.handle), out.nbytes)[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuMemcpyDtoH")
        return out


_compile_lock = threading.Lock()
_compiled_by_arch: dict[str, Any] = {}


def _compiled(arch: str) -> Any:
    """The workloads module compiled for ``sm_<arch>``, compiled once per process and architecture."""
    with _compile_lock:
        code = _compiled_by_arch.get(arch)
        if code is None:
            source = (kernels_dir() / _KERNEL_SOURCE).read_text()
            code = _compiled_by_arch[arch] = compile_source(source, arch)
        return code


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self) -> None:
        self._probe: tuple[bool, str] | None = None
        self._drv: _Driver | None = None
        self._count = 0
        self._lock = threading.Lock()

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
            raise NoDeviceError(f"CUDA is not usable here: {why}. Use the host backend: asyncgpu.devices('host') "
                                "or ASYNCGPU_BACKEND=host")
        if not 0 <= index < self._count:
            raise UnknownDeviceError(f"no device cuda:{index}: this machine has cuda:0..cuda:{self._count - 1}")
        assert self._drv is not None
        return CudaDevice(self._drv, index)


backend_class = CudaBackend
