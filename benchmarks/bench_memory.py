"""Memory a scope leaves behind: bytes per activity held after a scope of many activity blocks (host backend, or
CUDA with --backend cuda), and what is left once the timer is dropped.

    PYTHONPATH=$PWD python benchmarks/bench_memory.py [--activities 100000] [--backend host] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc

import asyncgpu


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--activities", type=int, default=100_000)
    p.add_argument("--backend", default="host")
    p.add_argument("--out", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    n = args.activities
    dev = asyncgpu.device(f"{args.backend}:0")
    dev.stream.spin_us(0)
    dev.synchronize()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    with asyncgpu.gpu_timer(dev) as t:
        for _ in range(n):
            with t.activity("a", device=dev):
                pass
    elapsed = time.perf_counter() - t0
    tl = t.timeline
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    stats = dev.pool_stats()
    print(
        f"{n:,} activities on {dev.name} in {elapsed:.2f} s: {held / n:.0f} bytes per activity held after the scope "
        f"(the timeline's columns {tl.start_ns.nbytes * 3 / n:.0f}); pool: {stats.created} events, {stats.free} free"
    )
    del t, tl
    gc.collect()
    dropped = tracemalloc.get_traced_memory()[0] - base
    print(f"once the timer is dropped: {dropped / n:.0f} bytes per activity")
    asyncgpu.close_all()
    if args.out:
        figures = {
            "activities": n,
            "backend": args.backend,
            "seconds": elapsed,
            "held_bytes_per_activity": held / n,
            "dropped_bytes_per_activity": dropped / n,
            "pool_events_created": stats.created,
        }
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
