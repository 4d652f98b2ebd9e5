"""Cross-GPU alignment against a reference that never crosses the host: GPU-to-GPU pings over peer memory.

    PYTHONPATH=$PWD python dev/diag_p2p_clock.py [--trials 30] [--pings 32] [--out FILE]

Why: `asyncgpu.check_alignment` judges the alignment by one physical instant, a host flag every GPU polls. But each
GPU *sees* that flip after its own PCIe read latency, which differs with the GPU's place on the bus, so the
%globaltimer stamps it compares hold the GPUs' detection differences as well as asyncgpu's calibration errors; and
asyncgpu's calibration pings cross the same host links, whose two directions need not take equally long.

Here GPU 0 and each other GPU k ping each other through their own device memory (peer access: NVLink or PCIe
peer to peer), one thread each: GPU 0 stamps ``t0``, writes ``v`` into GPU k's word, and waits for GPU k's answer
in its own word (``t1``); GPU k stamps ``tk`` when it sees ``v`` and writes it back. Causality alone puts the two
clocks' offset ``D = globaltimer_k − globaltimer_0`` in ``[tk − t1, tk − t0]``; the pings' intersection is the
estimate, within ± half its width (a peer link's two directions are the same hardware, so its middle is also where
symmetric latencies put it). Against that ``D``, per trial (a fresh asyncgpu calibration of every GPU each):

- ``gt``: asyncgpu's %globaltimer placement across GPUs: the two kernels' exit stamps placed on the host clock by
  each GPU's calibration, their difference minus the difference ``D`` says (µs);
- ``events``: the same for the timing events recorded right after those kernels, placed as asyncgpu places events
  (each GPU's anchor), against the exit stamps' difference through ``D`` (the front end's delay from a kernel's exit
  to the event after it is taken as equal on two GPUs of one model);
- ``flag``: what `check_alignment` would read (the host flips one flag; each GPU's stamp of it, placed by its
  calibration: GPU 0's − GPU k's), and ``seen``: how much later GPU k saw that flip than GPU 0, on one clock through
  ``D`` (the physics in the flag's reading, not asyncgpu's). ``flag`` = −``gt`` − ``seen``, exactly.

Prints per pair the p50 / max of |gt|, |events|, |flag| and the p50 of ``seen``, and ``D``'s bound. Needs two or
more CUDA GPUs with peer access between GPU 0 and the others (a pair without it is reported and skipped).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

import numpy as np

import asyncgpu
from asyncgpu._runtime.clock import placement

SOURCE = r"""
__device__ __forceinline__ unsigned long long gt() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
// One thread. `mine`: this GPU's word (the peer writes it); `theirs`: the peer's word (this GPU writes it).
// stamps: the initiator's t0, t1 per ping at [2i], [2i + 1]; the responder's stamp per ping at [2i]; then at [2n]
// a failure flag (1: timed out) and at [2n + 1] the kernel's exit stamp.
extern "C" __global__ void p2p_ping(volatile unsigned int* mine, volatile unsigned int* theirs,
                                    unsigned long long* stamps, unsigned int first, unsigned int n, int initiator,
                                    unsigned long long timeout_ns) {
    const unsigned long long begin = gt();
    stamps[2 * n] = 0;
    for (unsigned int i = 0; i < n; ++i) {
        const unsigned int v = first + i;
        if (initiator) {
            const unsigned long long t0 = gt();
            *theirs = v;
            __threadfence_system();
            while ((int)(*mine - v) < 0) {
                if (gt() - begin > timeout_ns) { stamps[2 * n] = 1; return; }
            }
            stamps[2 * i + 1] = gt();
            stamps[2 * i] = t0;
        } else {
            while ((int)(*mine - v) < 0) {
                if (gt() - begin > timeout_ns) { stamps[2 * n] = 1; return; }
            }
            stamps[2 * i] = gt();
            *theirs = v;
            __threadfence_system();
        }
    }
    stamps[2 * n + 1] = gt();
}
"""
TIMEOUT_NS = 50_000_000


class Side:
    """One GPU's end of the pings: its kernel, stream, word, stamps and an event recorded after the kernel."""

    def __init__(self, dev: asyncgpu.Device, n: int) -> None:
        from cuda.core import LaunchConfig

        from asyncgpu._backends.cuda import compile_source

        self.dev, self.bd = dev, dev._internal.bd
        bd = self.bd
        bd.make_current()
        self.kernel = compile_source(SOURCE, bd.arch).get_kernel("p2p_ping")
        bd.prepare_kernel(self.kernel)
        self.cfg = LaunchConfig(grid=1, block=1)
        self.stream = bd.create_stream()
        self.word = bd.alloc(64, np.uint32, self.stream)
        self.stamps = bd.alloc(2 * n + 2, np.uint64, self.stream)
        bd.memset(self.stream, self.word, 256, 0)
        self.event = bd.create_event(True)
        bd.sync_stream(self.stream)
        self.n = n

    def launch(self, peer: Side, first: int, initiator: bool) -> None:
        args = (
            np.uint64(int(self.word.handle)),
            np.uint64(int(peer.word.handle)),
            np.uint64(int(self.stamps.handle)),
            np.uint32(first & 0xFFFFFFFF),
            np.uint32(self.n),
            np.int32(1 if initiator else 0),
            np.uint64(TIMEOUT_NS),
        )
        self.bd.launch(self.stream, self.kernel, self.cfg, args)
        self.bd.record(self.event, self.stream)

    def read(self) -> np.ndarray:
        self.bd.sync_stream(self.stream)
        return self.bd.to_numpy(self.stamps, 2 * self.n + 2, np.uint64).astype(np.int64)


def ping(a: Side, b: Side, first: int) -> tuple[float, float, np.ndarray, np.ndarray]:
    """D = globaltimer_b − globaltimer_a (ns) and its ± bound, and both sides' stamps."""
    b.launch(a, first, initiator=False)  # (the responder first: it waits for the initiator's first write)
    a.launch(b, first, initiator=True)
    sa, sb = a.read(), b.read()
    n = a.n
    if sa[2 * n] or sb[2 * n]:
        raise RuntimeError(f"{a.dev.name} <-> {b.dev.name}: a ping timed out (both kernels must run at once)")
    t0, t1, tk = sa[0 : 2 * n : 2], sa[1 : 2 * n : 2], sb[0 : 2 * n : 2]
    lo, hi = int((tk - t1).max()), int((tk - t0).min())
    if hi < lo:  # (cannot happen with consistent clocks: say so rather than hide it)
        raise RuntimeError(f"{a.dev.name} <-> {b.dev.name}: the pings' brackets do not intersect ({lo} > {hi})")
    return (lo + hi) / 2, (hi - lo) / 2, sa, sb


def flag_flip(devs: list, page, first: int) -> np.ndarray:
    """check_alignment's instant: every GPU's calibration kernel spins on one host flag; the stamps of its flip."""
    bds = [d._internal.bd for d in devs]
    words, per = page.words, 64
    streams = [bd.create_stream() for bd in bds]
    for i, bd in enumerate(bds):
        base = bd.device_pointer(page)
        off = 256 + i * per
        ctypes.memset(page.ptr + off + 16, 0, 16)
        bd.launch_pingpong(streams[i], base, base + off, base + off + 16, first, 1)
    deadline = time.perf_counter_ns() + 1_000_000_000
    while any(words[(256 + i * per) // 4] != first for i in range(len(devs))):
        if time.perf_counter_ns() > deadline:
            raise RuntimeError("a device did not start the flag kernel within 1 s")
    words[0] = first
    for bd, s in zip(bds, streams):
        bd.sync_stream(s)
        bd.close_stream(s)
    return np.array(
        [np.frombuffer(page.view, np.uint64, 1, 256 + i * per + 16)[0] for i in range(len(devs))], dtype=np.int64
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--pings", type=int, default=32)
    ap.add_argument("--out")
    a = ap.parse_args()
    devs = asyncgpu.devices("cuda")
    if len(devs) < 2:
        print("needs two or more CUDA GPUs")
        return 2
    base = devs[0]._internal.bd
    pairs = []
    for d in devs[1:]:
        bd = d._internal.bd
        if not (base._dev.can_access_peer(d.index) and bd._dev.can_access_peer(base.index)):
            print(f"{devs[0].name} <-> {d.name}: no peer access, skipped")
            continue
        base._grant_peer_access(d.index)
        bd._grant_peer_access(base.index)
        pairs.append(d)
    if not pairs:
        return 2
    sides = {d.name: Side(d, a.pings) for d in [devs[0], *pairs]}
    s0 = sides[devs[0].name]
    page = base.alloc_mapped(4096)
    rows: dict[str, dict[str, list[float]]] = {
        d.name: {k: [] for k in ("D_ns", "D_bound_ns", "gt", "events", "flag", "seen", "anchor_bound")} for d in pairs
    }
    first = 1
    for d in [devs[0], *pairs]:  # warm-up: the kernels loaded, the calibration's first (CUPTI) round done
        d.clock()
    for _ in range(3):
        for d in pairs:
            ping(s0, sides[d.name], first)
            first += a.pings
    for trial in range(a.trials):
        every = [devs[0], *pairs]
        cals = {d.name: d.clock(refresh=True) for d in every}
        places = {d.name: placement(d, max_age_s=float("inf")) for d in every}
        stamps = flag_flip(every, page, trial + 1)
        for k, d in enumerate(pairs, start=1):
            sk = sides[d.name]
            D, bound, sa, sb = ping(s0, sk, first)
            first += a.pings
            n = a.pings
            exit0, exitk = int(sa[2 * n + 1]), int(sb[2 * n + 1])
            truth = (exitk - D) - exit0  # (ns on GPU 0's clock: how much later GPU k's kernel exited)
            c0, ck = cals[devs[0].name], cals[d.name]
            gt = float(ck.globaltimer_to_host_ns(exitk) - c0.globaltimer_to_host_ns(exit0)) - truth
            ev = places[d.name].host_ns(sk.event) - places[devs[0].name].host_ns(s0.event) - truth
            flag = float(c0.globaltimer_to_host_ns(stamps[0]) - ck.globaltimer_to_host_ns(stamps[k]))
            seen = float((stamps[k] - D) - stamps[0])
            r = rows[d.name]
            for key, v in (
                ("D_ns", D),
                ("D_bound_ns", bound),
                ("gt", gt),
                ("events", ev),
                ("flag", flag),
                ("seen", seen),
                ("anchor_bound", ck.bound_ns),
            ):
                r[key].append(float(v))
    page.free()
    print(f"{len(pairs) + 1} x {devs[0].description}, {a.trials} trials, {a.pings} pings a pair; µs")
    print(
        f"{'pair':14} {'D ± (p50)':>10} {'|gt| p50/max':>14} {'gt mean':>8} {'|events| p50/max':>17} "
        f"{'ev mean':>8} {'|flag| p50/max':>15} {'seen p50':>9}"
    )
    for d in pairs:
        r = {k: np.asarray(v) / 1e3 for k, v in rows[d.name].items()}

        def pm(x: np.ndarray) -> str:
            return f"{np.median(np.abs(x)):.2f} / {np.abs(x).max():.2f}"

        print(
            f"{devs[0].name}-{d.name:8} {np.median(r['D_bound_ns']):10.2f} {pm(r['gt']):>14} {r['gt'].mean():+8.2f} "
            f"{pm(r['events']):>17} {r['events'].mean():+8.2f} {pm(r['flag']):>15} {np.median(r['seen']):+9.2f}"
        )
    every_gt = np.concatenate([np.asarray(rows[d.name]["gt"]) for d in pairs]) / 1e3
    every_ev = np.concatenate([np.asarray(rows[d.name]["events"]) for d in pairs]) / 1e3
    every_flag = np.concatenate([np.asarray(rows[d.name]["flag"]) for d in pairs]) / 1e3
    print(
        f"KEY against peer pings, all pairs: %globaltimer |err| p50 {np.median(np.abs(every_gt)):.2f} max "
        f"{np.abs(every_gt).max():.2f} µs; events {np.median(np.abs(every_ev)):.2f} / {np.abs(every_ev).max():.2f}; "
        f"the flag's reading {np.median(np.abs(every_flag)):.2f} / {np.abs(every_flag).max():.2f}"
    )
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"devices": [d.description for d in devs], "pairs": rows}, f)
    asyncgpu.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
