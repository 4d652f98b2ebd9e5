"""Event brackets against CUPTI per position in sequences of launches (issue 13): where a bracket's excess sits.

    PYTHONPATH=$PWD python dev/bench_brackets.py [SEQ,SEQ,...] [--unprimed] [--out FILE]

Each sequence is launched back to back on one stream of the first GPU inside an events-source scope (no overhead
subtracted) nested in a CUPTI-source scope, 10 times. Per position: the duration's error (event pair - CUPTI, µs)
as median [min, max], and the medians of the start's and the end's errors (their common offset is the two
sources' placement; what matters is which one moves). Letters: M memset 40 MB, K inc_loop x50 on 40 MB, C copy
40 MB to pinned host memory, S spin 20 µs, B spin 2 ms, c a 4 KB copy, and, untimed (backend calls, no bracket):
p a 4-byte copy to pinned memory, q the empty kernel ``asyncgpu_prime``. A repetition follows the previous one's
last launch on the same stream. ``--unprimed``: without asyncgpu's own primers at compute<->copy switches (as
before they existed). Needs a CUDA GPU and cupti-python.
"""

import argparse
import asyncio
import os
import sys

import numpy as np

import asyncgpu
from asyncgpu._runtime import hooks

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout

N = 10_000_000
SEQS = "S,C,SS,CC,SC,CS,SpC,CqS,KC,CK,MKKKC,pMKKKC,qMKKKC,BMKKKC,BCCC,Sc,cS"


async def variant(d, name, fn, reps=10):
    st, en, du = {}, {}, {}
    for _ in range(reps):
        await asyncio.sleep(0.002)
        async with asyncgpu.gpu_timer(d, source="cupti") as tc:
            async with asyncgpu.gpu_timer(d, source="events", subtract_overhead=False) as te:
                fn()
                with d.record() as e:
                    await e.wait()
        re, rc = te.records(), tc.records()
        assert len(re) == len(rc), (len(re), len(rc))
        for i, (a, b) in enumerate(zip(re, rc)):
            k = f"{i}{a.kind[:2]}"
            st.setdefault(k, []).append((a.start_ns - b.start_ns) / 1e3)
            en.setdefault(k, []).append((a.end_ns - b.end_ns) / 1e3)
            du.setdefault(k, []).append((a.duration_ms - b.duration_ms) * 1e3)
    cells = (
        f"{k} dur {np.median(v):+5.2f} [{np.min(v):+.1f},{np.max(v):+.1f}] st {np.median(st[k]):+5.2f} "
        f"en {np.median(en[k]):+5.2f}"
        for k, v in du.items()
    )
    print(f"{name:12s} " + "  ".join(cells), flush=True)


async def run(seqs: str, unprimed: bool) -> None:
    d = asyncgpu.device(0)
    s = d.stream
    big, big_host = d.alloc(N), d.alloc_pinned(N)
    small, small_host = d.alloc(1024), d.alloc_pinned(1024)
    s.memset(big, 0)
    s.inc_loop(big, 1)
    s.copy_to_host(big, big_host)
    s.spin_us(1)
    await d.record().wait()
    bd = d._internal.bd
    prime = getattr(bd, "prime", None)
    ops = {
        "M": lambda: s.memset(big, 0),
        "K": lambda: s.inc_loop(big, 50),
        "C": lambda: s.copy_to_host(big, big_host),
        "S": lambda: s.spin_us(20),
        "B": lambda: s.spin_us(2000),
        "c": lambda: s.copy_to_host(small, small_host),
        "p": lambda: prime(s._internal.raw, "copy"),
        "q": lambda: prime(s._internal.raw, "compute"),
    }
    if unprimed:
        if not hasattr(hooks, "ENGINE_OF"):
            raise SystemExit("--unprimed: this library has no `hooks.ENGINE_OF` table to empty any more")
        hooks.ENGINE_OF = {}  # no launch kind has a known engine: nothing is primed
    for seq in seqs.split(","):
        await variant(d, seq, lambda seq=seq: [ops[c]() for c in seq])
    print(
        "learned pair excess ns:", d._internal.pair_excess_ns(), "bracket overhead:", d._internal.bd.bracket_overhead()
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("seqs", nargs="?", default=SEQS, help="comma list of sequences (letters above)")
    p.add_argument("--unprimed", action="store_true", help="without asyncgpu's primers at engine switches")
    p.add_argument("--out", help="also write what is printed to this file")
    args = p.parse_args(argv)
    with tee_stdout(args.out):
        asyncio.run(run(args.seqs, args.unprimed))


if __name__ == "__main__":
    main()
