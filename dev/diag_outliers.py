"""Which side is off when an events-timed kernel disagrees with CUPTI: the event pair, or CUPTI's record.

bench_accuracy's back-to-back workload (every GPU, two streams each; spins of 5 µs to 2 ms, 20 in a row behind a 3 ms
lead spin), with a spin kernel that stamps ``%globaltimer`` at its first and last instant into device memory: a third
duration that neither asyncgpu's events nor CUPTI produced. Inside an outer ``source="cupti"`` scope, the events
source inside, ``--rounds`` times. For every kernel: events − CUPTI, events − stamps, CUPTI − stamps (each less its
median over the kernels of its length: a kernel's own launch and exit are in CUPTI's span, not in its stamps). A
kernel whose events − CUPTI is beyond max(1 %, 1 µs) is listed with the three, so that the side that moved shows.

    PYTHONPATH=$PWD python dev/diag_outliers.py [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import asyncgpu

LENGTHS_US = (5, 20, 50, 200, 1000, 2000)
REPEAT = 20
LEAD_US = 3000
SPIN = r"""
__device__ __forceinline__ unsigned long long gt() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
extern "C" __global__ void stamped_spin(unsigned long long ns, unsigned long long* out) {
    const unsigned long long t0 = gt();
    unsigned long long t = t0;
    while (t - t0 < ns) t = gt();
    out[0] = t0;
    out[1] = t;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    from cuda.core import LaunchConfig

    from asyncgpu._backends.cuda import compile_source

    devs = asyncgpu.devices("cuda")
    one = LaunchConfig(grid=1, block=1)
    per_stream = len(LENGTHS_US) * (REPEAT + 1)
    kernels, stamps = {}, {}
    for d in devs:
        bd = d._internal.bd
        bd.make_current()
        kernels[d.name] = compile_source(SPIN, bd.arch).get_kernel("stamped_spin")
        stamps[d.name] = [d.alloc(2 * per_stream, np.uint64) for _ in d.streams[:2]]
        d.synchronize()  # (allocated in order on the default stream, written from two others)
    host = {d.name: d.alloc_pinned(2 * per_stream, np.uint64) for d in devs}
    lines: list[str] = []
    from asyncgpu._runtime.clock import placement

    # per kernel: length µs, events ns, CUPTI ns, stamps ns; events start − stamp start, events end − stamp end, the
    # same for CUPTI (each placed on the host clock, ns); device, stream, round, position
    rows = []
    for rnd in range(a.rounds + 1):  # (round 0 warms up: loads, pools, the first calibration)
        with asyncgpu.gpu_timer(devs, source="cupti", label="outer") as outer:
            with asyncgpu.gpu_timer(devs, label="inner") as inner:
                k = 0
                for length in LENGTHS_US:
                    for rep in range(REPEAT + 1):
                        us = LEAD_US if rep == 0 else length
                        for d in devs:
                            for s, buf in zip(d.streams[:2], stamps[d.name]):
                                s.launch(kernels[d.name], one, np.uint64(us * 1000), np.uint64(buf.ptr + 16 * k))
                        k += 1
        if outer.timeline.source != "cupti":
            print(f"no CUPTI here: {outer.timeline.source_note}")
            return 1
        if rnd == 0:
            continue
        ev: dict = {}
        cu: dict = {}
        for t, into in ((inner, ev), (outer, cu)):
            for r in t.records:
                into.setdefault((r.device, r.stream), []).append((r.duration_ms * 1e6, r.start_ns, r.end_ns))
        for d in devs:
            d.synchronize()
            for si, (s, buf) in enumerate(zip(d.streams[:2], stamps[d.name])):
                out = host[d.name]
                s.copy_to_host(buf, out)
                s.sync()
                span = (out[1::2] - out[0::2]).astype(np.float64)
                placed = placement(d, refresh=False).globaltimer_to_host_ns(out.astype(np.int64))
                g0, g1 = placed[0::2], placed[1::2]
                key = (d.name, s.label)
                e, c = np.asarray(ev.get(key, []), np.float64), np.asarray(cu.get(key, []), np.float64)
                if not len(e) == len(c) == per_stream:
                    lines.append(f"{key}: events {len(e)}, CUPTI {len(c)} records of {per_stream}: skipped")
                    continue
                for j in range(per_stream):
                    if j % (REPEAT + 1) == 0:
                        continue  # the lead spin
                    rows.append(
                        (LENGTHS_US[j // (REPEAT + 1)], e[j, 0], c[j, 0], span[j])
                        + (e[j, 1] - g0[j], e[j, 2] - g1[j], c[j, 1] - g0[j], c[j, 2] - g1[j])
                        + (d.name, si, rnd, j)
                    )
    arr = np.array([r[:8] for r in rows], np.float64)
    lines.append(f"{len(devs)} GPUs ({devs[0].description}), {a.rounds} rounds, {len(rows)} kernels")
    lines.append("length µs    n  ev−cupti p50 ns  ev−stamps p50 ns  cupti−stamps p50 ns  beyond tol")
    outliers = []
    for us in LENGTHS_US:
        m = arr[:, 0] == us
        e, c, g = arr[m, 1], arr[m, 2], arr[m, 3]
        ec, eg, cg = e - c, e - g, c - g
        tol = np.maximum(0.01 * c, 1000.0)
        beyond = np.abs(ec) > tol
        lines.append(
            f"{us:9d} {m.sum():4d} {np.median(ec):16.1f} {np.median(eg):17.1f} {np.median(cg):20.1f} {beyond.sum():11d}"
        )
        med = np.median(arr[m, 4:8], axis=0)  # each placed edge's median offset at this length
        for i in np.flatnonzero(m)[beyond]:
            outliers.append(
                (rows[i], arr[i, 1] - arr[i, 2], arr[i, 1] - arr[i, 3] - np.median(eg))
                + (arr[i, 2] - arr[i, 3] - np.median(cg), *(arr[i, 4:8] - med))
            )
    lines.append(
        "outliers: length, device, stream, round, position; events−CUPTI, and each against the stamps "
        "less its length's median (ns): the side that moved reads far from 0; then each edge placed on the host "
        "against its stamp, less its median: the events' start and end, CUPTI's start and end"
    )
    for row, ec1, eg1, cg1, es, ee, cs, ce in outliers:
        us, dev, si, rnd, j = row[0], *row[8:]
        lines.append(
            f"  {us:5d} µs {dev} s{si} round {rnd} #{j}: ev−cupti {ec1:+8.0f}  ev−stamps {eg1:+8.0f}  "
            f"cupti−stamps {cg1:+8.0f} | edges: events {es:+8.0f} {ee:+8.0f}  CUPTI {cs:+8.0f} {ce:+8.0f}"
        )
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    asyncgpu.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
