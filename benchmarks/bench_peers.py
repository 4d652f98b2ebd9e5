"""asyncgpu.benchmark side by side with cupyx.profiler.benchmark and triton.testing.do_bench, one run.

    PYTHONPATH=$PWD python benchmarks/bench_peers.py [--n-repeat 1000] [--out results.json]

Each workload is ONE function ``work(stream)`` that enqueues on an asyncgpu stream, and every peer times that same
function on that same stream of GPU 0:

* asyncgpu: ``asyncgpu.benchmark(work, devices=[stream])``;
* CuPy: ``cupyx.profiler.benchmark(lambda: work(stream))`` inside ``cupy.cuda.ExternalStream(stream.handle)``, so
  CuPy records its events on that stream;
* Triton: ``triton.testing.do_bench(lambda: work(stream))`` inside ``torch.cuda.stream(ExternalStream(...))``.
  do_bench picks its own repeat count (``rep`` ms of work) and zeroes a 256 MB buffer before every call to flush
  the L2 cache: that memset runs on the same stream and counts in its wall time, not in its GPU times.

Workloads: asyncgpu's spin kernel (a known duration: 10, 100, 1000 µs), a torch bf16 matmul, a CuPy elementwise
``y = 2 * x + 1`` on 128 MiB. Figures per peer: GPU time (mean, median, std, min) and its agreement with
asyncgpu's median; the host overhead per call = wall time of the whole benchmark call / calls of ``work``
(warm-up and estimates included) - mean GPU time. A peer that is not installed is skipped, and says so.
With two GPUs, asyncgpu and CuPy also time a two-GPU workload (CuPy calls the function once per repeat for both).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

import numpy as np

import asyncgpu


def _try_import(name: str):
    try:
        return __import__(name, fromlist=["_"]), None
    except Exception as exc:  # noqa: BLE001 - an optional peer: report why it is missing
        return None, f"{type(exc).__name__}: {exc}"


class Counted:
    """``work`` with a call counter (the overhead per call needs every call, warm-ups included)."""

    __name__ = "work"  # CuPy's benchmark names its result after its function

    def __init__(self, work):
        self.work, self.calls = work, 0

    def __call__(self, stream):
        self.calls += 1
        self.work(stream)


def cupy_stream(cupy, stream):
    """CuPy's view of an asyncgpu stream: ``Stream.from_external`` (CuPy 14, the ``__cuda_stream__`` protocol),
    else ``ExternalStream`` (older CuPy)."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(stream)
    return cupy.cuda.ExternalStream(stream.handle, stream.device.index)


def _stats_us(gpu_ms, wall_s, calls) -> dict:
    t = np.asarray(gpu_ms, np.float64) * 1e3
    return {
        "n": int(t.size),
        "mean_us": float(t.mean()),
        "median_us": float(np.median(t)),
        "std_us": float(t.std()),
        "min_us": float(t.min()),
        "max_us": float(t.max()),
        "wall_s": wall_s,
        "calls": calls,
        "overhead_us_per_call": wall_s * 1e6 / calls - float(t.mean()),
    }


# -- the peers -------------------------------------------------------------------------------------------------
def run_asyncgpu(work, stream, n_repeat, n_warmup, max_duration):
    fn = Counted(work)
    t0 = time.perf_counter()
    r = asyncgpu.benchmark(fn, n_repeat=n_repeat, n_warmup=n_warmup, max_duration_s=max_duration, devices=[stream])
    wall = time.perf_counter() - t0
    return _stats_us(r.gpu_times_ms[0], wall, fn.calls)


def run_cupy(cupy, cupyx_profiler, work, stream, n_repeat, n_warmup, max_duration):
    fn = Counted(work)
    with cupy.cuda.Device(stream.device.index), cupy_stream(cupy, stream):  # CuPy's events go on this stream
        t0 = time.perf_counter()
        r = cupyx_profiler.benchmark(
            fn, (stream,), n_repeat=n_repeat, n_warmup=n_warmup, max_duration=max_duration, name="work"
        )
        wall = time.perf_counter() - t0
    return _stats_us(np.asarray(r.gpu_times[0]) * 1e3, wall, fn.calls)


def run_do_bench(torch, triton_testing, work, stream):
    fn = Counted(work)
    with torch.cuda.device(stream.device.index), torch.cuda.stream(_torch_stream(torch, stream)):
        t0 = time.perf_counter()
        try:
            times = triton_testing.do_bench(lambda: fn(stream), return_mode="all")
        except (TypeError, ValueError, AssertionError):  # an older triton without "all": its median only
            times = triton_testing.do_bench(lambda: fn(stream), quantiles=[0.5])
        wall = time.perf_counter() - t0
    times = np.atleast_1d(np.asarray(times, np.float64))
    return _stats_us(times, wall, fn.calls)


_TORCH_STREAMS: dict = {}


def _torch_stream(torch, stream):
    s = _TORCH_STREAMS.get(stream.handle)
    if s is None:
        s = _TORCH_STREAMS[stream.handle] = torch.cuda.ExternalStream(
            stream.handle, device=torch.device("cuda", stream.device.index)
        )
    return s


# -- the workloads ---------------------------------------------------------------------------------------------
def workloads(torch, cupy, stream):
    out = {}
    for us in (10, 100, 1000):
        out[f"spin {us} us"] = functools.partial(lambda s, us: s.spin_us(us), us=us)
    if torch is not None:
        n = 4096
        with torch.cuda.device(stream.device.index):
            x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            y = torch.empty_like(x)

        def matmul(s):
            with torch.cuda.stream(_torch_stream(torch, s)):
                torch.matmul(x, x, out=y)

        out[f"torch bf16 matmul {n}"] = matmul
    if cupy is not None:
        with cupy.cuda.Device(stream.device.index):
            a = cupy.ones(1 << 25, dtype=cupy.float32)
            b = cupy.empty_like(a)
            axpb = cupy.ElementwiseKernel("float32 x", "float32 y", "y = 2.0f * x + 1.0f", "asyncgpu_axpb")
        cupy_streams: dict = {}

        def elementwise(s):
            cs = cupy_streams.get(s.handle)
            if cs is None:
                cs = cupy_streams[s.handle] = cupy_stream(cupy, s)
            with cs:
                axpb(a, b)

        out["cupy 2x+1 128 MiB"] = elementwise
    return out


def two_gpus(cupy, cupyx_profiler, devs, n_repeat, n_warmup, max_duration) -> dict:
    """A 200 µs spin on each of two GPUs: asyncgpu runs the devices from one thread each; CuPy's benchmark calls
    one function that launches on both (its events bracket both devices' work in one call)."""
    work = Counted(lambda s: s.spin_us(200))
    t0 = time.perf_counter()
    r = asyncgpu.benchmark(work, n_repeat=n_repeat, n_warmup=n_warmup, max_duration_s=max_duration, devices=devs)
    wall = time.perf_counter() - t0
    out = {
        "asyncgpu": {
            "wall_s": wall,
            "repeats": r.n_repeat,
            "wall_us_per_repeat": wall * 1e6 / (r.n_repeat + n_warmup),
            "median_us": [float(m * 1e3) for m in r.median_ms[1:]],
        }
    }
    if cupy is not None:
        streams = [cupy_stream(cupy, d.stream) for d in devs]

        def both():
            for d in devs:
                d.stream.spin_us(200)

        # CuPy records its events on each device's *current* stream: make ours current on both devices.
        for d, cs in zip(devs, streams):
            with cupy.cuda.Device(d.index):
                cs.use()
        t0 = time.perf_counter()
        rc = cupyx_profiler.benchmark(
            both,
            n_repeat=n_repeat,
            n_warmup=n_warmup,
            max_duration=max_duration,
            devices=tuple(d.index for d in devs),
            name="both",
        )
        wall = time.perf_counter() - t0
        for d in devs:
            with cupy.cuda.Device(d.index):
                cupy.cuda.Stream.null.use()
        out["cupy"] = {
            "wall_s": wall,
            "repeats": int(rc.gpu_times.shape[1]),
            "wall_us_per_repeat": wall * 1e6 / (rc.gpu_times.shape[1] + n_warmup),
            "median_us": [float(np.median(g) * 1e6) for g in rc.gpu_times],
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-repeat", type=int, default=1000)
    ap.add_argument("--n-warmup", type=int, default=10)
    ap.add_argument("--max-duration", type=float, default=3.0, help="seconds per peer and workload")
    ap.add_argument("--out", help="write every figure to this JSON file")
    ap.add_argument(
        "--backend",
        choices=("cuda", "host"),
        default="cuda",
        help="host: a smoke run of asyncgpu alone on host devices (the peers need CUDA)",
    )
    args = ap.parse_args()

    devs = asyncgpu.devices(args.backend)
    dev = devs[0]
    stream = dev.stream
    if args.backend == "cuda":
        torch, why_torch = _try_import("torch")
        cupy, why_cupy = _try_import("cupy")
    else:
        torch = cupy = None
        why_torch = why_cupy = "the peers need CUDA (--backend host)"
    cupyx_profiler, why_cupyx = _try_import("cupyx.profiler") if cupy is not None else (None, why_cupy)
    triton_testing, why_triton = _try_import("triton.testing") if torch is not None else (None, why_torch)
    versions = {"python": platform.python_version(), "asyncgpu": asyncgpu.__version__, "numpy": np.__version__}
    for name, mod in (("torch", torch), ("cupy", cupy)):
        if mod is not None:
            versions[name] = mod.__version__
    if triton_testing is not None:
        versions["triton"] = sys.modules["triton"].__version__
    skipped = {name: why for name, why in (("cupy", why_cupyx), ("do_bench", why_triton)) if why}
    for name, why in skipped.items():
        print(f"skipping {name}: {why}")
    print(f"device: {dev.name} {dev.description}; {len(devs)} GPU(s); versions {versions}")

    dev.stream.spin_us(1)  # compile and load the spin kernel before any timing
    dev.synchronize()
    results: dict = {}
    for name, work in workloads(torch, cupy, stream).items():
        row = results[name] = {}
        row["asyncgpu"] = run_asyncgpu(work, stream, args.n_repeat, args.n_warmup, args.max_duration)
        if cupyx_profiler is not None:
            row["cupy"] = run_cupy(cupy, cupyx_profiler, work, stream, args.n_repeat, args.n_warmup, args.max_duration)
        if triton_testing is not None:
            row["do_bench"] = run_do_bench(torch, triton_testing, work, stream)
        ref = row["asyncgpu"]["median_us"]
        for peer in row.values():
            peer["median_vs_asyncgpu_pct"] = (peer["median_us"] / ref - 1) * 100
        print(
            f"{name}: "
            + "; ".join(
                f"{p} median {v['median_us']:.2f} us, overhead {v['overhead_us_per_call']:.1f} us/call"
                for p, v in row.items()
            ),
            flush=True,
        )

    multi = None
    if len(devs) >= 2:
        multi = two_gpus(
            cupy if cupyx_profiler is not None else None,
            cupyx_profiler,
            devs[:2],
            args.n_repeat,
            args.n_warmup,
            args.max_duration,
        )
    else:
        print("two-GPU part skipped: this machine has one GPU")

    doc = {
        "device": f"{dev.name} {dev.description}",
        "gpus": len(devs),
        "host": platform.node(),
        "versions": versions,
        "skipped": skipped,
        "args": vars(args),
        "workloads": results,
        "two_gpus": multi,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        print(f"written to {args.out}")

    print(f"\nGPU time (median µs) and host overhead per call (µs), {dev.description}, one stream:")
    peers = ["asyncgpu", "cupy", "do_bench"]
    print(f"{'workload':24s}" + "".join(f"{p + ' med':>14s}{'Δ%':>7s}{'ovh':>8s}" for p in peers))
    for name, row in results.items():
        cells = []
        for p in peers:
            v = row.get(p)
            cells.append(
                f"{'—':>14s}{'':>7s}{'':>8s}"
                if v is None
                else f"{v['median_us']:14.2f}{v['median_vs_asyncgpu_pct']:+7.1f}{v['overhead_us_per_call']:8.1f}"
            )
        print(f"{name:24s}" + "".join(cells))
    if multi:
        print(
            "two GPUs, 200 µs spin each: "
            + "; ".join(
                f"{p} {v['wall_us_per_repeat']:.1f} µs wall per repeat, medians {[round(m, 1) for m in v['median_us']]}"
                for p, v in multi.items()
            )
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        asyncgpu.close_all()
