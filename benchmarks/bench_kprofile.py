"""In-kernel records: what a record costs on the GPU, and how fast the host decodes them.

    python3 benchmarks/bench_kprofile.py [--out results/kprofile.json] [--regions 2000] [--repeats 15]

Device cost (needs a CUDA GPU): kernels/profiled.cu's ``asyncgpu_kp_bench`` (per lane, ``regions`` regions of
one stage, each around ``work`` dependent FMAs) against its twin compiled with ASYNCGPU_PROFILE=0 (the same
source, every record compiled out), timed by a pair of events around each launch (the same pair for both, so
it cancels), median of ``repeats`` alternating runs. Cost per region = (instrumented - plain) / regions on the
critical path of one lane (two records per region); per record = half of it. Two shapes: one lane (one block of
32 threads) and the whole GPU (4 blocks per SM of 256 threads, two groups each: every SM's leaders storing).

Decode throughput (anywhere, pinned to one core): asyncgpu's numpy decoder on a synthetic buffer of 4096 lanes
x 2048 records (begin/end pairs, with a wrap of the 32-bit stamps) to host-time columns, and on a buffer with
instants and nested regions (the general path); against a straightforward Python loop over the records
(per-record unwrap and a stack per stage), timed on the first 64 lanes and reported per record. Each numpy row also
gives the minor page faults per decode (``ru_minflt``, the median over the timed decodes): the first touch of the
fresh output columns, which costs more on some hosts (virtual machines) than on others.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np

import asyncgpu
from asyncgpu._backends import load_backend
from asyncgpu._backends.kernels import FORMAT as F
from asyncgpu.kernel import decode
from asyncgpu.kernel.profiler import KernelProfiler

M32 = 0xFFFFFFFF


# -- device cost ------------------------------------------------------------------------------------------------------
def device_cost(regions: int, repeats: int) -> list[dict]:
    from cuda.core import LaunchConfig

    dev = asyncgpu.device(0)
    bd = dev._internal.bd
    on, off = bd._kernel("asyncgpu_kp_bench"), bd._kernel("asyncgpu_kp_bench_off")
    from cuda.core import Device as CudaCoreDevice

    sms = CudaCoreDevice(dev.index).properties.multiprocessor_count
    rows = []
    shapes = (("1 lane", 1, 32, 1), (f"whole GPU ({4 * sms} blocks x 2 groups)", 4 * sms, 256, 2))
    for label, grid, block, groups in shapes:
        out = dev.alloc(grid * block, np.float32)
        with KernelProfiler(dev, groups=groups, capacity=2 * regions) as prof:
            for work in (0, 16):
                args = (out.ptr, np.int32(regions), np.int32(work))
                cfg = LaunchConfig(grid=grid, block=block)
                times = {"on": [], "off": []}
                for _ in range(repeats + 2):  # the first pair warms up
                    for which, kernel in (("on", on), ("off", off)):
                        ptr = prof.arm(grid)
                        start = dev.stream.record()
                        bd.launch(dev.stream._internal.raw, kernel, cfg, (*args, ptr))
                        end = dev.stream.record()
                        end.wait_sync()
                        times[which].append((end - start) * 1e6)
                        start.release()
                        end.release()
                        if which == "on":
                            recs = prof.collect_sync()
                            assert len(recs) == grid * groups * regions, (len(recs), grid, groups, regions)
                t_on, t_off = (float(np.median(times[k][2:])) for k in ("on", "off"))
                per_region = (t_on - t_off) / regions
                rows.append(
                    {
                        "shape": label,
                        "work_fma": work,
                        "regions_per_lane": regions,
                        "lanes": grid * groups,
                        "plain_us": t_off / 1e3,
                        "instrumented_us": t_on / 1e3,
                        "ns_per_region": per_region,
                        "ns_per_record": per_region / 2,
                        "records": grid * groups * 2 * regions,
                    }
                )
        out.free()
    rows.append({"device": dev.description})
    return rows


# -- decode throughput ------------------------------------------------------------------------------------------------
def synthetic(lanes: int, cap: int, general: bool, seed: int = 0) -> np.ndarray:
    """A full buffer in asyncgpu's format, written with numpy: begin/end pairs of 4 stages (or, ``general``,
    an instant and two nested regions per 4 records), stamps starting 1 ms before a wrap of the low word."""
    rng = np.random.default_rng(seed)
    buf = np.zeros(F.words_for(lanes, cap), np.uint64)
    h = buf[: F.HEADER_WORDS].view(np.uint32)
    h[:] = F.header(2, lanes, cap)
    h[F.HDR_BLOCKS] = lanes // 2
    lw = buf[F.HEADER_WORDS :].reshape(lanes, F.LANE_WORDS + cap)
    start = (7 << 32) - 1_000_000 + rng.integers(0, 10_000, lanes)
    t = start[:, None] + np.cumsum(rng.integers(32, 2_000, (lanes, cap)), axis=1)
    k = np.arange(cap)
    if general:  # begin 0, instant 2, begin 1, end 1, end 0 ... : nesting and instants
        pattern = [(F.KIND_BEGIN, 0), (F.KIND_INSTANT, 2), (F.KIND_BEGIN, 1), (F.KIND_END, 1), (F.KIND_END, 0)]
        kinds = [pattern[i % 5] for i in range(cap - cap % 5)] + [(F.KIND_INSTANT, 3)] * (cap % 5)
    else:
        kinds = list(zip(k % 2, (k // 2) % 4))
    tags = np.array([F.tag(kind, stage) for kind, stage in kinds], np.uint64)
    lw[:, F.LANE_WORDS :] = ((t.astype(np.uint64) & np.uint64(M32)) << np.uint64(F.TIME_SHIFT)) | tags
    lw[:, F.LANE_START] = start
    lw[:, F.LANE_END] = t[:, -1] + 1
    lw[:, F.LANE_FIN] = F.fin_word(cap, 0)
    return buf


def python_decode(buf: np.ndarray, lanes: int, to_host) -> list[tuple]:
    """The straightforward way: a Python loop over every record, unwrapping and matching with a stack."""
    h = buf[: F.HEADER_WORDS].view(np.uint32)
    groups, cap = int(h[F.HDR_GROUPS]), int(h[F.HDR_CAPACITY])
    words = buf[: F.words_for(lanes, cap)].tolist()
    out = []
    for lane in range(lanes):
        at = F.HEADER_WORDS + lane * (F.LANE_WORDS + cap)
        start, fin = words[at + F.LANE_START], words[at + F.LANE_FIN]
        prev, stacks = start, {}
        for rec in words[at + F.LANE_WORDS : at + F.LANE_WORDS + min(fin & M32, cap)]:
            t = prev + (((rec >> F.TIME_SHIFT) - prev) & M32)
            prev = t
            kind, stage = rec & F.KIND_MASK, (rec >> F.STAGE_SHIFT) & F.STAGE_MASK
            if kind == F.KIND_BEGIN:
                stacks.setdefault(stage, []).append(t)
            elif kind == F.KIND_END:
                t0 = stacks[stage].pop()
                out.append((lane // groups, lane % groups, stage, to_host(t0), to_host(t), t - t0))
    return out


def minor_faults() -> int:
    """Minor page faults of this whole process so far (any thread may call it)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def decode_throughput(repeats: int) -> list[dict]:
    lanes, cap = 4096, 2048
    g0 = 7 << 32
    to_host = lambda t: 1e12 + (np.asarray(t, np.int64) - g0) * 1.0000071  # noqa: E731 - an affine clock, as calibrated
    scalar_to_host = lambda t: 1e12 + (t - g0) * 1.0000071  # noqa: E731
    rows = []
    for label, general in (("numpy, begin/end pairs", False), ("numpy, nested + instants", True)):
        buf = synthetic(lanes, cap, general)
        decode(buf, to_host=to_host)  # warm the allocator
        times, faults = [], []
        for _ in range(repeats):
            f0, t0 = minor_faults(), time.perf_counter()
            recs = decode(buf, to_host=to_host)
            times.append(time.perf_counter() - t0)
            faults.append(minor_faults() - f0)
        s = float(np.median(times))
        rows.append(
            {
                "decoder": label,
                "records": lanes * cap,
                "regions": len(recs),
                "ms": s * 1e3,
                "M_records_per_s": lanes * cap / s / 1e6,
                "minor_faults_per_decode": int(np.median(faults)),
            }
        )
    buf = synthetic(lanes, cap, False)
    sub = 64
    t0 = time.perf_counter()
    ref = python_decode(buf, sub, scalar_to_host)
    s = time.perf_counter() - t0
    recs = decode(buf, to_host=to_host)
    assert [r[5] for r in ref] == recs.duration_ns[: len(ref)].tolist(), "the decoders disagree"
    assert np.allclose([r[3] for r in ref], recs.start_ns[: len(ref)], rtol=0, atol=1e-3)
    rows.append(
        {
            "decoder": "Python loop",
            "records": sub * cap,
            "regions": len(ref),
            "ms": s * 1e3,
            "M_records_per_s": sub * cap / s / 1e6,
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--regions", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    result: dict = {}
    ok, why = load_backend("cuda").available()
    if ok:
        rows = device_cost(args.regions, args.repeats)
        result["device"], result["device_cost"] = rows[-1]["device"], rows[:-1]
        print(
            f"== device cost per record: {result['device']}, {args.regions} regions per lane, median of {args.repeats}"
        )
        print(f"{'shape':40} {'FMAs':>5} {'plain µs':>10} {'instr. µs':>10} {'ns/region':>10} {'ns/record':>10}")
        for r in rows[:-1]:
            print(
                f"{r['shape']:40} {r['work_fma']:>5} {r['plain_us']:>10.1f} {r['instrumented_us']:>10.1f} "
                f"{r['ns_per_region']:>10.2f} {r['ns_per_record']:>10.2f}"
            )
        asyncgpu.close_all()
    else:
        print(f"(no CUDA GPU: {why}; device cost skipped)")
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # one core
    rows = decode_throughput(args.repeats)
    result["decode"] = rows
    py = rows[-1]["M_records_per_s"]
    print(f"\n== decode throughput on one core (cpu {cpu}), median of {args.repeats}; target >= 200 M records/s")
    print(f"{'decoder':28} {'records':>10} {'ms':>9} {'M rec/s':>9} {'x Python':>9} {'faults/decode':>14}")
    for r in rows:
        faults = r.get("minor_faults_per_decode", "")
        print(
            f"{r['decoder']:28} {r['records']:>10} {r['ms']:>9.1f} {r['M_records_per_s']:>9.1f} "
            f"{r['M_records_per_s'] / py:>9.0f} {faults:>14}"
        )
    print("\n== summary")
    for r in result.get("device_cost", []):
        print(f"device   {r['shape'][:24]:24} {r['work_fma']:>2} FMA/region: {r['ns_per_record']:6.2f} ns per record")
    for r in rows:
        n = r.get("minor_faults_per_decode")
        faults = "" if n is None else f", {n} minor page faults per decode"
        print(f"decode   {r['decoder']:28}: {r['M_records_per_s']:8.1f} M records/s{faults}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
