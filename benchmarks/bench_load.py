"""Waits under load: thousands of waits in flight, completions paced or in bursts; asyncgpu against the peers.

    PYTHONPATH=$PWD python benchmarks/bench_load.py [--loops asyncio,uvloop,trio] [--full] [--out load.json]

Needs a CUDA GPU (every GPU present is used). Ground truth that asyncgpu did not produce: each wait's completion
is a ``pace`` kernel that spins until its scheduled ``%globaltimer`` instant and stores the instant it ended
into pinned host memory; the GPU-to-host clock offset comes from pinned-flag flips (a kernel spins on a host
word, stamps ``%globaltimer`` when the host flips it; the host brackets the flip), taken before and after every
case and interpolated (GPU clocks drift ~10 ppm against the host's).

Per case (n waits in flight over S streams per GPU, one task each, completions paced at a rate or released in
one burst): excess = host time when the task resumed - host time of its kernel's end stamp; p50/p90/p99 (µs),
CPU per wait (process CPU time, all threads, during the waiting phase / n), peak OS threads.

Routes, side by side in the same run and on the same streams and kernels:
* ``asyncgpu``: ``await ev.wait()``;
* ``poll``: each task polls ``cuEventQuery`` (raw binding) and yields (``sleep(0)``);
* ``to_thread``: ``await to_thread(cuEventSynchronize)`` (asyncio's default executor; trio.to_thread);
* ``floor``: no GPU: a plain thread resolves the same number of futures in batches at the same instants (the
  scheduled completion times): what the event loop itself can do.

Other sections: ``--queue`` measures how many operations the driver queues per stream before ``cuEventRecord`` /
``cuLaunchKernel`` block; ``--ticker`` records 10,000 events behind a held kernel from a task while a 1 ms ticker
runs, and reports how late the ticker got.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import ctypes
import gc
import json
import os
import platform
import sys
import threading
import time

import numpy as np

import asyncgpu

try:
    from cuda.bindings import driver as drv
    from cuda.core import LaunchConfig, Program, ProgramOptions
except ImportError:  # pragma: no cover
    drv = None

_now = time.perf_counter_ns

SOURCE = r"""
__device__ __forceinline__ unsigned long long gt() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
// Spin until %globaltimer reaches *base + rel_ns (the host writes base once every wait is registered), then store
// the instant into pinned memory: the completion's truth.
extern "C" __global__ void pace(const volatile unsigned long long* base, unsigned long long rel_ns,
                                unsigned long long* stamp) {
    const unsigned long long target = *base + rel_ns;
    unsigned long long t = gt();
    while (t < target) t = gt();
    *(volatile unsigned long long*)stamp = t;
    __threadfence_system();
}
// Hold a stream until the host writes `value` to *flag.
extern "C" __global__ void gate(volatile unsigned int* flag, unsigned int value) {
    while (*flag != value) {}
}
// Say it started, spin until the host writes `value` to *flag, store %globaltimer: one clock-offset sample.
extern "C" __global__ void flip(volatile unsigned int* flag, unsigned int value, volatile unsigned int* started,
                                unsigned long long* stamp) {
    *started = value;
    __threadfence_system();
    while (*flag != value) {}
    *(volatile unsigned long long*)stamp = gt();
    __threadfence_system();
}
// Do nothing: a launch to fill queues with.
extern "C" __global__ void nop() {}
"""


def _check(res):
    err = res[0]
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA call failed: {err}")
    return res[1] if len(res) == 2 else res[1:]


def _slack_1ns() -> None:
    try:
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK: precise sleeps in this thread
    except (OSError, AttributeError):
        pass


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _ours() -> int:
    """The main thread and asyncgpu's own threads (waiter threads)."""
    return 1 + sum(t.name.startswith("asyncgpu-") for t in threading.enumerate())


def _stats(excess_ns) -> dict:
    a = np.asarray(excess_ns, dtype=np.float64) / 1e3
    if a.size == 0:
        return {"p50_us": float("nan"), "p90_us": float("nan"), "p99_us": float("nan"), "n": 0}
    return {
        "p50_us": float(np.percentile(a, 50)),
        "p90_us": float(np.percentile(a, 90)),
        "p99_us": float(np.percentile(a, 99)),
        "max_us": float(a.max()),
        "n": int(a.size),
    }


class Truth:
    """One GPU's ground truth: pinned stamps, the pace/flip kernels, and the %globaltimer-to-host offset."""

    def __init__(self, dev, capacity: int) -> None:
        self.dev = dev
        self.capacity = capacity
        flags = drv.CU_MEMHOSTALLOC_PORTABLE | drv.CU_MEMHOSTALLOC_DEVICEMAP
        self.nbytes = 8 * (capacity + 64)
        self.ptr = int(_check(drv.cuMemHostAlloc(self.nbytes, flags)))
        self.dptr = int(_check(drv.cuMemHostGetDevicePointer(self.ptr, 0)))
        self.stamps = np.ctypeslib.as_array((ctypes.c_uint64 * (capacity + 64)).from_address(self.ptr))
        self.words = (ctypes.c_uint32 * 16).from_address(self.ptr + 8 * capacity)  # flip flag, started
        self.words_dptr = self.dptr + 8 * capacity
        arch = dev.description.split("sm_")[-1].rstrip(")")
        code = Program(SOURCE, "c++", ProgramOptions(arch=f"sm_{arch}", std="c++17")).compile("cubin")
        self.pace = code.get_kernel("pace")
        self.flip_k = code.get_kernel("flip")
        self.gate = code.get_kernel("gate")
        self.nop = code.get_kernel("nop")
        self.one = LaunchConfig(grid=1, block=1)
        self.flip_stream = dev.create_stream()
        self.value = 0

    def offset_sample(self) -> tuple[int, int, int]:
        """(host ns at the flip, %globaltimer - host offset ns, round trip ns) of one flip."""
        self.value += 1
        v = self.value
        w = self.words
        stamp_i = self.capacity + 8  # a stamp slot past the flag words
        self.stamps[stamp_i] = 0
        self.flip_stream.launch(
            self.flip_k,
            self.one,
            np.uint64(self.words_dptr),
            np.uint32(v),
            np.uint64(self.words_dptr + 4),
            np.uint64(self.dptr + 8 * stamp_i),
            name="flip",
        )
        deadline = _now() + 2_000_000_000
        while w[1] != v:
            if _now() > deadline:
                raise RuntimeError("the flip kernel did not start within 2 s")
        h0 = _now()
        w[0] = v
        while self.stamps[stamp_i] == 0:
            pass
        h1 = _now()
        gt = int(self.stamps[stamp_i])
        mid = (h0 + h1) // 2
        return mid, gt - mid, h1 - h0

    def offset(self, n: int = 15) -> tuple[int, int, int]:
        """The flip with the shortest round trip of ``n``: (host ns, offset ns, round trip ns)."""
        return min((self.offset_sample() for _ in range(n)), key=lambda r: r[2])

    def hold(self, streams, slot: int):
        """Hold each of ``streams`` behind a kernel spinning on the flag word; returns the function that releases
        them all (any thread). ``slot``: the stamp slot past the flag words the kernels write to."""
        self.value += 1
        v = self.value
        self.words[0] = v - 1
        for s in streams:
            s.launch(
                self.flip_k,
                self.one,
                np.uint64(self.words_dptr),
                np.uint32(v),
                np.uint64(self.words_dptr + 8),
                np.uint64(self.dptr + 8 * (self.capacity + slot)),
                name="hold",
            )

        def release():
            self.words[0] = v

        return release

    def close(self) -> None:
        drv.cuMemFreeHost(self.ptr)


def to_host(stamps: np.ndarray, before: tuple, after: tuple) -> np.ndarray:
    """Host ns of %globaltimer stamps, the offset interpolated linearly between two flips."""
    (h0, o0, _), (h1, o1, _) = before, after
    g0, g1 = h0 + o0, h1 + o1
    slope = (o1 - o0) / (g1 - g0) if g1 != g0 else 0.0
    s = stamps.astype(np.float64)
    return s - (o0 + (s - g0) * slope)


# -- the loops -------------------------------------------------------------------------------------------------
class AsyncioLoop:
    name = "asyncio"

    def run(self, fn, *args):
        with asyncio.Runner(loop_factory=self.factory()) as r:
            return r.run(fn(self, *args))

    def factory(self):
        return None

    async def sleep0(self):
        await asyncio.sleep(0)

    async def sleep(self, s):
        await asyncio.sleep(s)

    async def to_thread(self, fn, *a):
        return await asyncio.to_thread(fn, *a)

    async def gather(self, coros):
        async with asyncio.TaskGroup() as tg:
            for c in coros:
                tg.create_task(c)

    def floor_waiter(self):
        """(make a parked item, its wait coroutine, a batch resolver callable from any thread)."""
        loop = asyncio.get_running_loop()

        def resolve(futs):
            for f in futs:
                f.set_result(None)

        return loop.create_future, (lambda f: f), (lambda futs: loop.call_soon_threadsafe(resolve, futs))


class UvloopLoop(AsyncioLoop):
    name = "uvloop"

    def factory(self):
        import uvloop

        return uvloop.new_event_loop


class TrioLoop:
    name = "trio"

    def run(self, fn, *args):
        import trio

        return trio.run(fn, self, *args)

    async def sleep0(self):
        import trio

        await trio.sleep(0)

    async def sleep(self, s):
        import trio

        await trio.sleep(s)

    async def to_thread(self, fn, *a):
        import trio

        return await trio.to_thread.run_sync(fn, *a)

    async def gather(self, coros):
        import trio

        async with trio.open_nursery() as n:
            for c in coros:
                n.start_soon(lambda c=c: c)

    def floor_waiter(self):
        import trio

        token = trio.lowlevel.current_trio_token()

        def resolve(evs):
            for e in evs:
                e.set()

        async def wait(e):
            await e.wait()

        return trio.Event, wait, (lambda evs: token.run_sync_soon(resolve, evs))


LOOPS = {"asyncio": AsyncioLoop, "uvloop": UvloopLoop, "trio": TrioLoop}


# -- one case ----------------------------------------------------------------------------------------------------
def plan(n: int, rate: float | None, n_streams: int, lead_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Per wait: its stream index and its completion instant relative to the start (ns). Burst: all at 0."""
    streams = np.arange(n) % n_streams
    if rate is None:
        rel = np.zeros(n, dtype=np.int64)
    else:
        rel = (np.arange(n) * (1e9 / rate)).astype(np.int64)
    return streams, rel + lead_ns


#: ``f(truth, [(stamp index, event)], burst, stream index of each wait)`` called once a case's events are recorded
#: (`ab_load.py`'s oracle variant)
ON_EVENTS = None
START_NS = 2_000_000  # the first completion comes this long after every wait is registered


async def case_gpu(lp, route, setups, n, rate, n_streams):
    """One case over every GPU: n waits per GPU. Each stream is gated until every task has registered its wait;
    then the completions come at their paced instants. Returns per-wait excess (ns), CPU ns per wait, peak
    threads, and how many completed before the host saw them registered (0 by design)."""
    items = []  # flattened over devices: (device index, stamp index, event)
    per_dev = []
    base_i = None
    # The clock offsets first: once the gates are in, a flip kernel could queue behind one (streams share the GPU's
    # hardware queues), and the gates open only after this.
    befores = [truth.offset() for _, truth, _ in setups]
    for di, (_dev, truth, streams) in enumerate(setups):
        sidx, rel = plan(n, rate, n_streams, 0)
        truth.stamps[:n] = 0
        base_i = truth.capacity + 16  # the pinned word the pace kernels read their base from
        truth.stamps[base_i] = 1 << 62
        truth.value += 1
        v = truth.value
        truth.words[0] = v - 1
        for s in streams:
            s.launch(truth.gate, truth.one, np.uint64(truth.words_dptr), np.uint32(v), name="gate")
        evs = []
        burst = rate is None
        base_ptr = np.uint64(truth.dptr + 8 * base_i)
        if burst:  # one pace kernel per stream at the instant, then the events behind it
            for k, s in enumerate(streams):
                s.launch(truth.pace, truth.one, base_ptr, np.uint64(0), np.uint64(truth.dptr + 8 * k), name="pace")
            for i in range(n):
                evs.append((int(sidx[i]), streams[sidx[i]].record(timing=False)))
        else:
            for i in range(n):
                s = streams[sidx[i]]
                s.launch(truth.pace, truth.one, base_ptr, np.uint64(rel[i]), np.uint64(truth.dptr + 8 * i), name="pace")
                evs.append((i, s.record(timing=False)))
        per_dev.append((truth, v, evs, burst))
        if ON_EVENTS is not None:
            ON_EVENTS(truth, evs, burst, [int(x) for x in sidx])
        items += [(di, j, ev) for j, ev in evs]
    woke = [0] * len(items)
    registered = [0]
    peak = [_threads()]
    ours = [_ours()]

    if route == "asyncgpu":

        async def waiter(k, ev):
            await ev.wait()
            woke[k] = _now()

    elif route == "poll":
        query, ok = drv.cuEventQuery, drv.CUresult.CUDA_SUCCESS

        async def waiter(k, ev):
            raw = ev._raw[1]
            while query(raw)[0] != ok:
                await lp.sleep0()
            woke[k] = _now()

    elif route == "to_thread":
        sync = drv.cuEventSynchronize

        async def waiter(k, ev):
            await lp.to_thread(sync, ev._raw[1])
            woke[k] = _now()

    else:
        raise ValueError(route)
    coros = [waiter(k, ev) for k, (_, _, ev) in enumerate(items)]

    async def sampler():
        await lp.sleep0()  # every waiter has run its first step: all waits are registered
        registered[0] = _now()
        for (truth, v, _, _), before in zip(per_dev, befores):
            truth.stamps[base_i] = _now() + before[1] + START_NS
            truth.words[0] = v
        while not all(woke):
            peak[0] = max(peak[0], _threads())
            ours[0] = max(ours[0], _ours())
            await lp.sleep(0.005)

    c0 = time.process_time_ns()
    await lp.gather([*coros, sampler()])
    cpu = time.process_time_ns() - c0
    excess, early = [], 0
    k = 0
    for (truth, _, evs, burst), before in zip(per_dev, befores):
        after = truth.offset()
        stamps = truth.stamps[: (len(setups[0][2]) if burst else len(evs))].copy()
        host = to_host(stamps, before, after)
        for j, ev in evs:
            done = host[j]
            if done < registered[0]:
                early += 1
            else:
                excess.append(woke[k] - done)
            ev.release()
            k += 1
    return excess, cpu / len(items), (peak[0], ours[0]), early


async def case_floor(lp, n_total, rate):
    """The loop's floor: futures resolved by a plain thread, in batches, at the same instants (no GPU)."""
    make, wait_of, resolve = lp.floor_waiter()
    rel = np.zeros(n_total, dtype=np.int64) if rate is None else (np.arange(n_total) * (1e9 / rate)).astype(np.int64)
    parked = [make() for _ in range(n_total)]
    woke = [0] * n_total
    instants: list = []
    registered = [0]
    go = threading.Event()

    def thread():
        _slack_1ns()
        go.wait()
        i = 0
        while i < n_total:
            now = _now()
            if instants[i] > now:
                time.sleep((instants[i] - now) / 1e9)
                now = _now()
            j = bisect.bisect_right(instants, now, lo=i)
            resolve(parked[i:j])
            i = j

    async def waiter(k):
        await wait_of(parked[k])
        woke[k] = _now()

    peak = [_threads(), _ours()]

    async def start():  # (and samples the threads as `case_gpu`'s sampler does: the same load on the loop)
        await lp.sleep0()
        registered[0] = _now()
        instants.extend((rel + registered[0] + START_NS).tolist())
        go.set()
        while not all(woke):
            peak[0] = max(peak[0], _threads())
            peak[1] = max(peak[1], _ours())
            await lp.sleep(0.005)

    th = threading.Thread(target=thread, daemon=True)
    c0 = time.process_time_ns()
    th.start()
    await lp.gather([*(waiter(k) for k in range(n_total)), start()])
    cpu = time.process_time_ns() - c0
    th.join()
    excess = [w - t for w, t in zip(woke, instants) if t >= registered[0]]
    return excess, cpu / n_total, (peak[0], peak[1]), n_total - len(excess)


def run_case(lp_name, route, setups, n, rate, n_streams) -> dict:
    # A full collection first: otherwise one of 20-30 ms (a young process's generation 2) lands in whichever case
    # the allocations before it happen to reach it, and moving a wait's allocations moved it between cases (a
    # floor burst read 20-30 ms in three of three runs of one tree, 2 ms in the other's).
    gc.collect()
    lp = LOOPS[lp_name]()
    t0 = time.perf_counter()
    if route == "floor":
        excess, cpu, peak, early = lp.run(case_floor, n * len(setups), rate)
    else:
        excess, cpu, peak, early = lp.run(case_gpu, route, setups, n, rate, n_streams)
    return {
        "loop": lp_name,
        "route": route,
        "waits": n * len(setups),
        "devices": len(setups),
        "streams_per_device": n_streams,
        "rate_per_s": rate,
        **_stats(excess),
        "cpu_us_per_wait": cpu / 1e3,
        "peak_threads": peak[0],
        "peak_threads_ours": peak[1],
        "done_before_waiting": early,
        "seconds": time.perf_counter() - t0,
    }


# -- the driver's queue depth per stream ----------------------------------------------------------------------
def queue_depth(dev, truth) -> dict:
    """How many operations of each kind the driver queues on one stream behind a held kernel before the enqueuing
    call blocks; and whether a second stream has room of its own once the first is nearly full."""
    buf = dev.alloc(1, np.float32)

    def fill(kind: str, plan_: list) -> tuple[list, bool]:
        """``plan_``: [(stream, count or None = until the call blocks)], filled in order from a worker thread."""
        counts = [0] * len(plan_)
        stuck, done = threading.Event(), threading.Event()
        state = {"t": _now()}
        ev = dev._internal.plain_pool.take()
        tev = dev._internal.timing_pool.take()
        tokens = []

        def worker():
            try:
                for si, (s, limit) in enumerate(plan_):
                    for _ in range(limit if limit is not None else 50_000):
                        state["t"] = _now()
                        if kind == "record":
                            s._internal.bd.record(ev, s._internal.raw)
                        elif kind == "record_timing":
                            s._internal.bd.record(tev, s._internal.raw)
                        elif kind == "launch":
                            s._internal.bd.launch(s._internal.raw, truth.nop, truth.one, ())
                        elif kind == "hold":
                            tokens.append(s._internal.bd.hold(s._internal.raw))
                        else:
                            dev._internal.bd.memset(s._internal.raw, buf.live(), 4, 0)
                        counts[si] += 1
                        if stuck.is_set():
                            return
            finally:
                done.set()

        dev.synchronize()
        release = truth.hold([s for s, _ in plan_], 10)
        th = threading.Thread(target=worker, daemon=True)
        th.start()
        while not done.is_set():
            time.sleep(0.01)
            if _now() - state["t"] > 100_000_000:  # no progress for 100 ms: the call blocks
                break
        blocked = not done.is_set()
        stuck.set()
        release()
        if tokens and tokens[-1] is not None:  # the blocked hold returns once the device has room
            dev._internal.bd.release(tokens[-1])
        th.join(10)
        if tokens and tokens[-1] is not None:
            dev._internal.bd.release(tokens[-1])
        dev.synchronize()
        dev._internal.plain_pool.give(ev)
        dev._internal.timing_pool.give(tev)
        return counts, blocked

    out = {}
    for kind in ("record", "record_timing", "launch", "memset", "hold"):
        counts, blocked = fill(kind, [(dev.create_stream(), None)])
        out[kind] = {"queued_before_block": counts[0], "blocked": blocked}
        print(f"  queue depth, {kind}: {counts[0]} ops queued, then {'blocked' if blocked else 'no block'}", flush=True)
    limit = out["launch"]["queued_before_block"]
    counts, blocked = fill("launch", [(dev.create_stream(), max(limit - 50, 1)), (dev.create_stream(), None)])
    out["second_stream_launch"] = {"first": counts[0], "second_before_block": counts[1], "blocked": blocked}
    print(f"  queue depth: with {counts[0]} launches on one stream, a second took {counts[1]}", flush=True)
    plan_ = [(dev.create_stream(), 600) for _ in range(8)] + [(dev.create_stream(), None)]
    counts, blocked = fill("launch", plan_)
    out["ninth_stream_launch"] = {"counts": counts, "blocked": blocked}
    print(f"  queue depth: 600 launches on each of 8 streams, a ninth took {counts[-1]}", flush=True)
    counts, blocked = fill("launch", [(dev.create_stream(), 500), (dev.create_stream(), None)])
    counts2, _ = fill("record_timing", [(dev.create_stream(), 900), (dev.create_stream(), None)])
    out["mixed"] = {"500 launches then": counts[1], "900 timing records then": counts2[1]}
    print(f"  queue depth: after 500 launches a second stream took {counts[1]}; after 900 timing records {counts2[1]}")
    return out


# -- host cost per call -------------------------------------------------------------------------------------------
def host_cost(dev, n: int = 300, rounds: int = 15) -> dict:
    """Median ns per call over ``rounds`` rounds of ``n`` calls (the device drained between rounds): raw records,
    asyncgpu's record + release, a timed activity block, a launch untimed and timed (hold always / never)."""
    from asyncgpu._runtime import hooks

    s = dev.stream
    raw_ev = _check(drv.cuEventCreate(0))
    sh = s._internal.raw[1]
    lib = ctypes.CDLL("libcuda.so.1")
    rec = lib.cuEventRecord
    rec.argtypes, rec.restype = (ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
    evi, shi = int(raw_ev), s.handle

    def timed(fn, setup=None, teardown=None):
        per = []
        for _ in range(rounds):
            dev.synchronize()
            ctx = setup() if setup else None
            t0 = _now()
            fn(n)
            per.append((_now() - t0) / n)
            if teardown:
                teardown(ctx)
        dev.synchronize()
        return float(np.median(per))

    def raw_bindings(k):
        for _ in range(k):
            drv.cuEventRecord(raw_ev, sh)

    def raw_ctypes(k):
        for _ in range(k):
            rec(evi, shi)

    def record_release(k):
        for _ in range(k):
            dev.record(s).release()

    def hold_stream():
        token = dev._internal.bd.hold(s._internal.raw)
        return token

    def release_stream(token):
        if token is not None:
            dev._internal.bd.release(token)

    def launches(k):
        for _ in range(k):
            s.spin_us(0)

    rec_gil = ctypes.PyDLL("libcuda.so.1").cuEventRecord  # the GIL kept through the call
    rec_gil.argtypes, rec_gil.restype = (ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
    query = lib.cuEventQuery
    query.argtypes, query.restype = (ctypes.c_void_p,), ctypes.c_int
    elapsed = lib.cuEventElapsedTime
    elapsed.argtypes, elapsed.restype = (ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
    wait_value = lib.cuStreamWaitValue32_v2
    wait_value.argtypes, wait_value.restype = (
        (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint),
        ctypes.c_int,
    )
    pair = [int(_check(drv.cuEventCreate(0))) for _ in range(2)]
    flag = dev._internal.bd.alloc_mapped(4096)
    flag_dptr = dev._internal.bd.device_pointer(flag)
    out_ms = ctypes.c_float()

    def raw_ctypes_gil(k):
        for _ in range(k):
            rec_gil(evi, shi)

    def raw_query(k):  # a completed event
        for _ in range(k):
            query(evi)

    def raw_elapsed(k):
        rec(pair[0], shi)
        rec(pair[1], shi)
        dev._internal.bd.sync_stream(s._internal.raw)
        for _ in range(k):
            elapsed(ctypes.byref(out_ms), pair[0], pair[1])

    def raw_wait_value(k):  # a hold whose flag is already set: the stream never waits
        for _ in range(k):
            wait_value(shi, flag_dptr, 0, 0)

    def raw_block(k):  # what an event-pair activity needs of the driver at the least: 2 records, 1 query, 2 elapsed
        for _ in range(k):
            rec(pair[0], shi)
            rec(pair[1], shi)
        dev._internal.bd.sync_stream(s._internal.raw)
        for _ in range(k):
            query(pair[1])
            elapsed(ctypes.byref(out_ms), pair[0], pair[1])
            elapsed(ctypes.byref(out_ms), pair[0], pair[1])

    res = {
        "raw cuEventRecord (cuda.bindings)": timed(raw_bindings),
        "raw cuEventRecord (ctypes)": timed(raw_ctypes),
        "raw cuEventRecord (ctypes, GIL kept)": timed(raw_ctypes_gil),
        "raw cuEventQuery, complete (ctypes)": timed(raw_query),
        "raw cuEventElapsedTime (ctypes)": timed(raw_elapsed),
        "raw cuStreamWaitValue32, flag set (ctypes)": timed(raw_wait_value),
        "raw event-pair block: 2 records, 1 query, 2 elapsed": timed(raw_block),
        "dev.record() + release(), event pending": timed(record_release, hold_stream, release_stream),
        "dev.record() + release(), idle stream": timed(record_release),
    }
    from asyncgpu._backends import cupti

    sources = ["events"] + (["cupti"] if cupti.available()[0] else [])
    for source in sources:
        for nvtx in (True, False):
            with asyncgpu.gpu_timer(dev, nvtx=nvtx, source=source) as t:

                def blocks(k, t=t):
                    for _ in range(k):
                        with t.activity("a", device=dev):
                            pass

                res[f"t.activity() block, source={source}, nvtx={nvtx}"] = timed(blocks)
    untimed = timed(launches)
    res["launch spin_us(0), untimed"] = untimed
    saved = hooks.should_hold
    for hold in ("always", "never"):  # (a comparison the library does not offer: its hold policy patched)
        hooks.should_hold = saved if hold == "always" else (lambda bd, raw: False)
        with asyncgpu.gpu_timer(dev):
            res[f"launch, timed in a scope (added), hold {hold}"] = timed(launches) - untimed
    hooks.should_hold = saved
    drv.cuEventDestroy(raw_ev)
    for e in pair:
        drv.cuEventDestroy(e)
    flag.free()
    base = res["raw cuEventRecord (cuda.bindings)"]
    out = {k: {"ns": v, "x_raw_record": v / base} for k, v in res.items()}
    for k, v in out.items():
        print(f"  {k:48s} {v['ns'] / 1e3:6.2f} us  ({v['x_raw_record']:.2f}x raw record)", flush=True)
    return out


# -- the loop keeps ticking while 10,000 events queue behind a held kernel ----------------------------------------
async def _ticker_case(lp, dev, truth, n_events, n_streams, hold_ms):
    """The ticker's lateness, and when its worst tick came (ms after the case started; the hold is released at
    ``released_at_ms``) with the longest garbage collection meanwhile: a stall while recording, before the
    release, is the loop's own work, not the completions."""
    streams = [dev.create_stream() for _ in range(n_streams)]
    start_ns = _now()
    release_hold = truth.hold(streams, 12)
    late = []  # (ns late, ns after start_ns)
    stop = [False]
    released_ns = [0]
    gc_ns = []  # one per collection: -start, then its duration

    def release():
        released_ns[0] = _now()
        release_hold()

    def on_gc(phase, info):
        if phase == "start":
            gc_ns.append(-_now())
        elif gc_ns:
            gc_ns[-1] += _now()

    async def ticker():
        nxt = _now() + 1_000_000
        while not stop[0]:
            await lp.sleep(max(nxt - _now(), 0) / 1e9)
            now = _now()
            late.append((now - nxt, now - start_ns))
            nxt += 1_000_000

    evs = []

    async def recorder():
        t0 = _now()
        for i in range(n_events):
            s = streams[i % n_streams]
            await s.room()
            evs.append(s.record(timing=False))
        return _now() - t0

    async def body():
        t = await recorder()
        res["record_s"] = t / 1e9
        for ev in evs:
            await ev.wait()
        stop[0] = True

    res = {}
    timer = threading.Timer(hold_ms / 1e3, release)  # a thread: a loop frozen in the driver could not release
    timer.start()
    gc.callbacks.append(on_gc)
    try:
        await lp.gather([ticker(), body()])
    finally:
        gc.callbacks.remove(on_gc)
    timer.join()
    for ev in evs:
        ev.release()
    a = np.asarray([x for x, _ in late]) / 1e6
    worst = int(np.argmax(a))
    res.update(
        {
            "ticks": int(a.size),
            "late_max_ms": float(a.max()),
            "late_p99_ms": float(np.percentile(a, 99)),
            "late_max_at_ms": late[worst][1] / 1e6,
            "released_at_ms": (released_ns[0] - start_ns) / 1e6,
            "gc_max_ms": max(gc_ns, default=0) / 1e6,
        }
    )
    return res


def ticker(dev, truth, loop_name, n_events=10_000, n_streams=8, hold_ms=300) -> dict:
    gc.collect()  # a garbage collection of the previous cases' objects would read as a stall of the loop
    lp = LOOPS[loop_name]()
    r = lp.run(_ticker_case, dev, truth, n_events, n_streams, hold_ms)
    r.update({"loop": loop_name, "events": n_events, "streams": n_streams, "hold_ms": hold_ms})
    return r


RATES = {"1k": 1_000, "8k": 8_000, "40k": 40_000, "150k": 150_000, "burst": None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loops", default="asyncio,uvloop,trio")
    p.add_argument("--routes", default="asyncgpu,poll,to_thread,floor")
    p.add_argument("--full", action="store_true", help="also 10,000 waits at 1k/s and 8k/s (long)")
    p.add_argument("--queue", action="store_true", help="measure the driver's queue depth per stream")
    p.add_argument("--ticker", action="store_true", help="the 10,000-events-behind-a-hold ticker test")
    p.add_argument("--cost", action="store_true", help="host cost per call against a raw cuEventRecord")
    p.add_argument("--no-cases", action="store_true", help="only the sections asked for")
    p.add_argument("--cases", default="", help="comma list of N@RATE (e.g. 1000@40k,100@burst) to run only those")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_load.json"))
    args = p.parse_args()
    devs = asyncgpu.devices()
    loops = args.loops.split(",")
    routes = args.routes.split(",")
    if args.cases:
        cases = [(int(c.split("@")[0]), c.split("@")[1]) for c in args.cases.split(",")]
    else:
        cases = [(1000, r) for r in RATES] + [(100, "burst"), (10_000, "40k"), (10_000, "150k"), (10_000, "burst")]
        if args.full:
            cases += [(10_000, "1k"), (10_000, "8k")]
    cap = max(n for n, _ in cases) + 64
    setups = []
    for d in devs:
        truth = Truth(d, cap)
        setups.append((d, truth, []))
    result = {
        "device": devs[0].description,
        "devices": len(devs),
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "cases": [],
    }
    for d, truth, _ in setups:  # warm: compile, load, grow pools
        for _ in range(3):
            truth.offset(3)
        d.record(timing=False).release()
    if args.queue:
        print("queue depth per stream:", flush=True)
        result["queue"] = queue_depth(devs[0], setups[0][1])
    if args.cost:
        print("host cost per call:", flush=True)
        result["host_cost"] = host_cost(devs[0])
    if args.no_cases:
        cases = []
    if args.ticker:
        result["ticker"] = []
        for lp in loops:
            r = ticker(devs[0], setups[0][1], lp)
            result["ticker"].append(r)
            print(f"  ticker {lp}: {r}", flush=True)
    stream_cache: dict = {}
    for n, rate_name in cases:
        n_streams = max(8, -(-n // 300))
        for k, (d, truth, _) in enumerate(setups):
            key = (d.name, n_streams)
            if key not in stream_cache:
                stream_cache[key] = [d.create_stream() for _ in range(n_streams)]
            setups[k] = (d, truth, stream_cache[key])
        for lp in loops:
            for route in routes:
                if route == "to_thread" and n > 1000 and lp == "trio":
                    continue  # trio's thread limiter (40) makes this case take minutes
                row = run_case(lp, route, setups, n, RATES[rate_name], n_streams)
                row["case"] = f"{n}@{rate_name}"
                result["cases"].append(row)
                print(
                    f"  {row['case']:11s} {lp:8s} {route:10s} p50 {row['p50_us']:9.1f} p90 {row['p90_us']:9.1f} "
                    f"p99 {row['p99_us']:9.1f} us  cpu/wait {row['cpu_us_per_wait']:7.1f} us  threads "
                    f"{row['peak_threads']:3d} (ours {row['peak_threads_ours']})  early {row['done_before_waiting']}  "
                    f"{row['seconds']:.1f} s",
                    flush=True,
                )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)
    for _, truth, _ in setups:
        truth.close()
    asyncgpu.close_all()


def print_table(r: dict) -> None:
    print(f"\n== waits under load: {r['device']} x{r['devices']} (excess µs: wake - kernel end stamp) ==")
    print(f"{'case':11s} {'loop':8s} " + "  ".join(f"{x:>24s}" for x in ("asyncgpu", "poll", "to_thread", "floor")))
    rows: dict = {}
    for row in r["cases"]:
        rows.setdefault((row["case"], row["loop"]), {})[row["route"]] = row
    for (case, lp), by in rows.items():
        cells = []
        for route in ("asyncgpu", "poll", "to_thread", "floor"):
            x = by.get(route)
            cells.append(f"{x['p50_us']:7.0f}/{x['p99_us']:7.0f} {x['cpu_us_per_wait']:5.0f}c" if x else " " * 22)
        print(f"{case:11s} {lp:8s} " + "  ".join(f"{c:>24s}" for c in cells))
    print("(each cell: p50/p99 excess µs, CPU µs per wait)")


if __name__ == "__main__":
    main()
