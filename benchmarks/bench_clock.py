"""Clock alignment across GPUs: ground truth (every GPU stamps one physical instant) and calibration cost.

    python3 benchmarks/bench_clock.py [--trials 30] [--out results/clock.json]

Needs two or more CUDA GPUs for the ground truth; with one it reports the calibration figures only.
Each trial: a fresh calibration of every device (16 pings), then every GPU spins on one pinned host flag in a
kernel (%globaltimer) and waits on it in a stream (a timing event); the host flips the flag once. Figures are
the disagreement between GPU 0 and each other GPU at that instant: raw (clocks as read), naive (a single-ping
offset), aligned (asyncgpu's calibration), and events (asyncgpu's event placement, what timelines use); the events
twice: anchored as asyncgpu anchors them, and by each calibration's own kernel-exit bracket alone. Where the GPUs
can access each other's memory, also against GPU-to-GPU pings (no host link in the way): asyncgpu's own error
across GPUs for %globaltimer and events, and how much later each GPU saw the flag (`asyncgpu.check_alignment`).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import asyncgpu
from asyncgpu._runtime import clock


def _pct(values: np.ndarray) -> str:
    a = np.abs(values) / 1e3
    return f"{np.median(a):8.3f} {np.percentile(a, 90):8.3f} {a.max():8.3f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--out")
    args = parser.parse_args()
    devs = asyncgpu.devices("cuda")
    out: dict = {"devices": [d.description for d in devs]}
    print(f"== calibration: {len(devs)} x {devs[0].description}")
    print(
        f"{'device':8} {'bound µs':>9} {'anchor':>7} {'k-bound µs':>10} {'gt bound µs':>12} {'naive-best ns':>14} "
        f"{'cost ms':>8}"
    )
    cals = []
    for d in devs:
        d.clock()  # compile and warm up
        costs = []
        for _ in range(20):
            t0 = time.perf_counter_ns()
            cal = d.clock(refresh=True)
            costs.append((time.perf_counter_ns() - t0) / 1e6)
        cals.append(cal.to_dict() | {"cost_ms_median": float(np.median(costs))})
        kb = cal.kernel_anchor_bound_ns
        print(
            f"{d.name:8} {cal.bound_ns / 1e3:9.3f} {cal.anchor_source:>7} {(kb or float('nan')) / 1e3:10.3f} "
            f"{cal.globaltimer_bound_ns / 1e3:12.3f} {cal.naive_offset_ns - cal.globaltimer_offset_ns:14.1f} "
            f"{np.median(costs):8.3f}"
        )
    out["calibrations"] = cals
    if len(devs) >= 2:
        # Twice: the events anchored as asyncgpu anchors them (the device's narrow kernel-exit brackets, filled by
        # the calibrations above), then by each calibration's own bracket alone (`clock.EXIT_WINDOW` = 1)
        window = clock.EXIT_WINDOW
        for key, size in (("ground_truth", window), ("ground_truth_own_bracket", 1)):
            clock.EXIT_WINDOW = size
            try:
                r = asyncgpu.check_alignment(devs, trials=args.trials)
            finally:
                clock.EXIT_WINDOW = window
            out[key] = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}
            others = ", ".join(d.name for d in devs[1:])
            print(f"\n== ground truth ({key}), {args.trials} trials, {devs[0].name} vs {others}: |disagreement| µs")
            print(f"{'route':22} {'p50':>8} {'p90':>8} {'max':>8}")
            for k, label in (
                ("raw", "raw %globaltimer"),
                ("naive", "naive single ping"),
                ("aligned", "aligned %globaltimer"),
                ("events_aligned", "aligned events"),
                ("peer_aligned", "vs peer: %globaltimer"),
                ("peer_events_aligned", "vs peer: events"),
                ("peer_seen", "flag seen later (peer)"),
                ("peer_bound", "peer pings' ± bound"),
            ):
                if len(r[k]):
                    print(f"{label:22} {_pct(r[k])}")
            if not r["peer_pairs"]:
                print("(no peer access between the first GPU and the others: no GPU-to-GPU reference)")
    time.sleep(2.0)  # drift: the globaltimer's rate against the host clock over 2 s
    drifts = {d.name: d.clock(refresh=True).drift_ppm for d in devs}
    out["drift_ppm"] = drifts
    print("\n== drift over 2 s (ppm): " + ", ".join(f"{k} {v:+.3f}" for k, v in drifts.items() if v is not None))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
