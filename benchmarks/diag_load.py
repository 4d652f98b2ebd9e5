"""Where the time goes in bench_load's cases: the completion engine's steps, logged against the kernels' end stamps.

    PYTHONPATH=$PWD python benchmarks/diag_load.py 1000@150k[,N@RATE...] [asyncio,uvloop,trio] [repetitions]

Wraps the engine's collect / dispatch / resume / arm / pause (a diagnostic: it patches asyncgpu._runtime.engine) and
prints, per case and repetition, the first hand-overs after the first completion, the three latest waits with every
engine step around them, and the gaps between the waiter thread's and the loop's looks. Needs a CUDA GPU.
"""

import collections
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_load as B  # noqa: E402
import numpy as np  # noqa: E402

import asyncgpu  # noqa: E402
from asyncgpu._runtime import engine as E  # noqa: E402

_now = time.perf_counter_ns
LOG = []


def log(*a):
    LOG.append((_now(), threading.current_thread().name[:14], *a))


oc = E.Engine.collect


def collect(self, skip_covered=False, **kw):
    t0 = _now()
    f = oc(self, skip_covered, **kw)
    LOG.append(
        (t0, threading.current_thread().name[:14], "collect-T" if skip_covered else "collect-P", len(f), _now() - t0)
    )
    return f


E.Engine.collect = collect
od = E.Engine.dispatch


def dispatch(self, w, linger_ns, here=None):
    t0 = _now()
    od(self, w, linger_ns, here)
    LOG.append((t0, threading.current_thread().name[:14], "dispatch", len(w), _now() - t0))


E.Engine.dispatch = dispatch
orr = E._resume


def res(kind, items, then=None, start=0):
    t0 = _now()
    orr(kind, items, then, start)
    LOG.append((t0, threading.current_thread().name[:14], "resume", len(items), _now() - t0))


E._resume = res
oa = E._arm


def arm(kind, loop, engine, until, sent):
    LOG.append((_now(), threading.current_thread().name[:14], "arm", (until - _now()) // 1000, (_now() - sent) // 1000))
    oa(kind, loop, engine, until, sent)


E._arm = arm
op = E.Engine._pause


def pause(self):
    t0 = _now()
    op(self)
    LOG.append((t0, threading.current_thread().name[:14], "pause", 0, _now() - t0))


E.Engine._pause = pause
HOST = []
EXC = []
ost = B._stats


def stats(excess_ns):
    EXC.append(list(excess_ns))
    return ost(excess_ns)


B._stats = stats
oth = B.to_host


def to_host(stamps, before, after):
    h = oth(stamps, before, after)
    HOST.append(h)
    return h


B.to_host = to_host


def main():
    cases = [(int(c.split("@")[0]), c.split("@")[1]) for c in sys.argv[1].split(",")]
    loops = sys.argv[2].split(",") if len(sys.argv) > 2 else ["asyncio"]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    devs = asyncgpu.devices()
    d = devs[0]
    truth = B.Truth(d, 20000)
    for _ in range(3):
        truth.offset(3)
    streams = {}
    for n, rn in cases:
        ns = max(8, -(-n // 300))
        if ns not in streams:
            streams[ns] = [d.create_stream() for _ in range(ns)]
        setups = [(d, truth, streams[ns])]
        for lp in loops:
            for rep in range(reps):
                LOG.clear()
                HOST.clear()
                EXC.clear()
                row = B.run_case(lp, "asyncgpu", setups, n, B.RATES[rn], ns)
                h = HOST[0]
                burst = B.RATES[rn] is None
                ends = np.sort(h[: (ns if burst else n)])
                t0 = ends[0]
                print(
                    f"== {n}@{rn} {lp} rep {rep}: p50 {row['p50_us']:.1f} p90 {row['p90_us']:.1f} "
                    f"p99 {row['p99_us']:.1f} max {row['max_us']:.1f}; ends span {(ends[-1] - t0) / 1e3:.1f} us"
                )
                ev = sorted(LOG)
                # summary counts per kind in window
                win = [e for e in ev if t0 - 3e6 <= e[0] <= ends[-1] + 20e6]
                cnt = collections.Counter((e[1], e[2]) for e in win)
                print("   counts:", dict(cnt))
                fired = [
                    (e[0], e[1], e[2], e[3], e[4])
                    for e in win
                    if (e[2].startswith("collect") and e[3]) or e[2] in ("resume", "arm", "dispatch")
                ]
                for e in fired[:40]:
                    took = e[4] / 1e3 if isinstance(e[4], int) and e[2] != "arm" else e[4]
                    print(f"   {(e[0] - t0) / 1e3:9.1f} us  {e[1]:14s} {e[2]:10s} {e[3]!s:>6s} {took!s:>8}")
                if len(fired) > 40:
                    print(f"   ... {len(fired) - 40} more; last at {(fired[-1][0] - t0) / 1e3:.1f} us")
                if not burst and EXC:
                    ex = np.array(EXC[0], dtype=np.float64)
                    ends_i = h[:n]
                    worst = np.argsort(ex)[-3:][::-1]
                    for j in worst:
                        e_end, e_woke = ends_i[j], ends_i[j] + ex[j]
                        print(f"   worst wait {j} (stream {j % ns}): late {ex[j] / 1e3:.1f} us")
                        for e in ev:
                            if e_end - 300e3 <= e[0] <= e_woke + 50e3:
                                at_us = (e[0] - e_end) / 1e3
                                print(f"      {at_us:9.1f} us  {e[1]:14s} {e[2]:10s} {e[3]!s:>6s} {e[4]!s:>8}")
                # gaps in thread collects around the burst
                tc = [e[0] for e in win if e[2] == "collect-T"]
                pc = [e[0] for e in win if e[2] == "collect-P"]
                for name, xs in (("thread collects", tc), ("poller collects", pc)):
                    xs = np.array(xs)
                    near = xs[(xs > t0 - 1e6) & (xs < ends[-1] + 5e6)]
                    if near.size > 1:
                        g = np.diff(near) / 1e3
                        first = (near[near >= t0][0] - t0) / 1e3 if (near >= t0).any() else None
                        print(
                            f"   {name}: {near.size} in window, gap p50 {np.median(g):.1f} max {g.max():.1f} us; "
                            f"first after t0 {first}"
                        )
                    else:
                        print(f"   {name}: {near.size} in window")
    truth.close()
    asyncgpu.close_all()


main()
