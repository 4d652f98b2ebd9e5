"""Events against CUPTI on the same activities, each launched on an idle GPU, in a fresh process: the events
source with the pair overhead of the device's calibration (nothing learned from a CUPTI scope yet). An events
scope nested in a CUPTI-source scope: the inner one ends (and places its events) first.

    python dev/diag_pair_bias.py [--repeats 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import os as _os
import sys as _sys

import numpy as np

import asyncgpu

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", help="also write what is printed to this file")
    a = p.parse_args()
    tee_stdout_to(a.out)
    dev = asyncgpu.device(0, backend="cuda")
    cal = dev.clock()
    print(f"{dev.description}: pair overhead (ns) {cal.bracket_overhead_by_kind_ns}, {cal.bracket_overhead_source}")
    s = dev.stream
    n = 10_000_000
    arr = dev.alloc(n, np.float32)
    host = dev.alloc_pinned(n, np.float32)
    cases = {
        "memset 40 MB": lambda: s.memset(arr, 0),
        "inc_loop x50": lambda: s.inc_loop(arr, 50),
        "copy 40 MB": lambda: s.copy_to_host(arr, host),
        "spin 30 us": lambda: s.spin_us(30),
    }
    for fn in cases.values():  # load, warm
        fn()
    dev.synchronize()
    print(f"{'case':<14} {'CUPTI p50 us':>12} {'events-CUPTI p50':>17} {'min':>7} {'max':>7}")
    for name, fn in cases.items():
        diffs, refs = [], []
        for _ in range(a.repeats):
            dev._internal.forget_pair_excess()  # (what a CUPTI scope teaches: forgotten, so the calibration's applies)
            dev.synchronize()
            with asyncgpu.gpu_timer(dev, source="cupti") as outer:
                with asyncgpu.gpu_timer(dev, source="events") as inner:
                    fn()
            e = inner.timeline.duration_ns[0]
            c = outer.timeline.duration_ns[0]
            diffs.append((e - c) / 1e3)
            refs.append(c / 1e3)
        d = np.array(diffs)
        print(f"{name:<14} {np.median(refs):>12.2f} {np.median(d):>17.2f} {d.min():>7.2f} {d.max():>7.2f}")


if __name__ == "__main__":
    main()
