"""PyTorch and CuPy work on asyncgpu's streams on two GPUs: timed, adopted, benchmarked, and in the kernel history.

    python examples/torch_cupy_two_gpus.py     (a CUDA GPU, torch and cupy; with one GPU it runs on it alone)
    asyncgpu bench examples/torch_cupy_two_gpus.py:matmul --devices 0,1 -n 200

1. One task per GPU inside one `gpu_timer` scope, each launching from its device's own worker thread
   (``await dev.run(launch, t)``): a torch matmul on asyncgpu's stream s0 (handed to torch as an ``ExternalStream``),
   a CuPy FFT on s1 (``cupy.cuda.Stream.from_external``), then a reduction on torch's own stream, adopted with
   ``device.adopt_stream`` and ordered after the matmul with an asyncgpu event. The scope reports every activity on
   one timeline, with the balance between the GPUs.
2. ``asyncgpu.benchmark(matmul, devices=...)``: the same matmul on every GPU at once, on asyncgpu's streams, then
   on torch's own streams (adopted), with the TFLOP/s of the median.
3. ``asyncgpu.kernel_history()``: what asyncgpu itself launched (its built-in kernels), with grid, block, duration.
"""

from __future__ import annotations

import argparse
import sys

import anyio
import numpy as np
import rich
from example_setup import devices

import asyncgpu

N = 4096  #: matmul size (bf16, N x N)
FFT_POINTS = 1 << 22
_inputs: dict[int, object] = {}  # device index -> the matmul's input, made on first use on that device


def _torch_stream(stream):
    """A torch view of an asyncgpu Stream (same cudaStream_t)."""
    import torch

    return torch.cuda.ExternalStream(stream.handle, device=torch.device("cuda", stream.device.index))


def _cupy_stream(stream):
    """A CuPy view of an asyncgpu Stream: ``Stream.from_external`` (CuPy 14), else ``ExternalStream``."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(stream)  # any object with __cuda_stream__
    return cupy.cuda.ExternalStream(stream.handle, stream.device.index)


def matmul(stream):
    """``x @ x`` in bf16 on ``stream`` (an asyncgpu Stream): the function `benchmark` and ``asyncgpu bench`` time.
    The input is made on first use (in the warm-up) on the stream's device."""
    import torch

    i = stream.device.index
    with torch.cuda.device(i), torch.cuda.stream(_torch_stream(stream)):
        x = _inputs.get(i)
        if x is None:
            gen = torch.Generator(device=f"cuda:{i}").manual_seed(i)
            x = _inputs[i] = torch.randn(N, N, device=f"cuda:{i}", dtype=torch.bfloat16, generator=gen)
        return x @ x


def launch(ours, t):
    """Everything one GPU launches, called on its device's worker thread (``await dev.run(launch, t)``: ``ours`` is
    the device's stream s0): torch's and CuPy's Python-side launch costs of the two GPUs overlap wherever the GIL
    is released (torch's C++ dispatch, the driver calls), instead of queueing on the loop's thread."""
    import cupy
    import torch

    dev, other = ours.device, ours.device.streams[1]
    with t.activity("torch matmul", stream=ours):
        y = matmul(ours)
    with t.activity("cupy fft", stream=other):
        with cupy.cuda.Device(dev.index), _cupy_stream(other):
            a = cupy.random.default_rng(dev.index).random(FFT_POINTS, dtype=cupy.float32)
            spectrum = cupy.fft.rfft(a)
    torch_stream = torch.cuda.Stream(device=dev.index)  # a framework's own stream...
    theirs = dev.adopt_stream(torch_stream)  # ...adopted: asyncgpu records and times on it
    with ours.record() as matmul_done:
        theirs.wait(matmul_done)  # on the GPU: torch's stream waits for the matmul on s0
    with t.activity("torch reduce (torch's stream)", stream=theirs):
        with torch.cuda.stream(torch_stream):
            total = y.float().abs().sum()
    return torch_stream, theirs, total, spectrum


async def one_gpu(t, dev, out):
    torch_stream, theirs, total, spectrum = await dev.run(launch, t)
    with theirs.record() as done, dev.streams[1].record() as fft_done:
        await done.wait()  # the loop keeps running while this GPU works
        await fft_done.wait()
    out[dev.name] = (float(total), float(abs(spectrum[0])))
    del torch_stream  # (kept alive until asyncgpu's last record on it has run)


async def timeline(devs):
    out = {}
    async with asyncgpu.gpu_timer(devs, label="torch+cupy") as t:
        async with anyio.create_task_group() as tg:
            for d in devs:
                tg.start_soon(one_gpu, t, d, out)
    rich.print(t.report(limit=20))
    for name, (total, dc) in out.items():
        print(f"{name}: sum |x@x| = {total:.4g}, |rfft[0]| = {dc:.4g}")
    return t


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    install = "pip install torch cupy-cuda12x, or cupy-cuda13x for CUDA 13"
    devs = devices(cuda_only="torch and CuPy work on CUDA streams", modules=("torch", "cupy"), install=install)
    import torch

    names = ", ".join(f"{d.name} {d.description}" for d in devs)
    if len(devs) < 2:
        print(f"only one GPU ({names}): every part runs on it alone; the two-GPU overlap is not shown")
    else:
        devs = devs[:2]
        print(f"two GPUs: {names}")

    print("\n== 1. torch and cupy on asyncgpu's streams, and on torch's own stream, one task per GPU ==")
    anyio.run(timeline, devs)

    print("\n== 2. asyncgpu.benchmark: the same matmul on every GPU at once ==")
    flop = 2 * N**3
    r = asyncgpu.benchmark(matmul, n_repeat=200, n_warmup=10, devices=devs)
    print(r)
    rich.print(r)
    for d, med in zip(r.devices, r.median_ms[1:]):
        print(f"{d}: median {med * 1e3:,.1f} µs = {flop / (med * 1e-3) / 1e12:,.0f} TFLOP/s (bf16 {N}x{N})")
    torch_streams = [torch.cuda.Stream(device=d.index) for d in devs]  # torch's own streams (kept alive here)
    adopted = [d.adopt_stream(ts) for d, ts in zip(devs, torch_streams)]
    r2 = asyncgpu.benchmark(matmul, n_repeat=200, n_warmup=10, devices=adopted, name="matmul on torch's streams")
    print(r2)
    drift = np.abs(r2.median_ms[1:] / r.median_ms[1:] - 1).max()
    print(f"torch's own streams vs asyncgpu's: medians within {drift:.1%}")

    print("\n== 3. kernel history: what asyncgpu launched ==")
    with asyncgpu.kernel_history.recording():
        for d in devs:
            a = d.alloc(1 << 20)
            d.stream.memset(a, 0)
            d.stream.inc_loop(a, 100)
            d.stream.spin_us(50)
    for k in asyncgpu.kernel_history():
        shape = f"grid {k.grid} block {k.block}" if k.grid else ""
        print(f"{k.device} {k.stream} {k.kind:7s} {k.name:10s} {k.duration_ms * 1e3:9.1f} µs {shape}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        asyncgpu.close_all()
