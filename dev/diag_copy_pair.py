"""Why `test_events_time_copies_between_device_buffers_as_cupti_does` fails on some 2× H100 machines (run 39: in the
full suite, 2 of 16 copies over max(1 %, 1 µs), each the second, last copy of a late round): the test's own pattern
(an events scope nested in a CUPTI-source scope; a 200 µs spin then a 40 MB copy between device buffers, twice;
the host issues it all while the first spin runs) over many rounds, per copy position, in variants:

* ``test``: as the test (the CUPTI scopes teach the pair's excess as rounds go: `learn_pair_excess`);
* ``raw``: the same, the learned excess forgotten before each round (the calibration's overhead applies);
* ``tail``: a 50 µs spin after the second copy, inside both scopes (is the last copy's excess the scope exit's?);
* ``lead``: a 3 ms spin first, so that everything is queued before the GPU reaches it (the diag_busy_pair case);
* ``slow``: the host busy-waits 300 µs after each launch, so that the GPU reaches each held launch before the host
  has released it (every activity starts on an idle stream);
* ``gil``: as the test, with another Python thread spinning all along (a full suite's leftover threads: the
  launching thread loses the GIL at the interpreter's switch interval).

Each row: variant, copy position, n, events − CUPTI p10 / p50 / p90 / max (µs), how many over the tolerance, and the
median, for the slowest tenth, of its start and end differences (less the round's median start difference).

    python dev/diag_copy_pair.py [--rounds 60] [--variants test,raw,tail,lead,slow,gil] [--profile N]
        [--device 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu
from benchmarks._common import tee_stdout_to


def _pause(variant: str) -> None:
    if variant == "slow":
        end_ns = time.perf_counter_ns() + 300_000
        while time.perf_counter_ns() < end_ns:
            pass


def _spin_until(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def _round(dev: asyncgpu.Device, a, b, variant: str) -> list[tuple[int, float, float, float, float]]:
    """One round: ``(position, events − CUPTI duration ns, CUPTI duration ns, start difference ns, end difference
    ns)`` per copy; the start and end differences less the round's median start difference."""
    s = dev.stream
    if variant == "raw":
        dev._internal.forget_pair_excess()
    dev.synchronize()
    with asyncgpu.gpu_timer(dev, source="cupti") as outer:
        with asyncgpu.gpu_timer(dev, source="events") as inner:
            if variant == "lead":
                s.spin_us(3000)
            for _ in range(2):
                s.spin_us(200)
                _pause(variant)
                s.copy(b, a)
                _pause(variant)
            if variant == "tail":
                s.spin_us(50)
    rows = []
    for r_e, r_c in zip(inner.records, outer.records, strict=True):
        if r_e.kind == "memcpy":
            d_start = (r_e.start_ms - r_c.start_ms) * 1e6
            d_end = (r_e.start_ms + r_e.duration_ms - r_c.start_ms - r_c.duration_ms) * 1e6
            rows.append([len(rows), (r_e.duration_ms - r_c.duration_ms) * 1e6, r_c.duration_ms * 1e6, d_start, d_end])
    med = float(np.median([r[3] for r in rows]))
    return [(int(p), e, c, st - med, en - med) for p, e, c, st, en in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--variants", default="test,raw,tail,lead,slow,gil")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", help="also write what is printed to this file")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="profile each variant: its N costliest calls")
    a = p.parse_args()
    tee_stdout_to(a.out)
    dev = asyncgpu.device(a.device, backend="cuda")
    cal = dev.clock()
    by_kind = {k: round(v) for k, v in cal.bracket_overhead_by_kind_ns.items()}
    print(f"{dev.description}: pair overhead (ns) {by_kind}, {cal.bracket_overhead_source}")
    n = 10_000_000
    src, dst = dev.alloc(n, np.float32), dev.alloc(n, np.float32)  # 40 MB each, as the test's
    dev.stream.copy(dst, src)
    dev.synchronize()
    head = f"{'variant':<8} {'copy':>4} {'n':>4} {'p10':>6} {'p50':>6} {'p90':>6} {'max':>6} {'over':>5}"
    print(f"{head}  tail: start end")
    for variant in a.variants.split(","):
        dev._internal.forget_pair_excess()
        stop = threading.Event()
        other = threading.Thread(target=_spin_until, args=(stop,), daemon=True)
        if variant == "gil":
            other.start()
        t0 = time.perf_counter()
        prof = cProfile.Profile() if a.profile else None
        try:
            if prof is not None:
                prof.enable()
            got = [row for _ in range(a.rounds) for row in _round(dev, src, dst, variant)]
            if prof is not None:
                prof.disable()
            print(f"{variant}: {a.rounds} rounds in {time.perf_counter() - t0:.1f} s")
        finally:
            stop.set()
            if other.is_alive():
                other.join()
        if prof is not None:  # wall time per call: where a round goes (behind a busy thread: the GIL's waits)
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(a.profile)
        for pos in sorted({r[0] for r in got}):
            mine = np.array([r[1:] for r in got if r[0] == pos]) / 1e3  # µs
            d = mine[:, 0]
            over = int(np.sum(np.abs(d) > np.maximum(0.01 * mine[:, 1], 1.0)))
            q = np.percentile(d, [10, 50, 90])
            tail = d >= np.percentile(d, 90)
            st, en = np.median(mine[tail, 2]), np.median(mine[tail, 3])
            print(
                f"{variant:<8} {pos + 1:>4} {len(d):>4} {q[0]:>6.2f} {q[1]:>6.2f} {q[2]:>6.2f} {d.max():>6.2f} "
                f"{over:>5}  {st:>+5.2f} {en:>+5.2f}"
            )
    src.free()
    dst.free()
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
