"""What another busy Python thread in the process costs asyncgpu's calls: the GIL convoy.

A call that lets go of the GIL (a driver call through cuda.bindings or ctypes.CDLL) must take it back when it
returns; while another thread runs Python, that waits until the other thread gives it up, at the interpreter's
switch interval (5 ms). So each such call can cost up to 5 ms. Measured here with 0 and 1 threads spinning in Python
(``sum(range(1000))`` in a loop), per call, median and p90 (µs):

* ``launch``: an untimed ``spin_us(5)`` launch (cuda.core's launch);
* ``timed launch``: the same inside an events `gpu_timer` (held and primed pair: hold, records, launch, release);
* ``scope exit``: a sync events scope of 4 launches, its exit (placement; a calibration when the clock is stale);
* ``calibration``: ``dev.clock(refresh=True)`` (16 event pings and the ``%globaltimer`` kernel's), and how many
  failed;
* ``torch add_``: a torch launch on the same device (torch keeps the GIL through its launches), the peer.

With ``--switch-ms 0.5`` the interpreter hands the GIL over ten times as often: what a program with such threads
can do about it (``sys.setswitchinterval``).

    PYTHONPATH=$PWD python dev/diag_gil_convoy.py [--calls 200] [--seconds 20] [--switch-ms MS]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np

import asyncgpu
from asyncgpu.errors import ClockError


def _hog(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def _per_call(fn, calls: int, deadline: float) -> np.ndarray:
    out = []
    for _ in range(calls):
        if time.perf_counter() > deadline:
            break
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return np.array(out)


def _calibrations(dev: asyncgpu.Device, calls: int, deadline: float) -> tuple[np.ndarray, int]:
    failed = 0
    out = []
    for _ in range(calls):
        if time.perf_counter() > deadline:
            break
        t0 = time.perf_counter_ns()
        try:
            dev.clock(refresh=True)
        except ClockError:
            failed += 1
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return np.array(out), failed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--seconds", type=float, default=20.0, help="at most this long per row")
    p.add_argument("--switch-ms", type=float, default=None, help="set the interpreter's switch interval first (ms)")
    a = p.parse_args()
    if a.switch_ms is not None:
        sys.setswitchinterval(a.switch_ms / 1e3)
    dev = asyncgpu.device(0, backend="cuda")
    s = dev.stream
    dev.clock()
    try:
        import torch

        x = torch.zeros(1, device=f"cuda:{dev.index}")
    except Exception:  # (torch is the peer, not a dependency)
        x = None
    print(f"{dev.description}; switch interval {sys.getswitchinterval() * 1e3:.1f} ms")
    print(f"{'busy threads':<13} {'what':<13} {'n':>5} {'p50 µs':>9} {'p90 µs':>9}  note")
    for hogs in (0, 1, 0):
        stop = threading.Event()
        threads = [threading.Thread(target=_hog, args=(stop,), daemon=True) for _ in range(hogs)]
        for t in threads:
            t.start()
        try:
            rows = []

            def launch() -> None:
                s.spin_us(5)

            def every(n: int, fn):
                k = [0]

                def run() -> None:
                    fn()
                    k[0] += 1
                    if k[0] % n == 0:
                        dev.synchronize()

                return run

            end = time.perf_counter() + a.seconds
            rows.append(("launch", _per_call(every(50, launch), a.calls, end), ""))
            end = time.perf_counter() + a.seconds
            with asyncgpu.gpu_timer(dev):
                timed = _per_call(every(50, launch), a.calls, end)
            rows.append(("timed launch", timed, ""))

            exits = []
            end = time.perf_counter() + a.seconds
            for _ in range(max(1, a.calls // 10)):
                if time.perf_counter() > end:
                    break
                scope = asyncgpu.gpu_timer(dev)
                scope.__enter__()
                for _ in range(4):
                    s.spin_us(5)
                t0 = time.perf_counter_ns()
                scope.__exit__(None, None, None)
                exits.append((time.perf_counter_ns() - t0) / 1e3)
            rows.append(("scope exit", np.array(exits), ""))
            cal, failed = _calibrations(dev, max(1, a.calls // 10), time.perf_counter() + a.seconds)
            rows.append(("calibration", cal, f"{failed} failed"))
            if x is not None:
                import torch

                def add() -> None:
                    x.add_(1)

                end = time.perf_counter() + a.seconds
                rows.append(("torch add_", _per_call(every(50, add), a.calls, end), ""))
                torch.cuda.synchronize()
            for what, d, note in rows:
                if len(d) == 0:
                    print(f"{hogs:<13} {what:<13} {0:>5}")
                    continue
                q = np.percentile(d, [50, 90])
                print(f"{hogs:<13} {what:<13} {len(d):>5} {q[0]:>9.1f} {q[1]:>9.1f}  {note}")
        finally:
            stop.set()
            for t in threads:
                t.join()
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
