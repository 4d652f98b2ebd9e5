"""`KernelProfiler`: in-kernel records of one device — arm a buffer, hand its pointer to a kernel, collect it,
decode it, and place it on the scope's timeline.

    prof = asyncgpu.KernelProfiler(dev, stages=("load", "compute"), groups=2, capacity=64)
    ptr = prof.arm(grid)                      # zero + header on the stream, before the launch
    dev.stream.launch(kernel, config, ..., ptr, name="my_kernel")   # the kernel includes asyncgpu_profile.cuh
    recs = await prof.collect()               # async copy on the same stream, awaited; decoded with numpy
    print(recs.summary())

Placement: CUDA stamps (``%globaltimer``) go to the host time base through the device's clock calibration
(`Device.clock`); when it cannot be calibrated the records keep relative times and say so (``aligned``,
``time_base``), and the trace marks their tracks. Host-backend records are host stamps already. Each collect
hands a layer to the open ``gpu_timer`` scopes of the calling context that cover the device: the trace then
draws the records on the device's process, under a track named after the kernel, one track per (block, group)
for the first ``max_tracks`` lanes; `read_trace` brings the records back.

Threads: a profiler belongs to one device and may be used from any thread, one call at a time (arm, launch,
collect, in that order, then again). ``await collect()`` is a checkpoint; cancelling it withdraws the wait (the
copy still lands; collect again or arm again). ``collect_sync()`` blocks the calling thread instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence, final

import numpy as np

from asyncgpu._backends.kernels import FORMAT, kernels_dir
from asyncgpu._base.checks import whole
from asyncgpu._base.errors import ClockError, DeviceMismatchError, KernelRecordsError
from asyncgpu._base.layers import Canvas, column, from_column, register_layer
from asyncgpu._runtime import hooks, loops
from asyncgpu._runtime.clock import placement
from asyncgpu._runtime.event import block
from asyncgpu._runtime.memory import DeviceArray
from asyncgpu._runtime.stream import MAX_ITERATIONS
from asyncgpu.kernel.asyncgpu_format import decode
from asyncgpu.kernel.decoding import check_stages
from asyncgpu.kernel.records import KernelRecords

if TYPE_CHECKING:
    from asyncgpu._runtime.device import Device
    from asyncgpu._runtime.stream import Stream

__all__ = ["INC_LOOP_STAGES", "KernelLayer", "KernelProfiler", "include_dir"]

INC_LOOP_STAGES = ("load", "add", "store")
_MAX_U32 = 0xFFFFFFFF
_HOST_FIELDS = 1 + max(FORMAT.HDR_MAGIC, FORMAT.HDR_GROUPS, FORMAT.HDR_LANES, FORMAT.HDR_CAPACITY)  # uint32s


@final
class KernelProfiler:
    """In-kernel records of ``device`` (a `Device`, or a spec such as ``"cuda:0"``): a record buffer for ``groups``
    leaders per block, ``capacity`` records per (block, group); ``stages`` names the stage ids (0, 1, …) the kernel
    uses, each once (None: ``stage0``, ``stage1``…; the built-in `inc_loop`: ``load``, ``add``, ``store``).
    ``max_tracks``: how many (block, group) lanes the trace draws (the first ones). See the module docstring."""

    def __init__(
        self,
        device: Device | Any,
        *,
        stages: Sequence[str] | None = None,
        groups: int = 1,
        capacity: int = 256,
        name: str = "kernel",
        max_tracks: int = 16,
    ) -> None:
        from asyncgpu._runtime.select import device as open_device

        capacity = whole(
            "capacity",
            capacity,
            minimum=1,
            maximum=_MAX_U32,
            hint="records per (block, group); a zero-length lane holds none",
        )
        groups = whole("groups", groups, minimum=1, maximum=_MAX_U32, hint="leaders per block")
        max_tracks = whole("max_tracks", max_tracks)
        if stages is not None and len(stages) == 0:
            raise ValueError(
                "stages=() names no stage: leave it out (stages are then stage0, stage1…) or name each stage id "
                "the kernel uses, in order"
            )
        stages = check_stages(stages or ())
        if not isinstance(name, str):
            raise TypeError(f"name is the kernel's name in records and traces: a str, not {name!r}")
        device = open_device(device)  # (an open Device is returned as it is)
        self.device = device
        self.stages, self.groups, self.capacity = stages, groups, capacity
        self.name, self.max_tracks = name, max_tracks
        self._buf: DeviceArray | None = None
        self._host: np.ndarray | None = None  # pinned copy target, reused
        self._stream: Stream | None = None  # where the buffer was last armed and gathered
        self._words = 0  # words armed
        self._launch = (self.name, self.stages)  # what the armed launch is called, and its stage names
        self._state = "new"  # new, armed, gathering, gathered, closed

    # -- the buffer ---------------------------------------------------------------------------------------------
    @property
    def pointer(self) -> int:
        """The armed buffer's address, for the kernel's ``unsigned long long* records`` argument (a device address
        on CUDA, the host address on the host backend)."""
        return self._armed_buffer().ptr

    @property
    def array(self) -> DeviceArray:
        """The armed buffer (uint64 words). Host-backend kernels write it with `HostLane`."""
        return self._armed_buffer()

    @property
    def nbytes(self) -> int:
        """Bytes of the armed part of the buffer (header and lanes)."""
        return 8 * self._words

    def arm(self, grid: int | Sequence[int], *, stream: Stream | None = None) -> int:
        """Prepare the buffer for one launch of ``grid`` blocks (an int or up to three dimensions): enqueue on
        ``stream`` (default: the device's) a zeroing of the buffer and the writing of its header, allocating a
        larger buffer when needed. Returns `pointer`. Never blocks; arm again before every launch."""
        self.check_open()
        blocks = _blocks(grid)
        lanes = blocks * self.groups
        if lanes > _MAX_U32:
            raise ValueError(f"{blocks} blocks x {self.groups} groups = {lanes} lanes: at most {_MAX_U32}")
        if self._state == "gathering":
            raise KernelRecordsError(
                "a collect() of this profiler is still running: await it before arming again "
                "(or use one profiler per concurrent launch)"
            )
        s = self.device.stream_of(stream)
        prev = self._stream
        if prev is not None and prev is not s:  # the old stream's use of the buffer (a gather's copy) comes first
            with prev.record(timing=False) as done:
                s.wait(done)
        words = FORMAT.words_for(lanes, self.capacity)
        if self._buf is None or self._buf.size < words:
            if self._buf is not None:
                self._buf.free()
            self._buf = self.device.alloc(words, np.uint64, stream=s)
        rt, raw = self.device._internal, self._buf.live()
        rt.memset_raw(s, raw, 8 * words, 0)
        rt.write_words32(s, raw, FORMAT.header(self.groups, lanes, self.capacity)[:_HOST_FIELDS])
        self._stream, self._words, self._state = s, words, "armed"
        self._launch = (self.name, self.stages)
        return self._buf.ptr

    # -- the built-in instrumented workload ----------------------------------------------------------------------
    def inc_loop(self, array: DeviceArray, iterations: int, *, stream: Stream | None = None) -> None:
        """Arm, then launch the built-in ``inc_loop`` with in-kernel records on ``stream``: one lane per block
        (256 elements on CUDA, 65536 on the host backend), stages ``load``, ``add``, ``store`` (unless this
        profiler names its own). Timed as a kernel activity ``inc_loop`` in open scopes. `collect` afterwards."""
        if self.groups != 1:
            raise ValueError("the built-in inc_loop has one leader per block: use KernelProfiler(..., groups=1)")
        iterations = whole("iterations", iterations, maximum=MAX_ITERATIONS)
        if not isinstance(array, DeviceArray):
            raise TypeError(f"expected an asyncgpu DeviceArray (device.alloc), not {type(array).__name__}")
        if array.device is not self.device:
            raise DeviceMismatchError(
                f"that array lives on {array.device.name}, this profiler on {self.device.name}: "
                "use a profiler of the array's device"
            )
        if array.dtype != np.float32:
            raise TypeError(f"inc_loop works on float32 arrays, not {array.dtype}")
        s = self.device.stream_of(stream)
        rt = self.device._internal
        self.arm(rt.inc_loop_profiled_blocks(array.size), stream=s)
        self._launch = (self.name if self.name != "kernel" else "inc_loop", self.stages or INC_LOOP_STAGES)
        rt.prepare_workload("inc_loop_profiled")
        assert self._buf is not None
        hooks.launch(
            s,
            "inc_loop",
            "kernel",
            rt.inc_loop_profiled,
            s._internal.raw,
            array.live(),
            array.size,
            iterations,
            self._buf.live(),
        )

    # -- collecting -----------------------------------------------------------------------------------------------
    async def collect(self, *, strict: bool = True) -> KernelRecords:
        """Copy the buffer back after the work enqueued on its stream (the kernel), await it (the loop keeps
        running), decode and place the records, and hand them to the open scopes covering the device. A
        checkpoint. Raises `KernelRecordsError` (`KernelRecordsOverflowError` for dropped records) as
        `KernelRecords.decode` does; ``strict=False`` keeps the sound records and lists the problems."""
        if self._host is None or self._host.size < self._words:  # (pinned off the loop's thread)
            self.check_open()
            self._host = await self.device.aalloc_pinned(self._words, np.uint64)
        ev = self._start_gather()
        try:
            await ev.wait()
        except BaseException:
            self._state = "armed"
            raise
        finally:
            ev.release()
        return self._finish(strict)

    def collect_sync(self, *, strict: bool = True) -> KernelRecords:
        """`collect`, blocking the calling thread (GIL released while it waits); called from an event loop's
        thread it warns (`BlockingCallWarning`): ``await prof.collect()`` there."""
        loops.warn_blocking("KernelProfiler.collect_sync()", "`await prof.collect()`")
        ev = self._start_gather()
        try:
            block(ev)  # (warned above if this thread runs an event loop)
        except BaseException:
            self._state = "armed"
            raise
        finally:
            ev.release()
        return self._finish(strict)

    def _start_gather(self) -> Any:
        self.check_open()
        if self._state == "gathering":
            raise KernelRecordsError("a collect() of this profiler is already running: await it first")
        if self._state not in ("armed", "gathered"):
            raise KernelRecordsError(
                "nothing to gather: arm() the profiler, launch the kernel with its pointer, then collect()"
            )
        s, buf = self._stream, self._buf
        assert s is not None and buf is not None
        if self._host is None or self._host.size < self._words:
            self._host = self.device.alloc_pinned(self._words, np.uint64)
        self.device._internal.copy_to_host_raw(s, buf.live(), self._host, 8 * self._words)
        self._state = "gathering"
        return s.record(timing=False, tag="kernel records")

    def _finish(self, strict: bool) -> KernelRecords:
        assert self._host is not None
        self._state = "gathered"
        to_host, time_base = self._placement()
        name, stages = self._launch
        recs = decode(
            self._host[: self._words],
            stages,
            strict=strict,
            to_host=to_host,
            time_base=time_base,
            name=name,
            device=self.device.name,
        )
        hooks.attach(self.device, lambda: KernelLayer(recs, self.max_tracks))
        return recs

    def _placement(self) -> tuple[Any, str]:
        """How this device's stamps become host time, and the words that say so."""
        if self.device.backend == "host":
            return (lambda t: np.asarray(t, np.float64)), "host time (host-backend records are perf_counter_ns stamps)"
        place = placement(self.device)
        try:
            place.globaltimer_to_host_ns(0)  # raises ClockError without a %globaltimer calibration
        except ClockError as exc:
            return None, (
                f"relative: ns from the kernel's first stamp ({self.device.name}'s %globaltimer could not "
                f"be aligned to the host clock: {exc})"
            )
        assert place.calibration is not None
        return place.globaltimer_to_host_ns, (
            f"host time (%globaltimer aligned within ±{place.calibration.globaltimer_bound_ns:.0f} ns)"
        )

    # -- lifetime --------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the buffers (the device buffer in stream order, after the work already enqueued). Idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        buf, self._buf, self._host = self._buf, None, None
        if buf is not None and not self.device.closed:
            buf.free()

    def __enter__(self) -> KernelProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_open(self) -> None:
        if self._state == "closed":
            raise KernelRecordsError("this KernelProfiler is closed: make a new one")
        self.device._internal.check_open()

    def _armed_buffer(self) -> DeviceArray:
        if self._buf is None or self._state == "new":
            raise KernelRecordsError("the profiler is not armed: call prof.arm(grid) before the launch")
        return self._buf

    @staticmethod
    def include_dir() -> str:
        """`asyncgpu.kernel.include_dir`."""
        return include_dir()

    def __repr__(self) -> str:
        return (
            f"<asyncgpu.KernelProfiler {self.device.name} {self._state} groups={self.groups} capacity={self.capacity}>"
        )


def include_dir() -> str:
    """The directory holding ``asyncgpu_profile.cuh`` (and its format header): add it to the include path when
    compiling your own kernel (NVRTC ``include_path``, nvcc ``-I``)."""
    return str(kernels_dir())


def _blocks(grid: int | Sequence[int]) -> int:
    what = f"grid must be a block count or up to three dimensions, each a whole number >= 1, not {grid!r}"
    try:
        dims = (grid,) if isinstance(grid, (int, np.integer)) else tuple(grid)
        counts = [whole("grid", d, minimum=1) for d in dims]
    except (TypeError, ValueError) as exc:
        raise type(exc)(what) from None
    if not 1 <= len(counts) <= 3:
        raise ValueError(what)
    return math.prod(counts)


class KernelLayer:
    """The records of one collect as a layer of a timeline's trace (see `asyncgpu._base.layers`): on the device's
    process, a track named after the kernel holding one track per (block, group) for the first ``max_tracks``
    lanes that have records (the first one's name says how many exist), regions as slices (a second track per
    lane where regions overlap without nesting), instants as instant events."""

    kind = "kernel"

    def __init__(self, records: KernelRecords, max_tracks: int) -> None:
        self.records, self.max_tracks = records, max_tracks

    def finish(self) -> KernelLayer:
        """The records are data already: the scope keeps this layer as it is."""
        return self

    def draw(self, timeline: Any, canvas: Canvas) -> None:
        r = self.records
        if r.device not in timeline.devices:
            return
        d = timeline.devices.index(r.device)
        lane_col = r.lane
        inst_col = r.instant_block.astype(np.int64) * r.groups + r.instant_group
        lanes = np.union1d(lane_col, inst_col)
        shown = lanes[: self.max_tracks]
        # Relative records start at the scope's start: never mixed silently with host times (track names say so).
        shift = 0.0 if r.aligned else float(timeline.scope_start_ns)
        tag = "" if r.aligned else " (NOT aligned: relative time)"
        kernel = canvas.track(f"{r.name}{tag}", d)
        for k, lane in enumerate(shown.tolist()):
            block, group = divmod(lane, r.groups)
            label = f"{r.name} b{block} g{group}{tag}"
            if k == 0 and len(lanes) > len(shown):
                label += f" [first {len(shown)} of {len(lanes)} lanes]"
            track = canvas.track(label, d, parent=kernel)
            rows = np.flatnonzero(lane_col == lane)  # (a mask: no assumption on the row order)
            where = {"block": np.full(len(rows), block), "group": np.full(len(rows), group)}
            start = r.start_ns[rows] + shift
            end = np.maximum(r.end_ns[rows] + shift, start)
            args = {**where, "duration_ns": r.duration_ns[rows]}
            canvas.slices(track, r.stages, r.stage[rows], start, end, "kernel_stage", args)
            inst = np.flatnonzero(inst_col == lane)
            where = {"block": np.full(len(inst), block), "group": np.full(len(inst), group)}
            canvas.instants(track, r.stages, r.instant_stage[inst], r.instant_ns[inst] + shift, "kernel_stage", where)

    def to_data(self) -> dict[str, Any]:
        """The records as plain JSON types (`read_trace` makes the layer again with `from_data`)."""
        r = self.records
        head = {k: getattr(r, k) for k in _RECORD_FIELDS}
        cols = {k: column(getattr(r, k)) for k in _RECORD_COLUMNS}
        return {
            "kind": self.kind,
            "max_tracks": self.max_tracks,
            **head,
            "format": r.format,
            "stages": list(r.stages),
            "problems": list(r.problems),
            **cols,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> KernelLayer:
        """The layer `to_data` described."""
        fields: dict[str, Any] = {k: data[k] for k in _RECORD_FIELDS}
        fields |= {k: from_column(data[k], dtype) for k, dtype in _RECORD_COLUMNS.items()}
        records = KernelRecords(
            **fields, fmt=str(data["format"]), stages=tuple(data["stages"]), problems=tuple(data["problems"])
        )
        return cls(records, int(data["max_tracks"]))


_RECORD_FIELDS = ("name", "device", "groups", "blocks", "lanes", "lanes_started", "aligned", "time_base")
_RECORD_COLUMNS = {
    "block": np.int32,
    "group": np.int32,
    "stage": np.int16,
    "start_ns": np.float64,
    "end_ns": np.float64,
    "duration_ns": np.int64,
    "instant_block": np.int32,
    "instant_group": np.int32,
    "instant_stage": np.int16,
    "instant_ns": np.float64,
    "dropped": np.int64,
}
register_layer(KernelLayer.kind, KernelLayer.from_data)
