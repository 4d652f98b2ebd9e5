"""What one step mark costs the loop's thread, by how it is made, on a drained stream and behind a step's queued work.

A host-bound torch step (bench_steps' MLP) is issued on every device's stream; then each device's stream gets one mark
of the method under test, timed around the call (``busy``: the step's work still queued); then every device is
synchronized and a second mark is timed on the drained stream (``drained``). Methods take turns step by step, so that
the host's drift cancels. Methods:

- ``event``: a pooled timing event, recorded as the step timer records (`cuEventRecord`);
- ``event-notiming``: an event made with ``CU_EVENT_DISABLE_TIMING``;
- ``write-value``: `cuStreamWriteValue32` of a counter to mapped host memory (no timestamp: the cost of any op);
- ``stamp-kernel``: a one-thread kernel that writes ``%globaltimer`` to mapped host memory (cuda.core's launch);
- ``event-second``: two pooled timing events recorded back to back, the second timed (does the first op after the
  step's launches pay for them all?);
- ``event-keepgil``: ``event`` through a ctypes entry point that keeps the GIL (is the cost the GIL's way back?).

    PYTHONPATH=$PWD python dev/diag_mark_cost.py [--devices N] [--steps 200]

Prints, per method, the median and p90 µs per mark per device, busy and drained, and the whole mark of all devices.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import asyncgpu

METHODS = ("event", "event-notiming", "write-value", "stamp-kernel", "event-second", "event-keepgil")
STAMP = r"""
extern "C" __global__ void stamp(unsigned long long* out) {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); *out = t;
}
"""


class Marks:
    """Every method's means on one device."""

    def __init__(self, dev: asyncgpu.Device) -> None:
        from cuda.core import LaunchConfig

        from asyncgpu._backends.cuda import compile_source

        self.dev = dev
        self.bd = bd = dev._internal.bd
        self.raw = dev.stream._internal.raw
        bd.make_current()
        self.kernel = compile_source(STAMP, bd.arch).get_kernel("stamp")
        bd.prepare_kernel(self.kernel)
        self.cfg = LaunchConfig(grid=1, block=1)
        self.page = bd.alloc_mapped(1 << 16)
        self.dptr = bd.device_pointer(self.page)
        self.plain = bd.create_event(False)
        self.count = 0
        self.d = bd._drv.d
        import ctypes

        from asyncgpu._backends.cuda.driver import LIBCUDA

        self.record_keep = ctypes.PyDLL(LIBCUDA).cuEventRecord
        self.record_keep.restype = ctypes.c_int

    def first(self, method: str) -> None:
        """The untimed part of a method (``event-second``: its first record)."""
        if method == "event-second":
            self.mark("event")

    def mark(self, method: str) -> None:
        bd, raw = self.bd, self.raw
        if method in ("event", "event-second"):
            pool = self.dev._internal.timing_pool
            ev = pool.take()
            bd.record(ev, raw)
            self.dev._internal.recycle_later(ev)
        elif method == "event-keepgil":
            pool = self.dev._internal.timing_pool
            ev = pool.take()
            assert self.record_keep(ev[3], raw[3]) == 0
            self.dev._internal.recycle_later(ev)
        elif method == "event-notiming":
            bd.record(self.plain, raw)
        elif method == "write-value":
            self.count += 1
            self.d.cuStreamWriteValue32(raw[1], self.dptr, self.count & 0xFFFFFFFF, 0)
        else:
            bd.launch(raw, self.kernel, self.cfg, (np.uint64(self.dptr + 64),))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200, help="steps per method")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch

    from benchmarks.bench_steps import torch_work

    devs = asyncgpu.devices("cuda", count=a.devices)
    args = argparse.Namespace(layers=8, width=2048, batch=16, size=8192, matmuls=4)
    work = [torch_work(d, "host-bound", args) for d in devs]
    marks = [Marks(d) for d in devs]
    methods = a.methods.split(",")
    clock = time.perf_counter_ns
    busy: dict[str, list[float]] = {m: [] for m in methods}
    drained: dict[str, list[float]] = {m: [] for m in methods}
    whole: dict[str, list[float]] = {m: [] for m in methods}

    def sync() -> None:
        for d in devs:
            torch.cuda.synchronize(d.index)

    for _ in range(20):  # warm-up: torch's kernels loaded, every method once
        for w, d in zip(work, devs):
            w(d.stream)
        for m in methods:
            for mk in marks:
                mk.mark(m)
        sync()
    for k in range(a.steps * len(methods)):
        m = methods[k % len(methods)]
        for w, d in zip(work, devs):
            w(d.stream)
        t0 = clock()
        for mk in marks:
            mk.first(m)
            t = clock()
            mk.mark(m)
            busy[m].append((clock() - t) / 1e3)
        whole[m].append((clock() - t0) / 1e3)
        sync()
        for mk in marks:
            mk.first(m)
            t = clock()
            mk.mark(m)
            drained[m].append((clock() - t) / 1e3)
        sync()
    lines = [
        f"{len(devs)} device(s) ({devs[0].name}), {a.steps} steps per method; µs per mark per device: p50 / p90",
        f"{'method':<16} {'busy':>16} {'drained':>16} {'all devices, busy':>20}",
    ]
    for m in methods:
        b, dr, w = (np.percentile(np.array(x), [50, 90]) for x in (busy[m], drained[m], whole[m]))
        lines.append(f"{m:<16} {b[0]:7.2f} / {b[1]:6.2f} {dr[0]:7.2f} / {dr[1]:6.2f} {w[0]:10.2f} / {w[1]:7.2f}")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    for mk in marks:
        mk.bd.destroy_event(mk.plain)
        mk.page.free()
    asyncgpu.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
