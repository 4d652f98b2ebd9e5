"""Where the CUPTI step timer's overhead goes on a host-bound torch loop: each variant in a process of its own (CUPTI
taken before torch loads, as bench_steps does), its step time against the same process's bare steps.

    PYTHONPATH=$PWD python dev/diag_step_cupti.py [--steps 300] [--pairs 6] [--devices 1]

Variants: ``default`` (the CUPTI source's default cadence, `CUPTI_HARVEST_S`); ``flush-only`` (the same flushes,
every buffer dropped unparsed: what CUPTI's flush costs the loop, apart from the parse); ``flush-keep-gil`` (the
default, CUPTI's flush called keeping the GIL: its buffer callbacks, Python, then never wait for the GIL on the
flushing thread);
``harvest-50ms``, ``harvest-250ms``, ``harvest-1s`` and ``harvest-2s`` (fewer flushes, each of more records: is the
cost per flush or per record?); ``no-flush`` (harvest_s=3600: nothing flushed while timed: what CUPTI's own
instrumentation costs). Two variants split the CUPTI timer's cost into parts measured each between neighbours (the
loop's drift, which widens the pairs' spread, cancels): ``toggle`` (no step timer: CUPTI's activity kinds enabled
and disabled in turn in one session, blocks of ``--block`` steps, ABBA; each block's median step: what CUPTI's
instrumentation of every launch costs, apart from any flush) and ``alternate`` (one CUPTI step timer at its
default cadence, steps marked and unmarked in turn, as ``dev/diag_step_events.py alternate``: what marking a step
costs). The whole cost is then the instrumentation, the marking and the harvests' share (from ``default``'s own
steps). Each runs ``--pairs`` short pairs (bare, then CUPTI; then the other way round) and reports
the median of the pairs' ratios, the flushes' count, the time inside CUPTI's flush and in the bulk parse, the
records, and the records in CUPTI's buffers per activity kind (every kind, those skipped too: which kinds break the
runs of kernels). Then, from the CUPTI runs' own steps (timed one by one), what the harvests cost: the steps a
harvest overlapped against the others, as a share of the timed time (tighter than the pairs' ratio, whose spread is
the loop's drift; CUPTI's own instrumentation, in every step, is not in it), each harvest's wall time and thread
CPU, and CUPTI's buffer callbacks per flush.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

VARIANTS = (
    "default",
    "flush-only",
    "flush-keep-gil",
    "harvest-50ms",
    "harvest-250ms",
    "harvest-1s",
    "harvest-2s",
    "no-flush",
    "toggle",
    "alternate",
)
HARVEST_S = {
    "default": None,
    "flush-only": None,
    "flush-keep-gil": None,
    "harvest-50ms": 0.05,
    "harvest-250ms": 0.25,
    "harvest-1s": 1.0,
    "harvest-2s": 2.0,
    "no-flush": 3600.0,
    "toggle": None,
    "alternate": None,
}


def child(variant: str, steps: int, devices: int, pairs: int, block: int = 40) -> dict:
    from asyncgpu._backends import cupti, cupti_buffers

    if variant in ("toggle", "alternate"):
        return split_child(variant, steps, devices, pairs, block)

    calls = {"completed": 0, "requested": 0}  # CUPTI's buffer callbacks (counted from before the session opens)
    real_completed, real_requested = cupti_buffers.Buffers._on_completed, cupti_buffers.Buffers._on_requested

    def counted_completed(self, *a) -> None:
        calls["completed"] += 1
        real_completed(self, *a)

    def counted_requested(self, *a) -> None:
        calls["requested"] += 1
        real_requested(self, *a)

    cupti_buffers.Buffers._on_completed = counted_completed
    cupti_buffers.Buffers._on_requested = counted_requested
    cupti.acquire(cupti.STEPS)
    stats = {"flushes": 0, "flush_s": 0.0, "cupti_flush_s": 0.0, "records": 0, "names_read": 0}
    stats["harvests"], stats["harvest_cpu_s"], stats["harvest_s"] = 0, 0.0, 0.0  # whole harvests (the thread's CPU)
    stats["kinds"] = {}  # CUPTI activity kind -> records of it in the buffers (the process's total)
    flush_at: list[tuple[float, float]] = []  # each harvest that flushed (its whole span), perf_counter s
    step_at: list[tuple[float, float]] = []  # each timed step with the CUPTI source, perf_counter s
    if variant == "flush-only":  # (CUPTI flushes as usual; its buffers are dropped unread)

        def dropped(self) -> cupti_buffers.RecordBatch:
            self.drop()
            return cupti_buffers.RecordBatch.empty()

        cupti_buffers.Buffers.take = dropped
    real_flush, real_flush_all = cupti.flush_batch, cupti_buffers.Buffers.flush_all

    def timed_flush(channel: int):
        t0 = time.perf_counter()
        batch, ext = real_flush(channel)
        stats["flushes"] += 1
        stats["flush_s"] += time.perf_counter() - t0
        stats["records"] += len(batch)
        if cupti._buffers is not None:
            parser = cupti._buffers.parser
            stats["names_read"] = parser.names_read  # (the process's total so far)
            stats["kinds"] = {str(k): n for k, n in sorted(parser.kinds_seen.items())}
        return batch, ext

    keep_gil = None
    if variant == "flush-keep-gil":
        import ctypes

        keep_gil = ctypes.PyDLL(cupti_buffers.find_libcupti()).cuptiActivityFlushAll
        keep_gil.argtypes = (ctypes.c_uint32,)

    def timed_flush_all(self, forced: bool = True) -> None:
        t0 = time.perf_counter()
        if keep_gil is not None:
            keep_gil(1 if forced else 0)
        else:
            real_flush_all(self, forced)
        stats["cupti_flush_s"] += time.perf_counter() - t0

    from asyncgpu._timing import steps as steps_mod

    real_harvest = steps_mod.StepTimer._harvest

    def timed_harvest(self, *a, **kw) -> int:  # the whole harvest: flush, parse, place, attribute to steps
        t0, c0, f0 = time.perf_counter(), time.thread_time(), stats["flushes"]
        n = real_harvest(self, *a, **kw)
        if stats["flushes"] != f0:
            t1 = time.perf_counter()
            flush_at.append((t0, t1))
            stats["harvests"] += 1
            stats["harvest_s"] += t1 - t0
            stats["harvest_cpu_s"] += time.thread_time() - c0
        return n

    cupti.flush_batch = timed_flush
    cupti_buffers.Buffers.flush_all = timed_flush_all
    steps_mod.StepTimer._harvest = timed_harvest

    import anyio

    import asyncgpu
    from benchmarks.bench_steps import ci95, run_steps, torch_work

    args = argparse.Namespace(layers=8, width=2048, batch=16, size=8192, matmuls=4)
    devs = asyncgpu.devices("cuda", count=devices)
    work = [torch_work(d, "host-bound", args) for d in devs]

    async def bare() -> float:
        await run_steps(devs, work, 10, None)
        t0 = time.perf_counter()
        await run_steps(devs, work, steps, None)
        return (time.perf_counter() - t0) / steps * 1e3

    async def on() -> float:
        # (the default's max_pending; a harvest-* cadence gets room for 4 s of steps, no-flush for all: no early
        # harvest when half of max_pending steps wait, which at 256 comes every ~1 s on this loop)
        cadence = HARVEST_S[variant]
        pending = 256 if cadence is None else 1_000_000 if variant == "no-flush" else max(256, int(500 * cadence))
        async with asyncgpu.step_timer(devs, source="cupti", harvest_s=HARVEST_S[variant], max_pending=pending) as st:
            await run_steps(devs, work, 10, st)
            t0 = time.perf_counter()
            for _ in range(steps):  # (one at a time: which steps a harvest overlapped)
                s0 = time.perf_counter()
                await run_steps(devs, work, 1, st)
                step_at.append((s0, time.perf_counter()))
            return (time.perf_counter() - t0) / steps * 1e3

    async def main() -> dict:
        for d in devs:
            await d.prepare()
        await bare()
        out: dict = {"bare_ms": [], "cupti_ms": [], "ratios": []}
        for k in range(pairs):
            if k % 2 == 0:
                b = await bare()
                c = await on()
            else:
                c = await on()
                b = await bare()
            out["bare_ms"].append(b)
            out["cupti_ms"].append(c)
            out["ratios"].append(c / b)
        out["ci95"] = ci95(out["ratios"])
        out["stats"] = dict(stats, callbacks=dict(calls))
        out["harvest"] = overlap(step_at, flush_at)
        return out

    res = anyio.run(main)
    asyncgpu.close_all()
    return res


def split_child(variant: str, steps: int, devices: int, pairs: int, block: int) -> dict:
    """``toggle`` and ``alternate`` (see the module's doc), each in a process of its own with CUPTI taken first."""
    import anyio

    from asyncgpu._backends import cupti

    cupti.acquire(cupti.STEPS)  # (before torch loads, as bench_steps does; toggle keeps it for its whole run)
    import asyncgpu
    from benchmarks.bench_steps import ci95, run_steps, torch_work

    args = argparse.Namespace(layers=8, width=2048, batch=16, size=8192, matmuls=4)
    devs = asyncgpu.devices("cuda", count=devices)
    work = [torch_work(d, "host-bound", args) for d in devs]

    async def toggle() -> dict:
        from cupti import cupti as api

        kinds = cupti._kinds
        per_block: dict[bool, list[float]] = {True: [], False: []}
        ratios: list[float] = []
        for k in range(pairs):
            here: dict[bool, float] = {}
            for on in (True, False) if k % 2 == 0 else (False, True):
                for kind in kinds:
                    (api.activity_enable if on else api.activity_disable)(kind)
                if cupti._buffers is not None:  # (what the last block left: flushed and dropped, untimed)
                    cupti._buffers.flush_all(forced=True)
                    cupti._buffers.drop()
                await run_steps(devs, work, 5, None)  # (settle after the switch)
                ms = []
                for _ in range(block):
                    t0 = time.perf_counter()
                    await run_steps(devs, work, 1, None)
                    ms.append((time.perf_counter() - t0) * 1e3)
                here[on] = float(np.median(ms))
                per_block[on].append(here[on])
            ratios.append(here[True] / here[False])
        for kind in kinds:  # (as acquire left them, for release)
            api.activity_enable(kind)
        return {"bare_ms": per_block[False], "cupti_ms": per_block[True], "ratios": ratios, "ci95": ci95(ratios)}

    async def main() -> dict:
        for d in devs:
            await d.prepare()
        await run_steps(devs, work, 10, None)
        if variant == "toggle":
            return await toggle()
        from dev.diag_step_events import alternate

        return await alternate(devs, work, steps, "alternate", source="cupti")

    res = anyio.run(main)
    cupti.release(cupti.STEPS)
    asyncgpu.close_all()
    return res


def overlap(step_at: list[tuple[float, float]], flush_at: list[tuple[float, float]]) -> dict:
    """What the harvests cost the timed steps, from one run's own steps: those a flush overlapped against the rest
    (their median), the excess summed over the overlapped steps as a share of all timed steps' time. The loop's
    drift cancels (neighbours share it); CUPTI's own instrumentation, in every step, is not in it."""
    if not step_at:
        return {}
    st, fl = np.array(step_at), np.array(flush_at or [(0.0, 0.0)])
    dur = st[:, 1] - st[:, 0]
    hit = ((fl[None, :, 0] < st[:, None, 1]) & (fl[None, :, 1] > st[:, None, 0])).any(axis=1)
    if hit.all() or not hit.any():
        return {"steps": len(dur), "overlapped": int(hit.sum())}
    other = float(np.median(dur[~hit]))
    return {
        "steps": len(dur),
        "overlapped": int(hit.sum()),
        "p50_overlapped_ms": float(np.median(dur[hit])) * 1e3,
        "p50_other_ms": other * 1e3,
        "share": float((dur[hit] - other).sum() / dur.sum()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="steps per run (runs must outlast the harvest cadence)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--block", type=int, default=40, help="toggle: steps per block (each block's median)")
    ap.add_argument("--toggle-pairs", type=int, default=30, help="toggle: pairs of blocks (on, off)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--timeout-s", type=float, default=150.0, help="a variant's process is killed after this long")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        pairs = args.toggle_pairs if args.child == "toggle" else args.pairs
        print("RESULT " + json.dumps(child(args.child, args.steps, args.devices, pairs, args.block)))
        return 0
    print(
        f"{'variant':<14} {'bare ms':>8} {'cupti ms':>9} {'ratio p50 [95% CI]':>24}  flushes  in CUPTI ms/each"
        "  parse ms/each  records/step  names read  records in buffers by kind (per step)"
    )
    for v in args.variants.split(","):
        try:
            p = subprocess.run(
                [sys.executable, __file__, "--child", v, "--steps", str(args.steps), "--devices", str(args.devices)]
                + ["--pairs", str(args.pairs), "--block", str(args.block), "--toggle-pairs", str(args.toggle_pairs)],
                capture_output=True,
                text=True,
                timeout=args.timeout_s,
            )
        except subprocess.TimeoutExpired:  # (flush-keep-gil: a CUPTI thread waiting for the GIL we hold)
            print(f"{v:<14} no result within {args.timeout_s:.0f} s (killed)")
            continue
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{v:<14} failed (exit {p.returncode}): {p.stderr[-800:]}")
            continue
        r = json.loads(line[7:])
        if "stats" not in r:  # (toggle, alternate: ratios of neighbours, and what the child printed)
            lo, hi = r["ci95"]
            bare, on = (float(np.median(r[k])) for k in ("bare_ms", "cupti_ms"))
            what = "blocks of --block steps, kinds on/off" if v == "toggle" else "steps, marked/unmarked"
            print(
                f"{v:<14} {bare:8.3f} {on:9.3f} {float(np.median(r['ratios'])):9.4f} [{lo:.4f}, {hi:.4f}]"
                f"  ({len(r['ratios'])} neighbour pairs of {what})"
            )
            for ln in p.stdout.splitlines()[1:]:
                if not ln.startswith("RESULT ") and ln.startswith(" "):
                    print(ln)
            continue
        s = r["stats"]
        nf = max(s["flushes"], 1)
        lo, hi = r["ci95"]
        med = sorted(r["ratios"])[len(r["ratios"]) // 2]
        timed_steps = args.pairs * (args.steps + 10)
        bare, on = (sorted(r[k])[len(r[k]) // 2] for k in ("bare_ms", "cupti_ms"))
        print(
            f"{v:<14} {bare:8.3f} {on:9.3f}"
            f" {med:9.4f} [{lo:.4f}, {hi:.4f}]  {s['flushes']:7d}  {1e3 * s['cupti_flush_s'] / nf:16.3f}"
            f"  {1e3 * (s['flush_s'] - s['cupti_flush_s']) / nf:13.3f}  {s['records'] / timed_steps:12.1f}"
            f"  {s['names_read']:10d}  {_kinds(s['kinds'], timed_steps)}"
        )
        h, nh = r.get("harvest", {}), max(s["harvests"], 1)
        if "share" in h:
            print(
                f"{'':<14} steps a harvest overlapped: {h['overlapped']} of {h['steps']}, p50 "
                f"{h['p50_overlapped_ms']:.3f} ms against {h['p50_other_ms']:.3f}: the harvests cost "
                f"{100 * h['share']:.2f} % of the timed steps' time; a harvest: {1e3 * s['harvest_s'] / nh:.1f} ms "
                f"wall, {1e3 * s['harvest_cpu_s'] / nh:.1f} ms of its thread's CPU ({s['harvests']} harvests); CUPTI's "
                f"buffer callbacks per flush: {s['callbacks']['completed'] / nf:.1f} completed, "
                f"{s['callbacks']['requested'] / nf:.1f} requested"
            )
    return 0


def _kinds(seen: dict[str, int], steps: int) -> str:
    """CUPTI's activity kinds by name (cupti-python's ``ActivityKind``, else the number) with records per step."""
    try:
        from cupti import cupti

        name = {str(int(k)): k.name for k in cupti.ActivityKind}
    except Exception:  # noqa: BLE001 - (the numbers then)
        name = {}
    return " ".join(f"{name.get(k, k)}:{n / steps:.1f}" for k, n in seen.items()) or "-"


if __name__ == "__main__":
    sys.exit(main())
