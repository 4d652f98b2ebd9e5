"""The CUDA device's hot paths (record, query, elapsed time, launches) and the rest of its plain driver work:
streams, events, memory, workloads, kernels. `CudaDevice` adds holds, clock calibration, graphs and primers.

Threads: every method may be called from any thread. Methods that create resources (streams, events, buffers,
modules) make the device current in the calling thread first, as cuda.core requires. The hot methods
(`record`, `query`, `elapsed_ms`) call libcuda's ``cuEventRecord``/``cuEventQuery``/``cuEventElapsedTime`` through
ctypes function pointers with pre-extracted integer handles (`asyncgpu._backends.cuda.driver`).
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncgpu._backends.contract import BackendDevice, pinned_array
from asyncgpu._backends.cuda.compiler import _KERNEL_SOURCES, _compiled
from asyncgpu._backends.cuda.driver import CUDA_ERROR_NOT_READY, _ctypes_hot_paths, _Driver
from asyncgpu._backends.cuda.unheld import UnheldFree, releasing_holds
from asyncgpu._base.errors import BackendError, DeviceMismatchError, NotReadyError

if TYPE_CHECKING:
    from asyncgpu._backends.cuda.calibration import _Calibration
    from asyncgpu._backends.cuda.compiler import _Primer

INC_BLOCK = 256  #: threads per block of the ``inc_loop`` kernels


class MappedPage:
    """Pinned, portable, device-mapped host memory (``cuMemHostAlloc``), freed by `free`."""

    def __init__(self, drv: _Driver, nbytes: int) -> None:
        d = drv.d
        flags = d.CU_MEMHOSTALLOC_PORTABLE | d.CU_MEMHOSTALLOC_DEVICEMAP
        err, ptr = d.cuMemHostAlloc(nbytes, flags)
        if err is not drv.SUCCESS:
            raise drv.error(err, "cuMemHostAlloc")
        self._drv, self.ptr, self.nbytes = drv, int(ptr), nbytes
        self.view = (ctypes.c_char * nbytes).from_address(self.ptr)
        self.view[:] = bytes(nbytes)  # type: ignore[call-overload]  # ctypes takes bytes here; its stubs do not
        self.words = (ctypes.c_uint32 * (nbytes // 4)).from_address(self.ptr)  #: uint32 words, read and written

    def free(self) -> None:
        if self.ptr:
            with releasing_holds():  # (cuMemFreeHost waits for the GPUs)
                self._drv.d.cuMemFreeHost(self.ptr)
            self.ptr = 0


class CudaDeviceBase(BackendDevice):
    """One GPU's plain driver work; `CudaDevice` is the class the core sees."""

    def __init__(self, drv: _Driver, index: int) -> None:
        from cuda.core import Device

        self._drv = drv
        self._dev = Device(index)
        self._dev.set_current()
        self.index = index
        self.name = f"cuda:{index}"
        self.arch = self._dev.arch
        self.description = f"{self._dev.name} (sm_{self.arch})"
        l2 = int(getattr(self._dev.properties, "l2_cache_size", 0) or 0)
        self.cache_bytes = self.spill_bytes = l2 if l2 > 0 else None  # (`spill_bytes`: set by the calibration)
        self._kernels: dict[str, Any] = {}
        self._loaded: dict[int, Any] = {}  # id(kernel) -> kernel, for the kernels loaded into this context
        self._kernel_lock = threading.Lock()
        self._pinned_mr: Any = None  # a cuda.core LegacyPinnedMemoryResource, made on first use
        self._peer_sources: set[int] = set()  # GPUs whose memory pools let this one read them (`copy`)
        self._marker: Any = None  # an idle stream for `mark`
        self._cal: _Calibration | None = None  # the clock calibration's page and stream, made on first use
        self._primer: _Primer | None = None  # the engine primers' kernel and buffers (`prime`), made on first use
        if drv.record_c is not None:  # (per instance, on purpose)
            self.record, self.query, elapsed, since = _ctypes_hot_paths(drv)  # type: ignore[method-assign]
            if elapsed is not None:
                self.elapsed_ms, self.elapsed_since_ms = elapsed, since  # type: ignore[method-assign]

    # -- streams and events ------------------------------------------------------------------------------
    def make_current(self) -> None:
        self._dev.set_current()

    def create_stream(self) -> Any:
        from cuda.core import StreamOptions

        self.make_current()
        s = self._dev.create_stream(options=StreamOptions(nonblocking=True))
        return (s, s.handle, int(s.handle), ctypes.c_void_p(int(s.handle)))

    def adopt_stream(self, obj: Any) -> Any:
        self.make_current()
        if not hasattr(obj, "__cuda_stream__"):
            raise TypeError(f"cannot adopt {type(obj).__name__}: a CUDA stream must implement __cuda_stream__")
        s = self._dev.create_stream(obj)
        if s.device.device_id != self.index:
            raise DeviceMismatchError(
                f"that stream belongs to cuda:{s.device.device_id}, not {self.name}: adopt it "
                f"with asyncgpu.device({s.device.device_id})"
            )
        return (s, s.handle, int(s.handle), ctypes.c_void_p(int(s.handle)))

    def stream_handle(self, raw_stream: Any) -> int:
        return raw_stream[2]

    def close_stream(self, raw_stream: Any) -> None:
        raw_stream[0].close()

    def stream_idle(self, raw_stream: Any) -> bool:
        drv = self._drv
        if drv.stream_query_c is not None:
            err = drv.stream_query_c(raw_stream[3])
        else:
            err = int(drv.d.cuStreamQuery(raw_stream[1])[0])
        if err == CUDA_ERROR_NOT_READY:
            return False
        if err:
            raise drv.error(drv.d.CUresult(err), "cuStreamQuery")
        return True

    def create_event(self, timing: bool) -> Any:
        from cuda.core import EventOptions

        self.make_current()
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
        self.make_current()
        err = self._drv.d.cuCtxSynchronize()[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuCtxSynchronize")

    def memory_info(self) -> tuple[int, int] | None:
        """``cuMemGetInfo`` of this device's context."""
        self.make_current()  # cuMemGetInfo answers for the current context
        err, free, total = self._drv.d.cuMemGetInfo()
        if err is not self._drv.SUCCESS:
            return None
        return int(free), int(total)

    def workload_shape(self, workload: str, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
        if workload == "spin":
            return (1, 1, 1), (1, 1, 1)
        if workload == "inc_loop":
            return (max(1, (n + INC_BLOCK - 1) // INC_BLOCK), 1, 1), (INC_BLOCK, 1, 1)
        return None

    def profiler_start(self) -> None:
        self.make_current()
        err = self._drv.d.cuProfilerStart()[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuProfilerStart")

    def profiler_stop(self) -> None:
        self.make_current()
        err = self._drv.d.cuProfilerStop()[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuProfilerStop")

    def alloc_mapped(self, nbytes: int) -> MappedPage:
        """Pinned host memory mapped into every device (portable): flags that GPUs and host share."""
        self.make_current()
        return MappedPage(self._drv, nbytes)

    def device_pointer(self, page: MappedPage, offset: int = 0) -> int:
        """The address of ``page[offset]`` as this device sees it."""
        self.make_current()
        err, dptr = self._drv.d.cuMemHostGetDevicePointer(page.ptr, 0)
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuMemHostGetDevicePointer")
        return int(dptr) + offset

    # -- memory and workloads ---------------------------------------------------------------------------
    def alloc(self, n: int, dtype: Any, raw_stream: Any) -> Any:
        self.make_current()
        return self._dev.allocate(max(1, n * np.dtype(dtype).itemsize), stream=raw_stream[0])

    def alloc_pinned(self, n: int, dtype: Any) -> Any:
        from cuda.core import LegacyPinnedMemoryResource

        self.make_current()
        if self._pinned_mr is None:
            self._pinned_mr = LegacyPinnedMemoryResource()
        nbytes = max(1, n * np.dtype(dtype).itemsize)
        buf = self._pinned_mr.allocate(nbytes)
        hand = self.free_elsewhere if nbytes >= (self.slow_pinned_bytes or 0) else None  # (unpinning is slow too)
        return pinned_array(UnheldFree(buf), int(buf.handle), nbytes, n, dtype, hand)  # (its free waits for the GPUs)

    def _kernel(self, name: str) -> Any:
        with self._kernel_lock:
            kernel = self._kernels.get(name)
            if kernel is None:
                source = _KERNEL_SOURCES[name]
                code = _compiled(self.arch, source)
                self.make_current()
                for k, src in _KERNEL_SOURCES.items():
                    if src == source:
                        self._kernels[k] = code.get_kernel(k)
                kernel = self._kernels[name]
            return kernel

    def launch(self, raw_stream: Any, kernel: Any, config: Any, args: tuple) -> None:
        from cuda.core import launch

        self.make_current()
        launch(raw_stream[0], config, kernel, *args)

    def prepare_kernel(self, kernel: Any) -> None:
        """``cuFuncLoad`` the kernel's function in this device's context (CUDA 12.4+ drivers; older ones load it
        at the first launch). Once per kernel object."""
        if id(kernel) in self._loaded:
            return
        d = self._drv.d
        handle = getattr(kernel, "handle", None)
        if handle is not None and hasattr(d, "cuFuncLoad"):
            self.make_current()
            func = handle
            if isinstance(handle, d.CUkernel):  # a library kernel: its function in the current context
                err, func = d.cuKernelGetFunction(handle)
                if err is not self._drv.SUCCESS:
                    raise self._drv.error(err, "cuKernelGetFunction")
            (err,) = d.cuFuncLoad(func)
            if err is not self._drv.SUCCESS and err != d.CUresult.CUDA_ERROR_NOT_SUPPORTED:
                raise self._drv.error(err, "cuFuncLoad")
        self._loaded[id(kernel)] = kernel

    def spin(self, raw_stream: Any, duration_ns: int) -> None:
        from cuda.core import LaunchConfig

        self.launch(raw_stream, self._kernel("asyncgpu_spin"), LaunchConfig(grid=1, block=1), (np.uint64(duration_ns),))

    def inc_loop(self, raw_stream: Any, array: Any, n: int, iterations: int) -> None:
        from cuda.core import LaunchConfig

        config = LaunchConfig(grid=max(1, (n + INC_BLOCK - 1) // INC_BLOCK), block=INC_BLOCK)
        args = (int(array.handle), np.uint64(n), np.int32(iterations))
        self.launch(raw_stream, self._kernel("asyncgpu_inc_loop"), config, args)

    def memset(self, raw_stream: Any, array: Any, nbytes: int, byte: int) -> None:
        self.make_current()
        err = self._drv.d.cuMemsetD8Async(int(array.handle), byte, nbytes, raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuMemsetD8Async")

    def copy_to_host(self, raw_stream: Any, array: Any, host: Any, nbytes: int) -> None:
        self.make_current()
        err = self._drv.d.cuMemcpyDtoHAsync(host.ctypes.data, int(array.handle), nbytes, raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuMemcpyDtoHAsync")

    def copy(self, raw_stream: Any, dst: Any, src: Any, nbytes: int) -> None:
        # Unified addressing: the driver routes a copy between two GPUs over NVLink/PCIe (peer to peer).
        self.make_current()  # the stream's context must be current (the calling thread may work on another GPU)
        src_index = int(src.device_id)
        if src_index != self.index and src_index not in self._peer_sources:
            self._grant_peer_access(src_index)
        err = self._drv.d.cuMemcpyAsync(int(dst.handle), int(src.handle), nbytes, raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuMemcpyAsync")

    def _grant_peer_access(self, src_index: int) -> None:
        """Let this device read allocations of GPU ``src_index``'s memory pool (pool memory is accessible only
        from its own device until granted; cudaDeviceEnablePeerAccess does not cover pools)."""
        from cuda.core import Device

        src = Device(src_index)
        if not self._dev.can_access_peer(src_index):
            raise BackendError(
                f"{self.name} cannot read cuda:{src_index}'s memory directly (no peer access between "
                "them): copy through pinned host memory (copy_to_host, then a host-to-device copy)"
            )
        src.memory_resource.peer_accessible_by.add(self.index)
        self._peer_sources.add(src_index)

    def to_numpy(self, array: Any, n: int, dtype: Any) -> Any:
        out = np.empty(n, dtype=dtype)
        self.make_current()
        err = self._drv.d.cuMemcpyDtoH(out.ctypes.data, int(array.handle), out.nbytes)[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuMemcpyDtoH")
        return out
