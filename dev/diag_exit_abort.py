"""Which part of a process that nests events scopes in CUPTI-source scopes makes it abort at exit ("terminate called
without an active exception", exit 134: `dev/diag_cut_choice.py`, 1 of 12 runs on 4× H200, run 60). Each variant
runs ``--repeat`` times in child processes, one device per child, all devices at once; prints each variant's exit
codes. With ``LD_PRELOAD`` of `dev/abort_backtrace.c`'s library and ``--log``, each abort's native backtrace.

    PYTHONPATH=$PWD python dev/diag_exit_abort.py [--repeat 6] [--variants nested,nvrtc,close,no-finalize]

Variants: ``nested`` (a clock calibration, then 20 events scopes nested in CUPTI-source scopes around a spin, a
memset and an ``inc_loop``; no `close_all`); ``nvrtc`` (the same, plus a kernel compiled with NVRTC through
cuda.core and launched in each round, as the cut diagnostic does); ``close`` (``nested``, then `asyncgpu.close_all`);
``no-finalize`` (``nested``, with the CUPTI session's exit hook left to end the session but not to call
``cuptiFinalize``); ``events`` (``nvrtc`` with events scopes only: CUPTI only in the calibration); ``cut``
(`dev/diag_cut_choice.py` itself, 3 rounds); ``cut-no-finalize`` (``cut`` without the exit hook's ``cuptiFinalize``).

Run 60, 4× H200: none of 24 runs of any variant aborted, where `diag_cut_choice` aborted in 2 of 13 on the same
kind of machine. Run 61, 4× H200: ``cut`` aborted in 11 of 24 and 13 of 16, ``cut-no-finalize`` in 24 of 24,
``nested`` in 0 of 16; every abort's backtrace (13 of 13) was the device's worker thread, taking the GIL back
inside cuda.core's C++ free of the diagnostic's 40 MB pinned block (dropped as its ``main`` returned) after the
interpreter had begun its teardown, which ends such a daemon thread (``pthread_exit``: a forced unwind through a
``noexcept`` frame calls ``std::terminate``). The workers now settle at exit (`asyncgpu._runtime.worker`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

VARIANTS = ("nested", "nvrtc", "close", "no-finalize", "events", "cut", "cut-no-finalize")


def child(variant: str, device: int) -> None:
    if variant.startswith("cut"):
        _cut_choice(variant, device)
        return
    import numpy as np

    import asyncgpu
    from asyncgpu._backends import cupti

    if variant == "no-finalize":
        cupti.Buffers.detach = lambda self: None  # type: ignore[method-assign]
    d = asyncgpu.device(device, backend="cuda")
    d.clock()
    a = d.alloc(10_000_000, np.float32)
    kernel = None
    if variant in ("nvrtc", "events"):
        from cuda.core import LaunchConfig, Program, ProgramOptions

        src = 'extern "C" __global__ void probe(float* a) { a[threadIdx.x] += 1.0f; }'
        code = Program(src, "c++", ProgramOptions(arch=f"sm_{d._internal.bd.arch}")).compile("cubin")
        kernel = code.get_kernel("probe")
    for _ in range(20):
        d._internal.forget_pair_excess()
        outer = asyncgpu.gpu_timer(d, source="events" if variant == "events" else "cupti")
        with outer, asyncgpu.gpu_timer(d, source="events"):
            d.stream.spin_us(50)
            d.stream.memset(a, 0)
            d.stream.inc_loop(a, 100)
            if kernel is not None:
                d.stream.launch(kernel, LaunchConfig(grid=1, block=32), np.uint64(a.ptr), name="probe")
    if variant == "close":
        asyncgpu.close_all()
    print("DONE", flush=True)


def _cut_choice(variant: str, device: int) -> None:
    """``cut``: `dev/diag_cut_choice.py` itself, 3 rounds, its output dropped (the process that aborted);
    ``cut-no-finalize``: the same with the exit hook's ``cuptiFinalize`` left out (buffers flushed and dropped, then
    made immortal), to see whether CUPTI's teardown at exit is what aborts."""
    import runpy

    if variant == "cut-no-finalize":
        from asyncgpu._backends import cupti_buffers

        def detach(self: cupti_buffers.Buffers) -> int:
            self.flush_all(forced=True)
            self.drop()
            self.outlive_interpreter()
            return 0

        cupti_buffers.Buffers.detach = detach  # type: ignore[method-assign]
    sys.argv = [_CUT_CHOICE, "--rounds", "3", "--device", str(device)]
    with open(os.devnull, "w") as sink:
        stdout, sys.stdout = sys.stdout, sink
        try:
            runpy.run_path(_CUT_CHOICE, run_name="__main__")
        finally:
            sys.stdout = stdout
    print("DONE", flush=True)


_CUT_CHOICE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "diag_cut_choice.py")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=6)
    p.add_argument("--devices", type=int, default=0, help="devices to use at once (0: every one)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--log", help="append each failing child's whole stderr to this file")
    p.add_argument("--child", nargs=2, metavar=("VARIANT", "DEVICE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]))
        return
    n = a.devices or int(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU "))
    for variant in a.variants.split(","):
        codes: list[int] = []
        tails: list[str] = []
        for _ in range(a.repeat):
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--child", variant, str(g)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=os.environ,
                )
                for g in range(n)
            ]
            for proc in procs:
                out, err = proc.communicate(timeout=120)
                codes.append(proc.returncode)
                if proc.returncode or "DONE" not in out:
                    tails.append(err.strip().splitlines()[0] if err.strip() else out[-200:])
                    if a.log:
                        with open(a.log, "a") as log:
                            log.write(f"=== {variant}, exit {proc.returncode}\n{err}\n")
        bad = sum(c != 0 for c in codes)
        print(f"{variant:<12} {bad} of {len(codes)} exited non-zero: {sorted(set(codes))} {tails[:2]}", flush=True)


if __name__ == "__main__":
    main()
