"""`Stream`: an in-order queue of work on one device, and the built-in workloads launched on it.

Every launch through a `Stream` (the built-in workloads and `launch`) goes through `asyncgpu._runtime.hooks.launch`:
the installed observers (an open `gpu_timer` scope covering the stream's device, the kernel history) record it
(two pooled events, no host wait).

CUDA streams speak ``__cuda_stream__`` both ways: hand one to PyTorch (``torch.cuda.ExternalStream``), CuPy
(``cupy.cuda.ExternalStream``) or cuda.core, or adopt theirs with `Device.adopt_stream`.

Threads: a stream may be used from any thread; launches from several threads onto one stream are ordered as
they reach the backend. A stream of a closed worker raises `ClosedError`; `sync` warns
(`BlockingCallWarning`) in an event loop's thread.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING, Any, final

import numpy as np

from asyncgpu._base.checks import number, whole
from asyncgpu._base.errors import DeviceMismatchError, QueueFullError
from asyncgpu._runtime import hooks, loops
from asyncgpu._runtime.engine import WaitFor
from asyncgpu._runtime.event import Event, raw_of
from asyncgpu._runtime.hooks import QUEUE_BOUND, QUEUE_LIMIT, check_queue
from asyncgpu._runtime.hooks import launch as run_timed
from asyncgpu._runtime.memory import DeviceArray
from asyncgpu._runtime.waiting import await_completion

if TYPE_CHECKING:
    from asyncgpu._backends.contract import BackendDevice
    from asyncgpu._runtime.device import Device
    from asyncgpu._runtime.graph import GraphCapture
    from asyncgpu._runtime.hooks import CaptureHook
    from asyncgpu._runtime.internal import DeviceInternal

__all__ = ["ALL_WORK", "MAX_ITERATIONS", "QUEUE_BOUND", "QUEUE_LIMIT", "SEQ_BITS", "Stream", "StreamInternal"]

#: A stream's record numbers (``seqs``) start at its own multiple of ``1 << SEQ_BITS``: ``seq >> SEQ_BITS`` names
#: the `Stream` object for the life of the process (a CUDA handle may be reused after a close), 0 names no stream.
SEQ_BITS = 40
_STREAM_IDS = itertools.count(1)

_MAX_SPIN_US = 9.2e15  # the spin's duration in ns is a 64-bit integer on the device
MAX_ITERATIONS = (1 << 31) - 1  #: the most iterations of the built-in inc_loop (an int32 in the CUDA kernel)

CHECK_EVERY = 64  #: a stream records a checkpoint (a non-timing event) after this many launches
#: Work, waits and timed blocks enqueued through asyncgpu on every stream of the process so far (`StreamInternal.work`
#: summed, in one place: ``ALL_WORK[0]``): a step timer's entry reads this one number to see that nothing was enqueued
#: anywhere since the previous step's exit, where reading each of its streams' `work` costs a loop that the step's
#: own work has left cold (`asyncgpu._timing.steps`). Its ``+=`` runs under the GIL with no call between the read
#: and the write, so it never loses a count.
ALL_WORK = [0]


@final
class _Check:
    """A checkpoint on a stream: a non-timing event recorded after its ``ops``-th launch."""

    __slots__ = ("_raw", "_key", "_seq", "ops", "waiters")  # (`_raw`, `_key`, `_seq`: a wait's owner, as an `Event`)

    def __init__(self, raw: Any, key: int, seq: int, ops: int) -> None:
        self._raw, self._key, self._seq, self.ops, self.waiters = raw, key, seq, ops, 0


@final
class StreamInternal:
    """The library's side of one `Stream` (``stream._internal``), with plain names: its backend stream, record
    numbers, launch counts and checkpoints, the capture hook and the launch path's state. Holds the device's
    `DeviceInternal` (``dev``), not the `Device`."""

    __slots__ = (
        "key",
        "label",
        "dev",
        "bd",
        "raw",
        "owned",
        "seqs",
        "tag",
        "capture_hook",
        "held",
        "spills",
        "last_kind",
        "ops",
        "work",
        "next_check",
        "done_ops",
        "checks",
    )

    def __init__(self, dev: DeviceInternal, raw: Any, key: int, label: str, owned: bool) -> None:
        self.key = key  # the stream's handle: the key of its records (`Event`'s ``_key``)
        self.label = label
        self.dev = dev
        self.bd: BackendDevice = dev.bd
        self.raw = raw
        self.owned = owned  # False for an adopted stream (asyncgpu never closes it)
        self.seqs = itertools.count(next(_STREAM_IDS) << SEQ_BITS)  # record numbers, in record order (`SEQ_BITS`)
        self.tag: Any = None
        self.capture_hook: CaptureHook | None = None  # the graph capture in progress on this stream, if any
        self.held = False  # a launch onto it is being held now (`asyncgpu._runtime.hooks.launch_now`)
        #: the memset, copy or `inc_loop` being launched now spills the device's cache behind other work
        #: (`_spills`): its activity loses the calibration's pair overhead for such work (`clock.cut_kind`)
        self.spills = False
        self.last_kind: str | None = None  # the kind of its latest launch through asyncgpu, None if unknown
        self.ops = 0  # launches enqueued through asyncgpu (`counted`, `marked`)
        #: of those, the work, waits and timed blocks (`counted`): not the timing events recorded on their own
        #: (`Device.record`, `Event.record`, a step timer's: `marked`). A step timer's steps chain while it stays put
        #: (`asyncgpu._timing.steps`)
        self.work = 0
        self.next_check = CHECK_EVERY
        self.done_ops = 0  # launches the device is known to have passed (from the checkpoints)
        self.checks: deque[_Check] = deque()

    # -- room in the driver's queue ----------------------------------------------------------------------
    def counted(self, n: int = 1) -> None:
        """``n`` launches of work were just enqueued (the launch path calls this; hot: three adds and a compare)."""
        self.ops += n
        self.work += n
        ALL_WORK[0] += n
        if self.ops >= self.next_check:
            self.checkpoint()

    def marked(self) -> None:
        """A timing event was just recorded on its own: one of the driver's launch slots, and no work (`work`)."""
        self.ops += 1
        if self.ops >= self.next_check:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Record a checkpoint now (every `CHECK_EVERY` launches): what `passed` learns the device has run."""
        self.passed()
        pool = self.dev.plain_pool
        raw = pool.take()
        try:
            self.bd.record(raw, self.raw)
        except BaseException:
            pool.give(raw)
            raise
        self.checks.append(_Check(raw, self.key, next(self.seqs), self.ops))
        self.next_check = self.ops + CHECK_EVERY

    def check_room(self) -> None:
        """Before a launch onto this stream, when asyncgpu's count says `QUEUE_LIMIT` launches are queued (the
        hot paths call this only then, through `hooks.check_queue`): learn what the device has passed, and if the
        stream is still that full, raise `QueueFullError` in an event loop's thread, where the driver would soon
        block the loop until the device drains (for ever behind held work). Nothing has been enqueued or taken
        yet, so nothing is lost: ``await stream.room()`` and launch again. A plain thread (and a Jupyter cell,
        which blocks by design) keeps the driver's behaviour: it blocks once the driver's own queue is full."""
        self.passed()
        queued = self.ops - self.done_ops
        if queued < QUEUE_LIMIT or loops.current()[0] == loops.THREAD or loops.in_jupyter_kernel():
            return
        raise QueueFullError(
            f"{self.dev.name}/{self.label} has {queued} launches queued that the device has not run yet: "
            f"past about 1,000 the driver blocks the launching thread, here an event loop's (for ever if the "
            f"device is held). Nothing was enqueued: `await stream.room()` before launching waits for room without "
            f"blocking the loop (or launch from the device's worker thread: `await device.run(fn)`)"
        )

    def passed(self) -> None:
        """Move `done_ops` up to the newest checkpoint the device has passed; give their events back."""
        checks, query, pool = self.checks, self.bd.query, self.dev.plain_pool
        while checks and query(checks[0]._raw):
            c = checks.popleft()
            self.done_ops = c.ops
            if not c.waiters:
                pool.give(c._raw)
                c._raw = None

    def queued(self) -> int:
        """Launches enqueued through asyncgpu on this stream that the device may not have run yet (an upper
        bound: it knows of their completion at checkpoints, every `CHECK_EVERY` launches). Never blocks."""
        self.passed()
        return self.ops - self.done_ops

    def release_checks(self) -> None:
        """Give every checkpoint event back (the stream is closing; the device has run or drops its work)."""
        while self.checks:
            c = self.checks.popleft()
            if c._raw is not None:
                self.dev.recycle(c._raw, False, c._key, c._seq)
                c._raw = None

    def check_open(self) -> None:
        """Raise `ClosedError` (naming the fix) once the device's worker is closed."""
        if self.dev.closed:
            raise self.dev.closed_error("this stream")


@final
class Stream:
    """One stream of a device. Get them from `Device.streams`, `Device.create_stream` or `Device.adopt_stream`.

    Holds its label, handle and library side (`StreamInternal`, which holds the device's `DeviceInternal`), not
    the `Device`: `device` reads it from there."""

    __slots__ = ("label", "handle", "_internal")
    label: str
    handle: int
    _internal: StreamInternal

    def __init__(self) -> None:
        raise TypeError("streams come from device.streams, device.create_stream() or device.adopt_stream()")

    @classmethod
    def _create(cls, device: Device, raw: Any, label: str, owned: bool) -> Stream:
        self = object.__new__(cls)
        self.label = label  #: ``s0``, ``s1``… for the worker's streams, ``x0``… for adopted ones
        dev = device._internal
        self.handle = dev.bd.stream_handle(raw)  #: the ``cudaStream_t`` address on CUDA
        self._internal = StreamInternal(dev, raw, self.handle, label, owned)
        return self

    @property
    def device(self) -> Device:
        """The `Device` this stream belongs to (read-only)."""
        return self._internal.dev.device

    async def room(self, launches: int = 1) -> None:
        """Wait until ``launches`` more launches fit on this stream under `QUEUE_BOUND`: the driver queues
        about a thousand per stream and then blocks the launching thread, which in a task is the event loop's.
        Always a checkpoint (a producer that awaits it before each launch lets the loop's other tasks run);
        waits for the device only when the stream is full. Cancellation withdraws the wait. Launches made by
        other libraries on this stream are not counted."""
        si = self._internal
        if si.queued() + launches <= QUEUE_BOUND:
            await loops.checkpoint(*loops.current())
            return
        while si.queued() + launches > QUEUE_BOUND:
            need = si.ops + launches - QUEUE_BOUND
            c = next((c for c in si.checks if c.ops >= need), si.checks[-1])
            c.waiters += 1
            try:
                await await_completion(si.dev.engine, si.bd.query, WaitFor(c._raw, c._key, c._seq, "room", 0, c))
            finally:
                c.waiters -= 1
                if not c.waiters and c not in si.checks and c._raw is not None:
                    si.dev.plain_pool.give(c._raw)
                    c._raw = None

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: ``(0, cudaStream_t address)``. Host streams are not CUDA streams."""
        si = self._internal
        if si.bd.backend != "cuda":
            raise TypeError(f"{self.device.name}'s streams are host threads, not CUDA streams")
        si.check_open()
        return (0, self.handle)

    # -- ordering -----------------------------------------------------------------------------------------
    def record(self, event: Event | None = None, *, timing: bool = True, tag: Any = None) -> Event:
        """Record ``event`` here (or a new pooled one) and return it. See `Device.record`."""
        dev = self._internal.dev
        if event is None:
            return dev.device.record(self, timing=timing, tag=tag)
        if not isinstance(event, Event):
            raise TypeError(f"stream.record() records an asyncgpu Event (device.create_event()), not {event!r}")
        if event._dev is not dev:  # (one `DeviceInternal` per `Device`)
            raise DeviceMismatchError(f"that event belongs to {event.device.name}, this stream to {self.device.name}")
        return event.record(self, tag=tag)

    def wait(self, event: Event) -> None:
        """Make this stream wait, on the device, for ``event`` (also an event of another GPU). No host wait."""
        if not isinstance(event, Event):
            raise TypeError(f"stream.wait() takes an asyncgpu Event, not {type(event).__name__}")
        si = self._internal
        si.check_open()
        if event.device.backend != si.bd.backend:
            raise DeviceMismatchError(
                f"a {si.bd.backend} stream cannot wait on a {event.device.backend} event: wait on the host "
                "with `await event.wait()` instead"
            )
        raw = raw_of(event)
        check_queue(si)
        si.bd.wait_event(si.raw, raw)
        si.counted()

    def sync(self) -> None:
        """Block the calling thread (GIL released) until everything enqueued here has run. In a task:
        ``await stream.record().wait()`` (called from an event loop's thread, this warns: `BlockingCallWarning`)."""
        si = self._internal
        si.check_open()
        loops.warn_blocking("stream.sync()", "`with stream.record() as ev: await ev.wait()`")
        si.bd.sync_stream(si.raw)

    # -- graphs -------------------------------------------------------------------------------------------
    def capture(self) -> GraphCapture:
        """``with stream.capture() as graph:`` captures what is launched on this stream inside the block into
        a `Graph` (a CUDA graph; a list of the submitted work on the host backend) instead of running it;
        ``graph.launch()`` replays it, timing the graph and each captured part in open `gpu_timer` scopes.
        Enter and exit the block in one thread, without ``await`` inside (see `asyncgpu._graph`)."""
        from asyncgpu._runtime.graph import GraphCapture

        self._internal.check_open()
        return GraphCapture(self)

    # -- work ---------------------------------------------------------------------------------------------
    def launch(self, kernel: Any, config: Any, *args: Any, name: str | None = None) -> None:
        """Enqueue a kernel: a cuda.core ``Kernel`` with a ``LaunchConfig`` on CUDA; a callable with
        ``config=None`` on the host backend. Recorded as a ``kernel`` activity called ``name``. A kernel's module
        is loaded before its first launch is bracketed (CUDA loads lazily: the load is host time, not device time)."""
        si = self._internal
        if si.dev.closed:
            si.check_open()
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name is the kernel activity's name: a str, not {name!r}")
        label = name or getattr(kernel, "__name__", None) or "kernel"
        bd = si.bd
        if si.capture_hook is None:  # (a capture times its parts at replay, when the module is loaded)
            bd.prepare_kernel(kernel)
        run_timed(self, label, "kernel", bd.launch, si.raw, kernel, config, args)

    def spin_us(self, duration_us: float) -> None:
        """Busy-wait ``duration_us`` microseconds (a finite number >= 0) on the device (one thread on CUDA, on
        ``%globaltimer``)."""
        duration_ns = int(number("duration_us", duration_us, unit="microseconds", maximum=_MAX_SPIN_US) * 1000)
        si = self._internal
        si.check_open()
        si.bd.prepare("spin")
        run_timed(self, "spin", "kernel", si.bd.spin, si.raw, duration_ns)

    def inc_loop(self, array: DeviceArray, iterations: int) -> None:
        """Warp's ``inc_loop``: add 1.0 to every element of a float32 ``array``, ``iterations`` (a whole number
        >= 0) times."""
        si = self._check_array(array)
        iterations = whole("iterations", iterations, maximum=MAX_ITERATIONS)
        if array.dtype != np.float32:
            raise TypeError(f"inc_loop works on float32 arrays, not {array.dtype}")
        si.bd.prepare("inc_loop")
        # (it reads and writes the whole array: it spills the cache from the size a memset does, while its traffic,
        # not its arithmetic, bounds it: `memory_bound_passes`. A user's kernel touches what its code says, which
        # asyncgpu cannot see: it keeps the kernel's cut)
        bound = si.bd.memory_bound_passes  # (None: not measured, any pass count)
        bounded_by_memory = iterations > 0 and (bound is None or iterations <= bound)
        spills = bounded_by_memory and _spills(si, array.nbytes, si.bd.spill_bytes)
        self._run_flagged(spills, "inc_loop", "kernel", si.bd.inc_loop, si.raw, array.live(), array.size, iterations)

    def memset(self, array: DeviceArray, byte: int = 0) -> None:
        """Set every byte of ``array`` to ``byte`` (0..255)."""
        si = self._check_array(array)
        byte = whole("byte", byte, maximum=255)
        spills = _spills(si, array.nbytes, si.bd.spill_bytes)
        self._run_flagged(spills, "memset", "memset", si.bd.memset, si.raw, array.live(), array.nbytes, byte)

    def copy_to_host(self, array: DeviceArray, out: np.ndarray) -> None:
        """Copy ``array`` into the numpy array ``out`` (page-locked: `Device.alloc_pinned`) asynchronously.
        ``out`` holds the data once an event recorded after this call has completed."""
        si = self._check_array(array)
        if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or out.nbytes < array.nbytes:
            raise ValueError(
                f"out must be a C-contiguous numpy array of at least {array.nbytes} bytes "
                "(make one with device.alloc_pinned(n, dtype))"
            )
        run_timed(self, "copy_to_host", "memcpy", si.bd.copy_to_host, si.raw, array.live(), out, array.nbytes)

    def copy(self, dst: DeviceArray, src: DeviceArray) -> None:
        """Copy ``src`` into ``dst`` (same size in bytes or larger). ``dst`` must be on this stream's device;
        ``src`` may live on another device of the same backend: a peer-to-peer copy (NVLink/PCIe)."""
        si = self._check_array(dst)
        if not isinstance(src, DeviceArray):
            raise TypeError(f"expected an asyncgpu DeviceArray (device.alloc), not {type(src).__name__}")
        if src.device.backend != si.dev.backend:
            raise DeviceMismatchError(
                f"cannot copy from {src.device.name} to {self.device.name}: copy through a "
                "host array (copy_to_host) between backends"
            )
        if dst.nbytes < src.nbytes:
            raise ValueError(f"dst holds {dst.nbytes} bytes, src {src.nbytes}: allocate a large enough dst")
        spills = _spills(si, src.nbytes, si.bd.cache_bytes)
        self._run_flagged(spills, "copy", "memcpy", si.bd.copy, si.raw, dst.live(), src.live(), src.nbytes)

    def _run_flagged(self, spills: bool, name: str, kind: str, fn: Any, *args: Any) -> None:
        """`run_timed`, with the stream saying (`StreamInternal.spills`, `_spills`) while the observers see the
        launch whether it spills the device's cache; the flag is down again after it, however it ends."""
        si = self._internal
        si.spills = spills
        try:
            run_timed(self, name, kind, fn, *args)
        finally:
            si.spills = False

    def _check_array(self, array: DeviceArray) -> StreamInternal:
        si = self._internal
        si.check_open()
        if not isinstance(array, DeviceArray):
            raise TypeError(f"expected an asyncgpu DeviceArray (device.alloc), not {type(array).__name__}")
        if array.device is not si.dev.device:
            raise DeviceMismatchError(
                f"that array lives on {array.device.name}, this stream on {self.device.name}: "
                "allocate it on this device or copy it first"
            )
        return si

    def __repr__(self) -> str:
        return f"<asyncgpu.Stream {self.device.name}/{self.label} handle={self.handle:#x}>"


def _spills(si: StreamInternal, nbytes: int, limit: int | None) -> bool:
    """Whether a memset, `inc_loop` or copy of ``nbytes`` that someone times (`hooks.OBSERVERS`) spills the cache of
    ``si``'s device behind other work on its stream: from ``limit`` bytes on (a memset, an `inc_loop`: the device's
    measured `BackendDevice.spill_bytes`; a copy between device buffers: its `cache_bytes`, the size its calibration
    measured). Onto an idle stream, such work's pair costs what the small kind's does (run 45, `dev/diag_spill.py`:
    idle 160 MB memsets within 0.2 µs of CUPTI with the small kind's cut, on one H100 and 2× H200), so it is not
    flagged. Costs a stream query (~1 µs) when flagged work is timed."""
    return limit is not None and nbytes >= limit and bool(hooks.OBSERVERS) and not si.bd.stream_idle(si.raw)
