"""What `asyncgpu.ranks.watch_steps` costs a rank: CPU time per exchange on its exchange thread, the bytes each
rank sends per block, and whether the loop's step time moves, on gloo ranks of this machine (host devices: the
exchange does not touch the GPU, so this is its cost on any machine).

    PYTHONPATH=$PWD python dev/diag_rank_exchange.py [--ranks 2] [--steps 400] [--every 50] [--step-us 2000]

Each rank runs ``--steps`` steps (a ``--step-us`` sleep inside each, as a data loader's wait: the ranks share this
machine's CPUs) with a step timer, once without and once with `watch_steps`, and prints its median step time in both
and the exchange's CPU ms per block. Needs torch (gloo).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time


def rank_main(rank: int, world: int, store: str, out: str, steps: int, every: int, step_us: int) -> None:
    import anyio
    import torch.distributed as dist

    import asyncgpu

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    devs = asyncgpu.devices("host", count=1)

    async def run(watch: bool) -> tuple[list[float], object]:
        async with asyncgpu.step_timer(devs) as st:
            w = asyncgpu.ranks.watch_steps(st, every=every, timeout_s=60) if watch else None
            times = []
            for i in range(steps):
                t0 = time.perf_counter_ns()
                with st.step(i):
                    time.sleep(step_us / 1e6)
                times.append((time.perf_counter_ns() - t0) / 1e6)
        return times, w

    res = {}
    for mode in ("without", "with", "without", "with"):
        times, w = anyio.run(run, mode == "with")
        res.setdefault(mode, []).append(statistics.median(times[20:]))
        if w is not None:
            res["cpu_ms"] = list(w.exchange_cpu_ms)
            res["reports"] = len(w.reports)
            res["error"] = repr(w.error)
    now = time.perf_counter_ns()
    rows = [[i, now + i, now + i + 5, [now + i + 9], -1] for i in range(every)]  # a block as `StepWatch` sends it
    res["bytes_per_block"] = len(pickle.dumps((0, ("host:0",), rows)))
    with open(out, "w") as f:
        json.dump(res, f)
    asyncgpu.close_all()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--step-us", type=int, default=2000)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.ranks, args.store, args.out, args.steps, args.every, args.step_us)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(args.ranks)]
        base = [sys.executable, __file__, "--ranks", str(args.ranks), "--steps", str(args.steps)]
        base += ["--every", str(args.every), "--step-us", str(args.step_us), "--store", os.path.join(tmp, "store")]
        procs = [subprocess.Popen([*base, "--rank", str(r), "--out", outs[r]]) for r in range(args.ranks)]
        if any(p.wait(timeout=600) for p in procs):
            print("a rank failed")
            return 1
        for r, o in enumerate(outs):
            d = json.load(open(o))
            cpu = d["cpu_ms"]
            print(
                f"rank {r}: step ms without {d['without']}, with {d['with']}; {d['reports']} exchanges, CPU per "
                f"exchange median {statistics.median(cpu):.2f} ms (max {max(cpu):.2f}); ~{d['bytes_per_block']} bytes "
                f"sent per block of {args.every} steps; error {d['error']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
