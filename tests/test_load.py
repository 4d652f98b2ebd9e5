"""Waits under load and room in the driver's queue (issue 14), on every loop and backend.

The figures (latency under paced completions and bursts against the loop's floor) are a benchmark,
benchmarks/bench_load.py; these tests check behaviour: every wait resumes, none before its event, nothing is
left behind, the loop keeps running while launches wait for room.
"""

from __future__ import annotations

import contextlib
import threading
import time

import anyio
import numpy as np
import pytest

import asyncgpu
from asyncgpu._runtime import engine as engine_mod
from asyncgpu._runtime import internal as device_internal
from asyncgpu._runtime import stream as stream_mod
from asyncgpu.errors import BlockingCallWarning, QueueFullError

from .conftest import collector_off

pytestmark = pytest.mark.anyio


def _hold(dev, s):
    """Hold ``s`` on the device until the returned function is called (any thread)."""
    token = dev._internal.bd.hold(s._internal.raw)
    assert token is not None
    return lambda: dev._internal.bd.release(token)


async def _ticking(
    producer,
    release,
    after_s: float = 0.3,
    limit_s: float | None = None,
    ticks_ns: list[int] | None = None,
    release_when: threading.Event | None = None,
) -> np.ndarray:
    """Run ``producer()`` beside a 1 ms ticker (each tick 1 ms after the last: one stall makes one late tick),
    with the holds ``release`` released from another thread after ``after_s``, counted from when ``release_when``
    is set if one is given (at most 10 s later: a loop blocked in the driver, the failure under test, is released
    too); returns how late each tick ran (ms, the first left out), and appends to ``ticks_ns`` when each ran
    (``perf_counter_ns``). The collector is off meanwhile: its pauses are not asyncgpu's (a full collection in a
    young process took ~20 ms on a GPU host)."""
    late_ns: list[int] = []
    at_ns = ticks_ns if ticks_ns is not None else []
    stop = threading.Event()

    async def ticker():
        while not stop.is_set():
            nxt = time.perf_counter_ns() + 1_000_000
            await anyio.sleep(0.001)
            at_ns.append(time.perf_counter_ns())
            late_ns.append(at_ns[-1] - nxt)

    async def produce():
        try:
            await producer()
        finally:
            stop.set()

    def releaser():
        if release_when is not None:
            release_when.wait(10.0)
        time.sleep(after_s)
        for r in release:
            r()

    threading.Thread(target=releaser, daemon=True).start()
    with collector_off(), anyio.fail_after(limit_s) if limit_s is not None else contextlib.nullcontext():
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            tg.start_soon(produce)
    return np.asarray(late_ns[1:]) / 1e6


@pytest.mark.parametrize("backend", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_a_thousand_waits_in_flight_each_resume_after_its_event(backend):
    dev = asyncgpu.device(f"{backend}:0", streams=8)
    dev.stream.spin_us(0)  # load the kernel first: loading a module waits for the held streams (a deadlock)
    await anyio.to_thread.run_sync(dev.synchronize)
    release = [_hold(dev, s) for s in dev.streams]
    events = []
    for i in range(1000):
        s = dev.streams[i % 8]
        if i % 100 < 8:
            s.spin_us(200)
        events.append(s.record())
    woke = [0] * len(events)
    done_at_wake = [False] * len(events)

    async def waiter(i, ev):
        await ev.wait()
        woke[i] = time.perf_counter_ns()
        done_at_wake[i] = ev.query()

    async with anyio.create_task_group() as tg:
        for i, ev in enumerate(events):
            tg.start_soon(waiter, i, ev)
        await anyio.sleep(0.02)
        assert not any(woke), "a wait resumed while its stream was held"
        assert dev._internal.engine.pending == 1000
        for r in release:
            r()
    assert all(woke) and all(done_at_wake)
    assert dev._internal.engine.pending == 0
    for ev in events:
        ev.release()
    assert dev.pool_stats().in_use == 0


async def test_cancelled_waits_leave_nothing_behind():
    dev = asyncgpu.device("host:0", streams=4)
    release = [_hold(dev, s) for s in dev.streams]
    events = [dev.streams[i % 4].record() for i in range(500)]
    async with anyio.create_task_group() as tg:
        for ev in events:
            tg.start_soon(ev.wait)
        await anyio.sleep(0.01)
        assert dev._internal.engine.pending == 500
        tg.cancel_scope.cancel()
    assert dev._internal.engine.pending == 0
    for r in release:
        r()
    for ev in events:
        await ev.wait()  # still recorded, still the caller's
        ev.release()
    assert dev.pool_stats().in_use == 0


async def test_a_rerecorded_event_behind_a_held_head_never_resumes_those_before_it():
    """The engine infers the completion of waits behind a done head from the newest one; an event recorded again
    elsewhere says nothing of its old place and must not be used for that."""
    dev = asyncgpu.device("host:0", streams=2)
    held, free = dev.streams
    release = _hold(dev, held)
    events = [held.record() for _ in range(10)]
    woke = []

    async def waiter(i, ev):
        await ev.wait()
        woke.append(i)

    async with anyio.create_task_group() as tg:
        for i, ev in enumerate(events[:9]):
            tg.start_soon(waiter, i, ev)
        await anyio.sleep(0.005)
        tg.start_soon(waiter, 9, events[9])
        await anyio.sleep(0.005)
        events[9].record(free)  # re-recorded on an idle stream: it completes at once
        await anyio.sleep(0.02)
        assert woke in ([], [9]), f"resumed before their held events completed: {woke}"
        release()
    assert sorted(woke) == list(range(10))
    for ev in events:
        ev.release()


async def test_pollers_disarm_when_nothing_is_due():
    dev = asyncgpu.device("host:0")
    for _ in range(30):  # learn the duration: the engine then arms the loop's poller before each completion
        dev.stream.spin_us(1_000)
        with dev.record() as ev:
            await ev.wait()
    await anyio.sleep(0.01)
    assert dev._internal.engine.pending == 0
    assert all(dev._internal.engine not in p.engines for p in engine_mod._POLLERS.values())


@pytest.mark.parametrize("backend", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_launches_wait_for_room_and_the_loop_keeps_ticking(backend):
    """10,000 launches and events queued behind a held stream from a task that awaits room: the loop never
    blocks (a 1 ms ticker stays within 2 ms of its schedule), no stream holds more than the bound."""
    dev = asyncgpu.device(f"{backend}:0", streams=8)
    for s in dev.streams:
        s.spin_us(0)  # load the kernel before the ticker starts
    await anyio.to_thread.run_sync(dev.synchronize)
    release = [_hold(dev, s) for s in dev.streams]
    most_queued = [0]
    events = []
    # the producer's stretches on the loop over 0.5 ms: (ns, launch, at, the loop thread's CPU ns meanwhile: about
    # the wall time where the driver spun, about none where the thread waited for the GIL or slept in the driver)
    long_ns: list[tuple[int, int, int, int]] = []
    t0_ns = time.perf_counter_ns()

    async def producer():
        for i in range(10_000):
            s = dev.streams[i % 8]
            await s.room()
            a, cpu = time.perf_counter_ns(), time.thread_time_ns()
            s.spin_us(0)
            most_queued[0] = max(most_queued[0], s._internal.queued())
            if i % 10 == 0:
                events.append(s.record(timing=False))
            if time.perf_counter_ns() - a > 500_000:
                long_ns.append((time.perf_counter_ns() - a, i, a, time.thread_time_ns() - cpu))
        for ev in events:
            await ev.wait()
            ev.release()

    ticks_ns: list[int] = []
    late_ms = await _ticking(producer, release, ticks_ns=ticks_ns)
    assert most_queued[0] <= stream_mod.QUEUE_BOUND
    assert len(late_ms) > 100
    at_ms = (np.asarray(ticks_ns[1:]) - t0_ns) / 1e6
    late = [(round(float(x), 1), round(float(t))) for x, t in zip(late_ms, at_ms) if x >= 2.0]
    worst = (
        f"{late_ms.max():.1f} ms; ticks 2 ms late or more (ms late, at ms from the start; the holds end at 300):"
        f" {late}; the producer's launches and records over 0.5 ms (ms, launch, at ms, CPU ms):"
        f" {[(n / 1e6, i, (a - t0_ns) / 1e6, c / 1e6) for n, i, a, c in long_ns]}"
    )
    if backend == "host":
        # Host streams are 8 Python threads that contend for the GIL once released (stalls of tens of ms): the
        # bound only says the loop never froze for the hold (300 ms).
        assert late_ms.max() < 250.0, f"the loop stalled {worst}"
        return
    # Every tick within 2 ms but one: on a VM, a loop idle in epoll_wait with its timer due was seen woken 3.5 ms
    # late (faulthandler's stacks: the loop in select, the waiter thread asleep). Blocking in the driver for the
    # hold would stall for 300 ms.
    assert (late_ms >= 2.0).sum() <= 1 and late_ms.max() < 10.0, f"the loop stalled {worst}"


def test_a_pool_that_runs_out_reclaims_a_bounded_batch_of_releases(dev):
    """After a burst of releases, a take that finds its pool empty gives back `RECLAIM_BATCH` of them, not all:
    the thread that takes (a loop's) never pays for 10,000 releases at once; the rest come back later."""
    batch = device_internal.RECLAIM_BATCH
    dev.pool_stats()  # (takes back what earlier work released)
    events = [dev.record(timing=False) for _ in range(3 * batch)]
    dev.synchronize()
    for ev in events:
        ev.release()
    assert dev._internal.reclaim() == batch
    assert dev._internal.reclaim(everything=True) == 2 * batch


async def test_launching_past_the_bound_from_a_loop_raises_names_room_and_takes_nothing():
    dev = asyncgpu.device("host:0")
    s = dev.stream
    release = _hold(dev, s)
    launched = 0
    try:
        with pytest.raises(QueueFullError, match=r"await stream\.room\(\)"):
            for _ in range(2 * stream_mod.QUEUE_BOUND):
                s.spin_us(0)
                launched += 1
        assert stream_mod.QUEUE_LIMIT - 8 <= launched <= stream_mod.QUEUE_LIMIT
        in_use = dev.pool_stats().in_use
        with pytest.raises(QueueFullError):
            dev.record()  # a timing record takes a slot: refused before an event is taken
        with pytest.raises(QueueFullError):
            dev.create_event().record(s).release()
        assert dev.pool_stats().in_use == in_use
        with dev.record(timing=False):  # takes no slot: allowed
            pass
    finally:
        release()
    await s.room()
    assert s._internal.queued() <= stream_mod.QUEUE_BOUND
    s.spin_us(0)


def test_a_plain_thread_launches_past_the_bound_without_a_warning(recwarn):
    dev = asyncgpu.device("host:0")
    s = dev.stream
    release = _hold(dev, s)
    for _ in range(2 * stream_mod.QUEUE_BOUND):
        s.spin_us(0)
    assert s._internal.queued() >= stream_mod.QUEUE_BOUND
    release()
    dev.synchronize()
    assert not [w for w in recwarn if issubclass(w.category, BlockingCallWarning)]


async def test_room_is_cancellable():
    dev = asyncgpu.device("host:0")
    s = dev.stream
    release = _hold(dev, s)
    with pytest.raises(QueueFullError):
        for _ in range(2 * stream_mod.QUEUE_BOUND):
            s.spin_us(0)
    with anyio.move_on_after(0.05) as scope:
        await s.room()
    assert scope.cancelled_caught
    assert dev._internal.engine.pending == 0
    release()
    await s.room()  # the device drains: room again
    assert s._internal.queued() <= stream_mod.QUEUE_BOUND


@pytest.mark.parametrize("backend", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_ten_thousand_records_behind_held_streams_never_hang_and_lose_nothing(backend):
    """10,000 timing records from a task onto 8 held streams, without awaiting room first: each record either
    succeeds or raises `QueueFullError` naming the fix, taking nothing; the task that then awaits room goes on,
    the loop keeps ticking, and once the device drains every event is back in its pool."""
    dev = asyncgpu.device(f"{backend}:0", streams=8)
    await dev.prepare(events=10_000)  # (on CUDA a cold pool makes each event in ~7 µs as the burst goes)
    await dev.asynchronize()
    in_use_before = dev.pool_stats().in_use
    assert dev.pool_stats().free >= 10_000 - in_use_before
    release = [_hold(dev, s) for s in dev.streams]
    refused = [0]
    events = []
    # The holds end 0.3 s after the first refusal, not 0.3 s after the start: a producer slowed past 0.3 s before
    # the streams filled saw no refusal (one H100, run 44: 10,000 records, none refused). Records done when
    # refused first: (records, ms from the start).
    full, first = threading.Event(), []
    t0_ns = time.perf_counter_ns()

    async def producer():  # lets the loop run every 50 records (~0.5 ms of its own on a GPU host), not at each
        for i in range(10_000):
            s = dev.streams[i % 8]
            if i % 50 == 49:
                await anyio.sleep(0)
            while True:
                try:
                    events.append(dev.record(s))
                    break
                except QueueFullError as exc:
                    assert "await stream.room()" in str(exc)
                    refused[0] += 1
                    if not full.is_set():
                        first.append((len(events), (time.perf_counter_ns() - t0_ns) / 1e6))
                        full.set()
                    await s.room()
        full.set()  # (none refused: the holds end too, and the assertion below says so)
        for ev in events:
            await ev.wait()
            ev.release()

    late_ms = await _ticking(producer, release, limit_s=30, release_when=full)
    # the streams did fill: 10,000 records behind the hold are more than 8 bounds
    assert refused[0] >= 1, f"none refused; the loop's ticks were at most {late_ms.max():.1f} ms late"
    assert first[0][0] >= 8 * (stream_mod.QUEUE_LIMIT - stream_mod.CHECK_EVERY), first  # (each stream near its bound)
    assert len(events) == 10_000
    assert dev.pool_stats().in_use == in_use_before
    assert len(late_ms) > 50
    # The behaviour: the loop never waits in the driver for the hold (300 ms). How late its ticks run (the 2 ms
    # target) is measured by dev/diag_drain.py, phase by phase, and reported in benchmarks/RESULTS.md.
    if backend == "cuda":  # (host streams are Python threads contending for the GIL: see the test above)
        assert late_ms.max() < 50.0, f"the loop stalled {late_ms.max():.1f} ms"


async def test_a_failing_callback_is_reported_and_the_waiter_thread_goes_on(monkeypatch):
    from asyncgpu._runtime.engine import KIND_CALLBACK

    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda args: seen.append(args.exc_value))
    dev = asyncgpu.device("host:0")
    s = dev.stream
    s.spin_us(1_000)
    ev = s.record()

    def boom(_raw):
        raise ZeroDivisionError("in a callback")

    dev._internal.engine.add(ev._raw, ev._key, ev._seq, None, 0, KIND_CALLBACK, None, boom)
    await ev.wait()
    s.spin_us(1_000)
    with s.record() as later:
        await later.wait()  # the waiter thread still serves waits
    for _ in range(100):
        if seen:
            break
        await anyio.sleep(0.01)
    assert len(seen) == 1 and isinstance(seen[0], ZeroDivisionError)
    ev.release()


def _creators(dev, monkeypatch) -> list[str]:
    """The threads that created ``dev``'s events while a caller recorded 400, slower than the waiter thread grows."""
    creators: list[str] = []
    real = dev._internal.bd.create_event
    monkeypatch.setattr(
        dev._internal.bd,
        "create_event",
        lambda timing: creators.append(threading.current_thread().name) or real(timing),
    )
    events = []
    for _ in range(400):
        events.append(dev.record(timing=False))
        time.sleep(0.0002)  # (a caller slower than the waiter thread's growth, as a loop between records is)
    for ev in events:
        ev.release()
    return creators


def test_a_pool_grows_ahead_on_the_waiter_thread_where_events_are_costly(dev, monkeypatch):
    """Creating an event costs ~7 µs on a GPU (spikes of hundreds): once the pool made its first few, a caller that
    records (a loop's thread) never creates them itself while the waiter thread keeps up. Host events (2 µs) are
    made where they are needed."""
    if dev.backend == "host":
        assert set(_creators(dev, monkeypatch)) == {"MainThread"}
        monkeypatch.setattr(type(dev._internal.bd), "grows_ahead", True)  # a host device as costly as a GPU's
        dev = asyncgpu.device("host:1")
    creators = _creators(dev, monkeypatch)
    assert creators[:16] == ["MainThread"] * 16  # the pool's first chunk: made by the first take
    assert len(creators) >= 400
    assert set(creators[16:]) == {f"asyncgpu-{dev.name}-waiter"}


async def test_a_failing_job_is_reported_and_the_waiter_thread_goes_on(monkeypatch):
    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda args: seen.append(args.exc_value))
    dev = asyncgpu.device("host:0")
    ran = threading.Event()

    def boom():
        raise ZeroDivisionError("in a job")

    dev._internal.engine.run_soon(boom)
    dev._internal.engine.run_soon(ran.set)
    assert await anyio.to_thread.run_sync(ran.wait, 10)
    s = dev.stream
    s.spin_us(1_000)
    with s.record() as ev:
        await ev.wait()  # the waiter thread still serves waits
    assert len(seen) == 1 and isinstance(seen[0], ZeroDivisionError)


class _Owner:
    """Stands for the `Event` a wait came from: intact while it still holds that record."""

    def __init__(self, raw: object, seq: int) -> None:
        self._raw, self._seq, self._key = raw, seq, 0


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 300])
def test_completions_behind_a_done_head_cost_few_queries(n):
    """`_pop_done` pops exactly the done prefix of a stream's waits, in few queries: one when the next is not
    done, three when all are (a burst), O(log k) for k done, and two once it has seen the same k before (paced
    completions); a released event stops it, never skipped."""

    class Dev:
        name, on_progress = "fake:0", None

    def stream(done: int, broken: int | None) -> engine_mod._Queue:
        qs = engine_mod._Queue()
        for i in range(n):
            raw = [i]
            qs.waits.append(engine_mod.Waiter(raw, 0, i, "t", 0, engine_mod.KIND_THREAD, None, None, _Owner(raw, i)))
        if broken is not None:
            qs.waits[broken].owner._raw = ["re-recorded"]  # its event now stands elsewhere
        return qs

    rng = np.random.default_rng(n)
    for done in sorted({0, 1, n // 2, n - 1, n, *rng.integers(0, n + 1, 5).tolist()}):
        for broken in (None, *rng.integers(0, n, 2).tolist()):
            eng = engine_mod.Engine(Dev())
            qs = stream(done, broken)
            asked: list = []

            def query(raw, asked=asked, done=done):
                asked.append(raw[0])
                return isinstance(raw[0], int) and raw[0] < done

            fired: list = []
            eng._live = n
            eng._pop_done(qs, query, fired)
            got = len(fired)
            assert [w.seq for w in fired] == list(range(got))  # a prefix, in record order
            assert got == done if broken is None or broken >= done else got <= done
            if broken is None:
                most = 1 if done == 0 else 3 if done == n else 4 + 2 * int(np.log2(done + 1))
                assert len(asked) <= most, (n, done, asked)
                if 0 < done < n:  # the same run again, as paced completions come: two queries
                    again = stream(done, None)
                    again.run = qs.run
                    asked.clear()
                    eng._live = n
                    eng._pop_done(again, query, [])
                    assert len(asked) == 2 and again.waits[0].seq == done


class _Device:
    """A device whose events answer ``query``: an engine to drive by hand (`_engine`)."""

    name, on_progress = "fake:0", None

    def __init__(self, query) -> None:
        self.query = query


@contextlib.contextmanager
def _engine(query):
    """An `Engine` over a fake device, with no waiter thread: the test calls collect and _pause itself."""
    eng = engine_mod.Engine(_Device(query))
    eng._thread = threading.current_thread()
    try:
        yield eng
    finally:
        eng._thread = None


@pytest.mark.parametrize("n", [255, 256, 257, 1000])
def test_a_look_pops_a_bounded_part_of_a_burst_and_the_next_the_rest(n):
    """`Engine.collect(limit=...)` pops at most about ``limit`` completed waits (the rest stay at their heads,
    in order) and the next looks pop the rest: a burst's first waits are handed over sooner."""
    with _engine(lambda raw: True) as eng:  # every event complete
        waiters = [
            eng.add([i], i % 4, i // 4, "t", 0, engine_mod.KIND_THREAD, None, threading.Lock()) for i in range(n)
        ]
        seen = []
        while len(seen) < n:
            got = eng.collect(limit=256)
            assert got and len(got) <= 256
            seen += got
        assert sorted(id(w) for w in seen) == sorted(id(w) for w in waiters)
        per_stream = {}
        for w in seen:
            per_stream.setdefault(w.key, []).append(w.seq)
        assert all(seqs == sorted(seqs) for seqs in per_stream.values())  # each stream in record order
        assert eng.pending == 0 and eng.collect(limit=256) == []


def test_a_pollers_look_skips_a_head_not_due_yet_and_looks_again_within_max_poll():
    """`Engine.collect(due_only=True)` (a loop's poller) does not query a head predicted to complete well after now
    (each query costs the loop's thread 0.4-4 µs), looks at it once it is due, and at the latest `MAX_POLL_NS` after
    its last look whatever the prediction says (a stale estimate costs at most that)."""

    asked: list = []
    with _engine(lambda raw: asked.append(raw[0]) or False) as eng:
        now = time.perf_counter_ns()
        eng.add(["far"], 1, 1, "t", now, engine_mod.KIND_THREAD, None, threading.Lock())
        qs = eng._queues[1]
        qs.estimate_ns["t"], qs.spread_ns["t"] = 50_000_000, 0  # predicted 50 ms after its record
        qs.last_done_ns = now
        eng.collect(due_only=True)
        assert asked == ["far"]  # never looked at: looked once
        eng.collect(due_only=True)
        assert asked == ["far"]  # looked at just now and not due: left alone
        qs.looked_ns -= engine_mod.MAX_POLL_NS
        eng.collect(due_only=True)
        assert asked == ["far", "far"]  # not looked at for MAX_POLL_NS: looked again
        eng.collect()
        assert asked == ["far", "far", "far"]  # the waiter thread's look queries every head
        qs.estimate_ns["t"] = 1_000  # due now
        eng.collect(due_only=True)
        assert asked == ["far"] * 4


def test_the_waiter_thread_naps_while_a_loops_poller_covers_its_heads():
    """While a loop's poller covers a head (it polls it between the loop's iterations), the waiter thread plans its
    next look `COVERED_NAP_NS` ahead, not at the poller's linger: a thread that kept waking would take the GIL from
    the loop that polls. (The poller kicks the thread when it disarms.)"""

    loop = object()
    with _engine(lambda raw: False) as eng:
        eng.add(["pending"], 1, 1, "t", time.perf_counter_ns(), engine_mod.KIND_ASYNCIO, loop, None)
        eng.covered_until[loop] = time.perf_counter_ns() + engine_mod.LINGER_NS
        before = time.perf_counter_ns()
        eng._pause()  # (sleeps until its planned look, at most the nap)
        assert eng._wake_at_ns - before >= engine_mod.COVERED_NAP_NS - 100_000
        eng.covered_until.clear()  # not covered: the thread's own back-off, well under the nap
        before = time.perf_counter_ns()
        eng._pause()
        assert eng._wake_at_ns - before <= engine_mod.MAX_POLL_NS + 100_000


def test_a_trio_runs_poller_is_a_task_that_parks_and_ends_with_the_run(monkeypatch):
    """On trio the poller's passes run in a system task of the run, with a checkpoint between passes, never through
    `TrioToken.run_sync_soon` (trio's only sync "call soon": a socket write and a wake of the I/O manager at every
    call). The task parks while disarmed, serves the next arm, and ends with the run, leaving no poller and no
    covered loop."""
    trio = pytest.importorskip("trio")
    dev = asyncgpu.device("host:0")
    looks, runs = [0], [0]
    look, run = engine_mod.Poller.look, engine_mod.Poller.run

    def counted_look(self):
        looks[0] += 1
        return look(self)

    def counted_run(self):  # the asyncio form: one pass, then the next through the loop's scheduler
        runs[0] += 1
        return run(self)

    monkeypatch.setattr(engine_mod.Poller, "look", counted_look)
    monkeypatch.setattr(engine_mod.Poller, "run", counted_run)
    parked: list[bool] = []

    async def main():
        token = trio.lowlevel.current_trio_token()
        for _ in range(30):  # learn the duration: the engine arms the run's poller before each completion
            dev.stream.spin_us(1_000)
            with dev.record() as ev:
                await ev.wait()
        for _ in range(2):  # two armed periods: the parked task serves the second
            evs = []
            for _ in range(100):
                dev.stream.spin_us(50)
                evs.append(dev.record())
            async with trio.open_nursery() as nursery:
                for ev in evs:
                    nursery.start_soon(ev.wait)
            for ev in evs:
                ev.release()
            await trio.sleep(0.01)  # longer than a poller lingers
            poller = engine_mod._POLLERS.get(id(token))
            parked.append(poller is not None and poller.task is not None and poller.parked)

    trio.run(main)
    assert looks[0] > 100 and runs[0] == 0, (looks[0], runs[0])
    assert parked == [True, True], "the poller's task parks between arms"
    assert not engine_mod._POLLERS, "the run's end ends its poller"
    assert not dev._internal.engine.covered_until and dev._internal.engine.pending == 0

    had_poller: list[bool] = []

    async def ends_while_armed():  # a run that fails right after 100 waits are withdrawn
        evs = []
        for _ in range(100):
            dev.stream.spin_us(200)
            evs.append(dev.record())
        try:
            async with trio.open_nursery() as nursery:
                for ev in evs:
                    nursery.start_soon(ev.wait)
                with trio.move_on_after(5):  # armed once the first completion is near: ~0.2 ms in, later on a
                    while not engine_mod._POLLERS:  # loaded host (a fixed 2 ms was once too short there)
                        await trio.sleep(0.0005)
                had_poller.append(bool(engine_mod._POLLERS))  # (its task, armed or parked)
                nursery.cancel_scope.cancel()  # the waits withdrawn
            raise KeyError("the user's error")
        finally:
            for ev in evs:
                ev.release()

    with pytest.raises(KeyError, match="the user's error"):
        trio.run(ends_while_armed)
    assert had_poller == [True]
    assert not engine_mod._POLLERS and not dev._internal.engine.covered_until and dev._internal.engine.pending == 0
    dev.synchronize()


async def test_a_timed_launch_onto_a_full_stream_raises_and_its_scope_keeps_everything_else():
    """In a `gpu_timer` scope, a launch that finds its stream full raises before its brackets are taken: the
    scope records exactly the launches that went through, and every event comes back."""
    dev = asyncgpu.device("host:0")
    s = dev.stream
    in_use = dev.pool_stats().in_use
    release = _hold(dev, s)
    launched = 0
    try:
        async with asyncgpu.gpu_timer(dev, synchronize=False) as t:
            with pytest.raises(QueueFullError):
                for _ in range(stream_mod.QUEUE_LIMIT):
                    s.spin_us(0)
                    launched += 1
            with pytest.raises(QueueFullError):
                with t.activity("block", device=dev):
                    pass
            release()
            await s.room()
            s.spin_us(0)
            launched += 1
            with dev.record() as ev:
                await ev.wait()
    finally:
        release()
    assert len(t.timeline) == launched
    assert np.isfinite(t.timeline.duration_ns).all()
    assert dev.pool_stats().in_use == in_use
