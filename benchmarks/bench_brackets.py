"""Event brackets against CUPTI per position in sequences of launches (issue 13): raw event pair minus CUPTI's span.

    PYTHONPATH=$PWD python benchmarks/bench_brackets.py [SEQ,SEQ,...]

Each sequence is launched back to back on one stream of the first GPU inside an events-source scope (no overhead
subtracted) nested in a CUPTI-source scope, 8 times; per position, the median and range of (event pair - CUPTI)
in µs. Letters: M memset 40 MB, K inc_loop x50 on 40 MB, C copy 40 MB to pinned host memory, S spin 20 µs,
B spin 2 ms (a busy stream), m/c a 4 KB memset/copy. ``never``: the launch hold off (see asyncgpu._core.hooks).
Needs a CUDA GPU and cupti-python.
"""

import asyncio
import sys

import numpy as np

import asyncgpu
from asyncgpu._core import hooks

N = 10_000_000


async def variant(d, name, fn, reps=8, hold="always"):
    errs = {}
    hooks.HOLD = hold
    for _ in range(reps):
        await asyncio.sleep(0.002)
        async with asyncgpu.gpu_timer(d, source="cupti") as tc:
            async with asyncgpu.gpu_timer(d, source="events", subtract_overhead=False) as te:
                fn()
                with d.record() as e:
                    await e.wait()
        re, rc = te.records(), tc.records()
        for i, (r_e, r_c) in enumerate(zip(re, rc)):
            errs.setdefault(f"{i}{r_e.kind[:2]}", []).append((r_e.duration_ms - r_c.duration_ms) * 1e3)
    hooks.HOLD = "always"
    print(
        f"{name:24s} {hold:6s} "
        + "  ".join(f"{k} {np.median(v):+6.2f} [{np.min(v):+.1f},{np.max(v):+.1f}]" for k, v in errs.items()),
        flush=True,
    )


async def main():
    d = asyncgpu.device(0)
    s = d.stream
    old = d.alloc(N)
    oldp = d.alloc_pinned(N)
    small = d.alloc(1024)
    smallp = d.alloc_pinned(1024)
    s.memset(old, 0)
    s.inc_loop(old, 1)
    s.copy_to_host(old, oldp)
    s.spin_us(1)
    await d.record().wait()
    ops = {
        "M": lambda: s.memset(old, 0),
        "K": lambda: s.inc_loop(old, 50),
        "C": lambda: s.copy_to_host(old, oldp),
        "S": lambda: s.spin_us(20),
        "B": lambda: s.spin_us(2000),
        "m": lambda: s.memset(small, 0),
        "c": lambda: s.copy_to_host(small, smallp),
    }
    seqs = (
        sys.argv[1].split(",")
        if len(sys.argv) > 1
        else [
            "M",
            "K",
            "C",
            "S",
            "MKKKC",
            "KKKKK",
            "SSSS",
            "MMM",
            "CCC",
            "KC",
            "CK",
            "MK",
            "KM",
            "SM",
            "MS",
            "SC",
            "CS",
            "BMKKKC",
            "BSSSS",
            "BMMM",
            "BCCC",
            "mS",
            "Sm",
            "cS",
            "Sc",
        ]
    )
    for seq in seqs:
        fn = lambda seq=seq: [ops[c]() for c in seq]
        await variant(d, seq, fn)
        if seq.startswith("B") or seq in ("MKKKC", "SSSS"):
            await variant(d, seq, fn, hold="never")
    print("learned pair excess ns:", d.pair_excess_ns(), "bracket overhead:", d.bd.bracket_overhead_ns())


asyncio.run(main())
