"""Is a step timer's harvest slow beside a busy loop because its thread wakes on a cold CPU?

`bench_steps`' harvest share (the host-bound loop, 1200 marked steps in one timer, harvests profiled) run in rounds,
the harvest thread left where the scheduler puts it (``any``) and moved onto the CPU the loop's thread last ran on
for each harvest (``loop``), the two taking turns. Prints per round and variant: the harvest thread's share of the
loop's time, each harvest's wall and CPU time p50 (µs), and the CPU per step of its parts.

    PYTHONPATH=$PWD python dev/diag_harvest_cpu.py [--devices N] [--rounds 3] [--steps 1200] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import anyio
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import asyncgpu  # noqa: E402
from benchmarks.bench_steps import harvest_share, host_work, torch_work  # noqa: E402

VARIANTS = ("any", "loop")


async def run(devs: list, args: argparse.Namespace) -> list[dict]:
    make = host_work if devs[0].backend == "host" else torch_work
    for d in devs:
        await d.prepare()
    work = [make(d, "host-bound", args) for d in devs]
    out = []
    for r in range(args.rounds):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            share = await harvest_share(devs, work, args.steps, profile=True, pin_loop_cpu=v == "loop")
            row = {
                "round": r,
                "variant": v,
                "share_pct": share["share_pct"],
                "harvests": share["harvests"],
                "harvest_us_p50": float(np.median(share["harvest_us"])) if share["harvest_us"] else None,
                "harvest_cpu_us_p50": float(np.median(share["harvest_cpu_us"])) if share["harvest_cpu_us"] else None,
                "parts_us_per_step": {k: v / args.steps for k, v in share.get("harvest_parts_cpu_us", {}).items()},
                "share": share,
            }
            out.append(row)
            print(
                f"round {r} {v:>4}: harvest thread +{row['share_pct']:.2f} % of the loop; {row['harvests']} harvests, "
                f"each {row['harvest_us_p50']:.0f} µs p50, {row['harvest_cpu_us_p50']:.0f} µs of CPU",
                flush=True,
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cuda", "host"), default=None)
    ap.add_argument("--devices", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", metavar="DIR")
    args = ap.parse_args()
    if not hasattr(os, "sched_setaffinity"):
        print("needs Linux (os.sched_setaffinity)")
        return 2
    backend = args.backend or os.environ.get("ASYNCGPU_BACKEND") or "cuda"
    count = args.devices if args.devices is not None else (2 if backend == "host" else None)
    devs = asyncgpu.devices(backend, count=count)
    rows = anyio.run(run, devs, args)
    for v in VARIANTS:
        mine = [r for r in rows if r["variant"] == v]
        shares = ", ".join(f"{r['share_pct']:+.2f}" for r in mine)
        cpu = ", ".join(f"{r['harvest_cpu_us_p50']:.0f}" for r in mine)
        wall = ", ".join(f"{r['harvest_us_p50']:.0f}" for r in mine)
        print(f"{v:>4}: share % {shares}; harvest CPU µs p50 {cpu}; wall µs p50 {wall}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "harvest_cpu.json"), "w") as f:
            json.dump({"devices": [d.name for d in devs], "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
