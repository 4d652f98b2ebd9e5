"""Thread-to-thread handoff: `asyncgpu.Channel` against ``queue.Queue`` + ``event.synchronize()``, one run.

    PYTHONPATH=$PWD python benchmarks/bench_handoff.py [--items 400] [--small 20000] [--out results.json]

Needs a CUDA GPU; with two, the producer works on GPU 0 and the consumer on GPU 1 (else both on GPU 0, said in
the output). A producer thread launches a ``--kernel-us`` spin kernel per item and hands the item on (queue
depth 2); the consumer takes it:

* latency = the handoff's own delay, GPU ready → consumer running: ``running - max(ready, consumer waiting)``.
  ``ready`` is the producer's event on the host time base (its device's clock calibration); host-side routes
  count until the consuming thread or task runs, GPU-side routes until the consumer's stream runs past the wait
  (an event recorded on it, on the host time base). Every route is timed the same way, by the same events.
* CPU per handoff = process CPU time (all threads) over the route / items.
* handoffs per second: ``--small`` items with no GPU work between them (event record, put, take, done).

Routes, host-side: baseline ``queue.Queue`` + ``Event.wait_sync()`` (cuEventSynchronize; spins a core); Channel
``get()`` from a thread (woken by the waiter thread), Channel(spin=True) ``get()``, ``await get()`` on asyncio,
uvloop and trio. GPU-side: baseline ``queue.Queue`` + sync + record on the consumer's stream; Channel
``get(stream=...)`` (cuStreamWaitEvent, no host wait).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import queue
import resource
import threading
import time

import numpy as np

import asyncgpu
from asyncgpu._handoff.records import host_ns as _host_ns

_now = time.perf_counter_ns


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _stats(lat_ns: list[float], cpu_s: float, n: int, wall_s: float) -> dict:
    a = np.asarray(lat_ns, dtype=np.float64) / 1e3
    a = a[np.isfinite(a)]
    return {
        "p50_us": float(np.percentile(a, 50)),
        "p90_us": float(np.percentile(a, 90)),
        "p99_us": float(np.percentile(a, 99)),
        "n": int(a.size),
        "cpu_us_per_handoff": cpu_s / n * 1e6,
        "per_s": n / wall_s,
    }


def _run(producer, consumer) -> tuple[float, float]:
    """Run a producer thread and a consumer (in this thread); returns (cpu s, wall s)."""
    c0, t0 = _cpu_s(), time.perf_counter()
    t = threading.Thread(target=producer)
    t.start()
    consumer()
    t.join()
    return _cpu_s() - c0, time.perf_counter() - t0


# -- baselines -------------------------------------------------------------------------------------------------
def baseline(d0, d1, items: int, kernel_us: float, gpu_side: bool) -> dict:
    q: queue.Queue = queue.Queue(maxsize=2)
    lat: list[float] = []

    def produce():
        for _ in range(items):
            d0.stream.spin_us(kernel_us)
            q.put(d0.record())
        q.put(None)

    def consume():
        held = []
        while True:
            waiting_ns = _now()
            ev = q.get()
            if ev is None:
                break
            ev.wait_sync()
            if gpu_side:
                before = d1.stream.record()  # (kept alike the Channel route's two records)
                running = d1.stream.record()
                held.append((ev, before, running, waiting_ns))
            else:
                running_ns = _now()
                lat.append(running_ns - max(_host_ns(ev), waiting_ns))
                ev.release()
        d1.synchronize()
        for ev, before, running, waiting_ns in held:  # the consumer's stream was idle since it began waiting
            lat.append(_host_ns(running) - max(_host_ns(ev), waiting_ns))
            for e in (ev, before, running):
                e.release()

    cpu, wall = _run(produce, consume)
    return _stats(lat, cpu, items, wall)


# -- asyncgpu.Channel ------------------------------------------------------------------------------------------
def channel_thread(d0, d1, items: int, kernel_us: float, gpu_side: bool, spin: bool = False) -> dict:
    ch = asyncgpu.Channel(2, name="bench", spin=spin, keep_records=items)

    def produce():
        with ch:
            for _ in range(items):
                d0.stream.spin_us(kernel_us)
                ch.put_sync(None, stream=d0.stream)

    def consume():
        if gpu_side:
            while True:
                try:
                    h = ch.get_sync(stream=d1.stream)
                except asyncgpu.ClosedError:
                    break
                h.done()
            d1.synchronize()
        else:
            for h in ch:
                h.done()

    cpu, wall = _run(produce, consume)
    _settle(ch, items)
    return _stats(ch.latencies_ns().tolist(), cpu, items, wall)


def channel_loop(d0, items: int, kernel_us: float, loop: str) -> dict:
    ch = asyncgpu.Channel(2, name="bench", keep_records=items)

    def produce():
        with ch:
            for _ in range(items):
                d0.stream.spin_us(kernel_us)
                ch.put_sync(None, stream=d0.stream)

    async def consume_async():
        async for h in ch:
            h.done()

    def consume():
        if loop == "trio":
            import trio

            trio.run(consume_async)
        elif loop == "uvloop":
            import uvloop

            uvloop.run(consume_async())
        else:
            asyncio.run(consume_async())

    cpu, wall = _run(produce, consume)
    _settle(ch, items)
    return _stats(ch.latencies_ns().tolist(), cpu, items, wall)


def _settle(ch, items: int) -> None:
    deadline = time.perf_counter() + 5
    while len(ch.records()) < items and time.perf_counter() < deadline:
        time.sleep(0.001)


# -- many small items ------------------------------------------------------------------------------------------
def small_items(d0, n: int) -> dict:
    out = {}
    q: queue.Queue = queue.Queue(maxsize=64)

    def produce_q():
        for _ in range(n):
            q.put(d0.record())
        q.put(None)

    def consume_q():
        while (ev := q.get()) is not None:
            ev.wait_sync()
            ev.release()

    cpu, wall = _run(produce_q, consume_q)
    out["queue_sync"] = {"per_s": n / wall, "cpu_us_per_handoff": cpu / n * 1e6}
    ch = asyncgpu.Channel(64, name="small", keep_records=1)

    def produce_ch():
        with ch:
            for _ in range(n):
                ch.put_sync(None, stream=d0.stream)

    def consume_ch():
        for h in ch:
            h.done()

    cpu, wall = _run(produce_ch, consume_ch)
    out["channel"] = {"per_s": n / wall, "cpu_us_per_handoff": cpu / n * 1e6}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--small", type=int, default=20000)
    p.add_argument("--kernel-us", type=float, default=100.0)
    p.add_argument("--out", default=None)
    p.add_argument("--backend", default="cuda", help="cuda (default), or host to check the script without a GPU")
    args = p.parse_args()
    devs = asyncgpu.devices(args.backend) if args.backend == "cuda" else asyncgpu.devices("host", count=2)
    d0 = devs[0]
    d1 = devs[1] if len(devs) > 1 else devs[0]
    where = f"producer {d0.name} → consumer {d1.name}" + ("" if d1 is not d0 else " (one GPU: same device)")
    for d in {d0, d1}:
        d.clock(refresh=True)
    # warm up: kernels loaded, pools grown, the waiter threads' estimates learned
    channel_thread(d0, d1, 50, args.kernel_us, False)
    channel_thread(d0, d1, 50, args.kernel_us, True)
    baseline(d0, d1, 50, args.kernel_us, False)
    res: dict = {
        "devices": [d.description for d in devs],
        "where": where,
        "kernel_us": args.kernel_us,
        "items": args.items,
        "python": platform.python_version(),
    }
    routes = {
        "host: queue.Queue + Event.sync (baseline)": lambda: baseline(d0, d1, args.items, args.kernel_us, False),
        "host: Channel.get() thread": lambda: channel_thread(d0, d1, args.items, args.kernel_us, False),
        "host: Channel(spin=True).get() thread": lambda: channel_thread(
            d0, d1, args.items, args.kernel_us, False, spin=True
        ),
        "host: await Channel.get() asyncio": lambda: channel_loop(d0, args.items, args.kernel_us, "asyncio"),
        "host: await Channel.get() uvloop": lambda: channel_loop(d0, args.items, args.kernel_us, "uvloop"),
        "host: await Channel.get() trio": lambda: channel_loop(d0, args.items, args.kernel_us, "trio"),
        "gpu: queue.Queue + sync + record (baseline)": lambda: baseline(d0, d1, args.items, args.kernel_us, True),
        "gpu: Channel.get(stream=)": lambda: channel_thread(d0, d1, args.items, args.kernel_us, True),
    }
    res["routes"] = {}
    for name, fn in routes.items():
        for d in {d0, d1}:
            d.clock(max_age_s=0.5)
        try:
            res["routes"][name] = fn()
        except ImportError as exc:
            res["routes"][name] = {"skipped": str(exc)}
    res["small_items"] = small_items(d0, args.small)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(
        f"== handoff latency, GPU ready → consumer running ({where}; {args.items} items, "
        f"{args.kernel_us:.0f} µs kernels; {devs[0].description})"
    )
    print(f"{'route':48s} {'p50 µs':>8s} {'p90 µs':>8s} {'p99 µs':>8s} {'CPU µs/item':>12s}")
    for name, r in res["routes"].items():
        if "skipped" in r:
            print(f"{name:48s} skipped: {r['skipped']}")
            continue
        print(f"{name:48s} {r['p50_us']:8.1f} {r['p90_us']:8.1f} {r['p99_us']:8.1f} {r['cpu_us_per_handoff']:12.1f}")
    s = res["small_items"]
    print(f"== many small items ({args.small}, no GPU work between them, one GPU)")
    for name, r in s.items():
        print(f"{name:48s} {r['per_s']:10.0f} handoffs/s {r['cpu_us_per_handoff']:8.1f} CPU µs/item")
    base_h = res["routes"]["host: queue.Queue + Event.sync (baseline)"]
    ch_h = res["routes"]["host: Channel.get() thread"]
    base_g = res["routes"]["gpu: queue.Queue + sync + record (baseline)"]
    ch_g = res["routes"]["gpu: Channel.get(stream=)"]
    print(
        f"ratios: host-side p50 baseline/channel {base_h['p50_us'] / ch_h['p50_us']:.2f}x, CPU "
        f"{base_h['cpu_us_per_handoff'] / ch_h['cpu_us_per_handoff']:.2f}x; GPU-side p50 baseline/channel "
        f"{base_g['p50_us'] / ch_g['p50_us']:.2f}x; small items channel/baseline "
        f"{s['channel']['per_s'] / s['queue_sync']['per_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
