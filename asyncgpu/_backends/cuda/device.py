"""`CudaDevice`: the CUDA backend's device, its parts put together (hot paths, holds, calibration, graphs), with
the engine primers, preparation and the in-kernel records' launches."""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncgpu._backends.cuda.calibration import ClockMixin
from asyncgpu._backends.cuda.compiler import _PRIMER_LOCK, _Primer
from asyncgpu._backends.cuda.graphs import GraphsMixin
from asyncgpu._backends.cuda.holds import _NO_GATES, HoldsMixin
from asyncgpu._backends.cuda.hotpath import INC_BLOCK
from asyncgpu._backends.cuda.unheld import GATES, unwatch

__all__ = ["CudaDevice"]


class CudaDevice(HoldsMixin, ClockMixin, GraphsMixin):
    backend = "cuda"
    grows_ahead = True
    slow_pinned_bytes = 1 << 18  # cuMemHostAlloc pins page by page: milliseconds for tens of MB
    slow_alloc_bytes = 1 << 28  # from the device's pool, in stream order; a block this large may make it grow
    own_kernels = ("prime", "hold", "clock_pingpong", "clock_bracket")

    def prime(self, raw_stream: Any, engine: str) -> None:
        primer = self._primer
        if primer is None:
            primer = self._make_primer()
        call, what = primer.calls[engine]
        err = call(raw_stream[3])
        if err:
            raise self._drv.error(self._drv.d.CUresult(err), what)

    def close(self) -> None:
        unwatch()  # (the next hold, of any device, starts it again)
        primer, self._primer = self._primer, None
        if primer is not None:
            primer.close()
        if self._marker is not None:
            self.close_stream(self._marker)
            self._marker = None
        cal, self._cal = self._cal, None
        if cal is not None:
            cal.close(self)

    def prepare(self, workload: str) -> None:
        if workload == "prime":  # the primers' kernel, device buffer and pinned word
            self._make_primer()
            return
        if workload == "hold":  # the holds' pinned page of words (pinning holds back other threads' calls)
            self._open_gates()
            return
        kernel = self._kernels.get(f"asyncgpu_{workload}")
        if kernel is None or id(kernel) not in self._loaded:
            self.prepare_kernel(kernel if kernel is not None else self._kernel(f"asyncgpu_{workload}"))
        if workload.startswith("clock_"):  # the calibration's page and stream
            self._calibration()

    def is_prepared(self, what: Any) -> bool:
        if what == "prime":
            return self._primer is not None
        if what == "hold":
            return GATES.get(self.index) is not None or self.index in _NO_GATES
        if isinstance(what, str):
            kernel = self._kernels.get(f"asyncgpu_{what}")
            return kernel is not None and id(kernel) in self._loaded and (self._cal is not None or "clock" not in what)
        return id(what) in self._loaded

    def _make_primer(self) -> _Primer:
        with _PRIMER_LOCK:  # (not `_kernel_lock`: making the primer loads its kernel under that one)
            if self._primer is None:
                self._primer = _Primer(self)
            return self._primer

    # -- in-kernel records --
    def write_words32(self, raw_stream: Any, array: Any, values: Any) -> None:
        base = int(array.handle)
        for k, value in enumerate(np.asarray(values, dtype=np.uint32).tolist()):
            err = self._drv.d.cuMemsetD32Async(base + 4 * k, value, 1, raw_stream[1])[0]
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuMemsetD32Async")

    def inc_loop_profiled_blocks(self, n: int) -> int:
        return max(1, (n + INC_BLOCK - 1) // INC_BLOCK)

    def inc_loop_profiled(self, raw_stream: Any, array: Any, n: int, iterations: int, records: Any) -> None:
        from cuda.core import LaunchConfig

        config = LaunchConfig(grid=self.inc_loop_profiled_blocks(n), block=INC_BLOCK)
        args = (int(array.handle), np.uint64(n), np.int32(iterations), int(records.handle))
        self.launch(raw_stream, self._kernel("asyncgpu_inc_loop_profiled"), config, args)
