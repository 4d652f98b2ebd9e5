"""What a thread's first driver calls cost: each device's ``cuEventQuery`` and ``cuEventElapsedTime`` (the step
timer's harvest calls, through asyncgpu's ctypes entry points), timed call by call in fresh threads, in the main
thread, and in a fresh thread that first made another driver call (``cuStreamQuery``). On 4x H100 a step timer's
first harvest spent ~2.5 ms of its thread's CPU in its queries where later ones spent ~50 µs (runs 58-59).

    PYTHONPATH=$PWD python dev/diag_first_query.py [--threads 3]

Prints, per probe, each call's wall and CPU µs (the first three queries and two elapsed-time calls per device).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
import asyncgpu  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=3, help="fresh threads probed one after another")
    args = ap.parse_args()
    devs = asyncgpu.devices("cuda")
    marks = []
    for d in devs:
        di = d._internal
        pool = di.timing_pool
        a, b = pool.take(), pool.take()
        di.bd.record(a, d.stream._internal.raw)
        d.stream.spin_us(200)
        di.bd.record(b, d.stream._internal.raw)
        marks.append((d, di, a, b))
    for d in devs:
        d.synchronize()

    def probe(label: str, pre: bool = False) -> None:
        rows = []
        if pre:
            for d, di, _, _ in marks:
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                di.bd._drv.stream_query_c(d.stream._internal.raw[3])
                rows.append((d.name, "cuStreamQuery", time.perf_counter_ns() - t0, time.thread_time_ns() - c0))
        for d, di, a, b in marks:
            for k in range(3):
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                di.query(b)
                rows.append((d.name, f"query {k}", time.perf_counter_ns() - t0, time.thread_time_ns() - c0))
            for k in range(2):
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                di.elapsed_ms(a, b)
                rows.append((d.name, f"elapsed {k}", time.perf_counter_ns() - t0, time.thread_time_ns() - c0))
        print(f"== {label}: call, wall µs / CPU µs")
        print("   " + "; ".join(f"{n} {c} {w / 1e3:.1f}/{u / 1e3:.1f}" for n, c, w, u in rows))

    for i in range(args.threads):
        t = threading.Thread(target=probe, args=(f"fresh thread {i + 1}",))
        t.start()
        t.join()
    probe("main thread")
    t = threading.Thread(target=probe, args=("fresh thread, cuStreamQuery first", True))
    t.start()
    t.join()
    for _, di, a, b in marks:
        di.timing_pool.give(a)
        di.timing_pool.give(b)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
