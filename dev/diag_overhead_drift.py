"""Does a device's measured event-pair overhead depend on when it is measured? In one fresh process, per GPU: the
overhead (`bracket_overhead`, against CUPTI) at the device's first calibration, then again several times in a row,
after a second of idleness, and right after 200 ms of spinning (the GPU's clocks up); the SM clock (nvidia-smi) at
each point. A correction that moves by more than its use's tolerance between these is measured at the wrong time.

    python dev/diag_overhead_drift.py [--again 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import os as _os
import subprocess
import sys as _sys
import time

import asyncgpu

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to

KINDS = ("kernel", "memset", "memcpy", "memcpy_d2d")


def sm_clock_mhz(index: int) -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "-i", str(index), "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def row(label: str, index: int, by_kind: dict[str, float]) -> None:
    cells = " ".join(f"{by_kind.get(k, float('nan')):10.0f}" for k in KINDS)
    print(f"cuda:{index} {label:<26} {cells}   SM {sm_clock_mhz(index)} MHz")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--again", type=int, default=5)
    p.add_argument("--out", help="also write what is printed to this file")
    a = p.parse_args()
    tee_stdout_to(a.out)
    devs = asyncgpu.devices("cuda")
    print(f"{'':<33} " + " ".join(f"{k + ' ns':>10}" for k in KINDS))
    for dev in devs:
        bd = dev._internal.bd
        t0 = time.perf_counter()
        cal = dev.clock()
        row(f"first ({time.perf_counter() - t0:.2f} s)", dev.index, dict(cal.bracket_overhead_by_kind_ns))
        for k in range(a.again):
            row(f"again {k + 1}", dev.index, bd.bracket_overhead()[0])
        time.sleep(1.0)
        row("after 1 s idle", dev.index, bd.bracket_overhead()[0])
        dev.stream.spin_us(200_000)
        with dev.record() as done:
            done.wait_sync()
        row("after 200 ms of spin", dev.index, bd.bracket_overhead()[0])
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
