"""The raw driver binding (cuda.bindings) and libcuda's entry points through ctypes, for the hot paths.

``cuEventQuery`` and ``cuEventElapsedTime`` never block, so their ctypes entry points keep the GIL: releasing and
re-taking the GIL per call convoys the calling thread (the waiter, a step timer's harvest placing a hundred events)
behind a busy event loop, and each time it gets the GIL back it takes it from the loop's threads. ``cuEventRecord``
may block on a full push buffer, so it releases the GIL. ``ASYNCGPU_HOTPATH=bindings`` uses cuda.bindings for all
three instead.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Sequence

import numpy as np

from asyncgpu._base.errors import BackendError, NotReadyError

#: ``CUresult.CUDA_ERROR_NOT_READY`` as the plain int that libcuda's entry points return (ctypes): the event or
#: stream has work still pending
CUDA_ERROR_NOT_READY = 600
MASK32 = 0xFFFFFFFF
PAGE = 4096  #: the pinned pages of the holds and the clock calibration
LIBCUDA = "libcuda.so.1" if os.name != "nt" else "nvcuda.dll"


class _Driver:
    """The raw driver binding and the result codes the hot paths compare against (by identity)."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.d = driver
        self.SUCCESS = driver.CUresult.CUDA_SUCCESS
        self.NOT_READY = driver.CUresult.CUDA_ERROR_NOT_READY
        # ctypes entry points, set by `load_ctypes`
        self.record_c: Callable[..., int] | None = None
        self.query_c: Callable[..., int] | None = None
        self.elapsed_c: Callable[..., int] | None = None
        self.wait_value_c: Callable[..., int] | None = None
        self.stream_query_c: Callable[..., int] | None = None

    def load_ctypes(self) -> None:
        """Resolve libcuda's cuEventRecord/cuEventQuery/cuEventElapsedTime for the hot paths (after cuInit
        succeeded)."""
        if os.environ.get("ASYNCGPU_HOTPATH", "ctypes") != "ctypes":
            return
        name = LIBCUDA
        try:
            record, query = ctypes.CDLL(name).cuEventRecord, ctypes.PyDLL(name).cuEventQuery
        except (OSError, AttributeError):
            return
        record.restype = query.restype = ctypes.c_int  # arguments: ctypes.c_void_p made once per handle
        self.record_c, self.query_c = record, query
        keep_gil = ctypes.PyDLL(name)  # (its calls keep the GIL: for calls that never block)
        # the same timing either way; _v2 (CUDA 12.8+) reports no errors left by earlier asynchronous work
        elapsed = getattr(keep_gil, "cuEventElapsedTime_v2", None) or getattr(keep_gil, "cuEventElapsedTime", None)
        if elapsed is not None:  # (milliseconds out, start event, end event)
            # no argtypes: its callers pass a ``byref`` float and the events' ``c_void_p`` as they are, where
            # argtypes would convert all three per call (~0.3 µs of a ~1 µs call)
            elapsed.restype = ctypes.c_int
            self.elapsed_c = elapsed
        lib = ctypes.CDLL(name)
        stream_query = lib.cuStreamQuery
        stream_query.restype = ctypes.c_int
        self.stream_query_c = stream_query
        wait = getattr(lib, "cuStreamWaitValue32_v2", None) or getattr(lib, "cuStreamWaitValue32", None)
        if wait is not None:  # (stream, device address, value, flags)
            wait.restype = ctypes.c_int
            wait.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
            self.wait_value_c = wait

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
    """``record``, ``query``, ``elapsed_ms`` and ``elapsed_since_ms`` (the last two None where libcuda lacks
    cuEventElapsedTime) as plain closures over libcuda's entry points (integer handles)."""
    record_c, query_c, elapsed_c, result = drv.record_c, drv.query_c, drv.elapsed_c, drv.d.CUresult
    not_ready = CUDA_ERROR_NOT_READY  # (a local: no global lookup per query)
    assert record_c is not None and query_c is not None  # only called once `load_ctypes` set them

    def record(raw_event: Any, raw_stream: Any) -> None:
        err = record_c(raw_event[3], raw_stream[3])
        if err:
            raise drv.error(result(err), "cuEventRecord")

    def query(raw_event: Any) -> bool:
        err = query_c(raw_event[3])
        if not err:
            return True
        if err == not_ready:
            return False
        raise drv.error(result(err), "cuEventQuery")

    def elapsed_failed(err: int) -> Exception:
        if err == not_ready:
            return NotReadyError("the device has not reached that event yet: await event.wait() first")
        return drv.error(result(err), "cuEventElapsedTime")

    def elapsed_ms(start: Any, end: Any) -> float:
        ms = c_float()
        assert elapsed_c is not None
        err = elapsed_c(byref(ms), start[3], end[3])
        if err:
            raise elapsed_failed(err)
        return ms.value

    def elapsed_since_ms(start: Any, ends: Sequence[Any]) -> np.ndarray:
        # one output float for the batch, its pointer made once: the per-call Python is the call itself
        ms, out = c_float(), np.empty(len(ends), np.float64)
        ptr, handle = byref(ms), start[3]
        assert elapsed_c is not None
        for i, end in enumerate(ends):
            err = elapsed_c(ptr, handle, end[3])
            if err:
                raise elapsed_failed(err)
            out[i] = ms.value
        return out

    c_float, byref = ctypes.c_float, ctypes.byref
    if elapsed_c is None:
        return record, query, None, None
    return record, query, elapsed_ms, elapsed_since_ms
