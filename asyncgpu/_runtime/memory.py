"""`DeviceArray`: a 1-D block of device memory (GPU memory on CUDA, host memory on the host backend).

On CUDA it exposes ``__cuda_array_interface__`` (version 3), so CuPy, PyTorch and Numba can view it without a
copy; on the host backend it exposes ``__array__``. Its memory is freed when the array is garbage collected
or `free` is called (stream-ordered on CUDA: after the work already enqueued on the allocating stream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import numpy as np

from asyncgpu._base.errors import ReleasedError

if TYPE_CHECKING:
    from asyncgpu._runtime.device import Device

__all__ = ["DeviceArray"]


@final
class DeviceArray:
    """``size`` elements of ``dtype`` on ``device``. Make one with `Device.alloc`."""

    __slots__ = ("device", "size", "dtype", "_buf", "__weakref__")
    device: Device
    size: int
    dtype: np.dtype
    _buf: Any

    def __init__(self) -> None:
        raise TypeError("device arrays come from device.alloc(n, dtype)")

    @classmethod
    def _create(cls, device: Device, buf: Any, size: int, dtype: np.dtype) -> DeviceArray:
        self = object.__new__(cls)
        self.device, self._buf, self.size, self.dtype = device, buf, size, dtype
        return self

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def ptr(self) -> int:
        """The device address (CUDA) or the host address (host backend)."""
        buf = self.live()
        return int(buf.handle) if self.device.backend == "cuda" else int(buf.ctypes.data)

    def to_numpy(self) -> np.ndarray:
        """A synchronous copy into a new numpy array (waits for the device; for tests and examples)."""
        return self.device._internal.bd.to_numpy(self.live(), self.size, self.dtype)

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.device.backend != "cuda":
            raise AttributeError("__cuda_array_interface__: a host-backend array is not in GPU memory")
        return {
            "shape": (self.size,),
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype)

    def free(self) -> None:
        """Free the memory now (stream-ordered on CUDA). Using the array afterwards raises `ReleasedError`."""
        buf, self._buf = self._buf, None
        if buf is not None and hasattr(buf, "close"):
            buf.close()

    def live(self) -> Any:
        """The backend's buffer; `ReleasedError` once freed, `ClosedError` once its device is closed (its memory
        belonged to the closed worker), as every other object of a closed device."""
        if self._buf is None:
            raise ReleasedError("this array was freed: allocate a new one with device.alloc()")
        if self.device.closed:
            raise self.device._internal.closed_error("this array")
        return self._buf

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"<asyncgpu.DeviceArray {self.device.name} size={self.size} dtype={self.dtype}>"
