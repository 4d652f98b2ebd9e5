"""In-kernel records on every GPU at once: what happens inside a kernel, on the same timeline as the rest.

Two kernels per device, each device in its own task, inside one gpu_timer scope:
- a warp-specialised kernel of your own (compiled here with NVRTC, including asyncgpu_profile.cuh): per block a
  producer warp group loads tiles into shared memory (double-buffered) while a consumer warp group computes on
  the previous tile; they hand over through named barriers. Stages: wait_empty and load (producer), wait_full,
  compute and epilogue (consumer). The overlap of loads and compute is printed per device.
- the built-in inc_loop with records (stages load, add, store per block).

    python examples/kernel_stages.py [--trace PATH]              # every CUDA GPU (the trace: temp folder)
    ASYNCGPU_BACKEND=host python examples/kernel_stages.py       # host devices; threads play the warp groups
    python examples/kernel_stages.py --backend host              # the same

Without a GPU (and without the host backend asked for) it says so in one line and exits with 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

import anyio
import numpy as np
from example_setup import devices, trace_path

import asyncgpu
from asyncgpu.kernel import HostLane, KernelProfiler

STAGES = ("wait_empty", "load", "wait_full", "compute", "epilogue")
TILE = 4096  # floats per tile (16 KiB of shared memory, two buffers)

WS_KERNEL = r"""
#include "asyncgpu_profile.cuh"
enum : unsigned { WAIT_EMPTY, LOAD, WAIT_FULL, COMPUTE, EPILOGUE };
constexpr int TILE = %(tile)d;

__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %%0, %%1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %%0, %%1;" ::"r"(id), "r"(n) : "memory");
}

// out[block] = work * sum(x^2) over the block's `tiles` tiles. 256 threads: group 0 produces, group 1 consumes.
// Named barriers: 1 + s "tile s is full", 3 + s "tile s is empty", 5 the consumers' reduction.
extern "C" __global__ void __launch_bounds__(256) ws_sumsq(const float* x, float* out, int tiles, int work,
                                                         unsigned long long* records) {
    __shared__ __align__(16) float buf[2][TILE];
    __shared__ float partial[4];
    const int group = threadIdx.x / 128, t = threadIdx.x %% 128;
    asyncgpu::Profiler prof(records, group, t == 0);
    const float* src = x + (size_t)blockIdx.x * tiles * TILE;
    if (group == 0) {
        for (int k = 0; k < tiles; ++k) {
            const int s = k & 1;
            if (k >= 2) { auto r = prof.region(WAIT_EMPTY); bar_sync(3 + s, 256); }
            {
                auto r = prof.region(LOAD);  // ends after the leader's stores, which wait for its loads
                float4* dst = reinterpret_cast<float4*>(buf[s]);
                const float4* from = reinterpret_cast<const float4*>(src + (size_t)k * TILE);
                for (int j = t; j < TILE / 4; j += 128) dst[j] = from[j];
            }
            bar_arrive(1 + s, 256);
        }
    } else {
        float acc = 0.0f;
        for (int k = 0; k < tiles; ++k) {
            const int s = k & 1;
            { auto r = prof.region(WAIT_FULL); bar_sync(1 + s, 256); }
            {
                auto r = prof.region(COMPUTE);
                for (int j = t; j < TILE; j += 128) {
                    const float v = buf[s][j];
                    for (int w = 0; w < work; ++w) acc = fmaf(v, v, acc);
                }
                asm volatile("" : "+f"(acc)::"memory");
            }
            if (k + 2 < tiles) bar_arrive(3 + s, 256);
        }
        auto r = prof.region(EPILOGUE);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
        if ((t & 31) == 0) partial[t >> 5] = acc;
        bar_sync(5, 128);
        if (t == 0) out[blockIdx.x] = partial[0] + partial[1] + partial[2] + partial[3];
    }
    prof.finalize();
}
""" % {"tile": TILE}  # noqa: UP031 (the CUDA source has braces, so no str.format)


def host_ws_kernel(x: np.ndarray, out: np.ndarray, blocks: int, tiles: int, work: int, records) -> None:
    """The same kernel on the host backend: per block a producer thread and a consumer thread (the groups)."""

    def block(b: int) -> None:
        full, empty = threading.Semaphore(0), threading.Semaphore(2)
        slots = [None, None]

        def producer() -> None:
            lane = HostLane(records, b, 0, blocks=blocks)
            for k in range(tiles):
                with lane.region(0):
                    empty.acquire()
                with lane.region(1):
                    slots[k % 2] = x[(b * tiles + k) * TILE : (b * tiles + k + 1) * TILE].copy()
                full.release()
            lane.finalize()

        def consumer() -> None:
            lane = HostLane(records, b, 1, blocks=blocks)
            acc = np.float32(0)
            for k in range(tiles):
                with lane.region(2):
                    full.acquire()
                with lane.region(3):
                    v = slots[k % 2]
                    for _ in range(work):
                        acc += np.dot(v, v)
                empty.release()
            with lane.region(4):
                out[b] = acc
            lane.finalize()

        threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    for b in range(blocks):
        block(b)


def overlap(recs, a: int, b: int) -> float:
    """Per block, how much of stage ``b``'s time (group 1) overlaps stage ``a``'s (group 0); summed over blocks,
    as a fraction of stage ``b``'s total."""
    total = inter = 0.0
    for blk in np.unique(recs.block):
        sa = (recs.block == blk) & (recs.stage == a)
        sb = (recs.block == blk) & (recs.stage == b)
        s1, e1 = recs.start_ns[sa], recs.end_ns[sa]
        s2, e2 = recs.start_ns[sb], recs.end_ns[sb]
        inter += np.clip(np.minimum(e1[:, None], e2[None, :]) - np.maximum(s1[:, None], s2[None, :]), 0, None).sum()
        total += (e2 - s2).sum()
    return inter / total if total else 0.0


async def run_device(d, ws_kernel, blocks: int, tiles: int, work: int, inc_n: int) -> dict:
    # loaded on the device's worker thread: the devices' tasks never wait for each other's module loads
    await d.prepare("inc_loop", "inc_loop_profiled", *([ws_kernel] if ws_kernel is not None else []))
    n = blocks * tiles * TILE
    x = d.alloc(n, np.float32)
    d.stream.memset(x, 0)
    d.stream.inc_loop(x, 1)  # x = 1.0 everywhere: out[block] is exact
    out = d.alloc(blocks, np.float32)
    with KernelProfiler(d, stages=STAGES, groups=2, capacity=4 * tiles + 8, name="ws_sumsq", max_tracks=8) as prof:
        if d.backend == "cuda":
            from cuda.core import LaunchConfig

            d.stream.launch(
                ws_kernel,
                LaunchConfig(grid=blocks, block=256),
                x.ptr,
                out.ptr,
                np.int32(tiles),
                np.int32(work),
                prof.arm(blocks),
                name="ws_sumsq",
            )
        else:
            prof.arm(blocks)  # host-backend device memory is a numpy array: the host kernel works on it
            d.stream.launch(
                host_ws_kernel, None, x.live(), out.live(), blocks, tiles, work, prof.array, name="ws_sumsq"
            )
        ws = await prof.collect()
    got = out.to_numpy()
    if not np.all(got == tiles * TILE * work):
        raise SystemExit(f"{d.name}: ws_sumsq computed {got[:4]}..., expected {tiles * TILE * work}")
    a = d.alloc(inc_n, np.float32)
    d.stream.memset(a, 0)
    with KernelProfiler(d, max_tracks=8) as prof:
        prof.inc_loop(a, 500)
        inc = await prof.collect()
    return {"ws": ws, "inc": inc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("cuda", "host"), help="default: $ASYNCGPU_BACKEND, else cuda")
    parser.add_argument("--trace", metavar="PATH", help="where to write the Perfetto trace (default: temp folder)")
    parser.add_argument("--tiles", type=int, default=16, help="tiles per block of the warp-specialised kernel")
    parser.add_argument("--work", type=int, default=4, help="multiply-adds per element and tile")
    args = parser.parse_args()
    if args.backend is not None:
        os.environ["ASYNCGPU_BACKEND"] = args.backend
    trace = trace_path(args.trace, "kstages")
    devs = devices()
    if devs[0].backend == "cuda":
        from cuda.core import Device as CudaCoreDevice
        from cuda.core import Program, ProgramOptions

        kernels = {}
        for d in devs:  # the user's own kernel, compiled for each device, loaded in its context
            cd = CudaCoreDevice(d.index)
            cd.set_current()
            opts = ProgramOptions(arch=f"sm_{cd.arch}", std="c++17", include_path=[KernelProfiler.include_dir()])
            kernels[d.name] = Program(WS_KERNEL, "c++", opts).compile("cubin").get_kernel("ws_sumsq")
        blocks, inc_n = 2 * CudaCoreDevice(devs[0].index).properties.multiprocessor_count, 1 << 22
    else:
        kernels = {d.name: None for d in devs}
        blocks, inc_n, args.tiles, args.work = 4, 1 << 18, min(args.tiles, 8), min(args.work, 2)
    results: dict = {}

    async def body() -> asyncgpu.Timer:
        async with asyncgpu.gpu_timer(devs, label="kernel stages") as t:

            async def one(d):
                results[d.name] = await run_device(d, kernels[d.name], blocks, args.tiles, args.work, inc_n)

            async with anyio.create_task_group() as tg:
                for d in devs:
                    tg.start_soon(one, d)
        return t

    t = anyio.run(body)
    for d in devs:
        ws, inc = results[d.name]["ws"], results[d.name]["inc"]
        print(f"== {d.name} {d.description}: ws_sumsq, {blocks} blocks x 2 warp groups, {args.tiles} tiles")
        print(ws)
        print(f"consumer compute time overlapped by producer loads: {100 * overlap(ws, 1, 3):.1f} %")
        print(f"== {d.name}: inc_loop")
        print(inc)
    asyncgpu.write_trace(t, trace)
    print(
        f"trace: {trace} (open it in https://ui.perfetto.dev: each device's process holds a track per "
        "(block, group) for the first 8 of each kernel)"
    )
    asyncgpu.close_all()


if __name__ == "__main__":
    sys.exit(main())
