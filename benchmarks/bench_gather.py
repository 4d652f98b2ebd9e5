"""Gather at scale, simulated in one process: 32 ranks x 4 host devices x 10,000 activities per device.

    PYTHONPATH=$PWD python benchmarks/bench_gather.py [--ranks 32] [--devices 4] [--per-device 10000]
                                                       [--marks 100] [--repeat 3] [--out FILE.json]

Each rank's scope is a synthetic `Timeline` on its own host clock (an offset of seconds to the root's): every
device runs its activities back to back on two streams (durations log-normal around 50 µs, later ranks a little
slower), rows in issue order, with ``--marks`` collective marks spread over the scope. Every rank packs its
payload (`asyncgpu.ranks.wire`): in a real run the ranks do that in parallel, so it is timed apart. Rank 0, the
root, then does what `asyncgpu.ranks.gather` does there once the bytes arrive: pack its own payload, take each rank's
payload in turn (a fresh copy, as a receive buffer would be) and merge it, finish the `RankTimeline`, make the
cross-rank balance and render the report as text. The exchange itself (sockets) is not in the figure.

Reported: the root's seconds (median of ``--repeat`` runs), split into merge and balance + report; and bytes per
activity on the root: the peak of traced memory (tracemalloc: numpy's buffers and Python objects) during the
root's part, measured in a run of its own, and what the result holds (the merged columns). Targets (issue 7):
<= 5 s and <= 200 bytes per activity on the root. The table is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from asyncgpu._analysis.report import render
from asyncgpu._base.records import HostRange, Timeline
from asyncgpu.ranks.merge import Merger, RankTimeline
from asyncgpu.ranks.report import rank_report
from asyncgpu.ranks.wire import HostRanges, Marks, timeline_to_payload

NAMES = ["gemm", "attention", "layernorm", "allreduce", "h2d batch", "optimizer step"]


def make_rank(
    rank: int,
    devices: int,
    per_device: int,
    marks: int,
    offset_ns: int,
    seed: int = 0,
    host_ranges: bool = False,
    as_columns: bool = False,
) -> tuple[Timeline, Marks, HostRanges | None]:
    """One rank's scope on its own clock (root clock + ``offset_ns``), and its collective marks; with
    ``host_ranges``, one host range per activity too (every activity issued in a ``t.activity()`` block), as
    `HostRange` objects in the timeline or, ``as_columns``, as the columns the rank would pack them into."""
    rng = np.random.default_rng(seed * 1000 + rank)
    t0 = 5_000_000_000_000.0 + offset_ns  # host ns, as perf_counter_ns gives
    n = devices * per_device
    device = np.repeat(np.arange(devices, dtype=np.int16), per_device)
    local = rng.integers(0, 2, n)
    stream = (device.astype(np.int32) * 2 + local).astype(np.int32)
    dur = rng.lognormal(np.log(50e3 * (1 + 0.02 * rank)), 0.4, n)
    start = np.empty(n)
    for s in range(2 * devices):  # back to back on each stream
        rows = np.flatnonzero(stream == s)
        step = dur[rows] + rng.exponential(5e3, rows.size)
        start[rows] = t0 + 100e3 + np.cumsum(step) - step
    issued = start - rng.exponential(30e3, n)
    order = np.argsort(issued, kind="stable")
    end = start + dur
    scope = HostRange("train", "scope", int(t0), int(end.max()) + 1000, "MainThread")
    columns = None
    if host_ranges and as_columns:
        k = np.sort(issued).astype(np.int64)
        columns = HostRanges(
            [NAMES[0], "train"],
            ["user", "scope"],
            ["MainThread"],
            np.append(np.zeros(n), 1),
            np.append(np.zeros(n), 1),
            np.zeros(n + 1),
            np.append(k, scope.start_ns),
            np.append(k + 2000, scope.end_ns),
        )
    blocks = (
        tuple(HostRange(NAMES[0], "user", int(i), int(i) + 2000, "MainThread") for i in np.sort(issued))
        if host_ranges and not as_columns
        else ()
    )
    tl = Timeline.from_arrays(
        label="train",
        devices=[f"host:{d}" for d in range(devices)],
        device=device[order],
        start_ns=start[order],
        end_ns=end[order],
        duration_ns=dur[order],
        names=NAMES,
        name=rng.integers(0, len(NAMES), n)[order],
        streams=[(d, f"s{k}") for d in range(devices) for k in range(2)],
        stream=stream[order],
        scope_start_ns=int(t0),
        scope_end_ns=int(end.max()) + 1000,
        host_ranges=blocks + (scope,),
    )
    span = float(end.max() - t0)
    mark_ns = (t0 + span * (np.arange(1, marks + 1) / (marks + 1))).astype(np.int64)
    mark_row = np.searchsorted(issued[order], mark_ns)
    return (
        tl,
        Marks.from_tuples([("allreduce", int(t), int(r), "MainThread") for t, r in zip(mark_ns, mark_row)]),
        columns,
    )


def make_payloads(
    ranks: int, devices: int, per_device: int, marks: int, host_ranges: bool = False
) -> tuple[list, list, float]:
    """Every rank's payload (rank 0's as a timeline: the root packs its own), the offsets, and the seconds one
    rank takes to pack its payload (rank 0's, host ranges as objects as a real rank has them; the other ranks'
    host ranges are made as columns straight away, to keep the simulation short)."""
    payloads: list[Any] = []
    offsets = []
    pack_s = 0.0
    for r in range(ranks):
        off = 0 if r == 0 else int(r * 1_000_000_000 + 12_345 * r)
        tl, mk, hr = make_rank(r, devices, per_device, marks, off, host_ranges=host_ranges, as_columns=r > 0)
        info = {"rank": r, "host": f"node{r // 8}", "pid": 1000 + r, "backend": "host", "asyncgpu_version": "sim"}
        t = time.perf_counter()
        buf = timeline_to_payload(tl, mk, info, hr)
        if r == 0:
            pack_s = time.perf_counter() - t
        payloads.append((tl, mk, info) if r == 0 else buf)
        offsets.append((off, 0.0 if r == 0 else 40_000.0, 0.0 if r == 0 else 90_000.0, 0 if r == 0 else 16))
    return payloads, offsets, pack_s


def root_part(payloads: list, offsets: list, rows: list[int]) -> tuple[RankTimeline, str, float, float]:
    """What the root does: ``(result, report text, merge s, balance + report s)``."""
    t = time.perf_counter()
    merger = Merger(rows, 0)
    for r, p in enumerate(payloads):
        buf = timeline_to_payload(*p) if r == 0 else p.copy()  # the root packs its own; others arrive as bytes
        merger.add(buf, offsets[r])
        del buf
    result = merger.result()
    t_merge = time.perf_counter() - t
    t = time.perf_counter()
    text = render(rank_report(result, result.balance(), 64), width=120)
    return result, text, t_merge, time.perf_counter() - t


def run_scale(
    ranks: int = 32,
    devices: int = 4,
    per_device: int = 10_000,
    marks: int = 100,
    repeat: int = 3,
    memory: bool = True,
    host_ranges: bool = False,
) -> dict[str, Any]:
    """The figures (see the module docstring) as a dict."""
    payloads, offsets, pack_s = make_payloads(ranks, devices, per_device, marks, host_ranges)
    rows = [devices * per_device] * ranks
    n = sum(rows)
    runs = []
    for _ in range(repeat):
        result, text, t_merge, t_report = root_part(payloads, offsets, rows)
        runs.append((t_merge + t_report, t_merge, t_report))
        del result
    total, merge, report = (statistics.median(x) for x in zip(*runs))
    out: dict[str, Any] = {
        "ranks": ranks,
        "devices_per_rank": devices,
        "per_device": per_device,
        "marks_per_rank": marks,
        "host_range_per_activity": host_ranges,
        "activities": n,
        "root_s": total,
        "merge_s": merge,
        "balance_report_s": report,
        "pack_one_rank_s": pack_s,
        "payload_bytes_per_activity": float(np.mean([p.size for p in payloads[1:]])) / (devices * per_device)
        if ranks > 1
        else None,
        "report_lines": text.count("\n"),
        "runs_s": [r[0] for r in runs],
    }
    if memory:
        tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result, text, _, _ = root_part(payloads, offsets, rows)
        held = tracemalloc.get_traced_memory()[0] - base
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        out.update(
            peak_bytes_per_activity=peak / n,
            held_bytes_per_activity=held / n,
            columns_bytes_per_activity=result.timeline.nbytes / n,
        )
    return out


def run_processes(k: int, devices: int, per_device: int, marks: int, timeout_s: float = 300) -> dict[str, Any]:
    """The same scopes gathered for real: ``k`` processes on this machine, torch.distributed gloo (a file store),
    `asyncgpu.ranks.gather` called on every rank. Returns the root's seconds for the gather call (check-in, pings,
    payloads over sockets, merge) and for balance + report."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--_rank",
            "",
            "--_world",
            str(k),
            "--_dir",
            tmp,
            "--devices",
            str(devices),
            "--per-device",
            str(per_device),
            "--marks",
            str(marks),
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs = [subprocess.Popen(cmd[:2] + ["--_rank", str(r)] + cmd[4:], env=env) for r in range(k)]
        try:
            for p in procs:
                p.wait(timeout=timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(p.returncode for p in procs):
            raise RuntimeError(f"a rank failed: exit codes {[p.returncode for p in procs]}")
        with open(os.path.join(tmp, "root.json"), encoding="utf-8") as f:
            return json.load(f)


def _rank_main(rank: int, world: int, tmp: str, devices: int, per_device: int, marks: int) -> None:
    import torch.distributed as dist

    from asyncgpu._base.records import CollectiveMark
    from asyncgpu.ranks import gather

    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    tl, mk, _ = make_rank(rank, devices, per_device, marks, 0)
    tl = dataclasses.replace(
        tl,
        marks=tuple(
            CollectiveMark(mk.names[n], int(t), int(r), mk.threads[th])
            for n, t, r, th in zip(mk.name, mk.ns, mk.row, mk.thread)
        ),
    )
    dist.barrier()
    t = time.perf_counter()
    result = gather(tl, timeout_s=120)
    t_gather = time.perf_counter() - t
    if rank == 0:
        t = time.perf_counter()
        render(rank_report(result, result.balance(), 64), width=120)
        out = {
            "processes": world,
            "activities": len(result.timeline),
            "gather_s": t_gather,
            "balance_report_s": time.perf_counter() - t,
            "rank_clock_bound_us": max(r.bound_ns for r in result.ranks) / 1e3,
        }
        with open(os.path.join(tmp, "root.json"), "w", encoding="utf-8") as f:
            json.dump(out, f)
    dist.barrier()  # the others wait here (idle) while the root reports: no teardown competing for the CPUs
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--per-device", type=int, default=10_000)
    ap.add_argument("--marks", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--host-ranges", action="store_true", help="also one host range per activity (t.activity)")
    ap.add_argument(
        "--processes",
        type=int,
        default=0,
        help="also gather for real from this many processes on this machine (torch gloo)",
    )
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--_rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._rank is not None:
        _rank_main(a._rank, a._world, a._dir, a.devices, a.per_device, a.marks)
        return 0
    fig = run_scale(a.ranks, a.devices, a.per_device, a.marks, a.repeat, host_ranges=a.host_ranges)
    if a.processes:
        fig["processes"] = run_processes(a.processes, a.devices, a.per_device, a.marks)
    fig.update(
        python=sys.version.split()[0],
        numpy=np.__version__,
        machine=platform.machine(),
        cpus=os.cpu_count(),
        argv=sys.argv,
    )
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(fig, f, indent=2)
    print(
        f"== gather at scale: {a.ranks} ranks x {a.devices} devices x {a.per_device:,} activities "
        f"= {fig['activities']:,} activities, {a.marks} marks per rank"
        + (", a host range per activity" if a.host_ranges else "")
    )
    rows = [
        ("root: merge (unpack + copy into the merged columns)", f"{fig['merge_s']:.3f} s"),
        ("root: balance + report (text)", f"{fig['balance_report_s']:.3f} s"),
        ("root: total (target <= 5 s)", f"{fig['root_s']:.3f} s"),
        ("one rank: pack its payload", f"{fig['pack_one_rank_s'] * 1e3:.1f} ms"),
        ("payload bytes per activity", f"{fig['payload_bytes_per_activity']:.1f} B"),
        ("root: peak memory per activity (target <= 200 B)", f"{fig['peak_bytes_per_activity']:.1f} B"),
        ("root: held by the result per activity", f"{fig['held_bytes_per_activity']:.1f} B"),
    ]
    if a.processes:
        p = fig["processes"]
        rows += [
            (
                f"real: gather call on the root, {p['processes']} processes, {p['activities']:,} activities",
                f"{p['gather_s']:.3f} s",
            ),
            ("real: balance + report on the root", f"{p['balance_report_s']:.3f} s"),
            ("real: largest rank clock bound", f"{p['rank_clock_bound_us']:.1f} µs"),
        ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
