"""Does a process that ran a torch loop under the events step timer exit cleanly? Each variant runs in a child
process, ``--repeat`` times: its exit code (139: a crash after the interpreter's teardown, where faulthandler is off
already), and the threads still alive at its last ``atexit`` callback.

    PYTHONPATH=$PWD python dev/diag_exit.py [--devices 4] [--repeat 3] [--variants full,no-close,torch-only]

Variants: ``full`` (a step timer over a host-bound torch MLP on each device, then `asyncgpu.close_all`: what
dev/diag_step_events.py does); ``no-close`` (the same without `close_all`); ``torch-only`` (the same loop, no step
timer); ``no-torch`` (the step timer over asyncgpu's own spin kernels, no torch imported); ``timer-idle`` (the
timer open over the loop, no step marked); ``unchained`` (``chain=False``); ``free-torch-first`` (torch's tensors
dropped, its cache emptied and its devices synchronized before `close_all`); ``clock-only`` (the torch loop, no
timer, and each device's clock calibrated, as a step timer's entry does); ``clock-no-cupti`` (the same, CUPTI
not offered to the calibration); ``cupti-only`` (the torch loop, and a CUPTI session opened and closed, no
calibration); ``full-cupti-finalize`` (``full``, then ``cuptiFinalize`` before the interpreter's exit).
"""

from __future__ import annotations

import argparse
import atexit
import subprocess
import sys
import threading

VARIANTS = (
    "full",
    "no-close",
    "torch-only",
    "no-torch",
    "timer-idle",
    "unchained",
    "free-torch-first",
    "clock-only",
    "clock-no-cupti",
    "cupti-only",
    "full-cupti-finalize",
)


def _threads_at_exit() -> None:
    names = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    print("THREADS " + (", ".join(names) or "-"), flush=True)


def child(variant: str, devices: int, steps: int) -> None:
    atexit.register(_threads_at_exit)  # (registered first: runs last)
    import anyio

    from asyncgpu._backends import cupti

    if variant == "clock-no-cupti":
        cupti.available = lambda: (False, "off for this probe")

    import asyncgpu
    from benchmarks.bench_steps import run_steps, torch_work

    devs = asyncgpu.devices("cuda", count=devices)
    if variant == "no-torch":
        work = [lambda s: s.spin_us(2000) for _ in devs]
    else:
        args = argparse.Namespace(layers=8, width=2048, batch=16, size=8192, matmuls=4)
        work = [torch_work(d, "host-bound", args) for d in devs]

    async def main() -> None:
        for d in devs:
            await d.prepare()
        if variant in ("torch-only", "clock-only", "clock-no-cupti", "cupti-only"):
            await run_steps(devs, work, steps, None)
            if variant.startswith("clock"):
                for d in devs:
                    await d.aclock()
            if variant == "cupti-only":
                cupti.acquire(cupti.STEPS)
                cupti.flush_batch(cupti.STEPS)
                cupti.release(cupti.STEPS)
            return
        async with asyncgpu.step_timer(devs, chain=variant != "unchained") as st:
            await run_steps(devs, work, steps, None if variant == "timer-idle" else st)

    anyio.run(main)
    if variant == "free-torch-first":
        import gc

        import torch

        work.clear()
        gc.collect()
        for d in devs:
            torch.cuda.synchronize(d.index)
        torch.cuda.empty_cache()
    if variant != "no-close":
        asyncgpu.close_all()
    if variant == "full-cupti-finalize" and cupti._buffers is not None:
        cupti._buffers.flush_all(forced=True)
        print("cuptiFinalize:", cupti._buffers.lib.cuptiFinalize(), flush=True)
    print("BODY DONE", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variants", default="full,no-close,torch-only")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.devices, args.steps)
        return 0
    for v in args.variants.split(","):
        codes, threads = [], set()
        for _ in range(args.repeat):
            p = subprocess.run(
                [sys.executable, "-X", "faulthandler", __file__, "--child", v, "--devices", str(args.devices)]
                + ["--steps", str(args.steps)],
                capture_output=True,
                text=True,
            )
            codes.append(p.returncode)
            threads.update(ln[8:] for ln in p.stdout.splitlines() if ln.startswith("THREADS "))
            if p.returncode and "BODY DONE" not in p.stdout:
                print(f"{v}: failed before its end: {p.stderr[-600:]}")
        print(f"{v:<11} exit codes {codes}; threads alive at the last atexit: {' | '.join(sorted(threads)) or '?'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
