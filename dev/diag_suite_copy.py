"""Why `test_events_time_copies_between_device_buffers_as_cupti_does` failed on 2× H100 inside the full suite only
(runs 39-42, while it nested events inside a CUPTI scope: the second copy of rounds 2, 3, 6 and 7, counted from 0; its
data movement started ~1 µs after its start event). Found in run 42 with ``DIAG_AFTER_TEST`` (`after_test`): CUPTI's
instrumentation of the copy, on some streams only, which the pair around it counted; events alone show no delay. The
test's pattern, in blocks of 8 rounds on a fresh device each (as the test's fixture), per round: copy 2's start
against copy 1's (events − CUPTI, µs; the clock's placement is common to both), both errors, and the calibration's
age at the round's start. Variants:Variants:

* ``test``: the pattern, nested;
* ``shiftK``: K extra untimed 1 µs spins before each round's synchronize (moves where each round's commands fall in
  the stream's command queue, nothing else);
* ``noage``: the clock measured at the block's start and never again (``max_clock_age_s=inf``);
* ``everyround``: the clock measured at every scope's exit (``max_clock_age_s=1e-6``).

``--peer`` runs them again after a copy from cuda:1 to cuda:0 and back (each GPU's memory pool then readable by the
other, as the suite's two-GPU tests leave them: the nested test failed in 2-GPU suites only).

As a pytest plugin it runs after the session (the suite's state: ``python -m pytest -p dev.diag_suite_copy tests``;
``DIAG_VARIANTS=`` runs none, ``DIAG_CUT_AFTER=TEXT`` ends the session after the last test whose id holds TEXT,
``DIAG_PRIMER=generic|none`` changes the copy primer for the whole session, ``DIAG_EXTRA_STREAMS=K`` makes K idle
streams on cuda:0 right before the cut test); as a script, in a fresh process.

    python dev/diag_suite_copy.py [--blocks 4] [--variants test,shift1,shift2,shift3,noage,everyround] [--peer]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu
from asyncgpu._backends import load_backend
from asyncgpu._runtime.clock import CLOCK_MAX_AGE_S
from benchmarks._common import tee_stdout_to

VARIANTS = "test,shift1,shift2,shift3,noage,everyround"


def _block(variant: str) -> list[tuple[float, float, float, float]]:
    """Eight rounds on a fresh device: per round (copy 2's start − copy 1's start, err 1, err 2, clock age ms)."""
    dev = asyncgpu.device(0, backend="cuda")
    age_s = {"noage": math.inf, "everyround": 1e-6}.get(variant, CLOCK_MAX_AGE_S)
    shift = int(variant[5:]) if variant.startswith("shift") else 0
    n = 10_000_000
    a, b = dev.alloc(n), dev.alloc(n)
    s = dev.stream
    s.copy(b, a)
    dev.synchronize()
    dev.clock()
    out = []
    for _ in range(8):
        for _ in range(shift):
            s.spin_us(1)
        dev.synchronize()
        cal = dev._internal.last_clock()
        age_ms = (time.perf_counter_ns() - cal.taken_ns) / 1e6 if cal is not None else float("nan")
        with asyncgpu.gpu_timer(dev, source="cupti", max_clock_age_s=age_s) as outer:
            with asyncgpu.gpu_timer(dev, source="events", max_clock_age_s=age_s) as inner:
                for _ in range(2):
                    s.spin_us(200)
                    s.copy(b, a)
        pairs = [(e, c) for e, c in zip(inner.records, outer.records, strict=True) if e.kind == "memcpy"]
        errs = [(e.duration_ms - c.duration_ms) * 1e3 for e, c in pairs]
        starts = [(e.start_ns - c.start_ns) / 1e3 for e, c in pairs]
        out.append((starts[1] - starts[0], errs[0], errs[1], age_ms))
    a.free()
    b.free()
    dev.close()
    return out


def _cross_copies() -> None:
    d0, d1 = asyncgpu.device(0, backend="cuda"), asyncgpu.device(1, backend="cuda")
    x0, x1 = d0.alloc(1 << 20), d1.alloc(1 << 20)
    d1.stream.copy(x1, x0)  # (cuda:1 reads cuda:0's pool: granted)
    d1.synchronize()
    d0.stream.copy(x0, x1)
    d0.synchronize()
    x0.free()
    x1.free()
    d0.close()
    d1.close()


def run(blocks: int, variants: str, print=print) -> None:
    print(f"{'variant':<11} copy 2's start − copy 1's (µs) per round, '|' between blocks; then over 1 µs, ages (ms)")
    for variant in variants.split(","):
        got = [_block(variant) for _ in range(blocks)]
        shifts = " | ".join(" ".join(f"{r[0]:+.1f}" for r in blk) for blk in got)
        marks = " | ".join("".join("X" if max(abs(r[1]), abs(r[2])) > 1.0 else "." for r in blk) for blk in got)
        ages = [r[3] for blk in got for r in blk]
        errs = np.array([[r[1], r[2]] for blk in got for r in blk])
        print(f"{variant:<11} {shifts}")
        print(
            f"{'':<11} {marks}   copy 1 p50 {np.median(errs[:, 0]):+.2f}, copy 2 p50 {np.median(errs[:, 1]):+.2f} µs;"
            f" ages {np.percentile(ages, 10):.0f}-{np.percentile(ages, 90):.0f} ms"
        )


def _patch_primer(how: str) -> None:
    """The copy primer of every device opened from now on: ``generic`` through ``cuMemcpyAsync`` (the call the
    copies themselves go through) instead of ``cuMemcpyDtoDAsync``; ``none``: no primer ahead of a copy between
    device buffers."""
    import ctypes

    from asyncgpu._backends.cuda import compiler

    if how not in ("generic", "none"):
        raise SystemExit(f"DIAG_PRIMER={how!r}: use generic or none")
    init = compiler._Primer.__init__

    def patched(self, dev) -> None:
        init(self, dev)
        src = int(self._dptr)
        if how == "none":
            self.calls["copy_d2d"] = (lambda stream: 0, "none")
            return
        generic = ctypes.CDLL(compiler.LIBCUDA).cuMemcpyAsync
        generic.restype = ctypes.c_int
        generic.argtypes = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
        self.calls["copy_d2d"] = (lambda stream: generic(src + 32, src, 4, stream), "cuMemcpyAsync")

    compiler._Primer.__init__ = patched


def pytest_configure(config) -> None:
    """``DIAG_PRIMER=generic|none``: the copy primer changed for the whole session (`_patch_primer`)."""
    how = os.environ.get("DIAG_PRIMER")
    if how:
        _patch_primer(how)


_EXTRA: list = []  # idle streams made for the cut test (`pytest_runtest_setup`), kept until it ends


@pytest.hookimpl(tryfirst=True)  # (before the fixtures: the test's device and streams come after these)
def pytest_runtest_setup(item) -> None:
    """``DIAG_EXTRA_STREAMS=K`` (with ``DIAG_CUT_AFTER``): K idle streams made on cuda:0 right before the cut test,
    alive while it runs. The driver maps streams onto a fixed set of hardware queues (``CUDA_DEVICE_MAX_CONNECTIONS``),
    so this may move the test's streams to other queues; it changes nothing else."""
    k = int(os.environ.get("DIAG_EXTRA_STREAMS", "0"))
    cut = os.environ.get("DIAG_CUT_AFTER")
    if k and cut and cut in item.nodeid and "cuda" in item.nodeid and load_backend("cuda").available()[0]:
        from cuda.core import Device

        dev = Device(0)
        dev.set_current()
        _EXTRA.extend(dev.create_stream() for _ in range(k))


@pytest.hookimpl(tryfirst=True)  # (before the fixtures' teardown: the test's device is still open)
def pytest_runtest_teardown(item) -> None:
    """``DIAG_AFTER_TEST=TEXT``: right after the CUDA test whose id holds TEXT, on its own device and stream (the
    state in which it ran), `after_test` runs the copy test's pattern again in parts."""
    target = os.environ.get("DIAG_AFTER_TEST")
    if target and target in item.nodeid and "cuda" in item.nodeid:
        dev = item.funcargs.get("dev")
        if dev is not None:
            try:
                after_test(dev, _say)
            except Exception as exc:  # (a probe: it never changes the test's outcome)
                _say(f"after_test failed: {exc!r}")
    while _EXTRA:
        _EXTRA.pop().close()


def _say(line: str) -> None:
    """Print (pytest shows it only with a failing test's output: it captures the process's stdout during a test), and
    append to ``DIAG_OUT`` where set."""
    sys.__stdout__.write(line + "\n")
    sys.__stdout__.flush()
    out = os.environ.get("DIAG_OUT")
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def after_test(dev, say) -> None:
    """The copy test's pattern again, on the test's own device and stream, in parts (8 rounds each): per round, copy
    2's events − CUPTI duration error and the gap from the spin's end to the copy's start by each source (µs).

    * ``nested``: events nested in a CUPTI scope (the copy test until run 42);
    * ``events``: events only (copy 2's duration and gap);
    * ``cupti``: CUPTI only (copy 2's duration and gap);
    * ``stream``: nested, on a new stream of the same device;
    * ``long``: nested, 16 rounds (the period).

    Run 42 (2× H100, where the test failed): nested, copy 2 of rounds 2, 3, 6, 7 of every 8 starts ~1 µs after its
    start event; events alone, no such delay; a new stream, none: CUPTI's instrumentation of the copy, counted by a
    pair around it, on some streams only."""
    from asyncgpu import gpu_timer

    say("\n== the copy test's pattern again, on its device, right after it")
    n = 10_000_000
    a, b = dev.alloc(n), dev.alloc(n)
    s_new = dev.create_stream()  # (closed with the device)
    for part in ("nested", "events", "cupti", "stream", "long"):
        s = s_new if part == "stream" else dev.stream
        s.copy(b, a)
        dev.synchronize()
        cells = []
        for _ in range(16 if part == "long" else 8):
            dev.synchronize()
            with gpu_timer(dev, source="events" if part == "events" else "cupti") as outer:
                if part in ("events", "cupti"):
                    for _ in range(2):
                        s.spin_us(200)
                        s.copy(b, a)
                    inner = None
                else:
                    with gpu_timer(dev, source="events") as inner:
                        for _ in range(2):
                            s.spin_us(200)
                            s.copy(b, a)
            recs = list(outer.records)
            gap_o = (recs[3].start_ns - (recs[2].start_ns + recs[2].duration_ms * 1e6)) / 1e3
            if inner is None:
                cells.append(f"{recs[3].duration_ms * 1e3:.2f}/{gap_o:.2f}")
                continue
            ri = list(inner.records)
            gap_i = (ri[3].start_ns - (ri[2].start_ns + ri[2].duration_ms * 1e6)) / 1e3
            err = (ri[3].duration_ms - recs[3].duration_ms) * 1e3
            cells.append(f"{err:+.2f}/{gap_i:.2f}/{gap_o:.2f}")
        what = "copy 2 dur/gap" if part in ("events", "cupti") else "copy 2 err/gap events/gap CUPTI"
        say(f"{part:<7} ({what}): " + "  ".join(cells))
    a.free()
    b.free()


def pytest_collection_modifyitems(config, items) -> None:
    """``DIAG_CUT_AFTER=TEXT``: run the collected tests only up to the last whose id holds TEXT (the whole suite
    collected, as in the suite; run 41: the copy test failed so, after the suite's first 506 tests)."""
    cut = os.environ.get("DIAG_CUT_AFTER")
    if cut:
        last = max((i for i, item in enumerate(items) if cut in item.nodeid), default=len(items) - 1)
        del items[last + 1 :]


def pytest_sessionfinish(session, exitstatus) -> None:  # (after the suite: its state is this probe's subject)
    variants = os.environ.get("DIAG_VARIANTS", VARIANTS)
    if variants:  # (DIAG_VARIANTS= : the session only)
        _say("\n== dev/diag_suite_copy after the session")
        run(int(os.environ.get("DIAG_BLOCKS", "4")), variants, _say)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--variants", default=VARIANTS)
    p.add_argument("--peer", action="store_true", help="again, after copies between two GPUs")
    p.add_argument("--out", help="also write what is printed to this file")
    a = p.parse_args()
    tee_stdout_to(a.out)
    print("== dev/diag_suite_copy in a fresh process")
    run(a.blocks, a.variants)
    if a.peer:
        _cross_copies()
        print("== after copies between cuda:0 and cuda:1 (each pool readable by the other)")
        run(a.blocks, a.variants)
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
