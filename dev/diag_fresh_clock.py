"""How a GPU's ``%globaltimer`` moves against the host's clock in the first seconds of a process: each ping's causal
interval for the offset (``[stamp - h1, stamp - h0]``), every few milliseconds from the device's first
calibration on, summarised per window. A step or a slew of the timer (a driver correcting it after the context is
made) shows as windows whose intervals no longer overlap the first one's.

    PYTHONPATH=$PWD python dev/diag_fresh_clock.py [--seconds 3] [--every-ms 5] [--device 0] [--out DIR]

Run it in a fresh process: that is the case it probes (``tests/test_clock.py::test_cuda_calibration_bounds`` alone
fails there and passes inside the suite, run 31). The hypothesis to test: the first calibration's pings run before
the process's first CUPTI session (the calibration then measures the pair's overhead against CUPTI), and a CUPTI
session moves the timer. ``--cupti-at S`` opens and closes a CUPTI session S seconds in, and the window it falls in
is marked.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import asyncgpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--every-ms", type=float, default=5.0)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--window-ms", type=float, default=100.0)
    ap.add_argument("--cupti-at", type=float, default=1.5, help="seconds in: a CUPTI session (<0: none)")
    ap.add_argument("--out", metavar="DIR")
    args = ap.parse_args()
    t_open = time.perf_counter_ns()
    dev = asyncgpu.device(args.device, backend="cuda")
    cal = dev.clock(refresh=True, samples=32)
    bd = dev._internal.bd
    print(
        f"{dev.name}: first calibration {(cal.taken_ns - t_open) / 1e6:.1f} ms after the device was opened; "
        f"offset ±{cal.globaltimer_bound_ns:.0f} ns"
    )
    rows = []  # (host ns since the calibration, offset lo, offset hi) per ping
    t_start = time.perf_counter_ns()
    end = t_start + int(args.seconds * 1e9)
    cupti_at = None if args.cupti_at < 0 else t_start + int(args.cupti_at * 1e9)
    cupti_ns = None
    while time.perf_counter_ns() < end:
        if cupti_at is not None and cupti_ns is None and time.perf_counter_ns() >= cupti_at:
            from asyncgpu._backends import cupti

            cupti_ns = time.perf_counter_ns() - cal.taken_ns
            try:
                cupti.acquire(cupti.CALIBRATION)
                cupti.flush(cupti.CALIBRATION)
                cupti.release(cupti.CALIBRATION)
            except Exception as exc:  # noqa: BLE001 - the probe goes on without it, saying so
                print(f"no CUPTI session: {exc}")
        stamps, _ = bd.calibrate_globaltimer(4, 5_000_000)
        for g, h0, h1 in stamps.tolist():
            rows.append((h0 - cal.taken_ns, g - h1, g - h0))
        time.sleep(args.every_ms / 1e3)
    a = np.array(rows, np.float64)
    ref = cal.globaltimer_offset_ns
    print(f"{'window (ms)':>12} {'pings':>6} {'offset − calibration: lo..hi of the intersection (ns)':>50}")
    w = args.window_ms * 1e6
    for start in np.arange(a[:, 0].min(), a[:, 0].max(), w):
        m = (a[:, 0] >= start) & (a[:, 0] < start + w)
        if not m.any():
            continue
        lo, hi = a[m, 1].max() - ref, a[m, 2].min() - ref
        flag = "" if lo <= cal.globaltimer_bound_ns and hi >= -cal.globaltimer_bound_ns else "   <- outside the bound"
        if cupti_ns is not None and start <= cupti_ns < start + w:
            flag += "   (a CUPTI session opened and closed here)"
        print(f"{start / 1e6:12.0f} {int(m.sum()):6d} {lo:24.0f} .. {hi:.0f}{flag}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "diag_fresh_clock.json"), "w") as f:
            doc = {"device": dev.name, "bound_ns": cal.globaltimer_bound_ns, "cupti_at_ns": cupti_ns, "pings": rows}
            json.dump(doc, f)
    asyncgpu.close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
