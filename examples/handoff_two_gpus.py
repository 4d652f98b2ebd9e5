"""Hand GPU work from one thread to another across two GPUs, and a three-stage pipeline (threads, then trio).

    python examples/handoff_two_gpus.py [--trace PATH]          # two GPUs (needs trio)
    ASYNCGPU_BACKEND=host python examples/handoff_two_gpus.py      # two host devices instead of GPUs

1. A producer thread on GPU 0 makes batches (in a ring of 3 reused buffers); a consumer thread on GPU 1 takes
   each batch on the GPU (its stream waits for the producer's event: no host wait), copies it peer to peer and
   processes it. Before reusing a buffer the producer's stream waits, on the GPU, for the consumer's copy.
2. A three-stage pipeline across threads: make (GPU 0) → transform (GPU 1) → check (a host thread that takes
   the result once the GPU has finished it).
3. The same pipeline with the last stage as a trio task.

Every result is checked; the handoffs (with flow arrows) go to a Perfetto trace (in the temp folder unless
``--trace`` says where).
"""

from __future__ import annotations

import argparse
import sys
import threading

import numpy as np
import rich
from example_setup import devices, need, need_modules, trace_path

import asyncgpu

N = 1 << 20  # floats per batch
BATCHES = 12


def pick_devices():
    devs = devices()
    if len(devs) < 2:
        need(f"two GPUs (this machine has {len(devs)}), or host devices: ASYNCGPU_BACKEND=host python {sys.argv[0]}")
    return devs[0], devs[1]


def producer_consumer(d0, d1) -> None:
    ch = asyncgpu.Channel(2, name="batches")
    ring = [d0.alloc(N) for _ in range(3)]
    for buf in ring:
        d0.stream.memset(buf, 0)
    mine = d1.alloc(N)
    sums = []
    host = d1.alloc_pinned(N)

    def produce():
        handoffs = [None] * len(ring)
        with ch:
            for i in range(BATCHES):
                k = i % len(ring)
                if handoffs[k] is not None:
                    handoffs[k].wait_done_sync(stream=d0.stream)  # GPU-side: the consumer's copy is done with it
                d0.stream.memset(ring[k], 0)
                d0.stream.inc_loop(ring[k], i + 1)  # batch i holds i + 1 everywhere
                handoffs[k] = ch.put_sync(ring[k], stream=d0.stream)

    def consume():
        for _ in range(BATCHES):
            h = ch.get_sync(stream=d1.stream)  # d1's stream waits for the batch on the GPU; returns at once
            d1.stream.copy(mine, h.payload)  # peer to peer
            h.done(stream=d1.stream)  # the producer may reuse its buffer once this copy has run
            d1.stream.inc_loop(mine, 1000)  # process it on GPU 1
            d1.stream.copy_to_host(mine, host)
            d1.stream.sync()
            sums.append(float(host[0]))

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = [float(i + 1 + 1000) for i in range(BATCHES)]
    assert sums == expected, f"wrong results: {sums} != {expected}"
    lat = ch.latencies_ns(gpu_side=True) / 1e3
    rich.print(
        f"[bold]1. producer thread on {d0.name} → consumer thread on {d1.name}[/]: {BATCHES} batches "
        f"checked; GPU ready → consumer stream running p50 {np.nanmedian(lat):.1f} µs, "
        f"max {np.nanmax(lat):.1f} µs"
    )


def make(d0, out: asyncgpu.Channel, n_items: int) -> None:
    with out:
        for i in range(n_items):
            a = d0.alloc(N)
            d0.stream.memset(a, 0)
            d0.stream.inc_loop(a, i)
            out.put_sync(a, stream=d0.stream)


def transform(d1, inp: asyncgpu.Channel, out: asyncgpu.Channel) -> None:
    with out:
        for h in iter_gpu(inp, d1.stream):
            b = d1.alloc(N)
            d1.stream.copy(b, h.payload)
            h.done(stream=d1.stream)
            d1.stream.inc_loop(b, 10)
            out.put_sync(b, stream=d1.stream)


def iter_gpu(ch: asyncgpu.Channel, stream):
    """GPU-side takes until the channel is closed."""
    while True:
        try:
            yield ch.get_sync(stream=stream)
        except asyncgpu.ClosedError:
            return


def pipeline_threads(d0, d1, n_items: int = 32) -> None:
    a, b = asyncgpu.Channel(2, name="made"), asyncgpu.Channel(2, name="transformed")
    results = []

    def check():
        for h in b:  # host-side: each result is taken once GPU 1 has finished it
            with h:
                results.append(float(h.payload.to_numpy()[-1]))

    threads = [
        threading.Thread(target=make, args=(d0, a, n_items)),
        threading.Thread(target=transform, args=(d1, a, b)),
        threading.Thread(target=check),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [float(i + 10) for i in range(n_items)], results
    lat = b.latencies_ns(gpu_side=False) / 1e3
    rich.print(
        f"[bold]2. pipeline make ({d0.name}) → transform ({d1.name}) → check (host thread)[/]: {n_items} "
        f"items checked; GPU ready → checker running p50 {np.nanmedian(lat):.1f} µs"
    )


def pipeline_trio(d0, d1, n_items: int = 32) -> None:
    import trio

    a, b = asyncgpu.Channel(2, name="made (trio)"), asyncgpu.Channel(2, name="transformed (trio)")
    threads = [
        threading.Thread(target=make, args=(d0, a, n_items)),
        threading.Thread(target=transform, args=(d1, a, b)),
    ]
    for t in threads:
        t.start()

    async def check():
        results = []
        async for h in b:  # the trio loop keeps running while GPU 1 works
            with h:
                results.append(float(h.payload.to_numpy()[-1]))
        return results

    results = trio.run(check)
    for t in threads:
        t.join()
    assert results == [float(i + 10) for i in range(n_items)], results
    lat = b.latencies_ns(gpu_side=False) / 1e3
    rich.print(
        f"[bold]3. the same pipeline, checked by a trio task[/]: {n_items} items checked; GPU ready → task "
        f"running p50 {np.nanmedian(lat):.1f} µs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", metavar="PATH", help="where to write the Perfetto trace (default: temp folder)")
    args = parser.parse_args()
    need_modules("trio", install="pip install trio")
    trace = trace_path(args.trace, "handoff")
    d0, d1 = pick_devices()
    rich.print(f"devices: {d0.name} ({d0.description}), {d1.name} ({d1.description})")
    with asyncgpu.gpu_timer([d0, d1], label="handoff example", all_threads=True) as t:
        producer_consumer(d0, d1)
        pipeline_threads(d0, d1)
        pipeline_trio(d0, d1)
    asyncgpu.write_trace(t, trace)
    n = sum(len(layer.records()) for layer in t.timeline.layers if hasattr(layer, "records"))
    rich.print(f"{n} handoffs drawn with flow arrows in {trace} (open it at https://ui.perfetto.dev)")


if __name__ == "__main__":
    main()
