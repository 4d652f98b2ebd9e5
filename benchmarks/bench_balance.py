"""The balance report against the wall clock: an uneven split of real work, re-split as the report suggests.

    PYTHONPATH=$PWD python benchmarks/bench_balance.py --devices 4 [--units 120] [--ratio 1:2:3:4] [--out b.json]
    PYTHONPATH=$PWD python benchmarks/bench_balance.py --backend host --devices 2      (no GPU: numpy matmuls)

One `gpu_timer` scope per run, one task per device, each issuing its share of the work units from the loop's
thread (as most code does: the host issues the devices one after another). A unit is a bf16 matmul of
``--size`` x ``--size`` (torch, on asyncgpu's stream as an ``ExternalStream``, inside a ``t.activity`` block;
``--backend host``: a float32 numpy matmul launched on the host device's stream with ``stream.launch``).

1. uneven: the units split by ``--ratio`` (default 1:2:…:N), ``--repeat`` runs (after one warm-up run): the wall
   makespan from the timeline (scope start to the last device's end) and from the host clock (scope start to the
   scope's exit, which waits for every device), the report's straggler, verdict and predicted wall makespan for
   its suggested split (from the run with the median makespan);
2. re-split: the same runs with the suggested split; the error is measured / predicted - 1 (target: within 10 %);
3. host-bound: ``--tiny`` kernels of 5 µs per device (asyncgpu's spin kernel, launched one by one; on the host
   backend with 1 ms of host work after each): the report should name the host, not a device. With
   ``--launch worker`` each device's share is launched from its own
   worker thread (``await device.run(...)``) instead of the loop's thread.

Prints a table and, with ``--out``, writes every figure as JSON. Without torch on the CUDA backend it says so and
exits with status 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a host device's matmul on one core, as a GPU runs its own work
os.environ.setdefault("OMP_NUM_THREADS", "1")

import anyio  # noqa: E402  (after the BLAS thread count)
import numpy as np  # noqa: E402

import asyncgpu

_CHUNK = 64  #: units a task issues before it waits for room on its stream


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=2, help="how many devices (default 2)")
    ap.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    ap.add_argument("--units", type=int, default=120, help="work units in all (matmuls)")
    ap.add_argument("--ratio", help="the uneven split, e.g. 1:2:3:4 (default 1:2:...:N)")
    ap.add_argument("--size", type=int, help="matmul size (default 4096 on CUDA, 256 on the host backend)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per case (the median is reported)")
    ap.add_argument("--tiny", type=int, help="5 µs kernels per device in the host-bound case (2000; host: 100)")
    ap.add_argument("--launch", choices=("task", "worker"), default="task", help="who launches a device's share")
    ap.add_argument("--out", help="write every figure to this JSON file")
    args = ap.parse_args(argv)
    if args.devices < 1 or args.units < args.devices or args.repeat < 1:
        ap.error("--devices >= 1, --units >= --devices and --repeat >= 1")
    ratio = [float(x) for x in args.ratio.split(":")] if args.ratio else [float(i + 1) for i in range(args.devices)]
    if len(ratio) != args.devices or min(ratio) <= 0:
        ap.error(f"--ratio needs {args.devices} positive parts separated by ':'")
    args.ratio = ratio
    args.size = args.size or (4096 if args.backend == "cuda" else 256)
    args.tiny = args.tiny or (2000 if args.backend == "cuda" else 100)
    return args


def split(total: int, ratio: list[float]) -> list[int]:
    """``total`` whole units in proportion to ``ratio`` (largest remainder)."""
    quota = np.array(ratio) * total / sum(ratio)
    whole = np.floor(quota).astype(int)
    for i in np.argsort(-(quota - whole), kind="stable")[: total - int(whole.sum())]:
        whole[i] += 1
    return whole.tolist()


class Work:
    """A unit of work on one device: ``issue(t, dev, units)`` issues ``units`` of it on the device's stream."""

    def __init__(self, backend: str, size: int, devs: list[Any]) -> None:
        self.backend, self.size = backend, size
        self.buffers: dict[int, tuple[Any, Any, Any]] = {}
        for d in devs:
            if backend == "cuda":
                import torch

                with torch.cuda.device(d.index):
                    gen = torch.Generator(device=f"cuda:{d.index}").manual_seed(d.index)
                    x = torch.randn(size, size, device=f"cuda:{d.index}", dtype=torch.bfloat16, generator=gen)
                    stream = torch.cuda.ExternalStream(d.stream.handle, device=torch.device("cuda", d.index))
                    self.buffers[d.index] = (x, torch.empty_like(x), stream)
            else:
                x = np.random.default_rng(d.index).random((size, size), dtype=np.float32)
                self.buffers[d.index] = (x, np.empty_like(x), None)

    def issue(self, t: Any, dev: Any, units: int) -> None:
        x, y, stream = self.buffers[dev.index]
        if self.backend == "cuda":
            import torch

            with torch.cuda.device(dev.index), torch.cuda.stream(stream):
                for _ in range(units):
                    with t.activity("matmul", stream=dev.stream):
                        torch.matmul(x, x, out=y)
        else:
            for _ in range(units):
                dev.stream.launch(functools.partial(np.matmul, x, x, out=y), None, name="matmul")

    def tiny(self, t: Any, dev: Any, kernels: int) -> None:
        """5 µs kernels, one launch each. A host device cannot run a kernel that short (its stream thread's wake
        costs more), so there the host also works 1 ms (a sleep) after each launch."""
        for _ in range(kernels):
            dev.stream.spin_us(5)
            if self.backend == "host":
                time.sleep(0.001)


async def run(devs: list[Any], label: str, issue: Any, shares: list[int], launch: str) -> dict:
    """One scope: a task per device issuing its share; the figures of its balance report."""

    async def one(t: Any, dev: Any, units: int) -> None:
        if launch == "worker":
            await dev.run(lambda _stream: issue(t, dev, units))
            return
        for lo in range(0, units, _CHUNK):  # (a loop's thread must not fill a stream: room, then a chunk)
            n = min(_CHUNK, units - lo)
            await dev.stream.room(5 * n)  # (a timed launch queues up to 5: primer, hold, the work, 2 records)
            issue(t, dev, n)

    async with asyncgpu.gpu_timer(devs, label=label) as t:
        async with anyio.create_task_group() as tg:
            for d, units in zip(devs, shares):
                tg.start_soon(one, t, d, units)
    host_wall_ms = (time.perf_counter_ns() - t.timeline.scope_start_ns) / 1e6
    rep = t.balance(work_units=shares)
    return {
        "units": list(shares),
        "wall_ms": rep.makespan_ms,
        "host_wall_ms": host_wall_ms,
        "busy_ms": [r.busy_ms for r in rep.rows],
        "start_offset_ms": [r.start_offset_ms for r in rep.rows],
        "straggler": rep.straggler,
        "verdict": rep.verdict,
        "critical_path": rep.critical_path,
        "suggested": [r.suggested_units for r in rep.rows],
        "predicted_ms": rep.predicted_makespan_ms,
        "predicted_busy_ms": rep.predicted_busy_ms,
        "report": rep,
    }


async def repeat(devs: list[Any], label: str, issue: Any, shares: list[int], n: int, launch: str) -> dict:
    """``n`` runs; the run with the median wall makespan, with every run's makespans."""
    runs = [await run(devs, label, issue, shares, launch) for _ in range(n)]
    median = statistics.median_low([r["wall_ms"] for r in runs])
    out = next(r for r in runs if r["wall_ms"] == median)
    out["wall_ms_runs"] = [r["wall_ms"] for r in runs]
    out["host_wall_ms_median"] = statistics.median(r["host_wall_ms"] for r in runs)
    return out


async def bench(args: argparse.Namespace) -> dict:
    devs = asyncgpu.devices(args.backend, count=args.devices)
    work = Work(args.backend, args.size, devs)
    uneven = split(args.units, args.ratio)
    await run(devs, "warm-up", work.issue, split(args.units, [1.0] * len(devs)), args.launch)  # cuBLAS, caches
    first = await repeat(devs, "uneven", work.issue, uneven, args.repeat, args.launch)
    second = await repeat(devs, "re-split", work.issue, first["suggested"], args.repeat, args.launch)
    tiny = await repeat(devs, "host-bound", work.tiny, [args.tiny] * len(devs), 1, args.launch)
    return {
        "devices": [f"{d.name} {d.description}".strip() for d in devs],
        "uneven": first,
        "resplit": second,
        "host_bound": tiny,
    }


def table(res: dict) -> str:
    first, second, tiny = res["uneven"], res["resplit"], res["host_bound"]
    predicted = first["predicted_ms"]
    error = second["wall_ms"] / predicted - 1 if predicted else float("nan")
    rows = [
        ("case", "units", "wall (ms)", "host wall (ms)", "predicted (ms)", "error", "straggler"),
        ("uneven", first["units"], first["wall_ms"], first["host_wall_ms_median"], None, None, first["straggler"]),
        (
            "re-split",
            second["units"],
            second["wall_ms"],
            second["host_wall_ms_median"],
            predicted,
            error,
            second["straggler"],
        ),
        ("host-bound", tiny["units"], tiny["wall_ms"], tiny["host_wall_ms_median"], None, None, tiny["straggler"]),
    ]

    def cell(v: Any, pct: bool = False) -> str:
        if v is None:
            return "—"
        if isinstance(v, list):
            return ":".join(map(str, v))
        if isinstance(v, float):
            return f"{v:+.1%}" if pct else f"{v:,.3f}"
        return str(v)

    text = [[cell(v, pct=(k == 5 and i > 0)) for k, v in enumerate(r)] for i, r in enumerate(rows)]
    widths = [max(len(r[k]) for r in text) for k in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(r, widths))) for r in text]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [
        "",
        f"uneven:     {first['verdict']}",
        f"re-split:   {second['verdict']}",
        f"host-bound: {tiny['verdict']}",
        "target: the re-split's measured wall makespan within 10 % of the prediction: "
        + ("met" if abs(error) <= 0.1 else "NOT met"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend == "cuda":
        try:
            import torch
        except ImportError:
            print("bench_balance: the CUDA backend needs torch (pip install torch); --backend host needs nothing")
            return 2
        if not torch.cuda.is_available() or torch.cuda.device_count() < args.devices:
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            print(f"bench_balance: --devices {args.devices} needs that many CUDA GPUs, torch sees {have}")
            return 2
    res = anyio.run(bench, args)
    for case in ("uneven", "resplit", "host_bound"):
        import rich

        print(f"\n== {case}: the balance report of its median run ==")
        rich.print(res[case].pop("report"))
    print()
    print(table(res))
    if args.out:
        meta = {"args": {k: v for k, v in vars(args).items()}, "python": platform.python_version()}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({**meta, **res}, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        asyncgpu.close_all()
