"""Durations that never count host time: a launch's bracket is held until the work is enqueued (issue 13)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

import asyncgpu
from asyncgpu import gpu_timer
from asyncgpu._runtime import hooks

SLOW_HOST_S = 0.02  # host time spent between the start record and the work's submission


class _SlowSubmitter:
    """An observer installed after the scope's: its ``launch_begin`` runs after the scope recorded the start
    event and before the work is enqueued, as a slow host (Python, a busy GIL) would."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def launch_begin(self, stream, name, kind, fn, args):
        time.sleep(SLOW_HOST_S)
        if self.fail:
            raise RuntimeError("observer failed")
        return None

    def launch_end(self, token, ok):  # never called: launch_begin returns None
        raise AssertionError

    def wanted_kinds(self, device, kinds):
        return frozenset()

    def adopt(self, stream, name, kind, start_raw, end_raw):
        return False

    def attach(self, device, key, make_layer, fence):
        return []


def test_a_launch_on_an_idle_stream_is_timed_without_the_hosts_submission_time(dev):
    slow = _SlowSubmitter()
    with gpu_timer(dev) as t:
        hooks.install(slow)
        try:
            dev.stream.spin_us(2_000)
        finally:
            hooks.uninstall(slow)
    (rec,) = t.records
    # Without the hold the bracket would hold the 20 ms the host took to submit the spin.
    assert 1.9 <= rec.duration_ms < 2.0 + SLOW_HOST_S * 1e3 / 4, rec.duration_ms


def test_a_failed_launch_releases_its_hold(dev):
    slow = _SlowSubmitter(fail=True)
    with gpu_timer(dev) as t:
        hooks.install(slow)
        try:
            with pytest.raises(RuntimeError, match="observer failed"):
                dev.stream.spin_us(10)
        finally:
            hooks.uninstall(slow)
        dev.stream.spin_us(10)  # runs: the stream is not left held
    done = threading.Event()
    threading.Thread(target=lambda: (dev.synchronize(), done.set()), daemon=True).start()
    assert done.wait(10), "the stream stayed held after a failed launch"
    assert [r.name for r in t.records] == ["spin", "spin"] and t.records[1].complete


def test_a_held_launch_tells_the_watchdog_each_step(dev, monkeypatch):
    """A held launch says after each step (its start records, the work; a copy between device buffers also after its
    primer) that its thread goes on: a thread slowed down by another Python thread keeping the GIL is not taken for
    a stuck one, whose hold the watchdog ends (test_the_watchdog_leaves_a_hold_whose_thread_goes_on_slowly)."""
    bd = dev._internal.bd
    steps: list = []
    monkeypatch.setattr(bd, "progressed", steps.append)
    a, b = dev.alloc(1 << 10), dev.alloc(1 << 10)
    with gpu_timer(dev) as t:
        dev.stream.spin_us(10)
        kernel_steps = len(steps)
        dev.stream.copy(b, a)
        launch_steps = len(steps)  # (the scope's exit may calibrate the clock, whose held pairs step too)
    dev.synchronize()
    if not t.records or bd.hold_problem() is not None:
        pytest.skip(f"{dev.name} does not hold launches: {bd.hold_problem()}")
    assert kernel_steps == 2 and launch_steps == 5, steps
    assert all(x is not None for x in steps)
    monkeypatch.undo()
    a.free()
    b.free()


def test_a_pinned_free_while_a_launch_is_held_stops_no_thread(dev):
    """Freeing pinned memory waits for the GPU and holds a driver lock meanwhile. A free that starts while a hold
    is open would wait for the hold, and the thread that ends the hold would wait in its next driver call for the
    free: every thread stops. The free ends the holds first."""
    if dev.backend != "cuda":
        pytest.skip("CUDA's frees wait for the GPU; the host backend's do not")
    bd, raw = dev._internal.bd, dev.stream._internal.raw
    x = dev.alloc(1 << 20)
    holder = [dev.alloc_pinned(1024)]  # (small: freed by the thread that drops it, not handed to the worker)
    token = bd.hold(raw)
    assert token is not None, bd.hold_problem()
    freed, rescued = threading.Event(), threading.Event()

    def free() -> None:
        holder.clear()  # the last reference: cuMemFreeHost here
        freed.set()

    def rescue() -> None:  # without the fix the threads stop: end the hold after a while, so the test fails
        if not freed.wait(10):
            rescued.set()
            bd.release(token)

    threading.Thread(target=free, daemon=True).start()
    threading.Thread(target=rescue, daemon=True).start()
    time.sleep(0.05)  # the free is under way
    dev.stream.memset(x, 0)  # a driver call of the holding thread while the free runs
    bd.release(token)
    assert freed.wait(15) and not rescued.is_set(), "the free waited for an open hold"
    dev.synchronize()
    x.free()


#: A fresh process's first launch of a kernel inside its own hold (argv[1] "nowatch": with the watchdog kept from
#: starting, and a rescue that ends the hold after 5 s). Prints: seconds the launch took, holds the watchdog ended,
#: whether the rescue had to end it.
FIRST_LAUNCH_IN_A_HOLD = """
import sys, threading, time
import numpy as np
from cuda.core import LaunchConfig
import asyncgpu
from asyncgpu._backends.cuda import unheld
if sys.argv[1:] == ["nowatch"]:
    unheld.WATCH[0] = "kept from starting"
dev = asyncgpu.device(0, backend="cuda")
bd, raw = dev._internal.bd, dev.stream._internal.raw
kernel = bd._kernel("asyncgpu_clock_bracket")  # compiled, never launched: its function is loaded at its first launch
out = bd.alloc(8, np.uint64, raw)
token = bd.hold(raw, True)
assert token is not None, bd.hold_problem()
done, rescued = threading.Event(), []
def rescue():
    if not done.wait(5):
        rescued.append(1)
        bd.release(token)
threading.Thread(target=rescue, daemon=True).start()
t0 = time.perf_counter()
bd.launch(raw, kernel, LaunchConfig(grid=1, block=1), (np.uint64(1000), np.uint64(int(out.handle))))
took = time.perf_counter() - t0
done.set()
bd.release(token)
dev.synchronize()
print(took, unheld.RESCUED[0], bool(rescued), flush=True)
if sys.argv[1:] == ["nowatch"]:
    unheld.WATCH[0] = None  # (the device's close at exit stops a watchdog: there is none)
"""


def test_a_kernels_first_launch_inside_its_hold_stops_no_thread(dev):
    """A kernel's first launch loads its function, and a load may synchronize the context: inside its own hold,
    the launch would wait for the hold it is in. The watchdog ends the hold (`cuda.unheld`). In a process of its
    own: the case needs a kernel never launched there (`dev/check_unheld.py` shows it stops without the
    watchdog)."""
    if dev.backend != "cuda":
        pytest.skip("a CUDA driver's lazy loading")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FIRST_LAUNCH_IN_A_HOLD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    took_s, _watchdog_ended, rescued = out.stdout.split()[-3:]
    assert rescued == "False", f"the launch waited {took_s} s for its own hold"


# -- the timing source ------------------------------------------------------------------------------------------
def test_an_unknown_source_names_the_choices(dev):
    with pytest.raises(ValueError, match="'auto', 'cupti', 'events'"):
        gpu_timer(dev, source="nvml")


def test_host_devices_have_no_cupti_source(backend):
    if backend != "host":
        pytest.skip("the host backend's errors")
    import asyncgpu
    from asyncgpu.errors import SourceError

    d = asyncgpu.device("host:0")
    with pytest.raises(SourceError, match="source='events'"):
        with gpu_timer(d, source="cupti"):
            pass
    with gpu_timer(d, source="auto") as t:  # events, and says why
        d.stream.spin_us(100)
    assert t.source == t.timeline.source == "events"
    assert "CUDA devices only" in t.timeline.source_note
    with gpu_timer(d, source="events") as t:
        d.stream.spin_us(100)
    assert t.timeline.source == "events" and t.timeline.source_note == ""


def _cupti_or_skip(backend):
    if backend != "cuda":
        pytest.skip("CUPTI times CUDA devices")
    from asyncgpu._backends import cupti

    ok, why = cupti.available()
    if not ok:
        pytest.skip(why)


def test_cupti_attributes_each_launch_to_its_activity(dev, backend):
    _cupti_or_skip(backend)
    a = dev.alloc(1 << 20)
    s0, s1 = dev.streams[0], dev.streams[1]
    dev.synchronize()
    with gpu_timer(dev, source="cupti") as t:
        s0.memset(a, 0)
        s1.spin_us(50)
        s0.inc_loop(a, 20)
        s1.spin_us(80)
    assert t.timeline.source == "cupti", t.timeline.source_note
    got = [(r.name, r.stream) for r in t.records]
    assert got == [("memset", "s0"), ("spin", "s1"), ("inc_loop", "s0"), ("spin", "s1")]
    spins = [r.duration_ms * 1e3 for r in t.records if r.name == "spin"]
    # A spin kernel reads %globaltimer until its time is up: CUPTI's span is that time plus well under 3 µs.
    assert 50 <= spins[0] < 53 and 80 <= spins[1] < 83, spins
    assert all(r.complete and r.duration_ms > 0 for r in t.records)
    a.free()


def test_cupti_shows_framework_kernels_inside_a_block(dev, backend):
    _cupti_or_skip(backend)
    torch = pytest.importorskip("torch")
    x = torch.randn(2048, 2048, device=f"cuda:{dev.index}")
    s = dev.stream
    with torch.cuda.stream(torch.cuda.ExternalStream(s.handle, device=x.device)):
        (x @ x).sum().item()  # warm: cuBLAS loaded outside the scope
        with gpu_timer(dev, source="cupti") as t:
            with t.activity("matmul", stream=s):
                y = x @ x
            s.spin_us(20)
        del y
    assert t.timeline.source == "cupti", t.timeline.source_note
    names = [r.name for r in t.records]
    assert names[:2] == ["matmul", "spin"]
    children = [r for r in t.records[2:] if r.kind == "kernel"]
    assert children, names  # torch's GEMM, under its own name
    block = t.records[0]
    block_end_ms = block.start_ms + block.duration_ms
    for c in children:  # inside the block's span, on its stream
        assert c.stream == block.stream
        assert block.start_ms - 1e-3 <= c.start_ms and c.start_ms + c.duration_ms <= block_end_ms + 1e-3


_HELD_BY_TORCH = """
import warnings
warnings.simplefilter("ignore")
import asyncgpu
from asyncgpu.errors import SourceError
from torch.profiler import ProfilerActivity, profile
d = asyncgpu.device("cuda:0")
d.stream.spin_us(10)
d.synchronize()
with asyncgpu.gpu_timer(d, source="auto") as t:
    d.stream.spin_us(50)
print("before", t.timeline.source)
with profile(activities=[ProfilerActivity.CUDA]):
    with asyncgpu.gpu_timer(d, source="auto") as t:
        d.stream.spin_us(50)
    print("auto", t.timeline.source, round(t.records[0].duration_ms * 1e3, 1), "|", t.timeline.source_note)
    try:
        with asyncgpu.gpu_timer(d, source="cupti"):
            pass
    except SourceError as exc:
        print("cupti raised", exc)
"""


def test_another_cupti_subscriber_makes_auto_fall_back_and_cupti_raise(dev, backend):
    """In a process of its own: torch.profiler keeps CUPTI's one subscriber for the rest of the process."""
    _cupti_or_skip(backend)
    pytest.importorskip("torch")
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _HELD_BY_TORCH], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    lines = {line.split(" ", 1)[0]: line for line in out}
    assert lines["before"] == "before cupti", out
    auto = lines["auto"].split(" ", 3)
    assert auto[1] == "events" and "already taken" in auto[3], out
    assert 45 <= float(auto[2]) < 60, out  # the events' 50 µs spin
    assert "already taken" in lines["cupti"] and "source='events'" in lines["cupti"], out


def test_events_time_a_memset_on_an_idle_gpu_as_cupti_does(dev, backend):
    """The idle-start case: each 40 MB memset launched on an idle GPU. Unheld, the pair read +36 µs p50 here
    (H200); held and net of the pair's own latency, within a microsecond.

    Events and CUPTI time rounds of their own, in turn, compared as distributions (the i-th shortest of each):
    nested in a CUPTI scope, the pair would also count CUPTI's own instrumentation of the memset, which on some
    2× H100 streams lands inside it (runs 42 and 45: one memset of ten 3.1-5.2 µs over CUPTI, nested, in 2-GPU
    suites only; the same as run 42 showed for copies between device buffers: the copy test below).
    An events-side outlier still fails: it leaves the events' longest memset apart from CUPTI's."""
    _cupti_or_skip(backend)
    a = dev.alloc(10_000_000)
    dev.stream.memset(a, 0)
    durs_us: dict[str, list[float]] = {"events": [], "cupti": []}
    for i in range(24):
        dev.synchronize()
        time.sleep(0.002)
        source = ("events", "cupti")[i % 2]
        with gpu_timer(dev, source=source) as t:
            dev.stream.memset(a, 0)
        assert t.timeline.source == source, t.timeline.source_note
        durs_us[source].append(t.records[0].duration_ms * 1e3)
    ev, cu = np.sort(durs_us["events"]), np.sort(durs_us["cupti"])
    errs = ev - cu
    assert abs(np.median(ev) - np.median(cu)) <= 1.0 and np.abs(errs).max() < 2.0, (
        f"events {np.round(ev, 2)}\nCUPTI  {np.round(cu, 2)}"
    )
    a.free()


def test_a_bracket_after_the_other_engines_work_is_primed(dev, monkeypatch):
    """Only event brackets are primed, only at a compute<->copy switch or after work of unknown engine."""
    a, host = dev.alloc(1024), dev.alloc_pinned(1024)
    s = dev.stream
    dev.clock()  # (the first calibration primes its own stream: not a bracket's primer)
    primes = []
    monkeypatch.setattr(dev._internal.bd, "prime", lambda raw, engine: primes.append(engine))
    s.copy_to_host(a, host)
    s.spin_us(1)  # untimed: never primed
    with gpu_timer(dev, source="events") as t:
        s.spin_us(1)  # after a spin: no switch
        s.copy_to_host(a, host)
        s.copy_to_host(a, host)
        s.memset(a, 0)
        with t.activity("block"):
            pass
        s.spin_us(1)  # after a block (its engine unknown)
    assert primes == ["copy", "compute", "compute"]
    assert len(t.records) == 6


def test_events_time_launches_at_compute_copy_switches_as_cupti_does(dev, backend):
    """A kernel, a copy, a kernel, a copy, back to back (each follows the other engine's work): unprimed, each
    bracket read +4 to +8 µs against CUPTI (H200; its start event completed behind the previous engine); primed
    with a tiny op of its own engine, within a microsecond. Counts the primers too: one per switch."""
    _cupti_or_skip(backend)
    n = 1_000_000
    a, host = dev.alloc(n), dev.alloc_pinned(n)
    s = dev.stream
    s.spin_us(1)
    s.copy_to_host(a, host)
    dev.synchronize()
    dev.clock()  # (the first calibration primes its own stream: not a bracket's primer)
    primes = []
    real = dev._internal.bd.prime
    dev._internal.bd.prime = lambda raw, engine: primes.append(engine) or real(raw, engine)
    errs: dict[int, list[float]] = {}
    try:
        for _ in range(8):
            dev.synchronize()
            time.sleep(0.002)
            with gpu_timer(dev, source="cupti") as outer:
                with gpu_timer(dev, source="events") as inner:
                    for _ in range(2):
                        s.spin_us(30)
                        s.copy_to_host(a, host)
            for i, (r_e, r_c) in enumerate(zip(inner.records, outer.records, strict=True)):
                errs.setdefault(i, []).append((r_e.duration_ms - r_c.duration_ms) * 1e3)
    finally:
        del dev._internal.bd.prime
    assert primes == ["compute", "copy"] * 16, primes
    for i, e in errs.items():
        e.sort()
        assert abs(e[len(e) // 2]) <= 1.0, (i, errs)
    a.free()


def test_an_inc_loop_that_its_arithmetic_bounds_loses_the_kernels_cut(dev, backend):
    """An `inc_loop` over the device's spilling size on a busy stream loses the spilling kernel's cut while its
    memory traffic bounds it (one pass), and the kernel's once its arithmetic does (four times the calibration's
    `memory_bound_passes`): each reads CUPTI's duration as nearly as a spin in the same rounds does. Given the
    spilling cut, run 60's 1,000-pass ones (2× H100) read the cuts' difference (0.45 µs) long. Judged against half
    that difference, where it exceeds 0.3 µs; else the two cuts agree and no choice shows."""
    _cupti_or_skip(backend)
    cal, bd = dev.clock(), dev._internal.bd
    cuts = cal.bracket_overhead_by_kind_ns
    if bd.memory_bound_passes is None or bd.spill_bytes is None or "kernel_spill" not in cuts:
        pytest.skip(f"no spilling kernel's cut measured here ({cal.bracket_overhead_source})")
    gap_us = abs(cuts["kernel"] - cuts["kernel_spill"]) / 1e3
    if gap_us <= 0.3:
        pytest.skip(f"the kernel's and the spilling kernel's cuts agree within {gap_us:.2f} µs on this device")
    a = dev.alloc(bd.spill_bytes // 4 + 1)
    s, many = dev.stream, 4 * bd.memory_bound_passes
    s.inc_loop(a, 1)
    dev.synchronize()
    errs: dict[str, list[float]] = {"spin": [], "one pass": [], "many": []}
    for _ in range(8):
        dev._internal.forget_pair_excess()  # (the calibration's cuts, not what a CUPTI scope taught)
        dev.synchronize()
        with gpu_timer(dev, source="cupti") as outer:
            with gpu_timer(dev, source="events") as inner:
                s.spin_us(1000)
                s.inc_loop(a, 1)
                s.spin_us(50)
                s.inc_loop(a, many)
        got = [(r_e.duration_ms - r_c.duration_ms) * 1e3 for r_e, r_c in zip(inner.records, outer.records, strict=True)]
        for key, err in zip(("lead", "one pass", "spin", "many"), got, strict=True):
            errs.setdefault(key, []).append(err)
    spin = float(np.median(errs["spin"]))
    for key in ("one pass", "many"):
        assert abs(float(np.median(errs[key])) - spin) < gap_us / 2, (key, many, gap_us, errs)
    a.free()


def _handle(raw) -> int:
    return int(raw[2]) if isinstance(raw, tuple) and len(raw) > 2 else -1


def _us(a_ns, b_ns) -> float:
    return float("nan") if a_ns is None or b_ns is None else (a_ns - b_ns) / 1e3


class _CopyWitness:
    """What the copy test's failure message shows: per activity, its round and source, start and duration, when the
    host issued it, and for the events rounds whether it was held and which pooled events bracketed it (letters: one
    per event); per round, the garbage collections, the holds the watchdog ended, the excess CUPTI scopes had taught,
    the free events in the pool and the holds open on any GPU; the copy's buffers."""

    def __init__(self, monkeypatch, dev) -> None:
        import gc

        from asyncgpu._backends.cuda import unheld
        from asyncgpu._timing.scope import Timer

        self.dev, self.unheld, self.gc = dev, unheld, gc
        self.held: list[list[tuple[str, bool, int, int]]] = []  # per events scope: (kind, held, start, end event)
        self.rounds: list[dict] = []
        self.buffers = ""
        finish = Timer._finish

        def _finish(timer, fences):
            if timer.source == "events":
                self.held.append([(a.kind, a.held, _handle(a.start_raw), _handle(a.end_raw)) for a in timer._acts])
            return finish(timer, fences)

        monkeypatch.setattr(Timer, "_finish", _finish)

    def __enter__(self):
        self.gc.callbacks.append(self._gc)
        return self

    def __exit__(self, *exc) -> None:
        self.gc.callbacks.remove(self._gc)

    def _gc(self, phase, info) -> None:
        if phase == "start" and self.rounds:
            self.rounds[-1]["gc"].append((info["generation"], time.perf_counter_ns()))

    def round(self, i: int) -> None:
        internal = self.dev._internal
        self.rounds.append(
            {
                "gc": [],
                "t0_ns": time.perf_counter_ns(),
                "rescued": self.unheld.RESCUED[0],
                "excess_ns": dict(internal._pair_excess_ns),
                "threads": sorted(t.name for t in threading.enumerate()),
                "free_events": len(getattr(getattr(internal, "timing_pool", None), "_free", ())),
                "open_holds": self.unheld.open_holds(),
            }
        )

    def note_buffers(self, *arrays) -> None:
        try:  # (what the message shows must never fail the test itself)
            ptrs = [int(x.live().handle) for x in arrays]
        except Exception as exc:  # noqa: BLE001
            self.buffers = f"unknown ({exc!r})"
            return
        self.buffers = ", ".join(f"{p:#x} ({p % (2 << 20):#x} into 2 MiB)" for p in ptrs)

    def report(self, rows) -> str:
        """``rows``: (round, source, record) for every activity, in order."""
        lines = ["round source kind     start, µs    dur  issued-end  held  events  (starts from the round's first)"]
        letters: dict[int, str] = {}

        def letter(h: int) -> str:
            if h < 0:
                return "?"
            return letters.setdefault(h, chr(65 + len(letters) % 26) + str(len(letters) // 26 or ""))

        first: dict[int, int] = {}
        scope, pos, last = -1, 0, -1
        for i, source, r in rows:
            first.setdefault(i, r.start_ns)
            if i != last:
                last, pos = i, 0
                scope += source == "events"
            got = ("?", "?", -1, -1)
            if source == "events" and 0 <= scope < len(self.held) and pos < len(self.held[scope]):
                got = self.held[scope][pos]
            pos += 1
            events = f"{letter(got[2])}>{letter(got[3])}" if source == "events" else ""
            lines.append(
                f"{i:5d} {source:<6} {r.kind:<7} {_us(r.start_ns, first[i]):+11.2f} {r.duration_ms * 1e3:6.2f}"
                f" {_us(r.issued_ns, r.end_ns):+11.1f}  {got[1]!s:<5} {events}"
            )
        for i, r in enumerate(self.rounds):
            gcs = [(g, (t - r["t0_ns"]) / 1e6) for g, t in r["gc"]]
            lines.append(
                f"round {i}: gc (gen, ms) {gcs}, rescued {r['rescued']}, taught {r['excess_ns']},"
                f" free events {r['free_events']}, open holds {r['open_holds']}"
            )
        lines.append(f"threads: {self.rounds[0]['threads'] if self.rounds else []}; buffers {self.buffers}")
        return "\n".join(lines)


def _median_difference_interval(a, b, level: float = 0.95, resamples: int = 4000) -> tuple[float, float]:
    """The bootstrap interval (percentile, seeded) of median(a) − median(b), each sample resampled on its own."""
    rng = np.random.default_rng(0)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    da = np.median(rng.choice(a, (resamples, len(a))), axis=1)
    db = np.median(rng.choice(b, (resamples, len(b))), axis=1)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(da - db, [tail, 100 - tail])
    return float(lo), float(hi)


def test_the_copy_tests_judge_sees_a_bias_and_not_a_draw_of_clusters():
    """The copy test's judge (the interval of the medians' difference against ±0.3 µs), on run 43's one-H100
    copies as the population: a shift of 1 µs is seen in most draws and two draws of the same copies in none,
    where a fixed 0.5 µs bound on 16 copies of each failed about one draw in eight (the failures seen)."""
    pop = np.array(
        [29.57, 29.6, 29.7, 29.79, 29.89, 29.89, 29.89, 29.92, 29.92, 30.11, 30.31, 30.46, 30.46, 30.72, 30.82]
        + [30.94, 29.73, 29.76, 29.79, 29.95, 29.98, 30.24, 30.27, 30.46, 30.5, 30.59, 30.66, 30.69, 30.88]
        + [31.17, 31.65, 31.78]
    )
    rng = np.random.default_rng(1)

    def biased(a, b) -> bool:
        lo, hi = _median_difference_interval(a, b, resamples=500)
        return not (lo <= 0.3 and hi >= -0.3)

    draws = [(rng.choice(pop, 32), rng.choice(pop, 32)) for _ in range(40)]
    assert sum(biased(a, b) for a, b in draws) <= 1
    assert sum(biased(a + 1.0, b) for a, b in draws) >= 30


def test_events_time_copies_between_device_buffers_as_cupti_does(dev, backend, monkeypatch):
    """A kernel then a 40 MB copy between device buffers, twice (the busy-stream case: each copy queued behind a
    kernel). Such a copy runs on a copy engine of its own: its bracket is primed with a copy of its kind every
    time (unprimed it read +2 to +7 µs against CUPTI on H100), and loses the overhead measured for it.

    Events and CUPTI time rounds of their own, in turn, and the copies' durations are compared as distributions
    (the i-th shortest of each): ≥ 90 % within max(1 %, 1 µs), the issue's tolerance. The copies themselves differ
    from round to round by more than the p50 bias the issue allows (on H100 and H200 alike: 22.2 to 25.0 µs in one
    run, in clusters), so the medians' difference is judged against its own noise: the test fails when the 95 %
    bootstrap interval of events' median − CUPTI's lies wholly outside ±0.3 µs (a bias shown beyond the bound),
    not on a draw of clusters (run 43: −0.56 and −0.59 µs, one run in three on one H100 and on 2× H200, where a
    fixed 0.5 µs bound on 16 copies of each failed). It sees a 1 µs bias in ~9 runs of 10, 0.8 µs in half.
    Nested in a CUPTI scope, the pair would count CUPTI's own instrumentation: on some
    streams (2× H100, run 42: the test's stream, in 2-GPU suites) a copy recorded by CUPTI starts ~1 µs after the
    event just before it, in two rounds of every four, where the same stream timed by events alone, or a new stream
    timed nested, shows no such delay (`dev/diag_suite_copy.py`, ``DIAG_AFTER_TEST``)."""
    _cupti_or_skip(backend)
    n = 10_000_000
    a, b = dev.alloc(n), dev.alloc(n)
    s = dev.stream
    s.copy(b, a)
    dev.synchronize()
    dev.clock()
    durs_us: dict[str, list[float]] = {"events": [], "cupti": []}
    rows = []
    with _CopyWitness(monkeypatch, dev) as witness:
        witness.note_buffers(a, b)
        for i in range(32):
            dev.synchronize()
            witness.round(i)
            source = ("events", "cupti")[i % 2]
            with gpu_timer(dev, source=source) as t:
                for _ in range(2):
                    s.spin_us(200)
                    s.copy(b, a)
            assert t.timeline.source == source, t.timeline.source_note
            for r in t.records:
                rows.append((i, source, r))
                if r.kind == "memcpy":
                    durs_us[source].append(r.duration_ms * 1e3)
    ev, cu = np.sort(durs_us["events"]), np.sort(durs_us["cupti"])
    bound = np.maximum(0.01 * cu, 1.0)  # the tolerance: max(1 %, 1 µs)
    within = np.mean(np.abs(ev - cu) <= bound)
    lo, hi = _median_difference_interval(ev, cu)
    ok = within >= 0.9 and lo <= 0.3 and hi >= -0.3
    assert ok, (
        f"within max(1 %, 1 µs): {within:.0%}; events − CUPTI median {np.median(ev) - np.median(cu):+.2f} µs, 95 % "
        f"interval [{lo:+.2f}, {hi:+.2f}]\nevents {np.round(ev, 2)}\nCUPTI  {np.round(cu, 2)}\n" + witness.report(rows)
    )
    a.free()
    b.free()


def test_cupti_times_each_node_of_a_replayed_graph(dev, backend):
    """Under CUPTI a replay's event nodes are slowed down (H200: a 1.5 ms graph read 5 ms between its events);
    the graph and its parts take the nodes' own CUPTI times, matched in capture order. The test asserts the spans
    against the nodes, not a bound on the gaps between nodes: those are CUPTI's (a 500 µs part read 510.4 on 4×
    H100, run 50)."""
    _cupti_or_skip(backend)
    s = dev.stream
    s.spin_us(10)
    dev.synchronize()
    with s.capture() as graph:
        s.spin_us(1000)
        with graph.part("tail"):
            s.spin_us(300)
            s.spin_us(200)
    for _ in range(2):
        with gpu_timer(dev, source="cupti") as t:
            graph.launch()
        assert t.timeline.source == "cupti" and t.timeline.source_note == "", t.timeline.source_note
        names = [(r.name, r.kind) for r in t.records]
        assert names == [("graph", "graph"), ("spin", "kernel"), ("tail", "user"), ("spin", "kernel")] + [
            ("spin", "kernel")
        ]
        spins = [r.duration_ms * 1e3 for r in t.records if r.name == "spin"]
        assert 1000 <= spins[0] < 1003 and 300 <= spins[1] < 303 and 200 <= spins[2] < 203, spins
        # the graph and its part span their nodes, from the first one's start to the last one's end (CUPTI's own
        # times; the gaps between nodes are CUPTI's, ~10 µs each on H100, and not asserted)
        nodes = [r for r in t.records if r.kind == "kernel"]
        for span, (first, last) in ((("graph", "graph"), (nodes[0], nodes[-1])), (("tail", "user"), nodes[1:])):
            rec = next(r for r in t.records if (r.name, r.kind) == span)
            last_end_ns = last.start_ns + last.duration_ms * 1e6
            assert abs(rec.start_ns - first.start_ns) <= 1, (rec, nodes)
            assert abs(rec.duration_ms * 1e3 - (last_end_ns - first.start_ns) / 1e3) < 0.01, (rec, nodes)


class _StandInCupti:
    """A stand-in for `asyncgpu._backends.cupti` without a GPU. `choose` grants CUPTI to any source but
    "events"; a flush of a channel hands back, for each external id pushed on it since its last flush, the records
    CUPTI would: those put in ``work[(channel, id)]``, else one 40 ns kernel (the n-th id at 100 n ns). The real
    CUPTI runs in the GPU tests; this one checks what asyncgpu does with the records."""

    def __init__(self, monkeypatch) -> None:
        from asyncgpu._backends import cupti

        self.channels = (cupti.TIMER, cupti.BENCH, cupti.HISTORY)
        self.pushed: dict[int, list[int]] = {c: [] for c in self.channels}
        self.open = {c: 0 for c in self.channels}  # pushes not popped yet
        self.work: dict[tuple[int, int], list[tuple[str, int, int, str]]] = {}
        self.users = 0
        monkeypatch.setattr(cupti, "choose", self.choose)
        monkeypatch.setattr(cupti, "release", self.release)
        monkeypatch.setattr(cupti, "push", self.push)
        monkeypatch.setattr(cupti, "pop", self.pop)
        monkeypatch.setattr(cupti, "flush", self.flush)
        monkeypatch.setattr(cupti, "host_offset_ns", lambda: 0)

    def choose(self, source, devices, channel, what):
        from asyncgpu._backends import cupti

        cupti.check_source(source)
        if source == "events":
            return "events", ""
        self.users += 1
        return "cupti", ""

    def release(self, channel):
        self.users -= 1

    def push(self, ext, channel):
        self.pushed[channel].append(ext)
        self.open[channel] += 1

    def pop(self, channel):
        self.open[channel] -= 1

    def flush(self, channel):
        records, ext_map = [], {}
        for n, ext in enumerate(self.pushed[channel]):
            corr = 1000 + n
            ext_map[corr] = ext
            for kind, start, end, name in self.work.get((channel, ext), [("kernel", 100 * n, 100 * n + 40, "k")]):
                records.append((kind, start, end, corr, 0, 7, name))
        self.pushed[channel].clear()
        return records, ext_map


@pytest.fixture
def stand_in_cupti(monkeypatch):
    fake = _StandInCupti(monkeypatch)
    yield fake
    assert fake.users == 0, "a CUPTI user was left open"
    assert not any(fake.open.values()), f"pushes without a pop: {fake.open}"


def test_cupti_records_route_to_launches_blocks_and_graph_nodes(stand_in_cupti):
    """The timer's attribution: one record per launch; one per node of a graph replay, all under the replay's
    id; a foreign kernel inside a block."""
    import asyncgpu
    from asyncgpu._backends import cupti

    fake, timer = stand_in_cupti, cupti.TIMER
    d = asyncgpu.device("host:0")
    s = d.stream
    with s.capture() as graph:
        s.spin_us(100)
        with graph.part("tail"):
            s.spin_us(30)
            s.spin_us(20)
    with gpu_timer(d, source="cupti") as t:
        s.spin_us(10)  # one launch: one record
        with t.activity("block", stream=s):
            s.spin_us(10)  # a launch inside a block; the block's own id carries a foreign kernel (below)
        fake.work[(timer, fake.pushed[timer][1])] = [("kernel", 5_000, 5_300, "gemm_foreign")]
        graph.launch()
        fake.work[(timer, fake.pushed[timer][-1])] = [("kernel", 9_000, 9_100, "n0"), ("kernel", 9_110, 9_140, "n1")]
        fake.work[(timer, fake.pushed[timer][-1])].append(("kernel", 9_150, 9_170, "n2"))
    assert t.timeline.source == "cupti" and t.timeline.source_note == "", t.timeline.source_note
    got = [(r.name, r.kind, round(r.duration_ms * 1e6)) for r in t.records]
    assert got[0] == ("spin", "kernel", 40)
    assert got[1][:2] == ("block", "user") and got[2][:2] == ("spin", "kernel")
    assert got[3:8] == [
        ("graph", "graph", 170),
        ("spin", "kernel", 100),
        ("tail", "user", 60),
        ("spin", "kernel", 30),
        ("spin", "kernel", 20),
    ]
    assert got[8] == ("gemm_foreign", "kernel", 300)  # the block's child, under its own name
    assert got[1][2] >= 300  # the block spans its child


# -- source= on benchmark and kernel_history (issue 13) -------------------------------------------------------------
def _spin(stream, us):
    stream.spin_us(us)


def test_benchmark_and_history_refuse_an_unknown_source_before_anything_runs(dev):
    from asyncgpu import benchmark, kernel_history

    calls = []
    for bad in ("nvml", None, "CUPTI"):
        with pytest.raises(ValueError, match="source must be one of 'auto', 'cupti', 'events'"):
            benchmark(lambda s: calls.append(s), n_repeat=2, devices=dev, source=bad)
        with pytest.raises(ValueError, match="source must be one of 'auto', 'cupti', 'events'"):
            kernel_history.recording(source=bad)
    assert calls == [] and not kernel_history.enabled


def test_benchmark_on_host_devices_has_no_cupti_and_auto_says_why(two_devs, backend):
    if backend != "host":
        pytest.skip("the host backend's errors")
    from asyncgpu import benchmark
    from asyncgpu._analysis.report import render
    from asyncgpu.errors import SourceError

    with pytest.raises(
        SourceError, match=r"CUDA devices only, and this benchmark covers host:0, host:1: use source='events'"
    ):
        benchmark(_spin, (10,), n_repeat=2, devices=two_devs, source="cupti")
    r = benchmark(_spin, (10,), n_repeat=3, n_warmup=0, devices=two_devs, source="auto")
    assert r.source == "events" and "CUPTI times CUDA devices only" in r.source_note
    assert str(r).endswith("(GPU times: events)") and "\n" not in str(r)
    text = render(r, width=200)
    assert "GPU times from events" in text and "less the pair's own latency" in text and "CUDA devices only" in text
    d = r.to_dict()
    assert d["source"] == "events" and d["source_note"] == r.source_note
    r = benchmark(_spin, (10,), n_repeat=3, n_warmup=0, devices=two_devs)  # the default: events, nothing to say
    assert r.source == "events" and r.source_note == ""


def test_history_without_cuda_has_no_cupti_and_auto_says_why(dev, monkeypatch):
    from asyncgpu import kernel_history
    from asyncgpu._backends import load_backend
    from asyncgpu._runtime import hooks
    from asyncgpu.errors import ScopeError, SourceError

    monkeypatch.setattr(load_backend("cuda"), "available", lambda: (False, "no CUDA driver: stand-in"))
    with pytest.raises(
        SourceError,
        match=r"CUDA devices only, and this process has none \(no CUDA driver: stand-in\): use source='events'",
    ):
        with kernel_history.recording(source="cupti"):
            pass
    assert not kernel_history.enabled and hooks.HOLD_USERS == 0  # nothing left switched on
    with kernel_history.recording(source="auto") as rec:
        assert kernel_history.enabled and hooks.HOLD_USERS == 1  # events: launches are held
        dev.stream.spin_us(100)
    assert rec.source == "events" and "CUDA devices only" in rec.source_note and "stand-in" in rec.source_note
    (r,) = kernel_history()
    assert r.source == "events" and r.duration_ms > 0
    with pytest.raises(ScopeError, match="make a new one for each block"):
        with rec:
            pass


def test_benchmark_times_each_call_from_cuptis_records(stand_in_cupti, backend):
    """Each timed call runs under an id of its own: its GPU time is the span of the records of its work (first
    start to last end); a call CUPTI saw nothing for keeps its event time, and the result says how many."""
    if backend != "host":
        pytest.skip("the stand-in replaces CUPTI")
    import asyncgpu
    from asyncgpu import benchmark
    from asyncgpu._backends import cupti

    fake, bench = stand_in_cupti, cupti.BENCH
    two = asyncgpu.devices("host", count=2)
    r = benchmark(_spin, (50,), n_repeat=5, n_warmup=2, devices=two, source="cupti")
    assert r.source == "cupti" and r.source_note == "" and r.gpu_times_ms.shape == (2, 5)
    assert np.all(r.gpu_times_ms == 40e-6)  # ms: the stand-in's 40 ns kernel per call, not the events' 50 µs

    calls = []

    def fn(stream):
        if fake.open[bench]:  # a timed call (warm-up calls run without an id)
            seen = [("kernel", 1_000, 1_500, "a"), ("memset", 1_700, 3_000, "memset")] if len(calls) % 2 == 0 else []
            fake.work[(bench, fake.pushed[bench][-1])] = seen  # one device: no other thread pushes
            calls.append(fake.pushed[bench][-1])
        stream.spin_us(200)

    r = benchmark(fn, n_repeat=4, n_warmup=1, devices=two[0], source="auto")
    assert len(set(calls)) == 4
    g = r.gpu_times_ms[0]
    assert r.source == "cupti" and r.source_note == "CUPTI saw no work for 2 calls: their event times are kept"
    assert g[0] == g[2] == 2e-3 and g[1] >= 0.19 and g[3] >= 0.19  # spans; the events' 200 µs
    assert "the span of CUPTI's records" in render_text(r) and str(r).endswith("(GPU times: cupti)")


def render_text(r):
    from asyncgpu._analysis.report import render

    return render(r, width=200)


def test_history_takes_cuptis_times_inside_a_cupti_block(stand_in_cupti, backend):
    if backend != "host":
        pytest.skip("the stand-in replaces CUPTI")
    import asyncgpu
    from asyncgpu import kernel_history
    from asyncgpu._runtime import hooks

    d = asyncgpu.device("host:0")
    with kernel_history.recording(source="cupti") as rec:
        assert kernel_history.enabled and hooks.HOLD_USERS == 0  # CUPTI times the work: no hold
        d.stream.spin_us(300)
        d.stream.spin_us(300)
    assert rec.source == "cupti" and rec.source_note == "" and not kernel_history.enabled
    d.stream.spin_us(300)  # the history is off: not recorded
    with kernel_history.recording():
        d.stream.spin_us(300)
    recs = kernel_history()
    assert [r.source for r in recs] == ["cupti", "cupti", "events"]
    assert [(r.duration_ms, r.start_ns) for r in recs[:2]] == [(40e-6, 0), (40e-6, 100)]  # CUPTI's, placed
    assert recs[2].duration_ms >= 0.29  # the events' 300 µs


def test_a_launch_timed_by_a_scope_and_the_history_carries_both_ids(stand_in_cupti, backend):
    """Each feature has a channel of its own (an external correlation kind): the same launch's records reach
    both, and each keeps its own."""
    if backend != "host":
        pytest.skip("the stand-in replaces CUPTI")
    import asyncgpu
    from asyncgpu import kernel_history
    from asyncgpu._backends import cupti

    fake = stand_in_cupti
    d = asyncgpu.device("host:0")
    with kernel_history.recording(source="cupti"):
        with gpu_timer(d, source="cupti") as t:
            d.stream.spin_us(10)
        assert fake.pushed[cupti.TIMER] == [] and len(fake.pushed[cupti.HISTORY]) == 1  # the scope's flush: its own
        fake.work[(cupti.HISTORY, fake.pushed[cupti.HISTORY][0])] = [("kernel", 500, 590, "spin")]
    assert round(t.records[0].duration_ms * 1e6) == 40
    (r,) = kernel_history()
    assert r.source == "cupti" and round(r.duration_ms * 1e6) == 90


def test_a_failed_cupti_flush_keeps_the_event_times_and_says_why(stand_in_cupti, monkeypatch, backend):
    if backend != "host":
        pytest.skip("the stand-in replaces CUPTI")
    import asyncgpu
    from asyncgpu import benchmark, kernel_history
    from asyncgpu._backends import cupti

    def lost(channel):
        stand_in_cupti.pushed[channel].clear()
        raise RuntimeError("buffer lost")

    monkeypatch.setattr(cupti, "flush", lost)
    d = asyncgpu.device("host:0")
    why = "events, because the CUPTI flush failed (buffer lost)"
    r = benchmark(_spin, (100,), n_repeat=3, n_warmup=0, devices=d, source="cupti")
    assert (r.source, r.source_note) == ("events", why) and np.all(r.gpu_times_ms >= 0.09)
    with gpu_timer(d, source="cupti") as t:
        d.stream.spin_us(100)
    assert (t.timeline.source, t.timeline.source_note) == ("events", why)
    with kernel_history.recording(source="cupti") as rec:
        d.stream.spin_us(100)
    assert rec.source_note == why
    (launch,) = kernel_history()
    assert launch.source == "events" and launch.duration_ms >= 0.09


def test_bench_command_takes_a_source(capsys, tmp_path):
    from asyncgpu._cli.main import main

    path = tmp_path / "benchmod_source.py"
    path.write_text("def step(stream):\n    stream.spin_us(20)\n")
    argv = ["bench", f"{path}:step", "--backend", "host", "-n", "3", "-w", "0"]
    assert main([*argv, "--source", "cupti"]) == 2  # a usage mistake, in one line
    err = capsys.readouterr().err  # (diagnostics go to stderr)
    assert err.startswith("asyncgpu bench: source='cupti': CUPTI times CUDA devices only") and "Traceback" not in err
    assert main([*argv, "--source", "auto", "--json", str(tmp_path / "r.json")]) == 0
    assert "GPU times from events" in " ".join(capsys.readouterr().out.split())  # (wrapped to the console width)
    assert json.loads((tmp_path / "r.json").read_text())["source"] == "events"


# -- on a GPU: CUPTI's records in the benchmark and the kernel history ----------------------------------------------
@pytest.mark.parametrize("work", ["spin 50 µs", "memset 40 MB"])
def test_benchmark_with_cupti_agrees_with_events(dev, backend, work):
    """Per repeat median, CUPTI's span of each call's work against the events around it (less the pair's own
    latency): within max(1 %, 1 µs), the issue's tolerance."""
    _cupti_or_skip(backend)
    from asyncgpu import benchmark

    a = dev.alloc(10_000_000)

    def fn(stream):
        if work.startswith("spin"):
            stream.spin_us(50)
        else:
            stream.memset(a, 0)

    fn(dev.stream)  # load the kernel outside the timing
    dev.synchronize()
    events = benchmark(fn, n_repeat=200, n_warmup=10, devices=dev, source="events")
    exact = benchmark(fn, n_repeat=200, n_warmup=10, devices=dev, source="cupti")
    assert events.source == "events" and exact.source == "cupti" and exact.source_note == "", exact.source_note
    e_us, c_us = events.median_ms[1] * 1e3, exact.median_ms[1] * 1e3
    assert abs(e_us - c_us) <= max(0.01 * c_us, 1.0), (work, e_us, c_us)
    if work.startswith("spin"):
        assert 50 <= c_us < 53, c_us  # the spin's own time, plus well under 3 µs
    assert np.all(exact.gpu_times_ms > 0)
    a.free()


def test_kernel_history_records_carry_cupti_durations(dev, backend):
    _cupti_or_skip(backend)
    from asyncgpu import kernel_history

    a = dev.alloc(1 << 20)
    dev.stream.spin_us(10)
    dev.synchronize()
    kernel_history.clear()
    t0_ns = time.perf_counter_ns()
    with kernel_history.recording(source="cupti") as rec:
        dev.stream.spin_us(50)
        dev.stream.memset(a, 0)
        dev.stream.spin_us(80)
    t1_ns = time.perf_counter_ns()
    recs = kernel_history()
    assert rec.source == "cupti" and rec.source_note == "", rec.source_note
    assert [(r.name, r.source) for r in recs] == [("spin", "cupti"), ("memset", "cupti"), ("spin", "cupti")]
    spins = [r.duration_ms * 1e3 for r in recs if r.name == "spin"]
    assert 50 <= spins[0] < 53 and 80 <= spins[1] < 83, spins
    assert recs[1].duration_ms > 0
    starts = [r.start_ns for r in recs]
    assert starts == sorted(starts) and t0_ns - 50_000 <= starts[0] and recs[2].end_ns <= t1_ns + 50_000
    a.free()


def test_a_cupti_scope_and_a_cupti_history_read_the_same_records(dev, backend):
    """A launch timed by a scope and recorded by the history carries an id of each one's channel (CUPTI's
    external correlation kinds CUSTOM0 and CUSTOM2): both get its one record."""
    _cupti_or_skip(backend)
    from asyncgpu import kernel_history

    a = dev.alloc(1 << 20)
    dev.stream.spin_us(10)
    dev.synchronize()
    kernel_history.clear()
    with kernel_history.recording(source="cupti"):
        with gpu_timer(dev, source="cupti") as t:
            dev.stream.spin_us(50)
            dev.stream.memset(a, 0)
    recs = kernel_history()
    assert t.timeline.source == "cupti" and t.timeline.source_note == "", t.timeline.source_note
    assert [r.source for r in recs] == ["cupti", "cupti"]
    assert [round(r.duration_ms * 1e6) for r in recs] == [round(r.duration_ms * 1e6) for r in t.records]
    a.free()


def test_a_device_that_cannot_hold_says_so(monkeypatch):
    """Never silently: when a backend cannot hold launches, event-timed scopes say why in the timeline."""
    import asyncgpu

    d = asyncgpu.device("host:0")
    monkeypatch.setattr(d._internal.bd, "hold", lambda raw_stream, watched=False: None)
    monkeypatch.setattr(d._internal.bd, "hold_problem", lambda: "stream memory operations unusable")
    with gpu_timer(d) as t:
        d.stream.spin_us(100)
    assert t.timeline.source == "events"
    assert t.timeline.source_note == "launches not held (host:0: stream memory operations unusable)"
    with gpu_timer(d, source="auto") as t:  # both notes: why not CUPTI, why not held
        d.stream.spin_us(100)
    note = t.timeline.source_note
    assert note.startswith("CUPTI times CUDA devices only") and note.endswith("stream memory operations unusable)")


def test_synchronizing_calls_end_every_hold_and_skip_new_ones():
    """The CUDA backend's frees run inside `releasing_holds` (the GPU test above shows why); here its bookkeeping,
    on hold words of our own: the words move to their latest hold while the call runs, never back, and holds are
    skipped meanwhile."""
    import types

    from asyncgpu._backends.cuda import unheld

    gates = types.SimpleNamespace(words=[5, 0xFFFFFFFF, 9, 0], next=[7, 1, 9, 3], slots={11: 0, 12: 1, 13: 2})
    unheld.GATES[-1] = gates
    try:
        seen = []
        with unheld.releasing_holds():
            seen.append(unheld.syncing())
            deadline = time.monotonic() + 5
            while gates.words[:3] != [7, 1, 9] and time.monotonic() < deadline:
                time.sleep(0.001)
            gates.next[0] = 8  # a hold made just before the call: the releaser ends it too
            while gates.words[0] != 8 and time.monotonic() < deadline:
                time.sleep(0.001)
        assert seen == [True] and not unheld.syncing()
        assert gates.words == [8, 1, 9, 0]  # (1 is past 0xFFFFFFFF, cyclically; slot 3 was never given out)
        gates.words[2] = 20  # a word ahead of its latest hold (holds that ended out of order) never moves back
        unheld.release_all()
        assert gates.words[2] == 20
        assert not [t for t in threading.enumerate() if t.name == "asyncgpu-unhold"]
    finally:
        del unheld.GATES[-1]


def test_a_hold_left_open_is_named_after_the_test_and_ended():
    """A hold never ended leaves its stream waiting for ever, and whatever comes after it on that stream: the check
    after each test (`asyncgpu._testing.assert_quiescent`, this suite's autouse fixture) names it and ends it, so
    that the test that leaked it fails, not the tests after it. Here on hold words of our own."""
    import types

    from asyncgpu._backends import load_backend
    from asyncgpu._backends.cuda import unheld
    from asyncgpu._testing import assert_quiescent, leftovers

    load_backend("cuda")  # (the loaded backends' holds are looked at)
    gates = types.SimpleNamespace(words=[3, 9, 0], next=[4, 9, 1], slots={11: 0, 12: 1})
    unheld.GATES[-1] = gates
    try:
        with pytest.raises(AssertionError, match=r"holds left open .*cuda:-1: hold word 0 at 3, its latest hold 4"):
            assert_quiescent()
        assert gates.words == [4, 9, 0]  # (ended; word 2 was never given to a stream)
        assert leftovers()["open holds"] == []
    finally:
        del unheld.GATES[-1]


def test_a_hold_that_a_workers_queued_call_ends_is_not_named_left_open():
    """A clock refresh queued on a device's worker thread (a handoff's `ensure_clock`) holds its calibration stream
    while it runs: a test may end while it runs. The check after the test waits for the calls queued on the
    workers before it reads the holds, so such a hold is not named left open (run 43, one H200: a uvloop handoff
    test failed its teardown so). Here on hold words of our own, and a host device's worker."""
    import types

    from asyncgpu._backends import load_backend
    from asyncgpu._backends.cuda import unheld
    from asyncgpu._testing import leftovers

    load_backend("cuda")
    gates = types.SimpleNamespace(words=[3], next=[4], slots={11: 0})  # (a hold open: word 3, latest hold 4)
    unheld.GATES[-1] = gates
    dev = asyncgpu.device("host:0")
    try:
        begun = threading.Event()

        def calibrate() -> None:  # ends its hold after the test's end (the first call below)
            begun.set()
            time.sleep(0.05)
            gates.words[0] = 4

        dev._internal.worker.call_soon(calibrate)
        assert begun.wait(5)
        assert dev._internal.worker.busy()  # (a library call running counts as busy: `Device.aclose` waits for it)
        assert leftovers()["open holds"] == []
        assert gates.words == [4]
    finally:
        del unheld.GATES[-1]
        dev.close()


def test_the_watchdog_ends_a_watched_hold_left_open_and_no_other():
    """A watched hold (one that spans a launch) whose thread is stuck in a driver call (a kernel's first launch, GPU
    test above) is ended by the watchdog after one to two of its periods; a watched hold that ends in time, and
    an unwatched one (a benchmark keeps its repeat held on purpose) are left alone. On hold words of our own."""
    import types

    from asyncgpu._backends.cuda import unheld

    gates = types.SimpleNamespace(words=[5, 9, 0], next=[7, 9, 3], slots={11: 0, 12: 1})
    unheld.GATES[-1] = gates
    before = unheld.RESCUED[0]
    try:
        unheld.WATCHED[(-1, 0)] = (7, 0)  # a watched hold on word 0; word 2's hold (value 3) is not watched
        unheld.watch()
        unheld.watch()  # (one watchdog)
        assert [t.name for t in threading.enumerate()].count("asyncgpu-holdwatch") == 1
        t0 = time.monotonic()
        while gates.words[0] != 7 and time.monotonic() < t0 + 5:
            time.sleep(0.001)
        assert time.monotonic() - t0 >= (unheld.WATCHDOG_STUCK_LOOKS - 1) * unheld.WATCHDOG_PERIOD_S
        assert gates.words == [7, 9, 0] and unheld.RESCUED[0] == before + 1
        unheld.WATCHED[(-1, 1)] = (10, 0)  # a watched hold that ends in time is not counted
        time.sleep(unheld.WATCHDOG_PERIOD_S / 4)
        gates.words[1] = 10
        time.sleep(unheld.WATCHDOG_PERIOD_S * 3)
        assert unheld.RESCUED[0] == before + 1 and gates.words[2] == 0
        assert (-1, 0) not in unheld.WATCHED and (-1, 1) not in unheld.WATCHED  # (ended ones are forgotten)
    finally:
        unheld.unwatch()
        unheld.WATCHED.pop((-1, 0), None)
        unheld.WATCHED.pop((-1, 1), None)
        del unheld.GATES[-1]
    assert "asyncgpu-holdwatch" not in [t.name for t in threading.enumerate()]


def test_the_watchdog_leaves_a_hold_whose_thread_goes_on_slowly():
    """A launching thread behind another Python thread that keeps the GIL waits a switch interval (5 ms) at each
    driver call, so a bracket's few calls span 10-30 ms: it says after each step that it goes on (`progressed`),
    and the watchdog leaves its hold alone, however long, until it stops making steps. Ended early, the work
    would run before its end record was enqueued (+10 ms on a 40 MB copy, one H100). On hold words of our own."""
    import types

    from asyncgpu._backends.cuda import unheld
    from asyncgpu._backends.cuda.holds import HoldsMixin

    gates = types.SimpleNamespace(words=[5], next=[6], slots={11: 0})
    unheld.GATES[-1] = gates
    cell = [6, 0]  # the watched hold's [value, steps], as `holds.hold` shares it with its token
    token = (gates.words, 0, 6, cell)
    before = unheld.RESCUED[0]
    try:
        unheld.WATCHED[(-1, 0)] = cell
        unheld.watch()
        step_s = 1.5 * unheld.WATCHDOG_PERIOD_S  # slower than the watchdog's looks, a step every look or two
        for _ in range(8):  # (12 periods open, longer than the watchdog waits for a stuck thread)
            time.sleep(step_s)
            HoldsMixin.progressed(None, token)  # type: ignore[arg-type]
        assert gates.words == [5] and unheld.RESCUED[0] == before
        t0 = time.monotonic()  # no more steps: stuck
        while gates.words[0] != 6 and time.monotonic() < t0 + 5:
            time.sleep(0.001)
        assert gates.words == [6] and unheld.RESCUED[0] == before + 1
        assert time.monotonic() - t0 >= (unheld.WATCHDOG_STUCK_LOOKS - 1) * unheld.WATCHDOG_PERIOD_S
    finally:
        unheld.unwatch()
        unheld.WATCHED.pop((-1, 0), None)
        del unheld.GATES[-1]


def test_the_watchdog_stops_when_no_launch_is_held(monkeypatch):
    """The watchdog lives while launches are held: after its idle looks it stops, and the next watched hold would
    start it again (`holds.hold` sees no thread)."""
    from asyncgpu._backends.cuda import unheld

    monkeypatch.setattr(unheld, "WATCHDOG_IDLE_LOOKS", 3)
    unheld.watch()
    thread = unheld.WATCH[0]
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and unheld.WATCH == [None, None]
    unheld.unwatch()  # (nothing to stop)
