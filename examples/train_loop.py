"""A training loop on every device with always-on step timing: per-step busy time, stragglers, a live view, a trace.

python examples/train_loop.py --steps 2000 --live                  # every CUDA GPU: a torch MLP (bf16 where it can)
python examples/train_loop.py --backend host --steps 500 --live    # two host devices: the same loop in numpy

Each step, every device trains its own MLP (forward, backward, SGD) from its worker thread (``await dev.run(...)``,
one task per device), on the device's asyncgpu stream (handed to torch as an ``ExternalStream``).
``asyncgpu.step_timer`` marks each step: a pooled event per device at its exit (steps back to back share their
boundary), harvested off the loop's thread. The loop waits for every device's loss after each step (as
``loss.item()`` would) through ``await step.wait()``: on those same events, with no record of its own.
``--live`` draws the panel (busy bars, step p50/p99, stragglers, host- or device-bound); ``--trace PATH`` streams
the steps to a Perfetto trace you can open while it grows.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import anyio
import numpy as np
import rich
from example_setup import devices, need_modules, trace_path

import asyncgpu


# -- the model, in torch (CUDA) ---------------------------------------------------------------------------------------
def torch_model(dev: asyncgpu.Device, width: int, layers: int, batch: int) -> dict:
    import torch

    torch.manual_seed(dev.index)
    cuda = torch.device("cuda", dev.index)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    stream = torch.cuda.ExternalStream(dev.stream.handle, device=cuda)
    with torch.cuda.device(cuda), torch.cuda.stream(stream):
        net = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
        net = net.to(cuda, dtype)
        x = torch.randn(batch, width, device=cuda, dtype=dtype)
        y = torch.randn(batch, width, device=cuda, dtype=dtype)
    return {"net": net, "x": x, "y": y, "opt": torch.optim.SGD(net.parameters(), lr=1e-3), "torch_stream": stream}


def torch_step(stream: asyncgpu.Stream, m: dict) -> Any:
    """One training step, launched on ``stream`` (the device's asyncgpu stream) from the device's worker thread."""
    import torch

    with torch.cuda.device(stream.device.index), torch.cuda.stream(m["torch_stream"]):
        m["opt"].zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(m["net"](m["x"]), m["y"])
        loss.backward()
        m["opt"].step()
        return loss.detach()


# -- the same model in numpy, on a host device's stream ----------------------------------------------------------------
def numpy_model(dev: asyncgpu.Device, width: int, layers: int, batch: int) -> dict:
    rng = np.random.default_rng(dev.index)
    ws = [rng.standard_normal((width, width), np.float32) / np.sqrt(width) for _ in range(layers)]
    return {
        "w": ws,
        "x": rng.standard_normal((batch, width), np.float32),
        "y": rng.standard_normal((batch, width), np.float32),
        "loss": np.zeros(1),
    }


def _numpy_train(m: dict, lr: float = 1e-3) -> None:
    """Forward (ReLU layers), mean squared error, backward, SGD: what the host device's stream thread runs."""
    acts = [m["x"]]
    for w in m["w"]:
        acts.append(np.maximum(acts[-1] @ w, 0.0))
    err = acts[-1] - m["y"]
    m["loss"][0] = float(np.mean(err * err))
    grad = 2.0 * err / err.size
    for k in range(len(m["w"]) - 1, -1, -1):
        grad = grad * (acts[k + 1] > 0)
        g_w = acts[k].T @ grad
        grad = grad @ m["w"][k].T
        m["w"][k] -= lr * g_w


def numpy_step(stream: asyncgpu.Stream, m: dict) -> Any:
    stream.launch(_numpy_train, None, m, name="mlp step")  # (a host device's "kernel": a callable on its stream)
    return m["loss"]


# -- the loop --------------------------------------------------------------------------------------------------------
async def train(devs: list, steps: int, *, live: Any = False, trace: str | None = None, width: int = 1024,
                layers: int = 8, batch: int = 64, on_step: Any = None) -> asyncgpu.StepTimer:  # fmt: skip
    """``steps`` training steps on every device of ``devs``; returns the finished step timer. ``on_step(i)`` is
    called after each step (the memory test uses it)."""
    host = devs[0].backend == "host"
    make, step = (numpy_model, numpy_step) if host else (torch_model, torch_step)
    for d in devs:
        await d.prepare()  # the worker thread started, the pools grown: off the loop's thread
    models = [make(d, width, layers, batch) for d in devs]
    async with asyncgpu.step_timer(devs, live=live, trace=trace, label="train") as st:
        for i in range(steps):
            with st.step(i) as s:
                async with anyio.create_task_group() as tg:  # one task per device: each launches from its worker
                    for d, m in zip(devs, models):
                        tg.start_soon(d.run, step, m)
            await s.wait()  # every device's loss, as loss.item() would wait for it (on the step's own events)
            if on_step is not None:
                on_step(i)
    return st


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--live", action="store_true", help="draw the live panel (to stdout, terminal or not)")
    parser.add_argument("--trace", default=None, help="stream the steps to this Perfetto trace (default: temp folder)")
    parser.add_argument("--backend", choices=("cuda", "host"), default=None, help="default: $ASYNCGPU_BACKEND or cuda")
    parser.add_argument("--width", type=int, default=None, help="layer width (default 2048 on CUDA, 128 on host)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=None, help="batch (default 16 on CUDA, 32 on host)")
    args = parser.parse_args()
    if args.backend is not None:
        os.environ["ASYNCGPU_BACKEND"] = args.backend
    cuda = asyncgpu.default_backend() == "cuda"
    devs = devices(modules=("torch",) if cuda else (), install="pip install torch")
    if cuda:
        need_modules("torch", install="pip install torch")
    width = args.width or (2048 if cuda else 128)
    batch = args.batch or (16 if cuda else 32)
    trace = trace_path(args.trace, "asyncgpu-train-loop")
    if not trace.endswith((".pftrace", ".perfetto-trace", ".pb")):
        trace = os.path.splitext(trace)[0].removesuffix(".trace") + ".pftrace"  # (the stream is protobuf only)
    st = anyio.run(lambda: train(devs, args.steps, live=args.live, trace=trace, width=width,
                                 layers=args.layers, batch=batch))  # fmt: skip
    if not args.live:
        rich.print(st)
    s = st.stats()
    print(f"{s.steps} steps on {', '.join(s.devices)}: step p50 {s.step_ms['p50']:.3f} ms; {s.verdict}")
    print(f"trace: {trace} (open it in https://ui.perfetto.dev)", file=sys.stderr)


if __name__ == "__main__":
    main()
