"""The CUDA backend: the only package that imports cuda.core / cuda.bindings.

Its parts, by job: `driver` (the raw binding and libcuda's ctypes entry points for the hot paths), `hotpath`
(streams, events, record / query / elapsed time, launches, memory, workloads), `holds` (a stream held on a pinned
host word), `calibration` (host-device ping-pongs, the event pair's overhead), `graphs` (capture and replays),
`compiler` (NVRTC and the engine primers), `device` (`CudaDevice`, the parts put together) and `backend`
(`CudaBackend`).

Without a driver, `CudaBackend.available` probes ``cuInit`` once and nothing else is ever called. In a child
process forked after the parent initialized CUDA, the backend says it is unusable (naming the 'spawn' start
method) and never calls the driver.
"""

from __future__ import annotations

from asyncgpu._backends.cuda.backend import CudaBackend, backend_class
from asyncgpu._backends.cuda.calibration import host_pingpong
from asyncgpu._backends.cuda.compiler import compile_source, nvrtc_available
from asyncgpu._backends.cuda.device import CudaDevice
from asyncgpu._backends.cuda.hotpath import MappedPage
from asyncgpu._backends.kernels import kernels_dir

__all__ = [
    "CudaBackend",
    "CudaDevice",
    "MappedPage",
    "backend_class",
    "compile_source",
    "host_pingpong",
    "kernels_dir",
    "nvrtc_available",
]
