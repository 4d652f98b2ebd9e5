"""Time the same work on every device concurrently, one task per device, and print the report.

python examples/two_gpus.py            # every CUDA GPU
ASYNCGPU_BACKEND=host python examples/two_gpus.py      # two host devices (CPU worker threads)
"""

import argparse

import anyio
import numpy as np
import rich
from example_setup import devices

import asyncgpu


async def step(timer, dev, n):
    a = dev.alloc(n, np.float32)  # from the device's memory pool, in stream order: microseconds
    await dev.prepare("inc_loop")  # compile and load it on the device's worker thread, not the loop's
    dev.stream.memset(a, 0)
    with timer.activity("forward", device=dev):
        dev.stream.inc_loop(a, 200)
    with timer.activity("backward", device=dev):
        dev.stream.inc_loop(a, 400)
    with dev.record() as done:
        await done.wait()


async def main(devs, elements):
    async with asyncgpu.gpu_timer(devs, label="train step") as t:
        async with anyio.create_task_group() as tg:
            for i, d in enumerate(devs):
                tg.start_soon(step, t, d, elements * (i + 1))  # uneven on purpose
    rich.print(t)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=2_000_000, help="float32 elements on the first device")
    args = parser.parse_args()
    anyio.run(main, devices(), args.elements)
