"""Where a host-side take's latency goes, per consumer (plain thread, asyncio, uvloop, trio): the handoff
pipeline of examples/handoff_two_gpus.py with more items. For each take: GPU ready -> the engine's wake sent
(``sent_ns``, early wakes) -> the task woke (``woke_ns``) -> the task ran (``_take_ns``).

    python dev/diag_handoff.py [--items 200] [--backend cuda|host]
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import handoff_two_gpus as pipeline

import asyncgpu
from asyncgpu._core import engine as engine_mod


def run(consumer: str, backend: str, items: int) -> dict:
    d0, d1 = asyncgpu.device(f"{backend}:0"), asyncgpu.device(f"{backend}:{1 if backend == 'host' else 1}")
    a, b = asyncgpu.Channel(2, name="a"), asyncgpu.Channel(2, name="b")
    waiters: list = []
    real_add = engine_mod.Engine.add

    def add(self, *args, **kw):  # keep the consumer's waits to read their timestamps afterwards
        w = real_add(self, *args, **kw)
        if threading.current_thread() is threading.main_thread():
            waiters.append(w)
        return w

    engine_mod.Engine.add = add
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
        engine_mod.Engine.add = real_add
        for t in threads:
            t.join()
    lat = b.latencies_ns(gpu_side=False) / 1e3
    early = [w for w in waiters if w.woke_ns]
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
    out["waits"] = len(waiters)
    out["early_woken"] = len(early)
    if early:
        out["sent_to_woke_p50_us"] = float(np.median([(w.woke_ns - w.sent_ns) / 1e3 for w in early if w.sent_ns]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=200)
    p.add_argument("--backend", default="cuda")
    args = p.parse_args()
    for consumer in ("thread", "asyncio", "uvloop", "trio", "thread", "trio"):
        r = run(consumer, args.backend, args.items)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
