"""Events outliers on an idle-start memset, and whether CUPTI's session in the process brings them: the pattern of
`test_events_time_a_memset_on_an_idle_gpu_as_cupti_does` (a 40 MB memset on an idle GPU, each in its own events
scope, 2 ms apart), in phases of one process:

- ``fresh``: before anything in the process has loaded CUPTI;
- ``after``: after one CUPTI scope has opened and closed (the session ended, CUPTI still loaded);
- ``turns``: events and CUPTI scopes in turns, as the test takes them (the events rounds reported);
- ``cupti``: CUPTI's own durations of the ``turns`` phase, for reference.

    PYTHONPATH=$PWD python dev/diag_idle_memset.py [--rounds 200] [--device 0] [--mb 40]

Per phase: the p50, the max, and how many events durations exceed the phase's p50 by 1 µs or more (the test's
failures were single memsets 2.8-4.5 µs over the rest).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import asyncgpu
from asyncgpu import gpu_timer


def rounds(dev: asyncgpu.Device, a: asyncgpu.DeviceArray, n: int, sources: tuple[str, ...]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {s: [] for s in sources}
    for i in range(n):
        dev.synchronize()
        time.sleep(0.002)
        source = sources[i % len(sources)]
        with gpu_timer(dev, source=source) as t:
            dev.stream.memset(a, 0)
        assert t.timeline.source == source, t.timeline.source_note
        out[source].append(t.records[0].duration_ms * 1e3)
    return out


def show(name: str, durs_us: list[float]) -> None:
    d = np.asarray(durs_us)
    p50 = float(np.median(d))
    over = d[d >= p50 + 1.0]
    print(
        f"{name:>7}: n {len(d):4d}  p50 {p50:7.3f} µs  max {d.max():7.3f}  over p50+1 µs: {len(over):3d}"
        f" {np.round(np.sort(over) - p50, 2).tolist()}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--mb", type=int, default=40)
    args = ap.parse_args()
    dev = asyncgpu.device(args.device)
    a = dev.alloc(args.mb * 2**20 // 4)
    dev.stream.memset(a, 0)
    show("fresh", rounds(dev, a, args.rounds, ("events",))["events"])
    rounds(dev, a, 1, ("cupti",))
    show("after", rounds(dev, a, args.rounds, ("events",))["events"])
    turns = rounds(dev, a, 2 * args.rounds, ("events", "cupti"))
    show("turns", turns["events"])
    show("cupti", turns["cupti"])
    a.free()
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
