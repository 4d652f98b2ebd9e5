"""Where the demo's device tasks spend their time before their first launch: a log of the `Device` calls each
task makes (alloc, prepare, pinned allocation, launches, records) and of the timer's start, in ms from the
scope's start, per thread.

    python dev/diag_demo.py [--devices 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os as _os
import sys as _sys
import threading
import time

from asyncgpu._cli import main as _cli
from asyncgpu._runtime.device import Device
from asyncgpu._runtime.stream import Stream
from asyncgpu._timing import scope as _timer

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))  # the repository root
from benchmarks._common import tee_stdout_to

LOG: list[tuple[str, str, int, int]] = []


def logged(cls: type, name: str) -> None:
    real = getattr(cls, name)
    if getattr(real, "__code__", None) is not None and real.__code__.co_flags & 0x80:  # a coroutine function

        @functools.wraps(real)
        async def awrapper(self, *args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return await real(self, *args, **kwargs)
            finally:
                LOG.append((threading.current_thread().name, f"{_who(self)} {name}", t0, time.perf_counter_ns()))

        setattr(cls, name, awrapper)
        return

    @functools.wraps(real)
    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter_ns()
        try:
            return real(self, *args, **kwargs)
        finally:
            LOG.append((threading.current_thread().name, f"{_who(self)} {name}", t0, time.perf_counter_ns()))

    setattr(cls, name, wrapper)


def _who(obj: object) -> str:
    dev = getattr(obj, "device", obj)
    return getattr(dev, "name", type(obj).__name__)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--out", help="also write what is printed to this file")
    a = p.parse_args()
    tee_stdout_to(a.out)
    for name in ("alloc", "aalloc", "prepare", "aalloc_pinned", "record", "clock", "aclock", "mark_now"):
        logged(Device, name)
    for name in ("memset", "inc_loop", "copy_to_host"):
        logged(Stream, name)
    logged(_timer.Timer, "_start")
    with contextlib.redirect_stdout(io.StringIO()):
        _cli.main(["demo", "--devices", str(a.devices), "--no-trace", "-q", "--format", "json"])
    t0 = next(t for _, what, t, _ in LOG if what.endswith("_start"))
    for thread, what, s, e in sorted(LOG, key=lambda r: r[2]):
        if what.endswith("record") and (s - t0) > 2e9:
            continue
        print(f"{(s - t0) / 1e6:9.3f} {(e - t0) / 1e6:9.3f} {(e - s) / 1e6:8.3f} ms  {thread:<24} {what}")


if __name__ == "__main__":
    main()
