"""Run PyTorch and CuPy work on asyncgpu's streams, adopt theirs, and await completion from asyncio.

python examples/framework_streams.py   (needs a CUDA GPU, torch and cupy)
"""

import asyncio

import cupy
import rich
import torch

import asyncgpu


async def main():
    dev = asyncgpu.device(0)
    ours = dev.streams[1]
    theirs = dev.adopt_stream(cupy.cuda.Stream(non_blocking=True))
    async with asyncgpu.gpu_timer(dev, label="frameworks") as t:
        with t.activity("torch matmul", stream=ours):
            with torch.cuda.stream(torch.cuda.ExternalStream(ours.handle)):
                x = torch.randn(4096, 4096, device="cuda")
                y = x @ x
        with t.activity("cupy fft", stream=theirs):
            with cupy.cuda.Stream.from_external(theirs):
                cupy.fft.fft(cupy.random.random(1 << 22))
    rich.print(t)  # the scope awaited both streams' work on exit
    print("checksum", float(y.sum()))


if __name__ == "__main__":
    asyncio.run(main())
