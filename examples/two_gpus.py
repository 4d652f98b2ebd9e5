"""Time the same work on every device concurrently, one task per device, and print the report.

python examples/two_gpus.py            # every CUDA GPU
ASYNCGPU_BACKEND=host python examples/two_gpus.py
"""

import anyio
import numpy as np
import rich

import asyncgpu


async def step(timer, dev, n):
    a = dev.alloc(n, np.float32)
    dev.stream.memset(a, 0)
    with timer.activity("forward", device=dev):
        dev.stream.inc_loop(a, 200)
    with timer.activity("backward", device=dev):
        dev.stream.inc_loop(a, 400)
    with dev.record() as done:
        await done.wait()


async def main():
    devs = asyncgpu.devices()
    async with asyncgpu.gpu_timer(devs, label="train step") as t:
        async with anyio.create_task_group() as tg:
            for i, d in enumerate(devs):
                tg.start_soon(step, t, d, 2_000_000 * (i + 1))  # uneven on purpose
    rich.print(t)


if __name__ == "__main__":
    anyio.run(main)
