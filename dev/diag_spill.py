"""Which source is right once work spills the L2: the busy-stream step (events − CUPTI p50 ~0 while memsets,
``inc_loop`` and copies fit the L2, +0.3..+0.6 µs on one H100 and one H200, −0.2..−0.4 µs on multi-GPU H100 hosts,
once they spill: `dev/diag_busy_pair.py`, HISTORY runs 39-43), against stamps neither source made.

One busy stream (a 3 ms lead spin, so the GPU never waits for the host): each piece of work sits between two spins
that stamp ``%globaltimer`` at their first and last instant. The work's *bracket* (the next spin's first stamp less
the previous spin's last) is the stream's time from one spin's last instant to the next one's first: the work, its
launch and exit, and whatever the stream does in between (an event record, a write-back the work leaves). Rounds of
four settings in turn: no scope, an events scope, a CUPTI-source scope, and an events scope nested in a CUPTI-source
scope (both sources on the same activities). Per setting and work: the bracket and each source's duration, p50.
Runs of ten memsets or copies back to back are works too (one bracket, the durations summed): the busy sequences
of `dev/diag_busy_pair.py`, where one work's write-back may overlap the next. Last in each round, memsets and
copies launched onto the drained stream (idle starts: durations only, no bracket).

What decides it: how ``bracket − duration`` moves from a work that fits the L2 to the same work that spills it.
The bracket's launch and exit parts do not depend on the bytes, so a source whose ``bracket − duration`` stays flat
across sizes counts what the stream spends on the work; a source whose gap grows by Δ leaves Δ of the stream's time
out (or, when it shrinks, counts Δ that the stream did not spend). ``none`` against ``events`` and ``cupti``: what each
source's instrumentation adds to the stream.

Each row: setting, work, n, bracket p50 (µs), the source's duration p50, bracket − duration p50 and p10/p90; for
``nested``: events − CUPTI p50. A summary last: per source, kind and size, the change of ``bracket − duration`` from
the smallest size of that kind.

    PYTHONPATH=$PWD python dev/diag_spill.py [--rounds 20] [--device 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu
from asyncgpu._base.records import KINDS
from benchmarks._common import tee_stdout_to
from dev.diag_outliers import SPIN  # (a spin that stamps %globaltimer at its first and last instant)

SETTINGS = ("none", "events", "cupti", "nested")
SIZES_MB = (8, 16, 40, 160)  #: fits the L2 (50 MB on H100 and H200), fits, in the step by machine, spills
GAP_NS = 20_000  #: the stamped spins between the works
RUN = 10  #: works back to back in a run (one bracket, their durations summed)
LEAD_NS = 3_000_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20, help="rounds per setting")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    tee_stdout_to(a.out)
    return _run(a)


def _sources(t_events: object, t_cupti: object, n: int) -> dict[str, np.ndarray]:
    """Each given scope's durations (ns) of the ``n`` works, in issue order (the stamped spins and the 4-byte primers
    ahead of copies, which CUPTI sees, left out)."""
    out = {}
    for key, t in (("events", t_events), ("cupti", t_cupti)):
        if t is None:
            continue
        tl = t.timeline  # type: ignore[attr-defined]
        rows = []
        for r in range(len(tl.start_ns)):
            name = tl.names[int(tl.name[r])]
            if "stamped_spin" in name:
                continue
            dur = float(tl.duration_ns[r])
            if key == "cupti" and KINDS[int(tl.kind[r])] == "memcpy" and dur < 2_000:
                continue  # a primer (4 bytes); the works' copies take far longer
            rows.append((float(tl.start_ns[r]), dur))
        rows.sort()
        if len(rows) != n:
            raise SystemExit(f"{key}: {len(rows)} activities, expected {n}: {rows}")
        out[key] = np.array([d for _, d in rows])
    return out


def _run(a: argparse.Namespace) -> int:
    from cuda.core import LaunchConfig

    from asyncgpu._backends.cuda import compile_source

    dev = asyncgpu.device(a.device, backend="cuda")
    bd = dev._internal.bd
    bd.make_current()
    kernel = compile_source(SPIN, bd.arch).get_kernel("stamped_spin")
    one = LaunchConfig(grid=1, block=1)
    s = dev.stream
    bufs = {mb: (dev.alloc(mb * 250_000, np.float32), dev.alloc(mb * 250_000, np.float32)) for mb in SIZES_MB}
    works: list[tuple[str, Callable[[], object], int]] = []  # (label, launches, activities it makes)
    for mb in SIZES_MB:
        x, y = bufs[mb]
        works.append((f"memset {mb} MB", lambda x=x: s.memset(x, 0), 1))
        works.append((f"inc_loop {mb} MB", lambda x=x: s.inc_loop(x, 1), 1))
        works.append((f"copy d2d {mb} MB", lambda x=x, y=y: s.copy(y, x), 1))
    for passes in (50, 500):  # bench_accuracy's busy-stream and demo passes over 40 MB (4× H100: +0.13 / +0.54 µs)
        x = bufs[SIZES_MB[2]][0]
        works.append((f"inc_loop×{passes} {SIZES_MB[2]} MB", lambda x=x, p=passes: s.inc_loop(x, p), 1))
    for mb in (SIZES_MB[0], SIZES_MB[2], SIZES_MB[-1]):  # back to back, as diag_busy_pair's busy sequences
        x, y = bufs[mb]
        works.append((f"{RUN}× memset {mb} MB", lambda x=x: [s.memset(x, 0) for _ in range(RUN)], RUN))
        works.append((f"{RUN}× copy d2d {mb} MB", lambda x=x, y=y: [s.copy(y, x) for _ in range(RUN)], RUN))
    idle: list[tuple[str, Callable[[], object], int]] = []  # each launched onto the drained stream, no bracket
    for mb in (SIZES_MB[0], SIZES_MB[-1]):
        x, y = bufs[mb]
        idle.append((f"idle memset {mb} MB", lambda x=x: s.memset(x, 0), 1))
        idle.append((f"idle copy d2d {mb} MB", lambda x=x, y=y: s.copy(y, x), 1))
    n = len(works)
    works += idle
    acts = sum(w[2] for w in works)
    stamps = dev.alloc(2 * (n + 1), np.uint64)
    host = dev.alloc_pinned(2 * (n + 1), np.uint64)
    cal = dev.clock()
    by_kind = {k: round(v) for k, v in cal.bracket_overhead_by_kind_ns.items()}
    print(f"{dev.description}: pair overhead (ns) {by_kind}, {cal.bracket_overhead_source}")
    print(f"flagged as spilling behind other work: memsets from {bd.spill_bytes} bytes, copies from {bd.cache_bytes}")
    print(
        f"{n} works a round, each between two stamped {GAP_NS / 1e3:.0f} µs spins, behind a 3 ms spin; a run of "
        f"{RUN} back to back is one work (its durations summed; its change by size per activity)"
    )

    def one_round() -> None:
        s.launch(kernel, one, np.uint64(LEAD_NS), np.uint64(stamps.ptr), name="stamped_spin")
        for j, (_, fn, _) in enumerate(works[:n]):
            fn()
            s.launch(kernel, one, np.uint64(GAP_NS), np.uint64(stamps.ptr + 16 * (j + 1)), name="stamped_spin")
        for _, fn, _ in works[n:]:
            dev.synchronize()
            time.sleep(0.001)
            fn()

    one_round()  # loaded and warm
    dev.synchronize()
    # (setting, work index) -> rows of (bracket, events duration, CUPTI duration), ns (NaN: not timed)
    got: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for rnd in range(a.rounds * len(SETTINGS) + len(SETTINGS)):  # (the first of each setting warms up)
        setting = SETTINGS[rnd % len(SETTINGS)]
        dev._internal.forget_pair_excess()  # (events durations from the calibration's overheads alone)
        dev.synchronize()
        with contextlib.ExitStack() as stack:
            tc = (
                stack.enter_context(asyncgpu.gpu_timer(dev, source="cupti")) if setting in ("cupti", "nested") else None
            )
            te = (
                stack.enter_context(asyncgpu.gpu_timer(dev, source="events"))
                if setting in ("events", "nested")
                else None
            )
            one_round()
        for t, want in ((te, "events"), (tc, "cupti")):
            if t is not None and t.timeline.source != want:
                print(f"{setting}: the scope timed with {t.timeline.source} ({t.timeline.source_note})")
                return 1
        s.copy_to_host(stamps, host)
        s.sync()
        if rnd < len(SETTINGS):
            continue
        durs = _sources(te, tc, acts)
        st = host.astype(np.int64)
        ev, cu = durs.get("events", np.full(acts, np.nan)), durs.get("cupti", np.full(acts, np.nan))
        bounds = np.cumsum([0] + [w[2] for w in works])  # each work's activities, summed
        ev, cu = np.add.reduceat(ev, bounds[:-1]), np.add.reduceat(cu, bounds[:-1])
        for j in range(len(works)):
            bracket = float(st[2 * (j + 1)] - st[2 * j + 1]) if j < n else np.nan
            got.setdefault((setting, j), []).append((bracket, float(ev[j]), float(cu[j])))
    print(
        f"{'setting':<7} {'work':<22} {'n':>3} {'bracket':>8} {'source':<6} {'dur':>8} {'br−dur':>7} "
        f"{'p10':>6} {'p90':>6} {'ev−cu':>6}"
    )
    gaps: dict[tuple[str, str], float] = {}  # (source as set, work) -> bracket − duration p50, ns
    for (setting, j), rows in sorted(got.items(), key=lambda kv: (kv[0][1], SETTINGS.index(kv[0][0]))):
        arr = np.asarray(rows)
        br = arr[:, 0]
        cols = {"events": arr[:, 1], "cupti": arr[:, 2]}
        timed = [k for k, v in cols.items() if np.isfinite(v).all()]
        evcu = f"{np.median(cols['events'] - cols['cupti']) / 1e3:>+6.2f}" if len(timed) == 2 else f"{'':>6}"
        for src in timed or ["-"]:
            if src == "-":
                print(f"{setting:<7} {works[j][0]:<22} {len(br):>3} {np.median(br) / 1e3:>8.2f}")
                continue
            g = br - cols[src]
            q = np.percentile(g, [50, 10, 90]) / 1e3
            gaps[(f"{src} ({setting})", works[j][0])] = float(q[0])
            print(
                f"{setting:<7} {works[j][0]:<22} {len(br):>3} {np.median(br) / 1e3:>8.2f} {src:<6} "
                f"{np.median(cols[src]) / 1e3:>8.2f} {q[0]:>+7.2f} {q[1]:>+6.2f} {q[2]:>+6.2f} {evcu}"
            )
    print(
        "\nbracket − duration, p50, change from the smallest size of the same kind "
        "(µs; 0: the source follows the stream)"
    )
    for src in sorted({k for k, _ in gaps}):
        cells = []
        for kind in ("memset", "inc_loop", "copy d2d", f"{RUN}× memset", f"{RUN}× copy d2d"):
            base = gaps.get((src, f"{kind} {SIZES_MB[0]} MB"))
            for mb in SIZES_MB[1:]:
                v = gaps.get((src, f"{kind} {mb} MB"))
                if base is not None and v is not None:
                    per = RUN if kind.startswith(f"{RUN}×") else 1
                    cells.append(f"{kind} {mb} MB {(v - base) / per:+.2f}")
        print(f"  {src:<16} " + "; ".join(cells))
    brackets = {
        setting: {works[j][0]: float(np.median(np.asarray(got[(setting, j)])[:, 0])) for j in range(n)}
        for setting in SETTINGS
    }
    print("\nthe bracket, p50, against no scope (µs: what each setting adds to the stream's time for the work)")
    for setting in SETTINGS[1:]:
        cells = [f"{w} {(brackets[setting][w] - brackets['none'][w]) / 1e3:+.2f}" for w, _, _ in works[:n]]
        print(f"  {setting:<7} " + "; ".join(cells))
    print(key_line(works, got, bd.spill_bytes))
    dev.close()
    return 0


def key_line(works: list, got: dict, spill_bytes: int | None) -> str:
    """The key figures (`scripts/gpu_check.sh`'s table): the memsets' measured spilling size, and events − CUPTI per
    memset in the runs of 40 and 160 MB, apart (each source's rounds of its own) and nested, µs p50."""
    names = [w[0] for w in works]
    cells = []
    for mb in (SIZES_MB[2], SIZES_MB[-1]):
        j = names.index(f"{RUN}× memset {mb} MB")
        ev, cu = np.median(np.asarray(got[("events", j)])[:, 1]), np.median(np.asarray(got[("cupti", j)])[:, 2])
        nested = np.asarray(got[("nested", j)])
        cells.append(f"{(ev - cu) / RUN / 1e3:+.2f}/{np.median(nested[:, 1] - nested[:, 2]) / RUN / 1e3:+.2f}")
    size = "none" if spill_bytes is None else f">={spill_bytes >> 20} MB"  # (ASCII: the table cuts at 90 bytes)
    return f"KEY spill {size}; runs of {SIZES_MB[2]}|{SIZES_MB[-1]} MB, per memset apart/nested: {'|'.join(cells)} us"


if __name__ == "__main__":
    sys.exit(main())
