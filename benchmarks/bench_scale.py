"""Summaries at scale: 8 devices x 1,000,000 activities, timed on a synthetic `Timeline` (no GPU needed).

    PYTHONPATH=$PWD python benchmarks/bench_scale.py [--devices 8] [--per-device 1000000] [--repeat 3]
                                                      [--out benchmarks/results/scale.txt]

Each device has 2-4 streams; each stream runs activities back to back with short gaps (durations log-normal,
2 µs to a few ms), so the streams of a device overlap. Names and kinds are drawn from a training step's mix.
Rows come in issue order: each activity is issued shortly before it starts, so the rows are nearly, not exactly,
in time order. A second pass shuffles the rows (the worst case for the sorts).

Reported, median of ``--repeat`` runs: seconds for `device_summary`, for `balance` of that summary, for
`balance` straight from the timeline (which makes its own device summary) and for `activity_summary`; bytes held
per activity (the timeline's columns plus the summary objects) and the peak of temporary numpy memory during
`device_summary`, per activity. Targets: device_summary + balance <= 2 s, <= 200 bytes held per activity.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np

from asyncgpu._analysis.balance import balance
from asyncgpu._analysis.summary import activity_summary, device_summary
from asyncgpu._base.records import KIND_CODES, Timeline

NAMES = [
    ("gemm", "kernel", 120.0),
    ("attention", "kernel", 200.0),
    ("layernorm", "kernel", 15.0),
    ("gelu", "kernel", 10.0),
    ("allreduce", "kernel", 300.0),
    ("h2d batch", "memcpy", 80.0),
    ("d2h logits", "memcpy", 40.0),
    ("zero grads", "memset", 5.0),
    ("optimizer step", "user", 900.0),
]
WEIGHTS = np.array([30, 15, 15, 15, 5, 5, 5, 5, 5], dtype=np.float64)


def make_timeline(n_devices: int, per_device: int, seed: int = 0) -> Timeline:
    """A synthetic timeline of ``n_devices`` x ``per_device`` activities, rows in issue order."""
    rng = np.random.default_rng(seed)
    t0 = 1_000_000_000_000.0  # host ns, as perf_counter_ns gives
    n_streams = rng.integers(2, 5, n_devices)
    streams = [(d, f"s{s}") for d in range(n_devices) for s in range(n_streams[d])]
    first_stream = np.concatenate(([0], np.cumsum(n_streams)[:-1]))
    name = rng.choice(len(NAMES), n_devices * per_device, p=WEIGHTS / WEIGHTS.sum()).astype(np.int32)
    mean_us = np.array([m for _, _, m in NAMES])[name]
    dur = rng.lognormal(np.log(mean_us * 1e3), 0.5)  # ns
    device = np.repeat(np.arange(n_devices, dtype=np.int16), per_device)
    local = rng.integers(0, n_streams[device])
    stream = (first_stream[device] + local).astype(np.int32)
    gap = rng.exponential(20e3, dur.size) * (1 + 0.2 * device)  # later devices a little slower to feed
    start = np.empty_like(dur)
    for s in range(len(streams)):  # back to back on each stream
        rows = np.flatnonzero(stream == s)
        step = dur[rows] + gap[rows]
        start[rows] = t0 + 50e3 + np.cumsum(step) - step
    issue = np.argsort(start - rng.exponential(30e3, dur.size), kind="stable")
    kinds = np.array([KIND_CODES[k] for _, k, _ in NAMES], dtype=np.int8)[name]
    return Timeline.from_arrays(
        label="scale",
        devices=[f"cuda:{d}" for d in range(n_devices)],
        device=device[issue],
        start_ns=start[issue],
        end_ns=(start + dur)[issue],
        duration_ns=dur[issue],
        names=[n for n, _, _ in NAMES],
        name=name[issue],
        kind=kinds[issue],
        streams=streams,
        stream=stream[issue],
        scope_start_ns=int(t0),
        scope_end_ns=int(t0 + 1e6),
    )


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(median seconds, last result)."""
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def deep_size(obj: Any) -> int:
    """Bytes of a result object: the object, its fields, their items (strings, numbers, tuples)."""
    size = sys.getsizeof(obj)
    if is_dataclass(obj):
        return size + sum(deep_size(getattr(obj, f.name)) for f in fields(obj))
    if isinstance(obj, (tuple, list)):
        return size + sum(deep_size(v) for v in obj)
    return size


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak of memory allocated (numpy included) while ``fn`` runs, beyond what was held before."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure(tl: Timeline, repeat: int) -> dict[str, float]:
    s_dev, ds = timed(lambda: device_summary(tl), repeat)
    s_bal, rep = timed(lambda: balance(ds), repeat)
    s_bal_tl, _ = timed(lambda: balance(tl), repeat)
    s_act, acts = timed(lambda: activity_summary(tl), repeat)
    n = len(tl)
    return {
        "device_summary": s_dev,
        "balance(summary)": s_bal,
        "balance(timeline)": s_bal_tl,
        "activity_summary": s_act,
        "held_bytes": (tl.nbytes + deep_size(ds) + deep_size(rep) + deep_size(acts)) / n,
        "peak_bytes": peak_bytes(lambda: device_summary(tl)) / n,
        "utilisation": ds.rows[0].utilisation or 0.0,
        "imbalance": rep.imbalance or 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--per-device", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", help="also write the output to this file")
    args = ap.parse_args(argv)
    lines = [
        "$ PYTHONPATH=$PWD python benchmarks/bench_scale.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        (
            f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, numpy {np.__version__}"
        ),
    ]
    tl = make_timeline(args.devices, args.per_device)
    lines.append(f"# {tl!r}: {tl.nbytes / len(tl):.0f} bytes per row in the columns, median of {args.repeat} runs")
    rows = {"issue order": measure(tl, args.repeat)}
    rows["rows shuffled"] = measure(tl.select(np.random.default_rng(1).permutation(len(tl))), args.repeat)
    head = (
        f"{'rows':<14}{'device_summary':>16}{'balance(ds)':>13}{'balance(tl)':>13}{'dev+bal':>9}"
        f"{'activity_summary':>18}{'held B/act':>12}{'peak B/act':>12}"
    )
    lines += [head, "-" * len(head)]
    for label, m in rows.items():
        lines.append(
            f"{label:<14}{m['device_summary']:>15.3f}s{m['balance(summary)']:>12.6f}s"
            f"{m['balance(timeline)']:>12.3f}s{m['device_summary'] + m['balance(summary)']:>8.3f}s"
            f"{m['activity_summary']:>17.3f}s{m['held_bytes']:>12.1f}{m['peak_bytes']:>12.1f}"
        )
    worst = max(m["device_summary"] + m["balance(summary)"] for m in rows.values())
    held = max(m["held_bytes"] for m in rows.values())
    lines.append(
        f"targets: device_summary + balance <= 2 s: {'met' if worst <= 2 else 'MISSED'} ({worst:.3f} s, "
        f"worst); <= 200 bytes held per activity: {'met' if held <= 200 else 'MISSED'} ({held:.1f})"
    )
    m = rows["issue order"]
    lines.append(f"sanity: {tl.devices[0]} utilisation {m['utilisation']:.1%}, imbalance {m['imbalance']:.3f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
