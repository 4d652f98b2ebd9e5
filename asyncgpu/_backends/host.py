"""The host backend: devices that are CPU worker threads, with the same contract as CUDA devices.

Each stream is one thread that runs what was submitted to it, in order. An event completes when its stream
reaches it and carries the host time (``time.perf_counter_ns``) at that point, so elapsed times are real
timings of real host work. Nothing here imitates a GPU: a host device is an in-order executor.

Errors: an exception raised by work on a stream poisons the device, as a sticky CUDA error poisons a context:
every later query, sync or record on it raises `BackendError` chained to the original exception.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import queue
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np

from asyncgpu._backends.contract import Backend, BackendDevice, pinned_array
from asyncgpu._base.errors import BackendError, NotReadyError, ScopeError, UnknownDeviceError

__all__ = ["HostBackend", "HostDevice", "backend_class"]

MAX_HOST_DEVICES = 64
_STOP = object()
_EVENT_NODE = object()  # marks an event-record node in a captured host graph


class _HostEvent:
    """``records`` counts the records made of the event: as on CUDA, only the latest one completes it (an
    earlier record still queued on a stream passes by without a trace)."""

    __slots__ = ("done", "t_ns", "timing", "records")

    def __init__(self, timing: bool) -> None:
        self.done = threading.Event()
        self.done.set()  # a fresh event counts as complete, as cudaEventQuery says of an unrecorded event
        self.t_ns = 0
        self.timing = timing
        self.records = 0


_RECORDS = threading.Lock()  # a record against the completion of an earlier record of the same event


class _HostStream:
    """One in-order executor thread."""

    def __init__(self, device: HostDevice, number: int) -> None:
        self.device = device
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"asyncgpu-{device.name}-stream{number}", daemon=True)
        self.closed = False
        self.busy = False  # running an item now (`HostDevice.stream_idle`)
        self.capture: list | None = None  # while captured: what is submitted, kept for the graph (see graphs)
        self.thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.closed:
            raise BackendError(f"stream of {self.device.name} is closed")
        capture = self.capture
        if capture is not None:
            capture.append((fn, args))
            return
        self.queue.put((fn, args))

    def _run(self) -> None:
        device = self.device
        while True:
            item = self.queue.get()
            if item is _STOP:
                return
            fn, args = item
            if device.error is not None and fn is not _complete:
                continue  # a poisoned device runs no more work; events still complete so nothing hangs
            self.busy = True
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - recorded and re-raised to every waiter
                device.error = exc
            finally:
                self.busy = False
            hook = device.on_progress
            if hook is not None and fn is _complete:
                hook()


def _complete(ev: _HostEvent, record: int) -> None:
    """A stream reached record number ``record`` of ``ev``: it completes the event if no later record was made."""
    t_ns = time.perf_counter_ns()
    with _RECORDS:
        if ev.records == record:
            ev.t_ns = t_ns
            ev.done.set()


def _sleep_until(deadline_ns: int) -> None:
    while True:
        left = deadline_ns - time.perf_counter_ns()
        if left <= 0:
            return
        time.sleep(left / 1e9)


def _inc_loop(a: np.ndarray, iterations: int) -> None:
    with np.errstate(all="ignore"):  # as on a GPU: float math on whatever the memory holds raises nothing
        for _ in range(iterations):
            np.add(a, np.float32(1.0), out=a)


def _wait_other(ev: _HostEvent) -> None:
    ev.done.wait()


class HostDevice(BackendDevice):
    backend = "host"
    slow_pinned_bytes = 1 << 20  # resident memory is made so page by page (~0.3 ms per MB)

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"host:{index}"
        self.description = "host worker threads"
        self.error: BaseException | None = None
        self._streams: weakref.WeakSet[_HostStream] = weakref.WeakSet()
        self._count = 0

    def _check(self) -> None:
        if self.error is not None:
            raise BackendError(
                f"work on {self.name} raised {type(self.error).__name__}: {self.error}; the device "
                "is poisoned, fix the failing work and open a new process"
            ) from self.error

    def create_stream(self) -> _HostStream:
        self._count += 1
        s = _HostStream(self, self._count)
        self._streams.add(s)
        return s

    def adopt_stream(self, obj: Any) -> _HostStream:
        if isinstance(obj, _HostStream) and obj.device is self:
            return obj
        raise TypeError(
            f"{self.name} takes one of its own streams (device.stream, device.streams[i], "
            f"device.create_stream()), not {obj!r}"
        )

    def stream_handle(self, raw_stream: _HostStream) -> int:
        return id(raw_stream)

    def close_stream(self, raw_stream: _HostStream) -> None:
        if not raw_stream.closed:
            raw_stream.closed = True
            raw_stream.queue.put(_STOP)
            if raw_stream.thread is not threading.current_thread():
                raw_stream.thread.join()

    def create_event(self, timing: bool) -> _HostEvent:
        return _HostEvent(timing)

    def destroy_event(self, raw_event: _HostEvent) -> None:
        pass

    def record(self, raw_event: _HostEvent, raw_stream: _HostStream) -> None:
        self._check()
        if raw_stream.capture is not None:  # recorded on every replay, as an event-record node
            raw_stream.capture.append((_EVENT_NODE, raw_event))
            return
        with _RECORDS:  # the latest record counts: the completions of earlier ones are void from now on
            record = raw_event.records + 1
            raw_stream.submit(_complete, raw_event, record)  # (raises, changing nothing, on a closed stream)
            raw_event.records = record
            raw_event.done.clear()

    def mark(self, raw_event: _HostEvent) -> int:
        self._check()
        with _RECORDS:
            raw_event.records += 1
            record = raw_event.records
        _complete(raw_event, record)
        return 0

    def query(self, raw_event: _HostEvent) -> bool:
        self._check()
        return raw_event.done.is_set()

    def sync_event(self, raw_event: _HostEvent) -> None:
        raw_event.done.wait()
        self._check()

    def elapsed_ms(self, start: _HostEvent, end: _HostEvent) -> float:
        if not (start.done.is_set() and end.done.is_set()):
            raise NotReadyError("the host stream has not reached that event yet: await event.wait() first")
        return (end.t_ns - start.t_ns) / 1e6

    def wait_event(self, raw_stream: _HostStream, raw_event: _HostEvent) -> None:
        raw_stream.submit(_wait_other, raw_event)

    def hold(self, raw_stream: _HostStream, watched: bool = False) -> threading.Event | None:
        if raw_stream.capture is not None:  # a capture replays its items later: nothing to hold now
            return None
        gate = threading.Event()
        raw_stream.submit(gate.wait)
        return gate

    def release(self, token: threading.Event) -> None:
        token.set()

    def stream_idle(self, raw_stream: _HostStream) -> bool:
        return raw_stream.queue.empty() and not raw_stream.busy

    def sync_stream(self, raw_stream: _HostStream) -> None:
        if raw_stream.capture is not None:
            raise ScopeError(
                f"cannot synchronize a stream of {self.name} while it is being captured (nothing on "
                "it runs until the graph is launched): synchronize after the capture block"
            )
        marker = _HostEvent(False)
        self.record(marker, raw_stream)
        self.sync_event(marker)

    def memory_info(self) -> tuple[int, int] | None:
        """The host RAM the host devices share."""
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        except (AttributeError, ValueError, OSError):
            return None

    def sync_device(self) -> None:
        for s in list(self._streams):
            if not s.closed:
                self.sync_stream(s)
        self._check()

    def launch(self, raw_stream: _HostStream, kernel: Any, config: Any, args: tuple) -> None:
        if not callable(kernel) or config is not None:
            raise TypeError("a host device launches a Python callable with its arguments (no launch config)")
        self._check()
        raw_stream.submit(kernel, *args)

    def alloc(self, n: int, dtype: Any, raw_stream: _HostStream) -> np.ndarray:
        return np.empty(n, dtype=dtype)

    def alloc_pinned(self, n: int, dtype: Any) -> np.ndarray:
        """Host memory made resident at once, as pinning makes a block resident on CUDA: a fresh anonymous
        mapping (never memory the allocator had already made resident) whose every page is written now (faulted
        in, GIL released: ~0.3 ms per MB). Unmapped when its last view goes, as pinned blocks are freed
        (`pinned_array`)."""
        nbytes = n * np.dtype(dtype).itemsize
        block = mmap.mmap(-1, max(nbytes, 1))
        np.frombuffer(block, np.uint8).fill(0)  # (numpy releases the GIL; mmap's own MAP_POPULATE would not)
        address = ctypes.addressof(ctypes.c_char.from_buffer(block))  # (the temporary exports end here)
        hand = self.free_elsewhere if nbytes >= (self.slow_pinned_bytes or 0) else None
        return pinned_array(block, address, nbytes, n, dtype, hand)

    def spin(self, raw_stream: _HostStream, duration_ns: int) -> None:
        self.launch(raw_stream, lambda: _sleep_until(time.perf_counter_ns() + duration_ns), None, ())

    def inc_loop(self, raw_stream: _HostStream, array: np.ndarray, n: int, iterations: int) -> None:
        self.launch(raw_stream, _inc_loop, None, (array[:n], iterations))

    def memset(self, raw_stream: _HostStream, array: np.ndarray, nbytes: int, byte: int) -> None:
        self.launch(raw_stream, array.view(np.uint8)[:nbytes].fill, None, (byte,))

    def copy_to_host(self, raw_stream: _HostStream, array: np.ndarray, host: np.ndarray, nbytes: int) -> None:
        dst, src = host.view(np.uint8)[:nbytes], array.view(np.uint8)[:nbytes]
        self.launch(raw_stream, np.copyto, None, (dst, src))

    def copy(self, raw_stream: _HostStream, dst: np.ndarray, src: np.ndarray, nbytes: int) -> None:
        self.launch(raw_stream, np.copyto, None, (dst.view(np.uint8)[:nbytes], src.view(np.uint8)[:nbytes]))

    def calibrate_events(self, raw_events: list, timeout_ns: int) -> np.ndarray:
        # A host mark completes at once with the host time in it: the bracket is exact.
        out = np.empty((len(raw_events), 2), np.int64)
        for k, raw in enumerate(raw_events):
            self.mark(raw)
            out[k] = raw.t_ns
        return out

    def to_numpy(self, array: np.ndarray, n: int, dtype: Any) -> np.ndarray:
        return np.array(array[:n], dtype=dtype, copy=True)

    # -- graphs (asyncgpu._graph) ---------------------------------------------------------------------------
    # A host graph is the list of ``(fn, args)`` submitted during the capture; an event-record node is an item
    # ``(_EVENT_NODE, raw_event)`` and its node handle is its index in that list.
    def begin_capture(self, raw_stream: _HostStream) -> None:
        if raw_stream.capture is not None:
            raise BackendError(f"that stream of {self.name} is already being captured")
        raw_stream.capture = []

    def record_in_capture(self, raw_event: _HostEvent, raw_stream: _HostStream) -> None:
        if raw_stream.capture is None:
            raise BackendError(f"that stream of {self.name} is not being captured")
        raw_stream.capture.append((_EVENT_NODE, raw_event))

    def end_capture(self, raw_stream: _HostStream) -> list:
        items, raw_stream.capture = raw_stream.capture, None
        if items is None:
            raise BackendError(f"that stream of {self.name} is not being captured")
        return items

    def abort_capture(self, raw_stream: _HostStream) -> None:
        raw_stream.capture = None

    def graph_event_nodes(self, raw_graph: list, raw_events: list) -> list:
        index = {id(arg): k for k, (fn, arg) in enumerate(raw_graph) if fn is _EVENT_NODE}
        return [index[id(raw)] for raw in raw_events]

    def set_graph_events(self, raw_graph: list, nodes: list, raw_events: list) -> None:
        for node, raw in zip(nodes, raw_events):
            raw_graph[node] = (_EVENT_NODE, raw)

    def launch_graph(self, raw_graph: list, raw_stream: _HostStream) -> None:
        self._check()
        for fn, args in raw_graph:
            if fn is _EVENT_NODE:
                self.record(args, raw_stream)
            else:
                raw_stream.submit(fn, *args)

    def destroy_graph(self, raw_graph: list) -> None:
        raw_graph.clear()

    # -- in-kernel records --
    def write_words32(self, raw_stream: _HostStream, array: np.ndarray, values: Any) -> None:
        words = np.array(values, dtype=np.uint32)  # copied now, as a memset's value is
        self.launch(raw_stream, np.copyto, None, (array.view(np.uint32)[: words.size], words))

    def inc_loop_profiled_blocks(self, n: int) -> int:
        return max(1, -(-n // _PROFILED_BLOCK))

    def inc_loop_profiled(
        self, raw_stream: _HostStream, array: np.ndarray, n: int, iterations: int, records: np.ndarray
    ) -> None:
        self.launch(raw_stream, _inc_loop_profiled, None, (array[:n], iterations, records))


_PROFILED_BLOCK = 1 << 16  # elements per block (record lane) of the host inc_loop with records


def _inc_loop_profiled(a: np.ndarray, iterations: int, records: np.ndarray) -> None:
    """inc_loop in blocks of `_PROFILED_BLOCK` elements, each block's stages recorded as a GPU leader would."""
    from asyncgpu._backends.kernels import HostLane

    blocks = max(1, -(-a.size // _PROFILED_BLOCK))
    for b in range(blocks):
        lane = HostLane(records, b, blocks=blocks)
        chunk = a[b * _PROFILED_BLOCK : (b + 1) * _PROFILED_BLOCK]
        with lane.region(0):
            v = chunk.copy()
        with lane.region(1), np.errstate(all="ignore"):  # (as `_inc_loop`)
            for _ in range(iterations):
                np.add(v, np.float32(1.0), out=v)
        with lane.region(2):
            chunk[:] = v
        lane.finalize()


class HostBackend(Backend):
    name = "host"

    def available(self) -> tuple[bool, str]:
        return True, "host worker threads"

    def device_count(self) -> int:
        return MAX_HOST_DEVICES

    def open_device(self, index: int) -> HostDevice:
        if not 0 <= index < MAX_HOST_DEVICES:
            raise UnknownDeviceError(f"no device host:{index}: host devices are host:0..host:{MAX_HOST_DEVICES - 1}")
        return HostDevice(index)


backend_class = HostBackend
