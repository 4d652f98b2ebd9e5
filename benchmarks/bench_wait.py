"""Wake latency, CPU per wait and host cost per timed activity: asyncgpu against its peers, side by side, one run.

    PYTHONPATH=$PWD python benchmarks/bench_wait.py [--iters 1000] [--out results.json]

Needs a CUDA GPU (two for the in-flight part). Every route launches the same 200 µs spin kernel on the same
stream, brackets it with timing events, and awaits the end event:

* excess = (host time when the awaiting task resumes - host time before the first record) - GPU time of
  the kernel (end - start events). It includes the ~8 µs that recording + launching + recording cost.
* CPU per wait = process CPU time (all threads) over the loop / iterations.

Peers: polling ``cuEventQuery`` + ``sleep(0)`` in the loop; ``asyncio.to_thread(cuEventSynchronize)``; a
persistent waiter thread on a blocking-sync event + ``call_soon_threadsafe``; ``cuLaunchHostFunc`` with a
ctypes trampoline + ``call_soon_threadsafe``. Each on the default asyncio loop and on uvloop.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import platform
import queue
import resource
import sys
import threading
import time

import numpy as np

import asyncgpu
from asyncgpu._runtime import engine as _engine

try:
    from cuda.bindings import driver as drv
except ImportError:  # pragma: no cover
    drv = None

KERNEL_US = 200
_now = time.perf_counter_ns


def _check(res):
    err = res[0]
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA call failed: {err}")
    return res[1] if len(res) == 2 else res[1:]


def _raw_event(flags: int):
    return _check(drv.cuEventCreate(flags))


def _stats(excess_ns: list[int]) -> dict:
    a = np.asarray(excess_ns, dtype=np.float64) / 1e3
    return {
        "p50_us": float(np.percentile(a, 50)),
        "p90_us": float(np.percentile(a, 90)),
        "p99_us": float(np.percentile(a, 99)),
        "mean_us": float(a.mean()),
        "n": int(a.size),
    }


# -- routes: each an async function (dev, iters) -> (excess list in ns, cpu ns per wait) -----------------------
async def route_ours(dev, iters, warmup):
    s = dev.stream
    out = []
    c0 = None
    for i in range(warmup + iters):
        if i == warmup:
            c0 = time.process_time_ns()
        t0 = _now()
        start = dev.record(s)
        s.spin_us(KERNEL_US)
        end = dev.record(s)
        await end.wait()
        t1 = _now()
        gpu_ns = (end - start) * 1e6
        start.release()
        end.release()
        if i >= warmup:
            out.append(t1 - t0 - gpu_ns)
    return out, (time.process_time_ns() - c0) / iters


def _raw_pair(flags=0):
    return _raw_event(flags), _raw_event(flags)


def _elapsed_ns(a, b):
    return _check(drv.cuEventElapsedTime(a, b)) * 1e6


async def _measure_raw(dev, iters, warmup, wait, flags=0):
    """The peers' loop, one for all: record, launch the kernel, record, ``await wait(end_event)``, subtract the
    GPU time. Returns (excess list in ns, CPU ns per wait)."""
    s = dev.stream
    a, b = _raw_pair(flags)
    sh = s._internal.raw[1]
    out, c0 = [], None
    try:
        for i in range(warmup + iters):
            if i == warmup:
                c0 = time.process_time_ns()
            t0 = _now()
            drv.cuEventRecord(a, sh)
            s.spin_us(KERNEL_US)
            drv.cuEventRecord(b, sh)
            await wait(b)
            t1 = _now()
            if i >= warmup:
                out.append(t1 - t0 - _elapsed_ns(a, b))
        return out, (time.process_time_ns() - c0) / iters
    finally:
        drv.cuEventDestroy(a)
        drv.cuEventDestroy(b)


async def route_poll(dev, iters, warmup):
    async def wait(ev):
        while drv.cuEventQuery(ev)[0] != drv.CUresult.CUDA_SUCCESS:
            await asyncio.sleep(0)

    return await _measure_raw(dev, iters, warmup, wait)


async def route_to_thread(dev, iters, warmup):
    async def wait(ev):
        await asyncio.to_thread(drv.cuEventSynchronize, ev)

    return await _measure_raw(dev, iters, warmup, wait)


async def route_blocking_waiter(dev, iters, warmup):
    loop = asyncio.get_running_loop()
    q: queue.SimpleQueue = queue.SimpleQueue()

    def waiter():
        while True:
            item = q.get()
            if item is None:
                return
            ev, fut = item
            drv.cuEventSynchronize(ev)
            loop.call_soon_threadsafe(fut.set_result, None)

    async def wait(ev):
        fut = loop.create_future()
        q.put((ev, fut))
        await fut

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    try:
        return await _measure_raw(dev, iters, warmup, wait, flags=1)  # CU_EVENT_BLOCKING_SYNC
    finally:
        q.put(None)
        th.join()


async def route_host_func(dev, iters, warmup):
    loop = asyncio.get_running_loop()
    lib = ctypes.CDLL("libcuda.so.1")
    hostfn_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    slot = {}

    @hostfn_t
    def callback(_):  # runs on a CUDA driver thread: exactly what asyncgpu avoids
        loop.call_soon_threadsafe(slot["fut"].set_result, None)

    lib.cuLaunchHostFunc.argtypes = (ctypes.c_void_p, hostfn_t, ctypes.c_void_p)
    handle = dev.stream.handle

    async def wait(ev):
        slot["fut"] = fut = loop.create_future()
        if lib.cuLaunchHostFunc(handle, callback, None):
            raise RuntimeError("cuLaunchHostFunc failed")
        await fut

    return await _measure_raw(dev, iters, warmup, wait)


ROUTES = {
    "asyncgpu await ev.wait()": route_ours,
    "poll query() + sleep(0)": route_poll,
    "to_thread(event sync)": route_to_thread,
    "blocking-sync waiter thread": route_blocking_waiter,
    "cuLaunchHostFunc + call_soon_threadsafe": route_host_func,
}


def _run_on(loop_name: str, coro_fn, *args):
    if loop_name == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
            return r.run(coro_fn(*args))
    with asyncio.Runner() as r:
        return r.run(coro_fn(*args))


def single_wait(dev, iters, warmup, loops) -> list[dict]:
    rows = []
    for loop_name in loops:  # a throwaway pass: the first route measured in a process runs on cold caches
        _run_on(loop_name, route_ours, dev, iters // 4, warmup)
    for loop_name in loops:
        for name, fn in ROUTES.items():
            excess, cpu_ns = _run_on(loop_name, fn, dev, iters, warmup)
            rows.append({"route": name, "loop": loop_name, **_stats(excess), "cpu_us_per_wait": cpu_ns / 1e3})
            print(
                f"  {loop_name:8s} {name:42s} p50 {rows[-1]['p50_us']:7.1f}  p99 {rows[-1]['p99_us']:7.1f}  "
                f"cpu {rows[-1]['cpu_us_per_wait']:6.1f} us",
                flush=True,
            )
    # ours on trio
    import trio

    async def ours_trio():
        return await route_ours(dev, iters, warmup)

    excess, cpu_ns = trio.run(ours_trio)
    rows.append(
        {"route": "asyncgpu await ev.wait()", "loop": "trio", **_stats(excess), "cpu_us_per_wait": cpu_ns / 1e3}
    )
    return rows


def lead_sweep(dev, iters, warmup, loops) -> list[dict]:
    """The trade-off curve: the margin the engine adds to the learned wake delay, against latency and CPU."""
    rows = []
    saved = _engine.LEAD_MARGIN_NS
    try:
        for loop_name in loops:
            for margin_us in (0, 8, 15, 30, 60):
                _engine.LEAD_MARGIN_NS = margin_us * 1000
                excess, cpu_ns = _run_on(loop_name, route_ours, dev, iters, warmup)
                rows.append(
                    {
                        "lead_us": margin_us,
                        "loop": loop_name,
                        **_stats(excess),
                        "cpu_us_per_wait": cpu_ns / 1e3,
                        "learned_delivery_us": dev._internal.engine.delivery_ns() / 1e3,
                    }
                )
    finally:
        _engine.LEAD_MARGIN_NS = saved
    return rows


async def _in_flight(devs, n_events, head_ms, kernel_us, streams_per_device, per_kernel):
    """n_events kernels queued behind a long one on every stream; one task awaits each event.

    The events are spread over `streams_per_device` streams per device so that no stream holds more launches
    than the driver queues without blocking the enqueueing thread (about 1,000).
    """
    streams = {
        d: list(d.streams) + [d.create_stream() for _ in range(streams_per_device - len(d.streams))] for d in devs
    }
    refs, events = {}, []
    n_streams = len(devs) * streams_per_device
    for di, d in enumerate(devs):
        for k, s in enumerate(streams[d]):
            # The time reference: an event on the still idle stream itself, taken before its head kernel (a mark
            # on another stream can queue behind busy work when streams outnumber the GPU's hardware queues).
            ref = s.record()
            refs[s.handle] = (ref, _now())
            # Staggered heads: the streams complete their groups at spread-out times.
            s.spin_us(head_ms * 1000 + (di + k * len(devs)) * kernel_us / n_streams)
    for i in range(n_events):  # one kernel per `per_kernel` events keeps each queue within the driver's depth
        d = devs[i % len(devs)]
        ss = streams[d]
        j = i // len(devs)
        s = ss[(j // per_kernel) % len(ss)]
        if j % per_kernel == 0:
            s.spin_us(kernel_us)
        events.append((s.handle, s.record()))
    registered_ns = []
    woke = [0] * n_events

    async def waiter(i, ev):
        await ev.wait()
        woke[i] = _now()

    threads_during = []

    async def watch():
        await asyncio.sleep(0)
        registered_ns.append(_now())
        await asyncio.sleep(head_ms / 2000)
        threads_during.append(threading.active_count())

    await asyncio.gather(*(waiter(i, ev) for i, (_, ev) in enumerate(events)), watch())
    excess, early_done = [], 0
    for i, (key, ev) in enumerate(events):
        ref, t_ref = refs[key]
        done_ns = t_ref + (ev - ref) * 1e6
        if done_ns < registered_ns[0]:
            early_done += 1  # completed before the waits were registered: not a wake-up measurement
        else:
            excess.append(woke[i] - done_ns)
        ev.release()
    for ref, _ in refs.values():
        ref.release()
    return excess, threads_during[0], early_done


def in_flight(devs, n_events, loop_name, kernel_us=2000, streams_per_device=8, per_kernel=4) -> dict:
    excess, threads, early = _run_on(
        loop_name, _in_flight, devs, n_events, 400, kernel_us, streams_per_device, per_kernel
    )
    return {
        "loop": loop_name,
        "events": n_events,
        "devices": len(devs),
        "kernel_us": kernel_us,
        "events_per_kernel": per_kernel,
        "streams_per_device": streams_per_device,
        **_stats(excess),
        "threads": threads,
        "thread_limit": len(devs) + 2,
        "completed_before_waiting": early,
    }


async def _many_waits(dev, total, batch):
    rss = []
    done = 0
    t0 = time.perf_counter()
    while done < total:
        for s in dev.streams:
            s.spin_us(100)  # keeps the batch pending, so every wait goes through the engine
        evs = []
        for i in range(batch):
            s = dev.streams[i % 2]
            evs.append(s.record())
        await asyncio.gather(*(ev.wait() for ev in evs))
        for ev in evs:
            ev.release()
        done += batch
        if done % (total // 10) == 0:
            rss.append((done, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    return rss, time.perf_counter() - t0


def memory_flat(dev, total) -> dict:
    rss, secs = _run_on("asyncio", _many_waits, dev, total, 1000)
    return {"waits": total, "seconds": secs, "max_rss_kib": rss, "created_events": dev.pool_stats().created}


def host_cost(dev, n) -> dict:
    """ns per call: raw cuEventRecord (binding and ctypes), one pooled record, one timed activity."""
    s = dev.stream
    ev = _raw_event(0)
    sh = s._internal.raw[1]
    res = {}
    for _ in range(2):  # second pass is the measurement (warm caches, grown pools)
        t0 = _now()
        for _ in range(n):
            drv.cuEventRecord(ev, sh)
        res["raw cuEventRecord (cuda.bindings)"] = (_now() - t0) / n
        dev.synchronize()
        lib = ctypes.CDLL("libcuda.so.1")
        rec = lib.cuEventRecord
        rec.argtypes, rec.restype = (ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
        evi, shi = int(ev), s.handle
        t0 = _now()
        for _ in range(n):
            rec(evi, shi)
        res["raw cuEventRecord (ctypes)"] = (_now() - t0) / n
        dev.synchronize()
        evs = [None] * n
        t0 = _now()
        for i in range(n):
            evs[i] = dev.record(s)
        res["asyncgpu dev.record() (pooled event)"] = (_now() - t0) / n
        dev.synchronize()
        for e in evs:
            e.release()
        with asyncgpu.gpu_timer(dev, nvtx=True) as t:
            t0 = _now()
            for _ in range(n):
                with t.activity("a", device=dev):
                    pass
            res["asyncgpu timed activity (2 pooled records)"] = (_now() - t0) / n
        t0 = _now()
        for _ in range(n):
            s.spin_us(0)
        launch = (_now() - t0) / n
        dev.synchronize()
        with asyncgpu.gpu_timer(dev) as t:
            t0 = _now()
            for _ in range(n):
                s.spin_us(0)
            timed_launch = (_now() - t0) / n
        res["kernel launch (spin_us(0)), untimed"] = launch
        res["kernel launch, timed in a scope (added cost)"] = timed_launch - launch
    base = res["raw cuEventRecord (cuda.bindings)"]
    return {k: {"ns": v, "x_raw_binding_record": v / base} for k, v in res.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--in-flight", type=int, default=10_000)
    p.add_argument("--waits", type=int, default=300_000)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_wait.json"))
    args = p.parse_args()
    loops = ["asyncio", "uvloop"]
    devs = asyncgpu.devices()
    dev = devs[0]
    dev.stream.spin_us(1)  # compile and load the kernels
    dev.synchronize()
    result = {
        "device": dev.description,
        "devices": len(devs),
        "python": platform.python_version(),
        "kernel_us": KERNEL_US,
        "command": " ".join(sys.argv),
    }
    print("single wait, 200 us kernel:", flush=True)
    result["single_wait"] = single_wait(dev, args.iters, args.warmup, loops)
    print("lead sweep", flush=True)
    result["lead_sweep"] = lead_sweep(dev, args.iters // 2, args.warmup, loops)
    print("host cost", flush=True)
    result["host_cost"] = host_cost(dev, 20_000)
    print("in flight", flush=True)
    result["in_flight"] = [in_flight(devs, args.in_flight, lp) for lp in loops]
    print("memory over many waits", flush=True)
    result["memory"] = memory_flat(dev, args.waits)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)
    asyncgpu.close_all()


def print_table(r: dict) -> None:
    print(f"\n== {r['device']} x{r['devices']}, {r['kernel_us']} us kernel ==")
    print(f"{'route':44s} {'loop':8s} {'p50':>7s} {'p90':>7s} {'p99':>7s} {'cpu/wait':>9s}  (excess, us)")
    for row in r["single_wait"]:
        print(
            f"{row['route']:44s} {row['loop']:8s} {row['p50_us']:7.1f} {row['p90_us']:7.1f} {row['p99_us']:7.1f} "
            f"{row['cpu_us_per_wait']:9.1f}"
        )
    print("margin sweep (asyncgpu; early wake = learned delivery delay + margin before the predicted end):")
    for row in r["lead_sweep"]:
        print(
            f"  margin {row['lead_us']:3d} us {row['loop']:8s} p50 {row['p50_us']:6.1f} p99 {row['p99_us']:6.1f} "
            f"cpu {row['cpu_us_per_wait']:6.1f}  (learned delivery {row['learned_delivery_us']:.1f} us)"
        )
    print("host cost per call:")
    for k, v in r["host_cost"].items():
        print(f"  {k:48s} {v['ns'] / 1e3:6.2f} us  ({v['x_raw_binding_record']:.2f}x raw record)")
    for row in r["in_flight"]:
        print(
            f"in flight: {row['events']} events ({row['events_per_kernel']} per {row['kernel_us']} us kernel, "
            f"{row['streams_per_device']} streams "
            f"per GPU) on {row['devices']} GPUs, {row['loop']}: p50 {row['p50_us']:.1f} p90 {row['p90_us']:.1f} "
            f"p99 {row['p99_us']:.1f} us, threads {row['threads']} (limit {row['thread_limit']}), "
            f"{row['completed_before_waiting']} done before waiting"
        )
    m = r["memory"]
    print(
        f"memory: {m['waits']} waits in {m['seconds']:.1f} s, max RSS KiB at each tenth: "
        f"{[x[1] for x in m['max_rss_kib']]}, events created {m['created_events']}"
    )


if __name__ == "__main__":
    main()
