"""Diagnostics for waits under load (not a benchmark of record): which part of the in-flight excess comes from
the engine and which from the loop. Prints one line per variant.

    PYTHONPATH=$PWD python benchmarks/diag_inflight.py
"""

import asyncio
import time

import numpy as np

import asyncgpu
from asyncgpu._core import engine as _engine

_now = time.perf_counter_ns


async def run(devs, n, kernel_us, per_kernel, streams_per_device, head_ms=300):
    streams = {d: list(d.streams)[:streams_per_device] for d in devs}
    marks, events = {}, []
    n_streams = len(devs) * streams_per_device
    for di, d in enumerate(devs):
        for k, s in enumerate(streams[d]):
            s.spin_us(head_ms * 1000 + (di + k * len(devs)) * kernel_us / n_streams)
        marks[d] = (d.mark_now(), _now())
    for i in range(n):
        d = devs[i % len(devs)]
        j = i // len(devs)
        s = streams[d][(j // per_kernel) % streams_per_device]
        first = j % per_kernel == 0
        if first:
            s.spin_us(kernel_us)
        events.append((d, s.record(), first))
    woke = [0] * n

    async def waiter(i, ev):
        await ev.wait()
        woke[i] = _now()

    await asyncio.gather(*(waiter(i, ev) for i, (_, ev, _) in enumerate(events)))
    heads, mates = [], []
    for i, (d, ev, first) in enumerate(events):
        ref, t_ref = marks[d]
        (heads if first else mates).append(woke[i] - (t_ref + (ev - ref) * 1e6))
        ev.release()
    return np.array(heads) / 1e3, np.array(mates) / 1e3


def single_repeats(dev):
    """Run-to-run spread of the single-wait figures (asyncgpu against the blocking waiter), same process."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_wait as b

    for loop in ("asyncio", "uvloop") * 3:
        for name, fn in (("asyncgpu", b.route_ours), ("blocking waiter", b.route_blocking_waiter)):
            ex, cpu = b._run_on(loop, fn, dev, 1000, 50)
            st = b._stats(ex)
            print(
                f"  {loop:8s} {name:16s} p50 {st['p50_us']:6.1f} p90 {st['p90_us']:6.1f} p99 {st['p99_us']:6.1f} "
                f"cpu {cpu / 1e3:6.1f} us",
                flush=True,
            )


def main():
    devs = asyncgpu.devices(streams=8)
    devs[0].stream.spin_us(1)
    for d in devs:
        d.synchronize()
    single_repeats(devs[0])
    variants = [
        ("10k, 4/kernel, early cap 4", 10_000, 2000, 4, 8, 4),
        ("10k, 4/kernel, no early", 10_000, 2000, 4, 8, 0),
        ("2k, 1/kernel, early cap 4", 2_000, 2000, 1, 8, 4),
        ("2k, 1/kernel, no early", 2_000, 2000, 1, 8, 0),
        ("200, 1/kernel 1 stream, cap 4", 200, 2000, 1, 1, 4),
    ]
    for name, n, k_us, per, sp, cap in variants:
        _engine.EARLY_MAX = cap
        heads, mates = asyncio.run(run(devs, n, k_us, per, sp))
        line = f"{name:32s} heads p50 {np.median(heads):8.1f} p90 {np.percentile(heads, 90):8.1f} us"
        if mates.size:
            line += f" | queued-behind p50 {np.median(mates):8.1f} p90 {np.percentile(mates, 90):8.1f} us"
        print(line, flush=True)
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
