"""Launch workers: steps per second of a host-bound torch training step on N GPUs, launched from one event loop's
thread against launched from each device's own worker thread (`Device.run`), in one run.

    PYTHONPATH=$PWD python benchmarks/bench_workers.py [--devices N] [--steps 200] [--repeat 3] [--hidden 2048]
        [--layers 8] [--batch 16] [--loop asyncio|uvloop|trio] [--out workers.json]
    PYTHONPATH=$PWD python benchmarks/bench_workers.py --backend host     # the script's logic, no torch, no GPU

The step: an MLP of ``--layers`` bf16 ``Linear(hidden, hidden)`` + ReLU, forward, a mean-square loss, backward and
an SGD step (about 6 kernels per layer, plus the optimizer's), on a batch small enough that the GPUs finish each
kernel long before the host has launched the next: the host's launching bounds the step. One task per GPU, each
on its device's stream (handed to torch as an ``ExternalStream``), at most two steps in flight per GPU:

* ``loop``: each task calls the step itself, on the loop's thread, one step between checkpoints. The GPUs' launches
  take turns on that one thread.
* ``workers``: each task awaits ``dev.run(step)``: the step runs on the device's worker thread, and the GPUs'
  launches overlap wherever the GIL is released (torch's C++ dispatch, the CUDA driver's calls).

* ``plain threads (peer)``: no event loop, one plain thread per GPU running its steps: what the GIL lets threads
  do at all, the ceiling the workers are held against.

Also ``1 GPU``: the loop mode on the first GPU alone (the single-GPU rate the others are compared with).
Repetitions are interleaved (1 GPU, loop, workers, then again), each after its warm-up steps; the table gives the
medians and the ratio workers / loop. With ``--backend host`` the "step" is numpy work on small arrays and a
host-kernel launch: it checks the script, not the GIL's limits.

How far per-device threads scale is the GIL's to say: the report gives the Python version and whether the GIL is
on (``sys._is_gil_enabled()``; free-threaded CPython 3.13t+ runs the threads' Python in parallel too).
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
import sys
import sysconfig
import threading
import time
from typing import Any, Callable

import anyio
import numpy as np

import asyncgpu

IN_FLIGHT = 2  #: steps a GPU may have queued before its task waits for the oldest
WARMUP_STEPS = 10


def gil_picture() -> dict[str, Any]:
    """The interpreter: version, whether it is a free-threaded build, whether the GIL is on now."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "gil_enabled": True if is_enabled is None else bool(is_enabled()),
    }


def fail(message: str) -> None:
    print(f"bench_workers: {message}", file=sys.stderr)
    raise SystemExit(2)


# -- the steps ---------------------------------------------------------------------------------------------------
def torch_step(dev: asyncgpu.Device, hidden: int, layers: int, batch: int) -> Callable[[Any], None]:
    """A training step of an MLP on ``dev`` (see the module docstring), launching on the asyncgpu stream it is
    given. Made once per device; the model's setup is done (synchronized) before it returns."""
    import torch

    device = torch.device("cuda", dev.index)
    with torch.cuda.device(device):
        blocks: list[torch.nn.Module] = []
        for _ in range(layers):
            blocks += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
        model = torch.nn.Sequential(*blocks).to(device=device, dtype=torch.bfloat16)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(batch, hidden, device=device, dtype=torch.bfloat16)
        torch.cuda.synchronize(device)
    streams: dict[int, Any] = {}

    def step(stream: Any) -> None:
        ext = streams.get(stream.handle)
        if ext is None:
            ext = streams[stream.handle] = torch.cuda.ExternalStream(stream.handle, device=device)
        with torch.cuda.device(device), torch.cuda.stream(ext):
            opt.zero_grad(set_to_none=True)
            loss = model(x).float().square().mean()
            loss.backward()
            opt.step()

    return step


def host_step(dev: asyncgpu.Device, hidden: int, layers: int, batch: int) -> Callable[[Any], None]:
    """The host backend's stand-in: numpy on small arrays (the "launching") and one host-kernel launch."""
    rng = np.random.default_rng(dev.index)
    n = min(hidden, 128)
    weights = [rng.standard_normal((n, n)).astype(np.float32) for _ in range(layers)]
    x = rng.standard_normal((min(batch, 16), n)).astype(np.float32)
    out = np.empty_like(x)

    def kernel(a: np.ndarray) -> None:
        out[:] = a

    def step(stream: Any) -> None:
        a = x
        for w in weights:
            a = np.maximum(a @ w, 0.0)
        stream.launch(kernel, None, a, name="step")

    return step


# -- one measurement -------------------------------------------------------------------------------------------
async def run_steps(dev: asyncgpu.Device, step: Callable[[Any], None], steps: int, on_worker: bool) -> None:
    """``steps`` steps on ``dev``, at most `IN_FLIGHT` queued; returns once the device has run them all."""
    stream = dev.stream
    flight: collections.deque = collections.deque()
    checkpoint = anyio.lowlevel.checkpoint
    try:
        for _ in range(steps):
            if on_worker:
                await dev.run(step, stream=stream)
            else:
                step(stream)
                await checkpoint()  # (the other GPUs' tasks launch in turn)
            flight.append(stream.record(timing=False))
            if len(flight) > IN_FLIGHT:
                ev = flight.popleft()
                await ev.wait()
                ev.release()
        while flight:
            ev = flight.popleft()
            await ev.wait()
            ev.release()
    finally:
        for ev in flight:
            ev.release()


async def measure(devs: list, steps_of: dict, steps: int, on_worker: bool) -> float:
    """Steps per second over all of ``devs``: warm-up, then ``steps`` steps per device, one task each."""
    async with anyio.create_task_group() as tg:
        for d in devs:
            tg.start_soon(run_steps, d, steps_of[d.name], WARMUP_STEPS, on_worker)
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for d in devs:
            tg.start_soon(run_steps, d, steps_of[d.name], steps, on_worker)
    return len(devs) * steps / (time.perf_counter() - t0)


def plain_threads(devs: list, steps_of: dict, steps: int) -> float:
    """The peer without asyncgpu's loop: one plain thread per GPU runs its steps (at most `IN_FLIGHT` queued,
    waited for with the driver's own wait). What the GIL allows threads at all: the ceiling for the workers."""

    def one(dev: asyncgpu.Device, n: int) -> None:
        stream, step, flight = dev.stream, steps_of[dev.name], collections.deque()
        for _ in range(n):
            step(stream)
            flight.append(stream.record(timing=False))
            if len(flight) > IN_FLIGHT:
                with flight.popleft() as ev:
                    ev.wait_sync()
        for ev in flight:
            with ev:
                ev.wait_sync()

    def run(n: int) -> None:
        threads = [threading.Thread(target=one, args=(d, n)) for d in devs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run(WARMUP_STEPS)
    t0 = time.perf_counter()
    run(steps)
    return len(devs) * steps / (time.perf_counter() - t0)


async def bench(devs: list, steps_of: dict, steps: int, repeat: int) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {
        "1 GPU, loop thread": [],
        "loop thread": [],
        "per-device workers": [],
        "plain threads (peer)": [],
    }
    for d in devs:
        await d.prepare()  # (the workers started and asyncgpu's own kernels loaded before anything is timed)
    for _ in range(repeat):  # interleaved: a drift of the machine touches every mode alike
        runs["1 GPU, loop thread"].append(await measure(devs[:1], steps_of, steps, on_worker=False))
        runs["loop thread"].append(await measure(devs, steps_of, steps, on_worker=False))
        runs["per-device workers"].append(await measure(devs, steps_of, steps, on_worker=True))
        runs["plain threads (peer)"].append(await anyio.to_thread.run_sync(plain_threads, devs, steps_of, steps))
    return runs


# -- the command -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("cuda", "host"), default="cuda", help="host: check the script (numpy)")
    ap.add_argument("--devices", type=int, help="how many devices (default: every GPU; host: 2)")
    ap.add_argument("--steps", type=int, default=200, help="timed steps per device and repetition")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repetitions (medians reported)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    ap.add_argument("--out", metavar="JSON", help="also write the results to this file")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.repeat < 1 or (a.devices is not None and a.devices < 1):
        fail("--steps, --repeat and --devices are whole numbers >= 1")
    if a.backend == "cuda":
        try:
            import torch
        except ImportError:
            fail("needs torch with CUDA (pip install torch), or --backend host to check the script")
        if not torch.cuda.is_available():
            fail(
                "needs a CUDA GPU that torch can use (torch.cuda.is_available() is False); --backend host checks "
                "the script"
            )
        try:
            devs = asyncgpu.devices("cuda", count=a.devices)
        except (asyncgpu.NoDeviceError, asyncgpu.errors.UnknownDeviceError) as exc:
            fail(f"needs {a.devices or 'a'} CUDA GPU(s): {exc}")
        make = torch_step
        framework = f"torch {torch.__version__}"
    else:
        devs = asyncgpu.devices("host", count=a.devices or 2)
        make = host_step
        framework = f"numpy {np.__version__}"
    steps_of = {d.name: make(d, a.hidden, a.layers, a.batch) for d in devs}
    backend, options = ("trio", {}) if a.loop == "trio" else ("asyncio", {"use_uvloop": a.loop == "uvloop"})
    try:
        runs = anyio.run(bench, devs, steps_of, a.steps, a.repeat, backend=backend, backend_options=options)
    finally:
        asyncgpu.close_all()
    medians = {k: statistics.median(v) for k, v in runs.items()}
    ratio = medians["per-device workers"] / medians["loop thread"]
    gil = gil_picture()
    n = len(devs)
    step_desc = (
        f"{a.layers} x Linear({a.hidden}, {a.hidden}) + ReLU, bf16, batch {a.batch}, fwd+bwd+SGD"
        if a.backend == "cuda"
        else "numpy stand-in (small matmuls and a host-kernel launch)"
    )
    lines = [
        f"bench_workers: {n} x {devs[0].description}, {framework}, Python {gil['python']} "
        f"(GIL {'on' if gil['gil_enabled'] else 'off'}{', free-threaded build' if gil['free_threaded_build'] else ''}),"
        f" {a.loop}",
        f"step: {step_desc}; {a.steps} steps per device, {a.repeat} interleaved repetitions, medians",
        "",
        f"{'launched from':<22} {'devs':>4} {'steps/s':>10} {'per GPU':>9} {'min':>10} {'max':>10} {'vs loop':>8}",
    ]
    for mode, values in runs.items():
        gpus = 1 if mode.startswith("1 GPU") else n
        med = medians[mode]
        vs = med / medians["loop thread"]
        lines.append(
            f"{mode:<22} {gpus:>4} {med:>10,.1f} {med / gpus:>9,.1f} {min(values):>10,.1f} {max(values):>10,.1f} "
            f"{vs:>7.2f}x"
        )
    ceiling = medians["per-device workers"] / medians["plain threads (peer)"]
    lines += [
        "",
        f"per-device workers / loop thread on {n} GPUs: {ratio:.2f}x; workers / plain threads: {ceiling:.2f}x",
    ]
    print("\n".join(lines))
    if a.out:
        doc = {
            "devices": [f"{d.name} {d.description}" for d in devs],
            "framework": framework,
            "interpreter": gil,
            "loop": a.loop,
            "config": {k: getattr(a, k) for k in ("steps", "repeat", "hidden", "layers", "batch", "backend")},
            "steps_per_s": runs,
            "median_steps_per_s": medians,
            "ratio_workers_vs_loop": ratio,
        }
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
