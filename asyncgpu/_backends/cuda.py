"""The CUDA backend: the only module that imports cuda.core / cuda.bindings.

Threads: every method may be called from any thread. Methods that create resources (streams, events, buffers,
modules) make the device current in the calling thread first, as cuda.core requires. The hot methods
(`record`, `query`) call libcuda's ``cuEventRecord``/``cuEventQuery`` through ctypes function pointers with
pre-extracted integer handles. ``cuEventQuery`` never blocks, so it keeps the GIL: releasing and re-taking the
GIL per query convoys the waiter thread behind a busy event loop (measured: 10,000 waits in flight woke
~250 ms late). ``cuEventRecord`` may block on a full push buffer, so it releases the GIL.
``ASYNCGPU_HOTPATH=bindings`` uses cuda.bindings for both instead.

Without a driver, `CudaBackend.available` probes ``cuInit`` once and nothing else is ever called. In a child
process forked after the parent initialized CUDA, the backend says it is unusable (naming the 'spawn' start
method) and never calls the driver.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np

from asyncgpu._backends.contract import Backend, BackendDevice, pinned_array
from asyncgpu._backends.kernels import kernels_dir
from asyncgpu._base.errors import (
    BackendError,
    ClockError,
    DeviceMismatchError,
    NoDeviceError,
    NotReadyError,
    SourceError,
    UnknownDeviceError,
)

__all__ = ["CudaBackend", "CudaDevice", "backend_class", "nvrtc_available"]

_KERNEL_SOURCES = {
    "asyncgpu_spin": "workloads.cu",
    "asyncgpu_inc_loop": "workloads.cu",
    "asyncgpu_prime": "workloads.cu",
    "asyncgpu_clock_pingpong": "clock.cu",
    "asyncgpu_clock_bracket": "clock.cu",
    "asyncgpu_inc_loop_profiled": "profiled.cu",
    "asyncgpu_kp_bench": "profiled.cu",
    "asyncgpu_inc_loop_profiled_off": "profiled_off.cu",
    "asyncgpu_kp_bench_off": "profiled_off.cu",
}
_INC_BLOCK = 256
_MASK32 = 0xFFFFFFFF
# Calibration page (mapped pinned host memory), uint32 word indices and the byte offset of the stamps.
_W_FLAG_E, _W_ACK_E, _W_FLAG_K, _W_STARTED_K, _W_ACK_A = 0, 1, 2, 3, 5
_STAMPS_OFFSET, _MAX_STAMPS = 64, 63
_MEMSET_BYTES = 1 << 20  # the overhead calibration's memset, and the source of its copies
_COPY_BYTES = 64 << 10  # its copies to the host (with 1 KB copies the estimate moved by 0.3 µs between runs)
_PAGE = 4096
_START_TIMEOUT_NS = 20_000_000  # a calibration kernel that has not started by then: the device is busy


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
        self.wait_value_c: Callable[..., int] | None = None
        self.stream_query_c: Callable[..., int] | None = None

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
    """``record`` and ``query`` as plain closures over libcuda's entry points (integer handles)."""
    record_c, query_c, result = drv.record_c, drv.query_c, drv.d.CUresult
    assert record_c is not None and query_c is not None  # only called once `load_ctypes` set them

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
    grows_ahead = True
    slow_pinned_bytes = 1 << 18  # cuMemHostAlloc pins page by page: ~0.5 ms per MB (40 MB: ~20 ms on H100 hosts)
    slow_alloc_bytes = 1 << 28  # from the device's pool, in stream order; a block this large may make it grow
    own_kernels = ("prime", "hold", "clock_pingpong", "clock_bracket")

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
        self._loaded: dict[int, Any] = {}  # id(kernel) -> kernel, for the kernels loaded into this context
        self._kernel_lock = threading.Lock()
        self._pinned_mr: Any = None  # a cuda.core LegacyPinnedMemoryResource, made on first use
        self._peer_sources: set[int] = set()  # GPUs whose memory pools let this one read them (`copy`)
        self._marker: Any = None  # an idle stream for `mark`
        self._cal: _Calibration | None = None  # the clock calibration's page and stream, made on first use
        self._primer: _Primer | None = None  # the engine primers' kernel and buffers (`prime`), made on first use
        if drv.record_c is not None:
            self.record, self.query = _ctypes_hot_paths(drv)  # type: ignore[method-assign]  # per instance, on purpose

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

    # -- holds (`hold` / `release`): a stream waits on a host word until its bracket is fully enqueued -------
    def hold(self, raw_stream: Any) -> Any:
        gates = _GATES.get(self.index)
        if gates is None:
            if self.index in _NO_GATES:
                return None
            gates = self._open_gates()
            if gates is None:
                return None
        key = raw_stream[2]
        slot = gates.slots.get(key)
        if slot is None:
            slot = gates.assign(key)
        value = gates.next[slot] = (gates.next[slot] + 1) & _MASK32
        addr = gates.dptr + 4 * slot
        drv = self._drv
        if drv.wait_value_c is not None:
            err = drv.wait_value_c(raw_stream[3], addr, value, 0)  # CU_STREAM_WAIT_VALUE_GEQ (cyclic)
            failed = bool(err)
        else:
            d = drv.d
            res = d.cuStreamWaitValue32(raw_stream[1], addr, value, d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
            failed = res[0] is not drv.SUCCESS
        if failed:  # nothing was enqueued: brackets go unheld from now on (`hold_problem` says why)
            _NO_GATES[self.index] = f"cuStreamWaitValue32 failed on {self.name}: stream memory operations unusable"
            return None
        return (gates.words, slot, value)

    def hold_problem(self) -> str | None:
        return _NO_GATES.get(self.index)

    def prime(self, raw_stream: Any, engine: str) -> None:
        primer = self._primer
        if primer is None:
            primer = self._make_primer()
        call, what = primer.calls[engine]
        err = call(raw_stream[3])
        if err:
            raise self._drv.error(self._drv.d.CUresult(err), what)

    def stream_idle(self, raw_stream: Any) -> bool:
        drv = self._drv
        if drv.stream_query_c is not None:
            err = drv.stream_query_c(raw_stream[3])
        else:
            err = int(drv.d.cuStreamQuery(raw_stream[1])[0])
        if err == 600:  # CUDA_ERROR_NOT_READY
            return False
        if err:
            raise drv.error(drv.d.CUresult(err), "cuStreamQuery")
        return True

    def release(self, token: Any) -> None:
        words, slot, value = token
        if (value - words[slot]) & _MASK32 < 0x80000000:  # never move a word back (holds may end out of order)
            words[slot] = value

    def _open_gates(self) -> _Gates | None:
        with _GATES_LOCK:
            gates = _GATES.get(self.index)
            if gates is None and self.index not in _NO_GATES:
                try:
                    gates = _GATES[self.index] = _Gates(self)
                except BackendError as exc:
                    _NO_GATES[self.index] = str(exc)
            return gates

    def close(self) -> None:
        primer, self._primer = self._primer, None
        if primer is not None:
            primer.close()
        if self._marker is not None:
            self.close_stream(self._marker)
            self._marker = None
        cal, self._cal = self._cal, None
        if cal is not None:
            cal.close(self)

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

    # -- clocks ---------------------------------------------------------------------------------------------
    def _calibration(self) -> _Calibration:
        if self._cal is None:
            with self._kernel_lock:
                if self._cal is None:
                    self._cal = _Calibration(self)
        return self._cal

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

    def wait_value_record(
        self, raw_stream: Any, flag_dptr: int, value: int, raw_event: Any, ack_dptr: int | None = None
    ) -> None:
        """Enqueue: wait (on the device) until the uint32 at ``flag_dptr`` reaches ``value`` (cyclic compare),
        record ``raw_event``, then write ``value`` to ``ack_dptr``. No SM is involved."""
        d = self._drv.d
        err = d.cuStreamWaitValue32(
            raw_stream[1], flag_dptr, value & _MASK32, d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        )[0]
        if err is not self._drv.SUCCESS:
            raise ClockError(
                f"{self.name} cannot wait on host memory (cuStreamWaitValue32: {err.name}): stream "
                "memory operations are unsupported by this driver or device"
            )
        self.record(raw_event, raw_stream)
        if ack_dptr is not None:
            err = d.cuStreamWriteValue32(
                raw_stream[1], ack_dptr, value & _MASK32, d.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
            )[0]
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuStreamWriteValue32")

    def launch_pingpong(
        self, raw_stream: Any, flag_dptr: int, started_dptr: int, stamps_dptr: int, first: int, n: int
    ) -> None:
        """Launch kernels/clock.cu's ``asyncgpu_clock_pingpong`` (one thread). Its ``n + 1`` stamps must read 0
        before: a stamp is its ping's acknowledgement."""
        from cuda.core import LaunchConfig

        args = (
            np.uint64(flag_dptr),
            np.uint64(started_dptr),
            np.uint64(stamps_dptr),
            np.uint32(first & _MASK32),
            np.uint32(n),
        )
        self.launch(raw_stream, self._kernel("asyncgpu_clock_pingpong"), LaunchConfig(grid=1, block=1), args)

    def calibrate_events(self, raw_events: list, timeout_ns: int) -> np.ndarray:
        cal = self._calibration()
        n = len(raw_events)
        first = cal.next_e
        cal.next_e = (first + n) & _MASK32
        try:
            for k, raw in enumerate(raw_events):
                self.wait_value_record(cal.stream, cal.dptr + 4 * _W_FLAG_E, first + k, raw, cal.dptr + 4 * _W_ACK_E)
        except BaseException:
            cal.words[_W_FLAG_E] = (first + n - 1) & _MASK32  # release what was enqueued
            raise
        return host_pingpong(cal.words, _W_FLAG_E, _W_ACK_E, first, n, timeout_ns, self.name)

    def calibrate_globaltimer(self, n: int, timeout_ns: int, raw_event: Any = None) -> tuple:
        if not 1 <= n <= _MAX_STAMPS:
            raise ValueError(f"between 1 and {_MAX_STAMPS} globaltimer samples, not {n}")
        cal = self._calibration()
        if not self.query(cal.kernel_done):
            raise ClockError(
                f"{self.name}'s previous calibration kernel has not run yet: the device is busy "
                "(every SM taken by long kernels); calibrate again when it is idle"
            )
        first = cal.next_k
        cal.next_k = (first + n) & _MASK32
        d, words = cal.dptr, cal.words
        ctypes.memset(cal.page.ptr + _STAMPS_OFFSET, 0, 8 * (n + 1))  # (the kernel is done: nothing reads them)
        self.launch_pingpong(cal.stream, d + 4 * _W_FLAG_K, d + 4 * _W_STARTED_K, d + _STAMPS_OFFSET, first, n)
        if raw_event is not None:
            self.record(raw_event, cal.stream)
            err = self._drv.d.cuStreamWriteValue32(
                cal.stream[1],
                d + 4 * _W_ACK_A,
                first,
                self._drv.d.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT,
            )[0]
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuStreamWriteValue32")
        self.record(cal.kernel_done, cal.stream)
        deadline = time.perf_counter_ns() + _START_TIMEOUT_NS
        while words[_W_STARTED_K] != first:
            if time.perf_counter_ns() > deadline:
                words[_W_FLAG_K] = (first + n - 1) & _MASK32  # the kernel runs through at once when it starts
                raise ClockError(
                    f"{self.name}'s calibration kernel did not start within "
                    f"{_START_TIMEOUT_NS // 1_000_000} ms: the device is busy"
                )
        acks = (ctypes.c_uint64 * (n + 1)).from_address(cal.page.ptr + _STAMPS_OFFSET)
        hosts = host_pingpong(words, _W_FLAG_K, acks, first, n, timeout_ns, self.name)
        after = None
        if raw_event is not None:
            deadline = time.perf_counter_ns() + timeout_ns
            while words[_W_ACK_A] != first:
                if time.perf_counter_ns() > deadline:
                    raise ClockError(f"{self.name} did not reach the event after its calibration kernel")
            after = time.perf_counter_ns()
        # numpy reads the ctypes array through the buffer protocol (its stubs do not list ctypes arrays)
        stamps = np.frombuffer(cal.page.view, dtype=np.uint64, count=n + 1, offset=_STAMPS_OFFSET).astype(np.int64)  # type: ignore[call-overload]
        return np.column_stack([stamps[:n], hosts]), (int(stamps[n]), after)

    def bracket_overhead(self, repeats: int = 21) -> tuple[dict[str, float], str]:
        """What a pair of events adds to the time of what it brackets on the GPU, ns, per kind of work
        (``"kernel"``, ``"memset"``, ``"memcpy"`` to the host, ``"memcpy_d2d"`` between device buffers): the
        median over ``repeats`` of elapsed(start, end) minus the work's own time, for a 20 µs kernel, a 1 MB
        memset, a 64 KB copy to the host and a 512 KB copy between device buffers, queued behind a 1 ms kernel (so
        the GPU never waits for the host), each pair held and primed as an event-timing scope holds and primes
        its launches (`hold`, `prime`). The kinds differ: on H100 a copy to the host's pair adds about 1 µs more
        than a kernel's.

        The work's own time is CUPTI's record of it where CUPTI can be used here (cupti-python installed, no
        other profiler subscribed: the session is opened for this work and closed again): what the events source
        is compared with. Otherwise only the kernel is measured, against its first-to-last ``%globaltimer`` span,
        which leaves out its own launch and exit (~1 µs): durations then read that much short. Blocks about 4 ms
        (the first CUPTI session of a process: longer)."""
        from asyncgpu._backends import cupti

        use_cupti = cupti.available()[0]
        if use_cupti:
            try:
                cupti.acquire(cupti.CALIBRATION)
            except SourceError:
                use_cupti = False
        try:
            if not use_cupti:
                elapsed, spans = self._bracket_pairs(repeats, ("kernel",))
                return {"kernel": float(np.median(elapsed["kernel"] - spans))}, (
                    "against the kernel's own %globaltimer span (no CUPTI)"
                )
            out: dict[str, float] = {}
            # Two rounds: CUPTI calls every copy "memcpy", so the copies between device buffers (each behind its
            # primer, another copy) are told apart by running them alone, second in each primer-copy pair.
            first: tuple[np.ndarray, np.ndarray] | None = None  # the kernels' (elapsed, spans)
            for kinds in (("kernel", "memset", "memcpy"), ("memcpy_d2d",)):
                elapsed, spans = self._bracket_pairs(repeats, kinds)
                if first is None:
                    first = elapsed["kernel"], spans
                records, _ = cupti.flush(cupti.CALIBRATION)
                for kind, pairs in elapsed.items():
                    want = "memcpy" if kind == "memcpy_d2d" else kind
                    mine = sorted(
                        (
                            r
                            for r in records
                            if r[0] == want
                            and r[4] == self.index
                            and (kind != "kernel" or r[6] == "asyncgpu_clock_bracket")
                        ),
                        key=lambda r: r[1],
                    )
                    mine = mine[1::2] if kind == "memcpy_d2d" else mine[-repeats:]  # (a copy's primer comes first)
                    if len(mine) == repeats:
                        durations = np.array([r[2] - r[1] for r in mine], np.float64)
                        out[kind] = float(np.median(pairs - durations))
            if "kernel" not in out and first is not None:  # (CUPTI missed them: the span's estimate, and say so)
                return {"kernel": float(np.median(first[0] - first[1]))}, (
                    "against the kernel's own %globaltimer span (CUPTI did not record the calibration)"
                )
            return out, f"against CUPTI ({repeats} of each)"
        finally:
            if use_cupti:
                cupti.release(cupti.CALIBRATION)

    def _bracket_pairs(self, repeats: int, kinds: tuple[str, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Run ``repeats`` held event pairs around each kind of work of `bracket_overhead` named in ``kinds``,
        behind a 1 ms kernel on the calibration stream: ``({kind: elapsed ns}, the kernels' in-kernel spans ns)``.
        Blocks until they ran (`ClockError` after 100 ms)."""
        from cuda.core import LaunchConfig

        cal = self._calibration()
        s = cal.stream
        one = LaunchConfig(grid=1, block=1)
        kernel = self._kernel("asyncgpu_clock_bracket")
        out = self.alloc(2 * repeats, np.uint64, s)  # device memory: stores to host memory would slow the exit
        scratch = self.alloc(_MEMSET_BYTES, np.uint8, s)
        half = _MEMSET_BYTES // 2
        if cal.copy_page is None:
            cal.copy_page = self.alloc_mapped(_COPY_BYTES)
        host = np.frombuffer(cal.copy_page.view, np.uint8, _COPY_BYTES)  # type: ignore[call-overload]
        ops: dict[str, Callable[[int], None]] = {
            "kernel": lambda k: self.launch(s, kernel, one, (np.uint64(20_000), np.uint64(int(out.handle) + 16 * k))),
            "memset": lambda k: self.memset(s, scratch, _MEMSET_BYTES, 0),
            "memcpy": lambda k: self.copy_to_host(s, scratch, host, _COPY_BYTES),
            "memcpy_d2d": lambda k: self._drv_check(
                self._drv.d.cuMemcpyDtoDAsync(int(scratch.handle) + half, int(scratch.handle), half, s[1])[0],
                "cuMemcpyDtoDAsync",
            ),
        }
        self.spin(s, 1_000_000)
        pairs = {kind: [(self.create_event(True), self.create_event(True)) for _ in range(repeats)] for kind in kinds}
        try:
            for kind in kinds:
                for k, (a, b) in enumerate(pairs[kind]):
                    if kind == "memcpy" and k == 0:  # as `hooks.launch_now` primes: at the switch, before the hold
                        self.prime(s, "copy")
                    held = self.hold(s)
                    try:
                        if kind == "memcpy_d2d":  # every time, behind the hold
                            self.prime(s, "copy_d2d")
                        self.record(a, s)
                        ops[kind](k)
                        self.record(b, s)
                    finally:
                        if held is not None:
                            self.release(held)
            deadline = time.perf_counter_ns() + 100_000_000
            last = pairs[kinds[-1]][-1][1]
            while not self.query(last):
                if time.perf_counter_ns() > deadline:
                    raise ClockError(f"{self.name} did not run the overhead calibration within 100 ms: it is busy")
            stamps = self.to_numpy(out, 2 * repeats, np.uint64).astype(np.int64)
            spans = (stamps[1::2] - stamps[0::2]).astype(np.float64)
            elapsed = {kind: np.array([self.elapsed_ms(a, b) * 1e6 for a, b in ps]) for kind, ps in pairs.items()}
            out.close()  # (not on failure: queued work may still use them)
            scratch.close()
        finally:
            for ps in pairs.values():
                for a, b in ps:
                    self.destroy_event(a)
                    self.destroy_event(b)
        return elapsed, spans

    def _drv_check(self, err: Any, call: str) -> None:
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, call)

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
            return (max(1, (n + _INC_BLOCK - 1) // _INC_BLOCK), 1, 1), (_INC_BLOCK, 1, 1)
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
        return pinned_array(buf, int(buf.handle), nbytes, n, dtype, hand)

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
            return _GATES.get(self.index) is not None or self.index in _NO_GATES
        if isinstance(what, str):
            kernel = self._kernels.get(f"asyncgpu_{what}")
            return kernel is not None and id(kernel) in self._loaded and (self._cal is not None or "clock" not in what)
        return id(what) in self._loaded

    def _make_primer(self) -> _Primer:
        with _PRIMER_LOCK:  # (not `_kernel_lock`: making the primer loads its kernel under that one)
            if self._primer is None:
                self._primer = _Primer(self)
            return self._primer

    def prepare_kernel(self, kernel: Any) -> None:
        """``cuFuncLoad`` the kernel's function in this device's context (CUDA 12.4+ drivers; older ones load it
        at the first launch, as before). Once per kernel object."""
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

        config = LaunchConfig(grid=max(1, (n + _INC_BLOCK - 1) // _INC_BLOCK), block=_INC_BLOCK)
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

    # -- graphs (asyncgpu._graph) ---------------------------------------------------------------------------
    # A raw graph is ``(CUgraph, CUgraphExec)``: the template stays alive because its nodes name the nodes of
    # the executable graph (``cuGraphExecEventRecordNodeSetEvent`` takes a template node).
    def _capture_error(self, err: Any, call: str) -> BackendError:
        return BackendError(
            f"{call} failed: {getattr(err, 'name', err)}. The capture was invalidated or misused: inside "
            "`with stream.capture()` launch only on the captured stream, and do not synchronize, wait on the "
            "host or allocate outside the stream (CUDA forbids such calls in the capturing thread)"
        )

    def begin_capture(self, raw_stream: Any) -> None:
        d = self._drv.d
        self.make_current()
        err = d.cuStreamBeginCapture(raw_stream[1], d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)[0]
        if err is not self._drv.SUCCESS:
            raise self._capture_error(err, "cuStreamBeginCapture")

    def record_in_capture(self, raw_event: Any, raw_stream: Any) -> None:
        d = self._drv.d
        external = d.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL  # a node of the graph, not a capture-internal join
        err = d.cuEventRecordWithFlags(raw_event[1], raw_stream[1], external)[0]
        if err is not self._drv.SUCCESS:
            raise self._capture_error(err, "cuEventRecordWithFlags(CU_EVENT_RECORD_EXTERNAL)")

    def end_capture(self, raw_stream: Any) -> tuple:
        d = self._drv.d
        err, graph = d.cuStreamEndCapture(raw_stream[1])
        if err is not self._drv.SUCCESS:
            raise self._capture_error(err, "cuStreamEndCapture")
        err, exe = d.cuGraphInstantiate(graph, 0)
        if err is not self._drv.SUCCESS:
            d.cuGraphDestroy(graph)
            raise self._drv.error(err, "cuGraphInstantiate")
        return (graph, exe)

    def abort_capture(self, raw_stream: Any) -> None:
        err, graph = self._drv.d.cuStreamEndCapture(raw_stream[1])  # an error means there is nothing to free
        if err is self._drv.SUCCESS and int(graph):
            self._drv.d.cuGraphDestroy(graph)

    def graph_event_nodes(self, raw_graph: Any, raw_events: list) -> list:
        d = self._drv.d
        graph = raw_graph[0]
        room = 2 * len(raw_events) + 16
        while True:  # never pass numNodes=0 (a NULL array): ask for room until some is left over
            err, nodes, count = d.cuGraphGetNodes(graph, room)
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuGraphGetNodes")
            if count < room:
                break
            room *= 2
        record_type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD
        by_event = {}
        for node in nodes[:count]:
            err, node_type = d.cuGraphNodeGetType(node)
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuGraphNodeGetType")
            if node_type == record_type:
                err, event = d.cuGraphEventRecordNodeGetEvent(node)
                if err is not self._drv.SUCCESS:
                    raise self._drv.error(err, "cuGraphEventRecordNodeGetEvent")
                by_event[int(event)] = node
        missing = sum(raw[2] not in by_event for raw in raw_events)
        if missing:
            raise BackendError(
                f"{missing} of {len(raw_events)} timing events left no event-record node in the "
                "captured graph: this driver ignores CU_EVENT_RECORD_EXTERNAL; update the driver"
            )
        return [by_event[raw[2]] for raw in raw_events]

    def set_graph_events(self, raw_graph: Any, nodes: list, raw_events: list) -> None:
        d, exe = self._drv.d, raw_graph[1]
        for node, raw in zip(nodes, raw_events):
            err = d.cuGraphExecEventRecordNodeSetEvent(exe, node, raw[1])[0]
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuGraphExecEventRecordNodeSetEvent")

    def launch_graph(self, raw_graph: Any, raw_stream: Any) -> None:
        err = self._drv.d.cuGraphLaunch(raw_graph[1], raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuGraphLaunch")

    def destroy_graph(self, raw_graph: Any) -> None:
        d = self._drv.d
        err = d.cuGraphExecDestroy(raw_graph[1])[0]
        d.cuGraphDestroy(raw_graph[0])
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuGraphExecDestroy")

    # -- in-kernel records (issue 5) --
    def write_words32(self, raw_stream: Any, array: Any, values: Any) -> None:
        base = int(array.handle)
        for k, value in enumerate(np.asarray(values, dtype=np.uint32).tolist()):
            err = self._drv.d.cuMemsetD32Async(base + 4 * k, value, 1, raw_stream[1])[0]
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuMemsetD32Async")

    def inc_loop_profiled_blocks(self, n: int) -> int:
        return max(1, (n + _INC_BLOCK - 1) // _INC_BLOCK)

    def inc_loop_profiled(self, raw_stream: Any, array: Any, n: int, iterations: int, records: Any) -> None:
        from cuda.core import LaunchConfig

        config = LaunchConfig(grid=self.inc_loop_profiled_blocks(n), block=_INC_BLOCK)
        args = (int(array.handle), np.uint64(n), np.int32(iterations), int(records.handle))
        self.launch(raw_stream, self._kernel("asyncgpu_inc_loop_profiled"), config, args)


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
            self._drv.d.cuMemFreeHost(self.ptr)
            self.ptr = 0


class _Primer:
    """One device's engine primers (`CudaDevice.prime`): the empty one-thread kernel ``asyncgpu_prime`` for the
    compute engine, a 4-byte device-to-host copy for the copy engine, and a 4-byte copy between device buffers for
    copies between device buffers (profilers show each); all called through libcuda directly (a launch through
    cuda.core costs ~8 µs of host time)."""

    def __init__(self, dev: CudaDevice) -> None:
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
        lib = ctypes.CDLL("libcuda.so.1" if os.name != "nt" else "nvcuda.dll")
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
        self._drv.d.cuMemFree(self._dptr)  # (the stream-ordered primers ahead of a close are done or dropped)


class _Gates:
    """One GPU's hold words (`CudaDevice.hold`): a page of pinned, device-mapped uint32 words, one per stream,
    each counting up. Kept for the life of the process (one page per GPU, reused when the device is opened
    again): a stream queued behind a hold may still read its word after the worker that made it closed."""

    def __init__(self, dev: CudaDevice) -> None:
        self.page = dev.alloc_mapped(_PAGE)
        self.words = self.page.words
        self.dptr = dev.device_pointer(self.page)
        self.slots: dict[int, int] = {}  # stream handle -> word
        self.next = [0] * (_PAGE // 4)  # the value of each word's latest hold
        self._lock = threading.Lock()

    def assign(self, key: int) -> int:
        """The word for the stream ``key``: a word of its own while there are free ones, then a shared one (a
        shared word only lets a hold end early, never late: every release moves it forward)."""
        with self._lock:
            slot = self.slots.get(key)
            if slot is None:
                n = len(self.next)
                if len(self.slots) >= n:
                    return (key >> 4) % n
                slot = self.slots[key] = len(self.slots)
            return slot


_PRIMER_LOCK = threading.Lock()
_GATES: dict[int, _Gates] = {}  # GPU index -> its hold words
_NO_GATES: dict[int, str] = {}  # GPU index -> why its streams cannot be held
_GATES_LOCK = threading.Lock()


class _Calibration:
    """One device's calibration page, stream and 'kernel done' event."""

    def __init__(self, dev: CudaDevice) -> None:
        self.page = dev.alloc_mapped(_PAGE)
        self.words = self.page.words
        self.dptr = dev.device_pointer(self.page)
        self.stream = dev.create_stream()
        self.kernel_done = dev.create_event(False)
        self.next_e = self.next_k = 1
        self.copy_page: MappedPage | None = None  # the overhead calibration's copies land here (`bracket_overhead`)

    def close(self, dev: CudaDevice) -> None:
        # Release anything still waiting on the page, let the stream drain, then free.
        self.words[_W_FLAG_E] = (self.next_e - 1) & _MASK32
        self.words[_W_FLAG_K] = (self.next_k - 1) & _MASK32
        try:
            dev.sync_stream(self.stream)
        finally:
            dev.close_stream(self.stream)
            dev.destroy_event(self.kernel_done)
            self.page.free()
            if self.copy_page is not None:
                self.copy_page.free()


def host_pingpong(words: Any, flag: int, acks: Any, first: int, n: int, timeout_ns: int, name: str) -> np.ndarray:
    """The host half of a ping-pong: for each ping k, read the clock (h0), write ``first + k`` to ``words[flag]``,
    spin until the device acknowledges it, read the clock (h1). ``acks`` is an int: the word of ``words`` the
    device writes each value into (the streams' pings); or an array of ``n`` 64-bit words that read 0 until the
    device writes ping k's stamp into ``acks[k]`` (the kernel's). Returns int64 ``(n, 2)``; raises `ClockError`
    on timeout (after releasing the device side)."""
    clock = time.perf_counter_ns
    out = np.empty((n, 2), np.int64)
    deadline = clock() + timeout_ns
    word = acks if isinstance(acks, int) else -1
    for k in range(n):
        v = (first + k) & _MASK32
        h0 = clock()
        words[flag] = v
        if word >= 0:
            while (words[word] - v) & _MASK32 >= 0x80000000:  # cyclic: the ack has not reached v yet
                if clock() > deadline:
                    break
        else:
            while not acks[k]:
                if clock() > deadline:
                    break
        h1 = clock()
        if h1 > deadline:
            words[flag] = (first + n - 1) & _MASK32
            raise ClockError(
                f"{name} did not answer a clock ping within {timeout_ns / 1e6:.1f} ms: its "
                "calibration stream is queued behind other work (too many busy streams)"
            )
        out[k, 0], out[k, 1] = h0, h1
    return out


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


backend_class = CudaBackend
_BACKENDS: weakref.WeakSet[CudaBackend] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    parent = os.getppid()
    for backend in list(_BACKENDS):
        backend.forked(parent)


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)
