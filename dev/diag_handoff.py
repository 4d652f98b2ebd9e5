"""Where a host-side take's latency goes, per consumer (plain thread, asyncio, uvloop, trio): the handoff
pipeline of examples/handoff_two_gpus.py with more items: the latency of every take (GPU ready, or the consumer
asking if later, to the consumer running), split into the takes asked before and after the work was done, and the
first 8 takes (a fresh run's) apart from the rest.

    python dev/diag_handoff.py [--items 200] [--backend cuda|host] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
import handoff_two_gpus as pipeline

import asyncgpu
from benchmarks._common import tee_stdout_to


def run(consumer: str, backend: str, items: int) -> dict:
    d0, d1 = asyncgpu.device(f"{backend}:0"), asyncgpu.device(f"{backend}:{1 if backend == 'host' else 1}")
    a, b = asyncgpu.Channel(2, name="a"), asyncgpu.Channel(2, name="b")
    threads = [
        threading.Thread(target=pipeline.make, args=(d0, a, items)),
        threading.Thread(target=pipeline.transform, args=(d1, a, b)),
    ]
    for t in threads:
        t.start()
    taken = []

    async def check():
        async for h in b:
            with h:
                taken.append(h)

    try:
        if consumer == "thread":
            for h in b:
                with h:
                    taken.append(h)
        elif consumer == "trio":
            import trio

            trio.run(check)
        else:
            import anyio

            anyio.run(check, backend="asyncio", backend_options={"use_uvloop": consumer == "uvloop"})
    finally:
        for t in threads:
            t.join()
    lat = b.latencies_ns(gpu_side=False) / 1e3
    out = {
        "consumer": consumer,
        "n": len(lat),
        "p50_us": float(np.nanmedian(lat)),
        "p90_us": float(np.nanpercentile(lat, 90)),
    }
    recs = [r for r in b.records() if not r.gpu_side]
    late = np.array([(r.get_ns - r.ready_ns) / 1e3 for r in recs])  # > 0: the consumer asked after the work was done
    take = np.array([(r.take_ns - r.get_ns) / 1e3 for r in recs])
    out["get_after_ready"] = int((late > 0).sum())
    out["take_minus_get_p50_us(asked late)"] = float(np.median(take[late > 0])) if (late > 0).any() else float("nan")
    out["take_minus_ready_p50_us(asked early)"] = (
        float(np.median([(r.take_ns - r.ready_ns) / 1e3 for r, x in zip(recs, late) if x <= 0]))
        if (late <= 0).any()
        else float("nan")
    )
    parked = [r for r in recs if r.get_ns < r.put_ns]  # the consumer waited in get() before the item was put
    if parked:  # the item's arrival wakes the parked consumer: is that wake or the GPU work the longer?
        out["parked_takes"] = len(parked)
        out["put_to_take_p50_us"] = float(np.median([(r.take_ns - r.put_ns) / 1e3 for r in parked]))
        out["put_to_ready_p50_us"] = float(np.median([(r.ready_ns - r.put_ns) / 1e3 for r in parked]))
    out["first_8_p50_us"] = float(np.nanmedian(lat[:8]))  # what the example's 8 items show
    out["rest_p50_us"] = float(np.nanmedian(lat[8:]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=200)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--out", help="also write what is printed to this file")
    args = p.parse_args()
    tee_stdout_to(args.out)
    for consumer in ("thread", "asyncio", "uvloop", "trio", "thread", "trio"):
        r = run(consumer, args.backend, args.items)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
