"""Does CUPTI lengthen the copies it times? The copy test's pattern (a 200 µs spin, then a 40 MB copy between device
buffers, twice; `test_events_time_copies_between_device_buffers_as_cupti_does`), with spins that stamp
``%globaltimer`` at their first and last instant, in rounds of three settings in turn: no scope, an events scope,
a CUPTI-source scope. Each copy's stamp bracket (the next spin's first stamp less the previous spin's last: the copy
and the gaps around it, measured by neither source) is compared across the settings, and each source's copy
duration against it.

Run 43 (one H100): in CUPTI's own rounds its second copy read ~0.8 µs longer than its first, where the events
source's second copy did not. If CUPTI's rounds' brackets are that much longer than the unprofiled rounds', CUPTI
slows the copy it times (its record is of a copy users do not run); if not, CUPTI's record moved and the copy did not.

Each row: setting, copy position, n, bracket p50 / p10 / p90 (µs), source duration p50, bracket − duration p50.

    PYTHONPATH=$PWD python dev/diag_copy_stamps.py [--rounds 24] [--mb 40] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu
from benchmarks._common import tee_stdout_to
from dev.diag_outliers import SPIN  # (a spin that stamps %globaltimer at its first and last instant)

SETTINGS = ("none", "events", "cupti")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=24, help="rounds per setting")
    ap.add_argument("--mb", type=int, default=40, help="the copy's size (MB; the test copies 40)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    tee_stdout_to(a.out)
    return _run(a)


def _run(a: argparse.Namespace) -> int:
    from cuda.core import LaunchConfig

    from asyncgpu._backends.cuda import compile_source

    dev = asyncgpu.device(f"cuda:{a.device}")
    bd = dev._internal.bd
    bd.make_current()
    kernel = compile_source(SPIN, bd.arch).get_kernel("stamped_spin")
    one = LaunchConfig(grid=1, block=1)
    n = a.mb * 250_000  # float32 elements
    src, dst = dev.alloc(n), dev.alloc(n)
    stamps = dev.alloc(6, np.uint64)
    host = dev.alloc_pinned(6, np.uint64)
    s = dev.stream
    dev.synchronize()
    dev.clock()
    print(f"{dev.name}: {a.mb} MB copies between device buffers, {a.rounds} rounds per setting")
    # per setting and copy position: (bracket ns, the source's duration ns or NaN)
    got: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for rnd in range(a.rounds * len(SETTINGS) + len(SETTINGS)):  # (the first of each setting warms up)
        setting = SETTINGS[rnd % len(SETTINGS)]
        dev.synchronize()
        scope = asyncgpu.gpu_timer(dev, source=setting) if setting != "none" else contextlib.nullcontext()
        with scope as t:
            for k in range(2):
                s.launch(kernel, one, np.uint64(200_000), np.uint64(stamps.ptr + 16 * k))
                s.copy(dst, src)
            s.launch(kernel, one, np.uint64(5_000), np.uint64(stamps.ptr + 32))
        s.copy_to_host(stamps, host)
        s.sync()
        if rnd < len(SETTINGS):
            continue
        if t is not None and t.timeline.source != setting:
            print(f"{setting}: the scope timed with {t.timeline.source} ({t.timeline.source_note})")
            return 1
        st = host.astype(np.int64)
        durs = [r.duration_ms * 1e6 for r in t.records if r.kind == "memcpy"] if t is not None else [np.nan] * 2
        for k in range(2):
            bracket = float(st[2 * (k + 1)] - st[2 * k + 1])  # next spin's first stamp − this spin's last
            got.setdefault((setting, k), []).append((bracket, durs[k] if len(durs) == 2 else np.nan))
    print(f"{'setting':<8} {'copy':>4} {'n':>4} {'bracket':>8} {'p10':>7} {'p90':>7} {'duration':>9} {'br−dur':>7}")
    for (setting, k), rows in sorted(got.items(), key=lambda kv: (kv[0][1], SETTINGS.index(kv[0][0]))):
        arr = np.asarray(rows) / 1e3
        br, du = arr[:, 0], arr[:, 1]
        q = np.percentile(br, [50, 10, 90])
        dp = np.nanmedian(du) if np.isfinite(du).any() else np.nan
        gap = np.nanmedian(br - du) if np.isfinite(du).any() else np.nan
        print(f"{setting:<8} {k + 1:>4} {len(br):>4} {q[0]:>8.2f} {q[1]:>7.2f} {q[2]:>7.2f} {dp:>9.2f} {gap:>7.2f}")
    dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
