"""Where the CUPTI step timer's overhead goes on a host-bound torch loop: each variant in a process of its own (CUPTI
taken before torch loads, as bench_steps does), its step time against the same process's bare steps.

    PYTHONPATH=$PWD python dev/diag_step_cupti.py [--steps 300] [--devices 1]

Variants: ``default`` (harvest every 50 ms); ``no-flush`` (harvest_s=3600: nothing flushed while timed: what
CUPTI's own instrumentation costs). Each reports the flushes' count, their wall time (CUPTI's hand-over and the
bulk parse) and the records.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

VARIANTS = ("default", "no-flush")


def child(variant: str, steps: int, devices: int) -> dict:
    from asyncgpu._backends import cupti

    cupti.acquire(cupti.STEPS)
    stats = {"flushes": 0, "flush_s": 0.0, "records": 0}
    real_flush = cupti.flush_batch

    def timed_flush(channel: int):
        t0 = time.perf_counter()
        batch, ext = real_flush(channel)
        stats["flushes"] += 1
        stats["flush_s"] += time.perf_counter() - t0
        stats["records"] += len(batch)
        return batch, ext

    cupti.flush_batch = timed_flush

    import anyio

    import asyncgpu
    from benchmarks.bench_steps import run_steps, torch_work

    args = argparse.Namespace(layers=8, width=2048, batch=16, size=8192, matmuls=4)
    devs = asyncgpu.devices("cuda", count=devices)
    work = [torch_work(d, "host-bound", args) for d in devs]

    async def main() -> dict:
        for d in devs:
            await d.prepare()
        out = {}
        for _rep in range(2):
            await run_steps(devs, work, 30, None)
            t0 = time.perf_counter()
            await run_steps(devs, work, steps, None)
            out.setdefault("bare_ms", []).append((time.perf_counter() - t0) / steps * 1e3)
            harvest_s = 3600 if variant == "no-flush" else 0.05
            for k in stats:
                stats[k] = 0
            async with asyncgpu.step_timer(devs, source="cupti", harvest_s=harvest_s) as st:
                await run_steps(devs, work, 30, st)
                t0 = time.perf_counter()
                await run_steps(devs, work, steps, st)
                out.setdefault("cupti_ms", []).append((time.perf_counter() - t0) / steps * 1e3)
            out.setdefault("stats", []).append(dict(stats))
        return out

    res = anyio.run(main)
    asyncgpu.close_all()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.steps, args.devices)))
        return 0
    print(f"{'variant':<14} {'bare ms':>8} {'cupti ms':>9} {'ratio':>6}  flushes  flush ms/each  records")
    for v in args.variants.split(","):
        p = subprocess.run(
            [sys.executable, __file__, "--child", v, "--steps", str(args.steps), "--devices", str(args.devices)],
            capture_output=True,
            text=True,
        )
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{v:<14} failed (exit {p.returncode}): {p.stderr[-800:]}")
            continue
        r = json.loads(line[7:])
        for bare, cup, s in zip(r["bare_ms"], r["cupti_ms"], r["stats"]):
            nf = max(s["flushes"], 1)
            print(
                f"{v:<14} {bare:8.3f} {cup:9.3f} {cup / bare:6.2f}  {s['flushes']:7d}  {1e3 * s['flush_s'] / nf:13.3f}"
                f"  {s['records']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
