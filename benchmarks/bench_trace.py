"""Traces at scale: `write_trace` of a synthetic `Timeline` to Perfetto's native format (.pftrace) and to Chrome
JSON, on one core (no GPU needed).

    PYTHONPATH=$PWD python benchmarks/bench_trace.py [--devices 8] [--activities 1000000] [--big 10000000]
                                                     [--repeat 3] [--out benchmarks/results/trace.txt]

Timelines: ``--activities`` over ``--devices`` devices, 2-4 streams each, durations log-normal (2 µs to a few ms)
from a training step's mix of names and kinds (`bench_scale.make_timeline`), in two shapes:

- ``fifo``: each stream's rows in issue order start one after the other, as a stream runs them: the writer
  takes them a window of rows at a time, unsorted;
- ``shuffled``: `bench_scale`'s rows, which a little issue noise puts out of order within a stream: the writer
  sorts such a stream whole.

Reported: seconds to write (median of ``--repeat``), bytes per activity on disk, the peak of memory allocated
while writing (tracemalloc: numpy's buffers and Python objects) per activity, and seconds to read the trace back
(`read_trace`). Then the peak while writing ``--big`` activities (``fifo``), next to the same figure at
``--activities``: flat memory means the same megabytes. Targets (issue 16): 1 M activities on 8 devices written
in <= 2 s on one core of the GPU machine (<= 6 s on a 2-core development machine), <= 40 bytes per activity,
the big trace written with flat memory.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_scale import make_timeline  # noqa: E402

from asyncgpu._base.records import Timeline  # noqa: E402
from asyncgpu._trace.export import read_trace, write_trace  # noqa: E402


def fifo(tl: Timeline) -> Timeline:
    """``tl`` with each stream's rows in start order (the rows' order across streams kept otherwise): a stream
    runs its work in the order it was issued."""
    rows = np.arange(len(tl))
    for st in range(len(tl.streams)):
        mine = np.flatnonzero(tl.stream == st)
        rows[mine] = mine[np.argsort(tl.start_ns[mine], kind="stable")]
    return tl.select(rows)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def peak_mb(fn) -> float:
    """Peak of memory allocated while ``fn`` runs, beyond what was held before (MB)."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def measure(tl: Timeline, path: Path, repeat: int, read: bool = True) -> dict[str, float]:
    write_s = timed(lambda: write_trace(tl, path), repeat)
    size = path.stat().st_size
    return {
        "write_s": write_s,
        "bytes": size / len(tl),
        "peak_mb": peak_mb(lambda: write_trace(tl, path)),
        "read_s": timed(lambda: read_trace(path), 1) if read else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--activities", type=int, default=1_000_000)
    ap.add_argument("--big", type=int, default=10_000_000, help="activities of the memory run (0: none)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", help="also write the output to this file")
    args = ap.parse_args(argv)
    lines = [
        "$ PYTHONPATH=$PWD python benchmarks/bench_trace.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        (
            f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, numpy {np.__version__}; write times median of {args.repeat}"
        ),
    ]
    per_device = args.activities // args.devices
    shuffled = make_timeline(args.devices, per_device)
    runs = {"fifo": fifo(shuffled), "shuffled": shuffled}
    head = f"{'timeline':<12}{'format':<10}{'activities':>12}{'write':>10}{'B/activity':>12}{'peak MB':>10}{'read':>9}"
    lines += [head, "-" * len(head)]
    with tempfile.TemporaryDirectory() as d:
        results = {}
        for label, tl in runs.items():
            for fmt in (".pftrace", ".json"):
                if fmt == ".json" and label != "fifo":
                    continue
                m = measure(tl, Path(d) / f"t{fmt}", args.repeat if fmt == ".pftrace" else 1)
                results[label, fmt] = m
                lines.append(
                    f"{label:<12}{fmt:<10}{len(tl):>12,}{m['write_s']:>9.3f}s{m['bytes']:>12.1f}"
                    f"{m['peak_mb']:>10.1f}{m['read_s']:>8.2f}s"
                )
        del runs, shuffled
        if args.big:
            big = fifo(make_timeline(args.devices, args.big // args.devices, seed=1))
            m = measure(big, Path(d) / "big.pftrace", 1, read=False)
            results["big"] = m
            lines.append(
                f"{'fifo':<12}{'.pftrace':<10}{len(big):>12,}{m['write_s']:>9.3f}s{m['bytes']:>12.1f}"
                f"{m['peak_mb']:>10.1f}{'':>9}"
            )
            del big
    best = results["fifo", ".pftrace"]
    worst = max(results[k, ".pftrace"]["write_s"] for k in ("fifo", "shuffled"))
    limit = 2.0 if (os.cpu_count() or 1) > 2 else 6.0
    lines.append(
        f"targets: {args.activities:,} activities written in <= {limit:.0f} s: "
        f"{'met' if worst <= limit else 'MISSED'} ({worst:.3f} s, worst); <= 40 bytes per activity: "
        f"{'met' if best['bytes'] <= 40 else 'MISSED'} ({best['bytes']:.1f})"
    )
    if "big" in results:
        big_mb = results["big"]["peak_mb"]
        lines.append(
            f"memory: {big_mb:.1f} MB peak writing {args.big:,} activities against {best['peak_mb']:.1f} MB for "
            f"{args.activities:,} ({big_mb / best['peak_mb']:.2f}x for {args.big / args.activities:.0f}x the rows)"
        )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
