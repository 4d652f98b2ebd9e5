"""Step timing on a data-parallel training loop across ranks (torch DDP: a gradient all-reduce in every step, NCCL
on GPUs, gloo on host devices): what the step timer and `asyncgpu.ranks.watch_steps` cost each rank, and how soon
a rank made slow is flagged, without a per-step barrier.

    torchrun --standalone --nproc-per-node 4 dev/diag_ddp_steps.py [--steps 200] [--pairs 4] [--every 25]
    torchrun --standalone --nproc-per-node 2 dev/diag_ddp_steps.py --backend host      # gloo, CPU, host devices

Each rank trains an MLP under DDP on its GPU (torch launching onto the rank's asyncgpu stream) and reads its loss after
each step (outside the step). Overhead: ``--pairs`` rounds of blocks of ``--steps`` steps, one block per mode (``bare``;
``idle``: a step timer open, no step marked; ``timer``: a step timer; ``watch``: a step timer with `watch_steps`), the
modes' order rotated each round; each rank's median step time per block; rank 0 prints, per rank and mode, the ratios to
the round's bare block: median and 95 % interval (what an open timer costs, what marking steps adds, what the exchange
adds). Whole blocks drift apart by more than a mark costs, so the marking is also measured between neighbours:
``alternate`` (and ``alternate-watch``, with `watch_steps`) runs ``4 * --steps`` steps in one timer, every rank marking
the same steps in the order M U U M, and compares each marked step with its unmarked neighbour (median ratio and 95 %
interval). ``toggle`` measures the whole events source (the open timer, its harvest thread, every step marked) between
neighbours: about ``8 * --steps`` steps in one event loop, in blocks of ``--block`` steps alternately bare and inside a
step timer (every step marked), the timer opened and closed at the block's edges; each timed block's median step (its
first eighth left out: the entry) against the mean of the bare blocks on either side, so that the loop's drift cancels.
Stragglers: one timed run where rank ``--slow-rank`` sleeps ``--slow-ms`` before each step (a data loader) from step
``--steps // 2`` on, then one where it sleeps inside each step before issuing it; rank 0 prints, for each, the first
block that flags the slow rank (and how many steps after the slowdown began), the blocks that flag another rank, whether
the ranks were judged in lockstep, and each block as judged.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any

import anyio

import asyncgpu


def model(backend: str, rank: int, dev: asyncgpu.Device, width: int, layers: int) -> tuple:
    """``(ddp model, optimizer, input, the torch stream context)`` on the rank's device."""
    import torch

    torch.manual_seed(rank)
    if backend == "host":
        net = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
        ddp = torch.nn.parallel.DistributedDataParallel(net)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3), torch.randn(16, width), contextlib.nullcontext
    cuda = torch.device("cuda", dev.index)
    torch.cuda.set_device(cuda)
    stream = torch.cuda.ExternalStream(dev.stream.handle, device=cuda)
    with torch.cuda.stream(stream):
        net = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
        net = net.to(cuda, torch.bfloat16)
        ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[dev.index])
        x = torch.randn(16, width, device=cuda, dtype=torch.bfloat16)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3), x, lambda: torch.cuda.stream(stream)


async def run(args: argparse.Namespace, rank: int, dev: asyncgpu.Device, parts: tuple, mode: str, slow: str) -> tuple:
    """``--steps`` steps in ``mode`` (``bare``, ``idle``, ``timer``, ``watch``; ``alternate`` and
    ``alternate-watch``: ``4 * --steps`` steps in one timer, marked in the order M U U M, the same steps on every
    rank); returns (step times ms, the watch or None)."""
    ddp, opt, x, on_stream = parts
    times: list[float] = []
    alternate = mode.startswith("alternate")

    async def steps(st: Any, n: int) -> None:
        for i in range(n):
            late = slow and rank == args.slow_rank and i >= args.steps // 2
            t0 = time.perf_counter()
            if late and slow == "before":
                time.sleep(args.slow_ms / 1e3)
            marked = st is not None and (not alternate or i % 4 in (0, 3))
            with st.step(i) if marked else contextlib.nullcontext():
                if late and slow == "inside":
                    time.sleep(args.slow_ms / 1e3)
                with on_stream():
                    opt.zero_grad(set_to_none=True)
                    loss = ddp(x).float().square().mean()
                    loss.backward()  # (DDP's all-reduce: every rank's step waits for the slowest)
                    opt.step()
            with dev.record() as done:  # (the loss read after the step, as loss.item() would)
                await done.wait()
            times.append((time.perf_counter() - t0) * 1e3)

    if mode == "bare":
        await steps(None, args.steps)
        return times, None
    if mode == "toggle":  # blocks bare and timed in turn; ``times`` become the blocks' medians
        medians = []
        for b in range(2 * (4 * args.steps // args.block) + 1):  # (bare at both ends)
            del times[:]
            if b % 2:
                async with asyncgpu.step_timer(dev, max_pending=4 * args.block) as st:
                    await steps(st, args.block)
            else:
                await steps(None, args.block)
            medians.append(statistics.median(times[args.block // 8 :]))
        return medians, None
    watch = None
    async with asyncgpu.step_timer(dev, max_pending=4 * args.steps) as st:
        if mode.endswith("watch"):
            watch = asyncgpu.ranks.watch_steps(st, every=args.every, timeout_s=120)
        await steps(None if mode == "idle" else st, 4 * args.steps if alternate else args.steps)
    return times, watch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--block", type=int, default=40, help="toggle: steps a block")
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--slow-ms", type=float, default=5.0)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    if "LOCAL_RANK" not in os.environ:
        print("run it under torchrun: torchrun --standalone --nproc-per-node N dev/diag_ddp_steps.py", file=sys.stderr)
        return 2
    import torch.distributed as dist

    from benchmarks.bench_steps import ci95

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl" if args.backend == "cuda" else "gloo")
    world = dist.get_world_size()
    dev = asyncgpu.device(local) if args.backend == "cuda" else asyncgpu.device("host:0")
    if args.backend == "host":
        args.width, args.layers = min(args.width, 256), min(args.layers, 4)
    parts = model(args.backend, rank, dev, args.width, args.layers)
    anyio.run(run, args, rank, dev, parts, "bare", "")  # (warm-up)
    modes = ("bare", "idle", "timer", "watch")
    block_ms: dict[str, list[float]] = {m: [] for m in modes}
    for k in range(args.pairs):
        for mode in modes[k % len(modes) :] + modes[: k % len(modes)]:
            times, _ = anyio.run(run, args, rank, dev, parts, mode, "")
            block_ms[mode].append(statistics.median(times[args.steps // 10 :]))
    mine = {}
    for mode in modes[1:]:
        ratios = [t / b for t, b in zip(block_ms[mode], block_ms["bare"])]
        mine[mode] = (statistics.median(block_ms["bare"]), statistics.median(block_ms[mode]))
        mine[mode] += (statistics.median(ratios), ci95(ratios))
    for mode in ("alternate", "alternate-watch"):  # each marked step against its unmarked neighbour (M U U M)
        times, _ = anyio.run(run, args, rank, dev, parts, mode, "")
        groups = range(len(times) // 40, len(times) // 4)  # (the first tenth left out, as in the blocks)
        marked = [times[4 * g + k] for g in groups for k in (0, 3)]
        unmarked = [times[4 * g + k] for g in groups for k in (1, 2)]
        ratios = [m / u for m, u in zip(marked, unmarked)]
        mine[mode] = (statistics.median(unmarked), statistics.median(marked), statistics.median(ratios), ci95(ratios))
    medians, _ = anyio.run(run, args, rank, dev, parts, "toggle", "")  # (bare, timed, bare, ...)
    bare_b, timed_b = medians[0::2], medians[1::2]
    ratios = [t / ((a + b) / 2) for t, a, b in zip(timed_b, bare_b, bare_b[1:])]  # (against both neighbours)
    mine["toggle"] = (statistics.median(bare_b), statistics.median(timed_b), statistics.median(ratios), ci95(ratios))
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    found = {}
    for slow in ("before", "inside"):
        _, watch = anyio.run(run, args, rank, dev, parts, "watch", slow)
        reps = list(watch.reports)
        start = args.steps // 2
        after = [r for r in reps if r.block * args.every >= start]
        hit = next((r for r in after if r.flagged and r.straggler_rank == args.slow_rank), None)
        early = [r.block for r in reps if r.flagged and r.block * args.every < start]  # (no rank is slow yet)
        wrong = [r.block for r in after if r.flagged and r.straggler_rank != args.slow_rank]
        found[slow] = (hit, early, wrong, [r.lockstep for r in reps], reps)
    if rank == 0:
        print(f"{world} ranks ({args.backend}), {args.steps} steps a block, {args.pairs} rounds")
        for r, per_mode in enumerate(every):
            for mode, (b, t, med, (lo, hi)) in per_mode.items():
                base = "unmarked" if mode.startswith("alternate") else "bare blocks" if mode == "toggle" else "bare"
                print(f"rank {r}: {base} {b:.3f} ms, {mode} {t:.3f} ms: ratio p50 {med:.4f} [{lo:.4f}, {hi:.4f}]")
        for slow, (hit, early, wrong, lock, reps) in found.items():
            first = None if hit is None else hit.block * args.every
            when = (
                f"first flagged in the block of steps {first}-{first + args.every - 1} (the slowdown began at step "
                f"{args.steps // 2}), excess {hit.excess_ms[args.slow_rank]:.2f} ms"
                if hit is not None
                else "never flagged"
            )
            print(
                f"rank {args.slow_rank} slowed {args.slow_ms} ms {slow} its steps: {when}; blocks flagged before the "
                f"slowdown: {early or 'none'}; after it, blocks flagging another rank: {wrong or 'none'}; lockstep in "
                f"{sum(lock)} of {len(lock)} blocks"
            )
            for r in reps:  # (each block as judged: which rule, whom, by how much)
                rule = "lockstep" if r.lockstep else "free"
                excess = " ".join(f"{x:.2f}" for x in r.excess_ms)
                late = " ".join(f"{x:.2f}" for x in r.lateness_ms)
                print(
                    f"    block {r.block}: {rule:<8} step {r.step_ms:.2f} ms, straggler rank {r.straggler_rank} "
                    f"({r.straggler}){' FLAGGED' if r.flagged else ''}; excess ms [{excess}], lateness ms [{late}]"
                )
    asyncgpu.close_all()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
