"""What the calibration's held pair costs around copies between device buffers, by the copy's size and by what
follows the pair: the calibration's own rounds (`CudaDevice._bracket_pairs`, each pair held and primed as a scope
holds and primes, behind a 1 ms kernel), for copies and memsets from 512 KB to the L2's size, each pair followed
by nothing (the next pair's primer: as the calibration runs them) or by a short spin (as work between kernels is),
each round against CUPTI (`pair_excess_ns`). Repeated ``--repeats`` times, interleaved, to show the rounds' spread.

Why: on one H100, copies of 8-160 MB between kernels read +0.7 to +1.0 µs over CUPTI with the cut measured on
512 KB copies (`dev/diag_spill.py`, run 46), where multi-GPU H100 hosts read −0.2 to +0.05. Whether the cut
depends on the copy's size, or on the work after the pair, decides what the calibration should measure.

Each row: kind, size, tail, the pair's excess over CUPTI (ns): median over the repeats, and min..max; then each
row against the 512 KB row of its kind and tail.

    PYTHONPATH=$PWD python dev/diag_copy_cut.py [--repeats 5] [--device 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu
from asyncgpu._backends import cupti
from asyncgpu._backends.cuda.calibration import pair_excess_ns
from benchmarks._common import tee_stdout_to

#: what follows each pair: nothing (the next pair's primer, as the calibration runs them), a 5 µs spin, a 5 µs spin
#: timed in a held pair of its own (as a scope times the next launch: `dev/diag_spill.py`'s works sit between such)
TAILS = (("none", 0, False), ("spin", 5_000, False), ("timed spin", 5_000, True))
PAIRS = 21  #: pairs a round (the calibration's)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds per kind, size and tail")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    tee_stdout_to(a.out)
    dev = asyncgpu.device(f"cuda:{a.device}")
    cal = dev.clock()  # (the device's own calibration first: its cuts, for reference)
    bd = dev._internal.bd
    if bd.cache_bytes is None:
        print("no L2 size: nothing to measure")
        return 1
    by_kind = {k: round(v) for k, v in cal.bracket_overhead_by_kind_ns.items()}
    print(f"{dev.description}: pair overhead (ns) {by_kind}; {cal.bracket_overhead_source}")
    l2 = bd.cache_bytes
    sizes = [512 << 10, 2 << 20, l2 // 8, l2 // 4, l2 // 2, l2]
    excess: dict[tuple[str, int, int], list[float]] = {}
    cupti.acquire(cupti.CALIBRATION)
    try:
        for _ in range(a.repeats):
            for size in sizes:
                for tail, tail_ns, timed in TAILS:
                    for kind in ("memcpy_d2d_part", "memset_part"):
                        elapsed, _ = bd._bracket_pairs(PAIRS, (kind,), size, tail_ns, timed)
                        records, _ = cupti.flush(cupti.CALIBRATION)
                        ns = pair_excess_ns(records, kind, bd.index, elapsed[kind])
                        if ns is not None:
                            excess.setdefault((kind, size, tail), []).append(ns)
    finally:
        cupti.release(cupti.CALIBRATION)
    print(f"{'kind':<16} {'size':>9} {'tail':>10} {'n':>3} {'p50':>7} {'min':>7} {'max':>7} {'vs 512K':>8}")
    for kind in ("memcpy_d2d_part", "memset_part"):
        for tail, _, _ in TAILS:
            base = excess.get((kind, sizes[0], tail))
            for size in sizes:
                v = excess.get((kind, size, tail))
                if not v:
                    print(f"{kind:<16} {size / 2**20:>7.2f}MB {tail:>10}   0  (no records)")
                    continue
                rel = f"{np.median(v) - np.median(base):+8.0f}" if base else ""
                print(
                    f"{kind:<16} {size / 2**20:>7.2f}MB {tail:>10} {len(v):>3} {np.median(v):>7.0f} "
                    f"{min(v):>7.0f} {max(v):>7.0f} {rel}"
                )
    parts = []  # per tail: the copies' excess from L2/8 to L2/2 (the sizes users time, short of spilling)
    for tail, _, _ in TAILS:
        v = [
            np.median(excess[("memcpy_d2d_part", s, tail)])
            for s in sizes[2:5]
            if excess.get(("memcpy_d2d_part", s, tail))
        ]
        if v:
            parts.append(f"{tail} {min(v):.0f}..{max(v):.0f}")
    small = excess.get(("memcpy_d2d_part", sizes[0], "none"))
    if parts and small:
        print(f"KEY copy d2d pair: 512 KB {np.median(small):.0f} ns; L2/8..L2/2 by tail: {'; '.join(parts)} ns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
