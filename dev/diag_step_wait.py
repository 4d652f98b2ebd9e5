"""Where a device-bound step's time goes when the step timer names the host: the GPU test's pattern (a 300 µs spin
on the first GPU, 1500 µs on the second, ``issued()``, then a wait for each device inside the step), with the host's
own instants beside the step record.

    PYTHONPATH=$PWD python dev/diag_step_wait.py [--steps 20] [--repeat 3] [--loops asyncio,trio]

Per step (µs from the step's entry): when the host had issued (after ``issued()``), when each wait returned, the
step's exit; each device's start, end and issued instants as the timer placed them, its launch-bound time; the
host's tail after the last device end; the straggler. A step the host bounds shows which of these grew.
"""

from __future__ import annotations

import argparse
import time

import anyio

import asyncgpu


async def one_run(devs: list, steps: int) -> list[tuple]:
    host: list[tuple[int, ...]] = []
    async with asyncgpu.step_timer(devs) as st:
        for i in range(steps):
            with st.step(i) as step:
                t0 = time.perf_counter_ns()
                for d, us in zip(devs, [300, 1500]):
                    d.stream.spin_us(us)
                step.issued()
                t1 = time.perf_counter_ns()
                waits = []
                for d in devs:
                    with d.record() as done:
                        await done.wait()
                    waits.append(time.perf_counter_ns())
            host.append((t0, t1, *waits))
    return [(rec, h) for rec, h in zip(st.steps(), host)]


def show(rows: list[tuple]) -> tuple[int, int]:
    devs_head = " | ".join(f"dev{k} start  end  iss  lb" for k in range(2))
    print(f"  step  strag    step_ms  issued  wait0  wait1   exit | {devs_head} | tail")
    host_n = 0
    for rec, (t0, t1, w0, w1) in rows:
        b = rec.begin_ns
        last = max(d.end_ns for d in rec.devices)
        devs = " | ".join(
            f"{(d.start_ns - b) / 1e3:7.0f} {(d.end_ns - b) / 1e3:6.0f} {(d.issued_ns - b) / 1e3:5.0f}"
            f" {d.launch_bound_ms * 1e3:4.0f}"
            for d in rec.devices
        )
        host_n += rec.straggler == "host"
        print(
            f"  {rec.index:4d} {rec.straggler:>6} {rec.step_ms:8.3f} {(t1 - b) / 1e3:7.0f} {(w0 - b) / 1e3:6.0f}"
            f" {(w1 - b) / 1e3:6.0f} {(rec.exit_ns - b) / 1e3:6.0f} | {devs} | {(rec.exit_ns - last) / 1e3:6.0f}"
            f"  (entry {(t0 - b) / 1e3:.0f})"
        )
    return host_n, len(rows)


async def main_async(args: argparse.Namespace) -> None:
    devs = [asyncgpu.device(0), asyncgpu.device(1)]
    for d in devs:
        await d.prepare()
    for r in range(args.repeat):
        rows = await one_run(devs, args.steps)
        n, total = show(rows)
        print(f"run {r}: host named in {n} of {total} steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--loops", default="asyncio,trio")
    args = ap.parse_args()
    for loop in args.loops.split(","):
        print(f"== {loop}")
        anyio.run(main_async, args, backend=loop)


if __name__ == "__main__":
    main()
