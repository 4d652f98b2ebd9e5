"""Whether a GPU's drift against the host's clock holds still when the GPU's load changes, and which drift estimate
extrapolates a calibration best: each device calibrated every ``--every-s`` through phases idle, busy (torch bf16
matmuls back to back on a stream of its own, from a thread per device), idle again. Every calibration's best
``%globaltimer`` point (stamp, host ns) is kept; offline, each point is predicted from an earlier calibration ``age``
seconds before it, extrapolated with the drift each estimator gives at that earlier calibration:

* ``asyncgpu``: the drift the earlier calibration measured itself (`DeviceInternal.drift_base`);
* ``since first``: the slope from the device's first point;
* ``window W s``: the slope from the newest point at least W s older;

and the prediction's error (ns) is summarised per phase of the predicted point and per age. The points' own error
(each within its ``globaltimer_bound_ns``, ~0.5-1 µs) is in every error, so small ones are that floor.

    PYTHONPATH=$PWD python dev/diag_clock_drift.py [--devices 2] [--phases 15,25,15] [--every-s 0.25] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import numpy as np

import asyncgpu

AGES_S = (0.25, 2.0, 8.0, 30.0)
WINDOWS_S = (2.0, 5.0, 10.0)


def load(index: int, stop: threading.Event, size: int) -> None:
    """Matmuls back to back on ``cuda:index`` until ``stop`` (a side stream: the calibration's is asyncgpu's)."""
    import torch

    dev = torch.device("cuda", index)
    with torch.cuda.device(dev):
        s = torch.cuda.Stream(dev)
        a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
        with torch.cuda.stream(s):
            while not stop.is_set():
                for _ in range(8):
                    a = torch.tanh(a @ a)
                s.synchronize()


def slope_rate(g0: float, h0: float, g1: float, h1: float) -> float:
    """Host ns per device ns between two points."""
    return (h1 - h0) / (g1 - g0)


def predict(points: np.ndarray, rates: np.ndarray, i: int, j: int, how: str) -> float:
    """Point j's host time predicted from point i with the drift estimator ``how`` (only points <= i used;
    ``rates``: each calibration's own rate, host ns per device ns)."""
    g, h = points[:, 0], points[:, 1]
    if how == "asyncgpu":
        return h[i] + (g[j] - g[i]) * rates[i]
    if how == "since first":
        k = 0
    else:
        w_ns = float(how.split()[1]) * 1e9
        older = np.nonzero(h[: i + 1] <= h[i] - w_ns)[0]
        k = int(older[-1]) if len(older) else 0
    if k == i or h[i] - h[k] < 1e9:  # (under a second of history: no drift, as asyncgpu)
        rate = 1.0
    else:
        rate = slope_rate(g[k], h[k], g[i], h[i])
    return h[i] + (g[j] - g[i]) * rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--phases", default="15,25,15", help="seconds idle, busy, idle")
    ap.add_argument("--every-s", type=float, default=0.25)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    devs = asyncgpu.devices("cuda", count=args.devices)
    phases = [float(x) for x in args.phases.split(",")]
    names = ["idle", "busy", "idle again"]
    pts: dict[str, list[tuple[int, float, float, int, float]]] = {d.name: [] for d in devs}
    stop = threading.Event()
    loaders: list[threading.Thread] = []
    t_start = time.perf_counter()
    for p, (name, secs) in enumerate(zip(names, phases)):
        if name == "busy":
            stop.clear()
            loaders = [threading.Thread(target=load, args=(d.index, stop, args.size), daemon=True) for d in devs]
            for t in loaders:
                t.start()
        elif loaders:
            stop.set()
            for t in loaders:
                t.join()
            loaders = []
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            for d in devs:
                cal = d._internal.calibration(refresh=True)
                if cal.gt_point is not None:
                    stamp, host = cal.gt_point
                    pts[d.name].append((stamp, host, float(cal.globaltimer_bound_ns or 0.0), p, cal.rate))
            time.sleep(args.every_s)
    stop.set()
    print(f"{len(devs)} device(s), phases {dict(zip(names, phases))} s, a calibration every {args.every_s} s each")
    hows = ["asyncgpu", "since first"] + [f"window {w:g} s" for w in WINDOWS_S]
    doc: dict = {"phases": dict(zip(names, phases)), "every_s": args.every_s, "devices": {}}
    for d in devs:
        arr = np.array([(s, h) for s, h, *_ in pts[d.name]], dtype=np.float64)
        phase = np.array([pt[3] for pt in pts[d.name]])
        bounds = np.array([pt[2] for pt in pts[d.name]])
        rates = np.array([pt[4] for pt in pts[d.name]])
        h = arr[:, 1]
        # the drift in each phase: the slope over the phase's points (ppm, device fast > 0)
        drifts = []
        for p in range(len(names)):
            sel = phase == p
            if sel.sum() > 2:
                fit = np.polyfit(arr[sel, 1] - arr[sel, 1][0], arr[sel, 0] - arr[sel, 0][0], 1)
                drifts.append((fit[0] - 1) * 1e6)
            else:
                drifts.append(float("nan"))
        print(
            f"\n{d.name}: {len(arr)} points, gt bound p50 {np.median(bounds) / 1e3:.2f} µs; drift per phase (ppm): "
            + ", ".join(f"{n} {x:+.3f}" for n, x in zip(names, drifts))
        )
        print(f"{'age s':>6} {'estimator':<14} " + " ".join(f"{n + ' p50/max µs':>22}" for n in names))
        rows = {}
        for age in AGES_S:
            for how in hows:
                errs: dict[int, list[float]] = {p: [] for p in range(len(names))}
                for j in range(len(arr)):
                    cands = np.nonzero(h[:j] <= h[j] - age * 1e9)[0]
                    if not len(cands):
                        continue
                    i = int(cands[-1])
                    if h[j] - h[i] > 1.5 * age * 1e9 + 1e9:
                        continue
                    errs[int(phase[j])].append(predict(arr, rates, i, j, how) - h[j])
                cells = []
                for p in range(len(names)):
                    e = np.abs(np.array(errs[p])) / 1e3
                    cells.append(f"{np.median(e):9.2f} / {e.max():8.2f}" if len(e) else f"{'-':>20}")
                    rows[f"{age}|{how}|{names[p]}"] = {"n": len(e), "p50_us": float(np.median(e)) if len(e) else None,
                                                       "max_us": float(e.max()) if len(e) else None}  # fmt: skip
                print(f"{age:6.2f} {how:<14} " + " ".join(f"{c:>22}" for c in cells))
        doc["devices"][d.name] = {"drift_ppm": drifts, "errors": rows, "points": arr.tolist(), "phase": phase.tolist()}
    print(f"\n({time.perf_counter() - t_start:.0f} s)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "clock_drift.json"), "w") as f:
            json.dump(doc, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
