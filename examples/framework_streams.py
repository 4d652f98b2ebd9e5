"""Run PyTorch and CuPy work on asyncgpu's streams, adopt theirs, and await completion from asyncio.

python examples/framework_streams.py   (needs a CUDA GPU, torch and cupy: pip install torch cupy-cuda12x)
"""

import argparse
import asyncio

import rich
from example_setup import devices

import asyncgpu

NEEDS = "torch and CuPy work on CUDA streams"


async def main(dev):
    import cupy
    import torch

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
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    install = "pip install torch cupy-cuda12x, or cupy-cuda13x for CUDA 13"
    asyncio.run(main(devices(1, cuda_only=NEEDS, modules=("torch", "cupy"), install=install)[0]))
