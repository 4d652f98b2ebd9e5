"""`benchmark`: time a function on several devices at once, as CuPy's ``cupyx.profiler.benchmark`` does on one.

    def step(stream, x):                  # enqueue the work on `stream` (an asyncgpu Stream)
        with cupy.cuda.ExternalStream(stream.handle, stream.device.index):
            cupy.fft.fft(x[stream.device.index])
    r = asyncgpu.benchmark(step, (xs,), n_repeat=1000, devices=[0, 1])
    print(r)                              # one line per call, CuPy style; rich.print(r) for the table
    r.times_ms                            # (1 + n_devices, n_repeat): the CPU row, then one row per device

The contract of ``fn``: ``fn(stream, *args, **kwargs)`` is called once per device per repeat, with that
device's `Stream` (its default stream, or the stream named in ``devices``); it must enqueue its device work on
that stream. The stream speaks ``__cuda_stream__``: ``torch.cuda.ExternalStream(stream.handle)``,
``cupy.cuda.ExternalStream(stream.handle, stream.device.index)``, ``cuda.core``'s ``Stream.from_handle``. To time
work on a framework's own stream, adopt it (``device.adopt_stream(torch_stream)``) and pass that stream in
``devices``. ``args``/``kwargs`` go to every call: per-device data is looked up through ``stream.device``.

Threads: each device runs in its own thread (``asyncgpu-bench-<device>``), in a copy of the caller's context
(so `gpu_timer` scopes and the kernel history see the launches), with the device current on CUDA (CuPy and
PyTorch allocate there). Thread-local framework state of the caller (``torch.no_grad()``, CuPy's current
stream) does not follow: set it inside ``fn``. `benchmark` blocks the calling thread until the run ends; from
async code, run it with ``anyio.to_thread.run_sync``. All threads end and every event goes back to its pool
before it returns, also on errors.

How a repeat is timed, per device: the stream is held (it waits on the device until the repeat is enqueued, as
`gpu_timer` holds its launches), a pooled timing event is recorded, ``fn`` is called (its host time is measured),
a second event is recorded, and the hold is released. The devices advance in lockstep (every device finishes
repeat ``i`` before any starts ``i + 2``) and each keeps one repeat queued behind the one running, so the device
is rarely idle between repeats, as with ``triton.testing.do_bench``; and thanks to the hold, work shorter than
its own enqueueing (a 10 µs memset) is timed without the host's time between its launches. The GPU time is the
time between the two events (not the launch latency of an idle device, which CuPy's timings, synchronized after
every repeat, include), less what the pair of events itself adds (``subtract_overhead``, as `gpu_timer` does).
The warm-up calls are not timed, and the devices are synchronized after them.

The timing source (``source=``, as `gpu_timer`'s): ``"events"`` (the default) is the above. ``"cupti"``:
each timed call runs under an external correlation id of its own (`asyncgpu._backends.cupti`, the benchmark's
channel), and its GPU time is the span of CUPTI's records of the work it launched on that thread (first start to
last end: kernels, memsets, copies, those of torch or CuPy too), read when the run ends (a CUPTI flush: about
0.1 ms per hundred records); a call CUPTI saw no work for keeps its event time, and `BenchmarkResult.source_note`
says how many. ``max_noise`` judges the event times while the run goes on. ``"auto"``: CUPTI when it can be had,
else events (`BenchmarkResult.source_note` says why).

Stopping: after ``n_repeat`` repeats; after the first repeat that completes past ``max_duration_s`` seconds of
timed repeats; or, with ``max_noise``, once every device's relative standard deviation (std / mean) of the GPU
time is at most ``max_noise`` over at least `NOISE_MIN_REPEATS` repeats (nvbench's criterion; its default is
0.005). The repeat already queued when a stop is decided is completed and kept.

Errors: when ``fn`` raises (in warm-up or in a repeat) or the device fails, every device stops after its
current call and `BenchmarkError` is raised from the original exception, carrying the repeats every device
completed (``exc.result``). Ctrl-C (KeyboardInterrupt) stops the same way, then propagates.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from numbers import Integral, Real
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from asyncgpu._backends import cupti
from asyncgpu._base.errors import BenchmarkError
from asyncgpu._runtime import loops
from asyncgpu._runtime.clock import placement
from asyncgpu._runtime.device import Device
from asyncgpu._runtime.stream import Stream
from asyncgpu._timing.bench_result import BenchmarkResult

__all__ = ["NOISE_MIN_REPEATS", "BenchmarkResult", "benchmark", "parse_devices"]

NOISE_MIN_REPEATS = 10  #: repeats needed before ``max_noise`` may stop a run (nvbench's min-samples default)
PROGRESS_AFTER_S = 1.0  #: a run longer than this shows a progress bar (when attached to a terminal)
_POLL_S = 0.1
_now = time.perf_counter_ns
_ROUTER = cupti.Router(cupti.BENCH)  # external id -> `_Call` of a run timed with CUPTI, until the run ends


# -- running ---------------------------------------------------------------------------------------------------
class _Run:
    """The state the device threads share. Stop decisions are made only in the barrier's action (one thread,
    while the others wait), so every device sees the same decision at the same repeat."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        streams: list[Stream],
        n_repeat: int,
        n_warmup: int,
        max_duration_s: float,
        max_noise: float | None,
        cut_ms: list[float],
        source: str,
        source_note: str,
    ) -> None:
        n = len(streams)
        self.fn, self.args, self.kwargs, self.streams = fn, args, kwargs, streams
        self.cut_ms = cut_ms  # per device: what the event pair adds, taken out of each event time
        self.source, self.source_note = source, source_note
        self.calls: list[list[_Call]] = [[] for _ in range(n)]  # per device, per repeat (CUPTI source)
        self.n_repeat, self.n_warmup = n_repeat, n_warmup
        self.max_duration_ns = max_duration_s * 1e9
        self.max_noise = max_noise
        self.barrier = threading.Barrier(n, action=self._on_barrier)
        self.gpu_ms: list[list[float]] = [[] for _ in range(n)]
        self.t0_ns: list[list[int]] = [[] for _ in range(n)]
        self.t1_ns: list[list[int]] = [[] for _ in range(n)]
        self.welford = np.zeros((n, 3))  # count, mean, M2 per device (for max_noise)
        self.count = 0  # repeats complete on every device
        self.started = False
        self.start_ns = self.end_ns = 0
        self.stop_reason: str | None = None
        self.interrupted = False  # set by the caller's thread (Ctrl-C)
        self.failure: tuple[BaseException, str, str] | None = None  # (exception, device, phase): first one wins
        self._failure_lock = threading.Lock()

    def extra_end(self, now_ns: int) -> None:
        """A repeat completed after the run stopped on a failure (`_finish`): the timed span ends no earlier."""
        with self._failure_lock:
            self.end_ns = max(self.end_ns, now_ns)

    @property
    def aborting(self) -> bool:
        return self.failure is not None or self.interrupted

    def fail(self, exc: BaseException, device: str, phase: str) -> None:
        with self._failure_lock:
            if self.failure is None:
                self.failure = (exc, device, phase)
        self.barrier.abort()

    def _on_barrier(self) -> None:
        now = _now()
        if not self.started:  # every device is warm: the timed repeats begin
            self.started, self.start_ns, self.end_ns = True, now, now
            if self.interrupted:
                self.stop_reason = "interrupted"
            return
        self.end_ns = now
        i = self.count
        self.count = i + 1
        if self.max_noise is not None:
            w = self.welford
            x = np.array([g[i] for g in self.gpu_ms])
            w[:, 0] += 1
            delta = x - w[:, 1]
            w[:, 1] += delta / w[:, 0]
            w[:, 2] += delta * (x - w[:, 1])
        if self.stop_reason is not None:
            return
        if self.interrupted:
            self.stop_reason = "interrupted"
        elif self.count >= self.n_repeat:
            self.stop_reason = "n_repeat"
        elif now - self.start_ns >= self.max_duration_ns:
            self.stop_reason = "max_duration"
        elif self.max_noise is not None and self.count >= NOISE_MIN_REPEATS:
            w = self.welford
            with np.errstate(divide="ignore", invalid="ignore"):
                rsd = np.sqrt(w[:, 2] / w[:, 0]) / w[:, 1]
            if np.all(rsd <= self.max_noise):
                self.stop_reason = "max_noise"


def _worker(run: _Run, k: int) -> None:
    """One device's thread: warm-up, then the timed repeats in lockstep with the other devices."""
    stream = run.streams[k]
    dev = stream.device
    fn, args, kwargs = run.fn, run.args, run.kwargs
    phase = "warm-up"
    events: list[Any] = []
    try:
        dev._internal.make_current()  # CUDA: make the device current in this thread
        for _ in range(run.n_warmup):
            if run.aborting:
                break
            fn(stream, *args, **kwargs)
        if run.n_warmup and not run.aborting:
            with dev.record(stream) as warm:
                warm.wait_sync()
        events = [dev.create_event() for _ in range(4)]
        pairs = ((events[0], events[1]), (events[2], events[3]))
        gpu_ms, t0s, t1s, cut_ms = run.gpu_ms[k], run.t0_ns[k], run.t1_ns[k], run.cut_ms[k]
        calls = run.calls[k] if run.source == "cupti" else None
        run.barrier.wait()  # every device is warm
        i, inflight = 0, None
        while True:
            issued = None
            if i < run.n_repeat and run.stop_reason is None:
                phase = f"repeat {i}"
                start, end = pairs[i & 1]
                held = dev._internal.hold(stream)  # the device starts the repeat once it is all enqueued
                try:
                    start.record(stream)
                    if calls is None:
                        t0 = _now()
                        fn(stream, *args, **kwargs)
                        t1 = _now()
                    else:  # what this thread launches in the call carries the call's id
                        call = _Call()
                        calls.append(call)
                        cupti.push(call.ext, cupti.BENCH)
                        try:
                            t0 = _now()
                            fn(stream, *args, **kwargs)
                            t1 = _now()
                        finally:
                            cupti.pop(cupti.BENCH)
                    end.record(stream)
                except BaseException:
                    if inflight is not None:  # the previous call returned: its repeat is kept (`_finish`)
                        _finish(run, k, inflight)
                    raise
                finally:
                    if held is not None:
                        dev._internal.release(held)
                t0s.append(t0)
                t1s.append(t1)
                issued = (start, end)
                i += 1
            if inflight is not None:
                phase = f"repeat {len(gpu_ms)}"
                _time(inflight, gpu_ms, cut_ms)
                try:
                    run.barrier.wait()  # its action counts the repeat and decides whether to stop
                except threading.BrokenBarrierError:
                    # A failure on another device can break the barrier after it tripped, before this thread
                    # woke up (threading.Barrier then raises here too): the repeat it counted means every call
                    # of the one issued since returned, so that one is timed as `_finish` times it.
                    if issued is not None and run.count >= len(gpu_ms):
                        _finish(run, k, issued)
                    raise
            elif issued is None:
                break
            inflight = issued
    except threading.BrokenBarrierError:
        pass  # another device failed, or the caller was interrupted
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which re-raises it
        run.fail(exc, dev.name, phase)
    finally:
        for ev in events:
            ev.release()


def _time(pair: tuple[Any, Any], gpu_ms: list[float], cut_ms: float) -> None:
    """Wait for a repeat's end event and append its GPU time (less ``cut_ms``, as `Placement.trim`: never below
    zero) to ``gpu_ms``."""
    start, end = pair
    end.wait_sync()
    elapsed_ms = end - start
    gpu_ms.append(elapsed_ms - min(elapsed_ms, cut_ms))


def _finish(run: _Run, k: int, pair: tuple[Any, Any]) -> None:
    """Device ``k``'s call of the next repeat failed: time the repeat still in flight (its call returned, and so
    did every other device's, which time theirs before they find the run stopped), so that the partial result
    keeps every repeat whose calls all returned. A device that fails here keeps what it has."""
    try:
        _time(pair, run.gpu_ms[k], run.cut_ms[k])
    except Exception:  # noqa: BLE001 - the device failed too: the call's own exception is the one to report
        return
    run.extra_end(_now())


def _targets(devices: Any) -> list[Stream]:
    """One stream per device: each `Stream` given, or the default stream of each device spec."""
    from asyncgpu._runtime.select import device as open_device
    from asyncgpu._runtime.select import resolve_devices

    if devices is None:
        return [d.stream for d in resolve_devices(None)]
    items = [devices] if isinstance(devices, (Stream, Device, Integral, str)) else list(devices)
    out: list[Stream] = []
    for item in items:
        s = item if isinstance(item, Stream) else open_device(item).stream
        s._internal.dev.check_open()
        if any(o.device is s.device for o in out):
            raise ValueError(
                f"{s.device.name} is given twice: benchmark times one stream per device (pass one of "
                f"its streams, or the device)"
            )
        out.append(s)
    if not out:
        raise ValueError("benchmark needs at least one device")
    return out


def parse_devices(spec: str | None, backend: str | None = None) -> list[Device]:
    """Devices from a command-line list (the CLI and the magics): ``"0,1"``, ``"cuda:0,cuda:1"``,
    ``"host:0,host:1"``; None: every device of ``backend`` (default: `asyncgpu.default_backend`)."""
    from asyncgpu._runtime.select import device, devices

    if spec is None:
        return devices(backend)
    items = [x.strip() for x in spec.split(",") if x.strip()]
    if not items:
        raise ValueError(f"no device in {spec!r}: give indices or names, e.g. 0,1 or host:0,host:1")
    return [device(int(x) if x.isdigit() else x, backend=backend) for x in items]


class _Call:
    """One timed call of a CUPTI-timed run: its external id and the records routed to it (`cupti.Router`)."""

    __slots__ = ("ext", "cupti")

    def __init__(self) -> None:
        self.cupti: list | None = None
        self.ext = _ROUTER.tag(self)


def _check(
    fn: Any,
    args: Any,
    kwargs: Any,
    n_repeat: Any,
    n_warmup: Any,
    max_duration_s: Any,
    max_noise: Any,
    source: Any,
) -> tuple[tuple, dict]:
    if not callable(fn):
        raise TypeError(f"benchmark() times a callable fn(stream, *args, **kwargs), not {type(fn).__name__}")
    if isinstance(args, (str, bytes)) or not isinstance(args, Iterable):
        raise TypeError(f"args must be a tuple of positional arguments for fn, not {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping of keyword arguments for fn, not {type(kwargs).__name__}")
    if isinstance(n_repeat, bool) or not isinstance(n_repeat, Integral) or n_repeat < 1:
        raise ValueError(f"n_repeat must be a whole number >= 1, got {n_repeat!r}")
    if isinstance(n_warmup, bool) or not isinstance(n_warmup, Integral) or n_warmup < 0:
        raise ValueError(f"n_warmup must be a whole number >= 0, got {n_warmup!r}")
    # numbers.Real's stubs declare only < and <= (>= and > work through the reflected operators): ignore[operator]
    if isinstance(max_duration_s, bool) or not isinstance(max_duration_s, Real) or not max_duration_s >= 0:  # type: ignore[operator]
        raise ValueError(f"max_duration_s is in seconds and must be >= 0 (math.inf: no limit), got {max_duration_s!r}")
    if max_noise is not None and (
        isinstance(max_noise, bool) or not isinstance(max_noise, Real) or not 0 < max_noise < math.inf  # type: ignore[operator]
    ):
        raise ValueError(
            f"max_noise is a relative standard deviation (0.005 = 0.5%) and must be > 0, got {max_noise!r}"
        )
    cupti.check_source(source)
    return tuple(args), dict(kwargs or {})


def benchmark(
    fn: Callable[..., Any],
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    n_repeat: int = 10000,
    n_warmup: int = 10,
    max_duration_s: float = math.inf,
    devices: Any = None,
    max_noise: float | None = None,
    name: str | None = None,
    progress: bool | None = None,
    source: str = "events",
    subtract_overhead: bool = True,
) -> BenchmarkResult:
    """Time ``fn(stream, *args, **kwargs)`` on every device of ``devices`` at once; see the module docstring
    for the contract, the threads and how repeats are timed.

    ``devices``: like `gpu_timer`'s (default: every device of the default backend), or asyncgpu `Stream` s to
    run on (one per device). ``n_repeat`` timed repeats (>= 1) after ``n_warmup`` untimed calls per device;
    ``max_duration_s`` in seconds of timed repeats; ``max_noise``:
    stop once every device's relative std is at most this (0.005 = 0.5%). ``progress``: a rich progress bar on
    stderr: ``None`` shows it on runs longer than `PROGRESS_AFTER_S` when stderr is a terminal, ``True`` always,
    ``False`` never.

    ``source``: where GPU times come from, as in `gpu_timer`: ``"events"`` (the default), ``"cupti"`` (CUPTI's
    records of each call's work: needs cupti-python, the extra ``asyncgpu[cupti]``, and CUDA devices) or
    ``"auto"`` (CUPTI when it can be had, else events); `BenchmarkResult.source` says which one ran.
    ``subtract_overhead`` (event times, as `gpu_timer`'s): take what the pair of events itself adds out of each
    repeat's time (the device's `DeviceInternal.pair_excess_ns` once a CUPTI scope has taught it, else its measured
    bracket overhead; nothing on the host backend); ``False`` keeps the raw time between
    the events, as CuPy and ``do_bench`` report it.

    Returns a `BenchmarkResult`; raises `BenchmarkError` (with the partial result) when ``fn`` or its device
    fails, ``ValueError``/``TypeError`` for bad arguments, `UnknownDeviceError`/`NoDeviceError` for devices
    that do not exist, `SourceError` naming the fix when ``source="cupti"`` cannot be had. Blocks the calling
    thread (called from an event loop's thread it warns, `BlockingCallWarning`: run it with
    ``anyio.to_thread.run_sync`` there); not a checkpoint.
    """
    loops.warn_blocking("benchmark()", "`await anyio.to_thread.run_sync(lambda: asyncgpu.benchmark(...))`")
    args, kwargs = _check(fn, args, kwargs, n_repeat, n_warmup, max_duration_s, max_noise, source)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name is the benchmark's name in its report: a str (or None: fn's name), not {name!r}")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress is True, False or None (a bar on long runs in a terminal), not {progress!r}")
    streams = _targets(devices)
    label = name or getattr(fn, "__name__", None) or type(fn).__name__
    cut_ms = [placement(s.device, subtract_overhead=bool(subtract_overhead)).overhead_ns / 1e6 for s in streams]
    used, note = cupti.choose(source, [s.device for s in streams], cupti.BENCH, "this benchmark")
    try:
        run = _Run(
            fn,
            args,
            kwargs,
            streams,
            int(n_repeat),
            int(n_warmup),
            float(max_duration_s),
            None if max_noise is None else float(max_noise),
            cut_ms,
            used,
            note,
        )
        try:
            return _execute(run, label, progress)
        finally:
            for calls in run.calls:
                for call in calls:
                    _ROUTER.untag(call.ext)
    finally:
        if used == "cupti":
            cupti.release(cupti.BENCH)


def _execute(run: _Run, label: str, progress: bool | None) -> BenchmarkResult:
    """Run the device threads to the end (also on errors and Ctrl-C) and make the result."""
    streams = run.streams
    threads = [
        threading.Thread(
            target=contextvars.copy_context().run,
            args=(_worker, run, k),
            daemon=True,
            name=f"asyncgpu-bench-{s.device.name}",
        )
        for k, s in enumerate(streams)
    ]
    bar = _Progress(run, label, progress)
    try:
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(_POLL_S)
                    bar.update()
        except BaseException:  # Ctrl-C in this thread: stop the devices cleanly, then let it go on
            run.interrupted = True
            for t in threads:
                t.join()
            raise
    finally:
        bar.close()
    result = _result(run, label)
    if run.failure is not None:
        exc, dev, phase = run.failure
        if not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt, SystemExit raised inside fn
        raise BenchmarkError(
            f"{label} raised {type(exc).__name__}: {exc} (on {dev}, in {phase}); "
            f"{result.n_repeat} complete repeat(s) are in this error's .result",
            result,
            dev,
            phase,
        ) from exc
    return result


def _result(run: _Run, label: str) -> BenchmarkResult:
    # After a failure, the repeat in flight when a call raised was timed on every device (`_finish`): it counts.
    n = min(len(g) for g in run.gpu_ms) if run.failure is not None else run.count
    gpu = np.array([g[:n] for g in run.gpu_ms], np.float64).reshape(len(run.streams), n)
    t0 = np.array([t[:n] for t in run.t0_ns], np.int64).reshape(len(run.streams), n)
    t1 = np.array([t[:n] for t in run.t1_ns], np.int64).reshape(len(run.streams), n)
    cpu = (t1.max(axis=0) - t0.min(axis=0)) / 1e6 if n else np.zeros(0)
    reason = "error" if run.failure is not None else (run.stop_reason or "interrupted")
    source, note = run.source, run.source_note
    if source == "cupti":
        source, note = _cupti_times(run, gpu)
    return BenchmarkResult(
        label,
        tuple(s.device.name for s in run.streams),
        cpu,
        gpu,
        run.n_warmup,
        reason,
        (run.end_ns - run.start_ns) / 1e9,
        tuple(s.label for s in run.streams),
        source,
        note,
    )


def _cupti_times(run: _Run, gpu: np.ndarray) -> tuple[str, str]:
    """Put CUPTI's span of each complete call's work in ``gpu`` (ms, in place) where CUPTI saw it; flushes CUPTI
    (blocks). Returns the source and its note."""
    _offset_ns, failed = _ROUTER.collect()  # (durations only: no placement)
    if failed:
        return "events", failed
    missing = 0
    for k, calls in enumerate(run.calls):
        for i, call in enumerate(calls[: gpu.shape[1]]):
            seen = cupti.span(call.cupti or ())
            if seen is None:
                missing += 1
            else:
                gpu[k, i] = (seen[1] - seen[0]) / 1e6
    note = f"CUPTI saw no work for {missing} calls: their event times are kept" if missing else ""
    return "cupti", note


# -- progress --------------------------------------------------------------------------------------------------
def _progress_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


class _Progress:
    """A rich progress bar, refreshed by the caller's thread while it waits (no thread of its own)."""

    def __init__(self, run: _Run, label: str, show: bool | None) -> None:
        self.run, self.label, self.show = run, label, show
        self.t0_ns = _now()
        self.bar: Any = None
        self.task: Any = None

    def update(self) -> None:
        if self.show is False:
            return
        if self.bar is None:
            if self.show is None and (_now() - self.t0_ns < PROGRESS_AFTER_S * 1e9):
                return
            console = _progress_console()
            if self.show is None and not console.is_terminal:
                self.show = False
                return
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[done]}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
                auto_refresh=False,
            )
            self.bar.start()
            self.task = self.bar.add_task(f"benchmark {self.label}", total=1.0, done="warm-up")
        run = self.run
        fraction = run.count / run.n_repeat
        if run.started and math.isfinite(run.max_duration_ns):
            fraction = max(fraction, (_now() - run.start_ns) / max(run.max_duration_ns, 1.0))
        self.bar.update(
            self.task, completed=min(fraction, 1.0), done=f"{run.count:,} repeats" if run.started else "warm-up"
        )
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
