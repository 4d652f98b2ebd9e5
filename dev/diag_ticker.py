"""What stalls the loop in the ticker test: the test's workload, with every thread's stack dumped at a late tick.

    PYTHONPATH=$PWD python dev/diag_ticker.py [asyncio|uvloop|trio] [repetitions] [dump file] [--calls] [--reserve]
        [--bound N]

As `tests/test_load.py::test_launches_wait_for_room_and_the_loop_keeps_ticking`: 10,000 launches and 1,000 events
on 8 streams held 300 ms, from a task that awaits room, while a 1 ms ticker runs. Before each tick's sleep,
`faulthandler.dump_traceback_later` is armed 1.6 ms past the tick's due time: a tick that late dumps the stack of
every thread from faulthandler's own C thread (no GIL needed, so a thread stuck in the driver or holding the GIL
shows where it is). Prints per repetition the latest tick, when it came, the longest collector pause and its
generation. Needs a CUDA GPU.

``--calls``: every call of the CUDA backend device's methods (any thread) that lasts over 50 µs is logged with its
thread, and each of the producer's launches over 0.4 ms is printed with the calls of other threads that overlap it
(is a long launch the driver's alone, or does it wait on a driver lock that another asyncgpu thread holds: the
waiter thread growing the event pool, say?). ``--reserve``: the non-timing pool holds 1,100 free events before the
hold (no growth while the producer launches). ``--bound N``: `QUEUE_BOUND` N for the run (does a shallower queue
spare the loop the driver's long launches?).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import threading
import time

import anyio
import numpy as np

import asyncgpu

DUMP_AFTER_S = 0.0016
_now = time.perf_counter_ns


CALL_MIN_NS = 50_000
LAUNCH_MIN_NS = 400_000
#: (thread name, method, start ns, duration ns) of backend calls over `CALL_MIN_NS`: appended from any thread
CALLS: list[tuple[str, str, int, int]] = []
WRAPPED = (
    "create_event",
    "destroy_event",
    "record",
    "query",
    "sync_event",
    "elapsed_ms",
    "sync_stream",
    "sync_device",
    "launch",
    "spin",
    "hold",
    "release",
    "wait_event",
)


def trace_calls() -> None:
    """Wrap the CUDA backend device's methods (class level, before any device exists) to log long calls."""
    from asyncgpu._backends.cuda.device import CudaDevice

    def wrap(name: str, fn):
        def timed(*a, **k):
            t0 = _now()
            try:
                return fn(*a, **k)
            finally:
                dt = _now() - t0
                if dt > CALL_MIN_NS:
                    CALLS.append((threading.current_thread().name, name, t0, dt))

        return timed

    for name in WRAPPED:
        if hasattr(CudaDevice, name):
            setattr(CudaDevice, name, wrap(name, getattr(CudaDevice, name)))


async def once(rep: int, loop_name: str, out, reserve: bool = False) -> None:
    dev = asyncgpu.device("cuda:0", streams=8)
    if reserve:
        await anyio.to_thread.run_sync(dev._internal.plain_pool.reserve, 1100)
    for s in dev.streams:
        s.spin_us(0)
    await anyio.to_thread.run_sync(dev.synchronize)
    tokens = [dev._internal.bd.hold(s._internal.raw) for s in dev.streams]
    late: list[tuple[int, int]] = []
    stop = threading.Event()
    events = []
    long_launches: list[tuple[int, int, int, int]] = []  # (launch, start ns, ns, the loop thread's CPU ns)
    CALLS.clear()
    grows0 = dev._internal.plain_pool.stats().grows
    marks: dict[str, int] = {}
    pauses: list[list[int]] = []  # [start ns, duration ns, generation]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            pauses.append([_now(), 0, info["generation"]])
        elif pauses:
            pauses[-1][1] = _now() - pauses[-1][0]

    async def ticker() -> None:
        while not stop.is_set():
            due = _now() + 1_000_000
            faulthandler.dump_traceback_later(0.001 + DUMP_AFTER_S, file=out)
            await anyio.sleep(0.001)
            faulthandler.cancel_dump_traceback_later()
            late.append((_now() - due, _now()))

    async def producer() -> None:
        marks["start"] = _now()
        for i in range(10_000):
            s = dev.streams[i % 8]
            await s.room()
            a, cpu = _now(), time.thread_time_ns()
            s.spin_us(0)
            if _now() - a > LAUNCH_MIN_NS:
                long_launches.append((i, a, _now() - a, time.thread_time_ns() - cpu))
            if i % 10 == 0:
                events.append(s.record(timing=False))
        marks["launched"] = _now()
        for ev in events:
            await ev.wait()
            ev.release()
        marks["waited"] = _now()
        stop.set()

    def release() -> None:
        marks["released"] = _now()
        for t in tokens:
            dev._internal.bd.release(t)

    out.write(f"\n===== {loop_name} rep {rep}\n")
    out.flush()
    threading.Timer(0.3, release).start()
    gc.callbacks.append(on_gc)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            tg.start_soon(producer)
    finally:
        faulthandler.cancel_dump_traceback_later()
        gc.callbacks.remove(on_gc)
    ms = np.array([x[0] for x in late[1:]]) / 1e6
    worst = int(np.argmax(ms)) + 1
    t0 = marks["start"]
    at = {k: round((v - t0) / 1e6, 1) for k, v in marks.items()}
    longest = max(pauses, key=lambda g: g[1], default=[t0, 0, None])
    msg = (
        f"{loop_name} rep {rep}: latest tick {ms.max():.3f} ms at {(late[worst][1] - t0) / 1e6:.1f} ms; p99 "
        f"{np.percentile(ms, 99):.3f}; ticks 1.5 ms late or more: {int((ms >= 1.5).sum())}, 2 ms or more: "
        f"{int((ms >= 2.0).sum())}; launches over {LAUNCH_MIN_NS / 1e6} ms: {len(long_launches)} "
        f"({sum(x[2] for x in long_launches) / 1e6:.1f} ms); marks (ms) {at}; "
        f"longest collection {longest[1] / 1e6:.2f} ms (generation {longest[2]}) at {(longest[0] - t0) / 1e6:.1f} ms"
    )
    me = threading.current_thread().name
    for i, a, n, cpu in long_launches:
        others = [
            (th, m, round((c0 - t0) / 1e6, 2), round(dt / 1e3))
            for th, m, c0, dt in CALLS
            if th != me and c0 < a + n and c0 + dt > a
        ]
        msg += (
            f"\n  launch {i} at {(a - t0) / 1e6:.2f} ms took {n / 1e3:.0f} µs (CPU {cpu / 1e3:.0f}); other threads' "
            f"calls over {CALL_MIN_NS // 1000} µs meanwhile (thread, call, at ms, µs): {others}"
        )
    if CALLS:
        by: dict[tuple[str, str], list[int]] = {}
        for th, m, _, dt in CALLS:
            by.setdefault((th, m), []).append(dt)
        msg += "\n  calls over 50 µs (thread, call: count, max µs): " + ", ".join(
            f"{th} {m}: {len(v)}, {max(v) / 1e3:.0f}" for (th, m), v in sorted(by.items())
        )
    pool = dev._internal.plain_pool
    msg += f"\n  non-timing pool: created {pool._created}, grows {pool._grows} (before: {grows0})"
    print(msg, flush=True)
    out.write(msg + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("loop", nargs="?", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    p.add_argument("reps", nargs="?", type=int, default=5, help="repetitions (default 5)")
    p.add_argument("dumps", nargs="?", help="the stack dumps' file (default ticker-dumps-LOOP.txt)")
    p.add_argument("--out", help="the stack dumps' file (as DUMPS)")
    p.add_argument("--calls", action="store_true", help="log backend calls over 50 µs, per long launch")
    p.add_argument("--reserve", action="store_true", help="1,100 free non-timing events before each hold")
    p.add_argument("--bound", type=int, help="QUEUE_BOUND for this run (QUEUE_LIMIT 128 above it): a shallower queue")
    args = p.parse_args(argv)
    if args.bound:
        from asyncgpu._runtime import device, hooks, stream

        for mod in (hooks, stream, device):
            if hasattr(mod, "QUEUE_BOUND"):
                mod.QUEUE_BOUND = args.bound
            if hasattr(mod, "QUEUE_LIMIT"):
                mod.QUEUE_LIMIT = args.bound + 128
    loop_name, reps = args.loop, args.reps
    path = args.out or args.dumps or f"ticker-dumps-{loop_name}.txt"
    backend, options = {"asyncio": ("asyncio", {}), "uvloop": ("asyncio", {"use_uvloop": True}), "trio": ("trio", {})}[
        loop_name
    ]
    if args.calls:
        trace_calls()
    with open(path, "a") as out:
        for rep in range(reps):
            anyio.run(once, rep, loop_name, out, args.reserve, backend=backend, backend_options=options)
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
