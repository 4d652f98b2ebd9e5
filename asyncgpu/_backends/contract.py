"""The contract every backend implements.

A backend is a module of `asyncgpu._backends` (``cuda``, ``host``) whose ``backend_class`` implements `Backend`.
The core (devices, pools, the completion engine, graphs) only talks to these methods; it never imports CUDA.

Raw objects (``raw_event``, ``raw_stream``) are whatever the backend chooses; the core stores and passes them
back. Methods marked *hot* are called once per record or query and must stay cheap.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Backend", "BackendDevice", "PinnedBlock", "pinned_array"]


class BackendDevice(ABC):
    """One device of a backend. Methods may be called from any thread unless stated otherwise."""

    name: str  #: e.g. ``"cuda:0"`` or ``"host:1"``
    index: int
    backend: str
    description: str  #: human-readable model, e.g. ``"NVIDIA H200"``
    #: Whether creating an event costs enough (CUDA: ~7 µs, spikes of hundreds) that the pools create them ahead of
    #: need on the waiter thread rather than on the thread that takes one (host events: 2 µs, made where needed).
    grows_ahead: bool = False

    #: Called by the backend (from any thread, never a CUDA driver thread) after it completes an event, so a
    #: sleeping completion engine can look at once. The core installs it; ``None`` means nobody listens.
    on_progress: Callable[[], None] | None = None

    #: Allocations of at least this many bytes may hold the calling thread past ~100 µs: `alloc_pinned` (pinning
    #: works page by page) and `alloc` (a memory pool that must grow). The core warns when an event loop's thread
    #: makes one (the device's worker thread has the awaitable forms). None: never that slow.
    slow_pinned_bytes: int | None = None
    slow_alloc_bytes: int | None = None

    #: Installed by the core: takes a one-item list holding the object whose last reference frees a large pinned
    #: block (see `PinnedBlock`) and empties it on the device's worker thread; False where it cannot (the caller
    #: frees it).
    free_elsewhere: Callable[[list], bool] | None = None

    #: The device's cache (CUDA: its L2), bytes; None: no such cache. A copy between device buffers of at least
    #: this many bytes spills it, and behind other work its event pair then costs what the calibration measured
    #: for such a copy (``"memcpy_d2d_spill"``). Where smaller copies begin to spill is not measured: copies'
    #: durations vary from round to round by more than the step (one H100, run 46, 40 MB copies given the
    #: spilling cut: −0.64 µs in the copy test, +0.34 and +0.82 between `dev/diag_spill.py`'s stamped spins).
    cache_bytes: int | None = None

    #: A memset (or asyncgpu's `inc_loop`, which reads and writes its array) of at least this many bytes spills the
    #: device's cache, and behind other work its event pair then costs what the calibration measured for such work
    #: (``"memset_spill"``, ``"kernel_spill"``). Measured per device by its first
    #: clock calibration (CUDA: `spill_threshold`; where that step starts differs by machine: 40 MB memsets behind
    #: other work took the whole step on one H100 and none of it on 2× H200, run 45); ``cache_bytes`` until then.
    #: None: no such cache.
    spill_bytes: int | None = None

    #: asyncgpu's `inc_loop` over ``spill_bytes`` or more spills the cache only while memory bounds it: up to this
    #: many passes. Past them its arithmetic takes longer than its traffic, and its pair costs what a kernel's does
    #: (run 60, 2× H100: 1,000 and 1,500 passes over 40 MB given the spilling cut read +0.55 to +0.63 µs; their
    #: raw excess was the kernel's; 50 passes, memory-bound, took the spilling cut within 0.25 µs). Measured per
    #: device by its first clock calibration (CUDA: `memory_bound_passes`); None: not measured, every pass count
    #: counts as spilling.
    memory_bound_passes: int | None = None

    #: The kernels the backend launches by itself (engine primers, clock calibration), by the names `prepare`
    #: takes: what ``await device.prepare()`` loads besides the built-in workloads.
    own_kernels: tuple[str, ...] = ()

    def make_current(self) -> None:  # noqa: B027 - optional: host devices have no context
        """Make this device current in the calling thread (CUDA: its primary context, as cuda.core needs in every
        thread that uses a device). Cheap when it already is; the device's worker thread calls it before each job."""

    @abstractmethod
    def create_stream(self) -> Any: ...

    @abstractmethod
    def adopt_stream(self, obj: Any) -> Any:
        """Wrap a foreign stream (an object with ``__cuda_stream__``, or a backend stream)."""

    @abstractmethod
    def stream_handle(self, raw_stream: Any) -> int:
        """An integer identifying the stream (the ``cudaStream_t`` address on CUDA)."""

    @abstractmethod
    def create_event(self, timing: bool) -> Any: ...

    @abstractmethod
    def destroy_event(self, raw_event: Any) -> None: ...

    @abstractmethod
    def record(self, raw_event: Any, raw_stream: Any) -> None:
        """Hot. Enqueue ``raw_event`` on ``raw_stream`` (re-recording an event that is complete)."""

    @abstractmethod
    def mark(self, raw_event: Any) -> int:
        """Record ``raw_event`` at the present moment of the device's clock (on an internal idle stream).
        Returns the key (stream handle) it was recorded on. Scopes use marks as their start and end."""

    @abstractmethod
    def query(self, raw_event: Any) -> bool:
        """Hot. True once the stream passed the event. Raises `BackendError` on a device error."""

    @abstractmethod
    def sync_event(self, raw_event: Any) -> None:
        """Block the calling thread, GIL released, until the event completes."""

    @abstractmethod
    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two completed timing events of this device."""

    def elapsed_since_ms(self, start: Any, ends: Sequence[Any]) -> np.ndarray:
        """`elapsed_ms` from ``start`` to each of ``ends`` (float64 ms): a harvest's batch, one call a backend may
        make cheaper than ``len(ends)`` calls. Raises `NotReadyError` if any is pending."""
        elapsed = self.elapsed_ms
        return np.fromiter((elapsed(start, end) for end in ends), np.float64, len(ends))

    @abstractmethod
    def wait_event(self, raw_stream: Any, raw_event: Any) -> None:
        """Make ``raw_stream`` wait (on the device, no host wait) for ``raw_event``."""

    def hold(self, raw_stream: Any, watched: bool = False) -> Any:
        """Enqueue a device-side wait on ``raw_stream`` that only `release` ends: what follows starts on the
        device once the host has enqueued all of it (a timing bracket then never counts the host's submission
        time on an idle stream). ``watched``: the hold spans one launch, and the backend ends it if it stays open
        far longer (its thread stuck in a driver call that waits for the device: the CUDA backend's watchdog).
        Returns a token for `release`, or None where there is no such wait (the host backend; a device without
        stream memory operations). Any thread; never blocks."""
        return None

    def hold_problem(self) -> str | None:
        """Why `hold` enqueues nothing on this device (None: it holds, or has no need to)."""
        return None

    def prime(self, raw_stream: Any, engine: str) -> None:  # noqa: B027 - optional: hosts have no engines
        """Enqueue a tiny untimed operation on ``engine`` (``"compute"``, ``"copy"`` to the host, or ``"copy_d2d"``
        between device buffers: `asyncgpu._runtime.hooks.engine_of`) of ``raw_stream``, so that
        the next event record runs behind that engine. On CUDA a record runs behind the engine of the stream's
        previous operation: a bracket's start recorded right after a compute<->copy switch completes ~5 µs before
        its work starts (``asyncgpu._runtime.hooks.launch_now`` primes at switches). Takes one launch slot; any
        thread; never blocks (but for the driver's full queue, as a launch)."""

    def stream_idle(self, raw_stream: Any) -> bool:
        """Whether everything enqueued on ``raw_stream`` has run (a snapshot). Any thread; never blocks."""
        return True

    def own_streams(self) -> list[tuple[int, int]]:
        """The streams only asyncgpu's own work runs on (the clock's calibration, the marks), as ``(context
        handle, stream handle)``: a profiler's records of work on them are not the user's. Any thread; never
        blocks."""
        return []

    def progressed(self, token: Any) -> None:  # noqa: B027 - optional: paired with a watched `hold`
        """Say that the thread that made the watched hold ``token`` got one step further in enqueuing what the
        hold spans (a record, the work): a thread that goes on, however slowly (it waits for the GIL behind
        another Python thread at each driver call), is not stuck, and its hold is not ended early. The launching
        thread; never blocks."""

    def release(self, token: Any) -> None:  # noqa: B027 - optional: paired with `hold`
        """End the wait `hold` enqueued (also any earlier one of that stream). Never raises, never blocks."""

    @abstractmethod
    def sync_stream(self, raw_stream: Any) -> None: ...

    @abstractmethod
    def sync_device(self) -> None:
        """Block until all work on every stream of this device is done."""

    @abstractmethod
    def close_stream(self, raw_stream: Any) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing of their own
        """Release what the backend device holds itself (after the worker closed its streams)."""

    @abstractmethod
    def launch(self, raw_stream: Any, kernel: Any, config: Any, args: tuple) -> None:
        """Enqueue a kernel (CUDA: a cuda.core Kernel and LaunchConfig; host: a callable, config None)."""

    # Built-in workloads (``asyncgpu.workloads``): each enqueues on ``raw_stream`` and returns at once.
    @abstractmethod
    def alloc(self, n: int, dtype: Any, raw_stream: Any) -> Any: ...

    @abstractmethod
    def alloc_pinned(self, n: int, dtype: Any) -> Any:
        """A numpy array in page-locked host memory (resident host memory on the host backend), made with
        `pinned_array`: a block of `slow_pinned_bytes` or more is freed through `free_elsewhere`."""

    def prepare(self, workload: str) -> None:  # noqa: B027 - optional: nothing to load on most backends
        """Load what the built-in ``workload`` (``"spin"``, ``"inc_loop"``, ``"inc_loop_profiled"``, or one of
        `own_kernels`) needs (compile, module load), so that the first timed call does not count that host time
        as device time."""

    def is_prepared(self, what: Any) -> bool:
        """Whether `prepare` (``what`` a workload name) or `prepare_kernel` (a kernel) has nothing left to do: no
        compile, no module load. Cheap; any thread."""
        return True

    def prepare_kernel(self, kernel: Any) -> None:  # noqa: B027 - optional: nothing to load on most backends
        """Load ``kernel`` (what `launch` takes) into this device now, so that its first launch does not load it
        inside a timing bracket (CUDA loads modules lazily, at the first launch, by default). Called before every
        user launch: repeated calls must be cheap."""

    @abstractmethod
    def spin(self, raw_stream: Any, duration_ns: int) -> None: ...

    @abstractmethod
    def inc_loop(self, raw_stream: Any, array: Any, n: int, iterations: int) -> None: ...

    @abstractmethod
    def memset(self, raw_stream: Any, array: Any, nbytes: int, byte: int) -> None: ...

    @abstractmethod
    def copy_to_host(self, raw_stream: Any, array: Any, host: Any, nbytes: int) -> None: ...

    @abstractmethod
    def copy(self, raw_stream: Any, dst: Any, src: Any, nbytes: int) -> None:
        """Device-to-device copy, also from another device of the same backend (peer to peer)."""

    @abstractmethod
    def to_numpy(self, array: Any, n: int, dtype: Any) -> Any:
        """Synchronous copy of a device array to a new numpy array (tests and examples)."""

    # Clocks (`asyncgpu._clock`). Host times are ``time.perf_counter_ns()``.
    @abstractmethod
    def calibrate_events(self, raw_events: list, timeout_ns: int) -> Any:
        """Record each timing event at a host-bracketed instant; returns an int64 array ``(n, 2)`` of host
        times ``[h0, h1]`` between which each event's timestamp lies. Blocks (at most ``timeout_ns``, then
        raises `ClockError`)."""

    def calibrate_globaltimer(self, n: int, timeout_ns: int, raw_event: Any = None) -> Any:
        """``n`` host-bracketed readings of the device's ``%globaltimer``: ``(samples, exit)`` where samples is
        an int64 array ``(n, 3)`` of ``[stamp, h0, h1]``, and exit is ``(stamp, h2)``: the kernel's last stamp
        and, if ``raw_event`` was given (recorded right after the kernel), the host time at which the host saw
        the device pass that event (None otherwise). Returns None when the device has no such clock (host)."""
        return None

    def bracket_overhead(self) -> tuple[dict[str, float], str]:
        """What a pair of timing events adds to the time of the work it brackets on the device (launch and
        completion latency), in ns per kind of work (``"kernel"``, and where measured ``"memset"``,
        ``"memcpy"``), and how it was measured (a few words for reports); ``({}, "")`` where it cannot be told
        apart (the host backend)."""
        return {}, ""

    def memory_info(self) -> tuple[int, int] | None:
        """``(free, total)`` bytes of the memory this device's allocations come from, or None if unknown."""
        return None

    def workload_shape(self, workload: str, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
        """``(grid, block)`` with which the built-in ``workload`` (``"spin"``, ``"inc_loop"``) runs on ``n``
        elements, or None where there is no launch grid (the host backend)."""
        return None

    def profiler_start(self) -> None:  # noqa: B027 - optional: no profiler to drive on most backends
        """Start a profiler capture range (``cuProfilerStart``)."""

    def profiler_stop(self) -> None:  # noqa: B027
        """End a profiler capture range (``cuProfilerStop``)."""

    # -- graphs (asyncgpu._graph) -------------------------------------------------------------------------
    # A capture turns what is enqueued on one stream into a graph: `begin_capture`, the work (and a
    # `record_in_capture` per event-record node), then `end_capture` (or `abort_capture`). A raw graph is
    # launched as often as wanted until `destroy_graph`. Begin and end a capture in one thread.
    @abstractmethod
    def begin_capture(self, raw_stream: Any) -> None:
        """From now on, work enqueued on ``raw_stream`` (from any thread) is stored in a graph, not run."""

    @abstractmethod
    def record_in_capture(self, raw_event: Any, raw_stream: Any) -> None:
        """Add a node to the capture of ``raw_stream`` that records ``raw_event`` on every replay."""

    @abstractmethod
    def end_capture(self, raw_stream: Any) -> Any:
        """End the capture; returns the graph, ready to launch. `BackendError` if the capture was invalidated."""

    @abstractmethod
    def abort_capture(self, raw_stream: Any) -> None:
        """End the capture and discard what it holds. Never raises."""

    @abstractmethod
    def graph_event_nodes(self, raw_graph: Any, raw_events: list) -> list:
        """The event-record node that records each of ``raw_events`` (as given to `record_in_capture`), in the
        order of ``raw_events``."""

    @abstractmethod
    def set_graph_events(self, raw_graph: Any, nodes: list, raw_events: list) -> None:
        """Make each node record the matching event from the next launch on (launches already enqueued keep
        the events they had)."""

    @abstractmethod
    def launch_graph(self, raw_graph: Any, raw_stream: Any) -> None:
        """Enqueue one replay of the graph on ``raw_stream``."""

    @abstractmethod
    def destroy_graph(self, raw_graph: Any) -> None:
        """Free the graph (a replay in flight still completes)."""

    # -- in-kernel records --
    # `asyncgpu._kprofile` arms a record buffer (zeroed, then its header written, in stream order), launches
    # the instrumented built-in inc_loop on it, and copies it back with `copy_to_host`.
    @abstractmethod
    def write_words32(self, raw_stream: Any, array: Any, values: Any) -> None:
        """Enqueue on ``raw_stream``: write the uint32 ``values`` (read now, at the call) to the start of
        ``array``, after the work already enqueued there."""

    @abstractmethod
    def inc_loop_profiled_blocks(self, n: int) -> int:
        """How many blocks (record lanes, one group each) `inc_loop_profiled` uses for ``n`` elements."""

    @abstractmethod
    def inc_loop_profiled(self, raw_stream: Any, array: Any, n: int, iterations: int, records: Any) -> None:
        """Enqueue the built-in inc_loop with in-kernel records into ``records`` (a buffer armed for
        ``inc_loop_profiled_blocks(n)`` blocks and one group): stages 0 load, 1 add, 2 store per block."""


class Backend(ABC):
    name: str

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """Whether devices can be opened, and why not. Probes once; never hangs without a driver."""

    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def open_device(self, index: int) -> BackendDevice: ...

    def end_open_holds(self) -> list[str]:
        """End every hold still open (a stream left waiting on its host word: every later call on that GPU would
        wait behind it) and say which, one line each; [] when none. Backends without holds have none. Any thread."""
        return []


class PinnedBlock:
    """The owner of a pinned host block behind the numpy arrays that view it (`pinned_array`). When the last view
    goes, ``resource`` (the object whose last reference frees the block) is handed to ``free_elsewhere`` (the
    device's worker thread: unpinning a large block holds a thread for milliseconds, and a finalizer runs in
    whichever thread drops the last view, often an event loop's); without one, or when it declines, the block
    is freed right here."""

    __slots__ = ("resource", "free_elsewhere")

    def __init__(self, resource: Any, free_elsewhere: Callable[[list], bool] | None) -> None:
        self.resource = resource
        self.free_elsewhere = free_elsewhere

    def __del__(self) -> None:
        holder = [self.resource]  # (the only reference left: whoever empties it frees the block)
        self.resource = None
        hand = self.free_elsewhere
        if hand is not None and holder[0] is not None:
            try:
                hand(holder)
            except Exception:  # noqa: BLE001 - a finalizer must not raise: the block is freed here instead
                pass


def pinned_array(
    resource: Any, address: int, nbytes: int, n: int, dtype: Any, free_elsewhere: Callable[[list], bool] | None
) -> np.ndarray:
    """A numpy array of ``n`` elements of ``dtype`` over the ``nbytes`` at ``address``, which ``resource`` holds
    (its last reference frees them): kept alive by the array and its views through a `PinnedBlock`."""
    view = (ctypes.c_char * max(nbytes, 1)).from_address(address)
    view._asyncgpu_owner = PinnedBlock(resource, free_elsewhere)  # type: ignore[attr-defined]
    return np.frombuffer(memoryview(view), dtype=dtype, count=n)
