"""Where the truth for placement and durations lies, per device (every CUDA GPU of the machine):

A. The ping-pong's round trip and the reference it gives. The library's calibration kernel (stamp, system fence,
   ack) against a lean one whose 64-bit stamp *is* the acknowledgement (one posted write, no fence). Each ping
   says, by causality alone, that offset = stamp - host instant lies in [stamp - h1, stamp - h0]; the
   intersection over all pings is a reference whose uncertainty (half its width) is known without assuming the
   two directions are symmetric.
B. What one poll of a host word costs an SM (the GPU's own clock): the grain of the host->GPU direction.
C. The event pair's raw excess over CUPTI, per kind (kernel, memset, copies D2H/H2D/D2D), idle start and busy
   stream: what a per-kind correction would take out.
D. Placement: a kernel that stamps its first and last instant, timed by the events source, against the lean
   reference taken just before and after it; and the library's calibration offset against the reference.

    python dev/diag_placement.py [--pings 200] [--repeats 15] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import asyncgpu
from asyncgpu._runtime.clock import placement

LEAN = r"""
__device__ __forceinline__ unsigned long long gt() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
// The stamp is the acknowledgement: one 8-byte posted write to mapped host memory per ping.
extern "C" __global__ void lean_pingpong(const volatile unsigned int* flag, volatile unsigned long long* stamps,
                                         unsigned int first, unsigned int n) {
    for (unsigned int i = 0; i < n; ++i) {
        const unsigned int v = first + i;
        while ((int)(*flag - v) < 0) {}
        stamps[i] = gt();
        __threadfence_system();
    }
}
// n successive polls of a host word, each stamped: the SM's cost of one read over PCIe.
extern "C" __global__ void poll_cost(const volatile unsigned int* flag, unsigned long long* out, unsigned int n) {
    unsigned int acc = 0;
    out[0] = gt();
    for (unsigned int i = 1; i <= n; ++i) { acc += *flag; out[i] = gt(); }
    if (acc == 0xffffffffu) out[0] = 0;
}
"""


class Lean:
    """The lean ping-pong on one device, with its own stream and mapped page."""

    def __init__(self, dev: asyncgpu.Device) -> None:
        from cuda.core import LaunchConfig

        from asyncgpu._backends.cuda import compile_source

        self.bd = bd = dev._internal.bd
        code = compile_source(LEAN, bd.arch)
        bd.make_current()
        self.k_pp, self.k_poll = code.get_kernel("lean_pingpong"), code.get_kernel("poll_cost")
        self.cfg = LaunchConfig(grid=1, block=1)
        self.stream = bd.create_stream()
        self.page = bd.alloc_mapped(1 << 16)
        self.base = bd.device_pointer(self.page)
        self.next = 1

    def pings(self, n: int) -> np.ndarray:
        """(n, 3) int64: stamp, h0, h1."""
        bd, words = self.bd, self.page.words
        first = self.next
        self.next += n
        stamps = np.frombuffer(self.page.view, np.uint64, n, 4096)  # type: ignore[call-overload]
        stamps[:] = 0
        bd.launch(
            self.stream,
            self.k_pp,
            self.cfg,
            (np.uint64(self.base), np.uint64(self.base + 4096), np.uint32(first), np.uint32(n)),
        )
        time.sleep(0.002)  # the kernel runs and polls before the first flip
        clock = time.perf_counter_ns
        out = np.empty((n, 3), np.int64)
        for k in range(n):
            h0 = clock()
            words[0] = first + k
            while stamps[k] == 0:
                pass
            h1 = clock()
            out[k, 1], out[k, 2] = h0, h1
        bd.sync_stream(self.stream)
        out[:, 0] = stamps.astype(np.int64)
        return out

    def poll_cost(self, n: int = 256) -> np.ndarray:
        bd = self.bd
        out = bd.alloc(n + 1, np.uint64, self.stream)
        bd.launch(self.stream, self.k_poll, self.cfg, (np.uint64(self.base), np.uint64(int(out.handle)), np.uint32(n)))
        bd.sync_stream(self.stream)
        st = bd.to_numpy(out, n + 1, np.uint64).astype(np.int64)
        out.close()
        return np.diff(st)


def reference(p: np.ndarray) -> dict:
    """Offset (stamp - host) by intersection over pings and by the best ping, with bounds (ns)."""
    lo = p[:, 0] - p[:, 2]  # offset >= stamp - h1
    hi = p[:, 0] - p[:, 1]  # offset <= stamp - h0
    L, H = int(lo.max()), int(hi.min())
    rtt = p[:, 2] - p[:, 1]
    b = int(np.argmin(rtt))
    return {
        "n": len(p),
        "rtt_min_ns": float(rtt.min()),
        "rtt_p50_ns": float(np.median(rtt)),
        "best_offset_ns": int(p[b, 0] - (p[b, 1] + p[b, 2]) // 2),
        "best_bound_ns": float(rtt[b]) / 2,
        "int_offset_ns": (L + H) // 2,
        "int_bound_ns": (H - L) / 2,  # negative: the pings contradict each other (the clocks moved)
    }


def lib_pings(dev: asyncgpu.Device, n: int) -> np.ndarray:
    rows = []
    while n > 0:
        m = min(n, 63)
        pings, _ = dev._internal.bd.calibrate_globaltimer(m, 5_000_000)
        rows.append(pings)
        n -= m
    return np.concatenate(rows)


def part_ab(devs: list, n: int) -> dict:
    out = {}
    print(f"\n== A/B: ping-pong round trips and references ({n} pings), ns")
    head = f"{'dev':7} {'kernel':8} {'rtt min':>8} {'rtt p50':>8} {'best ±':>7} {'inters ±':>9} {'int-best':>9}"
    print(head + f" {'poll p50':>9}")
    for d in devs:
        lean = Lean(d)
        lean.pings(8)  # warm
        res = {}
        res["library"] = reference(lib_pings(d, n))
        res["lean"] = reference(lean.pings(n))
        poll = lean.poll_cost()
        res["poll_ns"] = {"p50": float(np.median(poll)), "min": float(poll.min()), "max": float(poll.max())}
        res["lean_minus_library_offset_ns"] = res["lean"]["int_offset_ns"] - res["library"]["int_offset_ns"]
        for name in ("library", "lean"):
            r = res[name]
            print(
                f"{d.name:7} {name:8} {r['rtt_min_ns']:8.0f} {r['rtt_p50_ns']:8.0f} {r['best_bound_ns']:7.0f} "
                f"{r['int_bound_ns']:9.0f} {r['int_offset_ns'] - r['best_offset_ns']:9.0f} {res['poll_ns']['p50']:9.0f}"
            )
        out[d.name] = res
        d._lean = lean
    return out


def part_c(devs: list, repeats: int) -> dict:
    n = 10_000_000
    out = {}
    print(f"\n== C: event pair's raw excess over CUPTI (µs), p50 [min, max] of {repeats}; calibration's overhead")
    for d in devs:
        s = d.stream
        a, b = d.alloc(n, np.float32), d.alloc(n, np.float32)
        small = d.alloc(n // 8, np.float32)
        host = d.alloc_pinned(n, np.float32)
        cases = {
            "spin 30us": (s.spin_us, 30),
            "inc_loop": (s.inc_loop, a, 50),
            "memset 40MB": (s.memset, a, 0),
            "memset 5MB": (s.memset, small, 0),
            "D2H 40MB": (s.copy_to_host, a, host),
            "D2D 40MB": (s.copy, b, a),
        }
        for fn, *args in cases.values():
            fn(*args)
        d.synchronize()
        cal = d.clock()
        print(f"{d.name}: calibration overhead (ns) {cal.bracket_overhead_by_kind_ns} ({cal.bracket_overhead_source})")
        res = {}
        for name, (fn, *args) in cases.items():
            for state in ("idle", "busy"):
                xs = []
                for _ in range(repeats):
                    d._internal.forget_pair_excess()  # (the calibration's overheads, not what the CUPTI scopes teach)
                    d.synchronize()
                    with asyncgpu.gpu_timer(d, source="cupti") as outer:
                        with asyncgpu.gpu_timer(d, source="events", subtract_overhead=False) as inner:
                            if state == "busy":
                                s.spin_us(500)
                            fn(*args)
                    k = 1 if state == "busy" else 0
                    xs.append((inner.timeline.duration_ns[k] - outer.timeline.duration_ns[k]) / 1e3)
                x = np.array(xs)
                kind = (
                    "memset"
                    if "memset" in name
                    else "memcpy_d2d"
                    if "D2D" in name
                    else "memcpy"
                    if "2" in name
                    else "kernel"
                )
                err = x - placement(d).cuts[kind] / 1e3  # what the events source reports, less CUPTI
                res[f"{name} {state}"] = {
                    "p50": float(np.median(x)),
                    "min": float(x.min()),
                    "max": float(x.max()),
                    "error_p50": float(np.median(err)),
                    "error_max_abs": float(np.abs(err).max()),
                }
                print(
                    f"  {name:12} {state:5} {np.median(x):6.2f} [{x.min():6.2f}, {x.max():6.2f}]   net error p50 "
                    f"{np.median(err):+6.2f} max|.| {np.abs(err).max():5.2f}"
                )
        res["calibration_overhead_ns"] = cal.bracket_overhead_ns
        out[d.name] = res
        for arr in (a, b, small):
            arr.free()
    return out


def part_d(devs: list, repeats: int, n: int) -> dict:
    out = {}
    print("\n== D: placement against the lean reference (µs); reference ± and library calibration's ±")
    for d in devs:
        from asyncgpu._backends.cuda import unheld

        lean, bd = d._lean, d._internal.bd
        kernel = bd._kernel("asyncgpu_clock_bracket")
        from cuda.core import LaunchConfig

        cfg = LaunchConfig(grid=1, block=1)
        stamps_buf = d.alloc(2, np.uint64)
        rows = []
        for _ in range(repeats):
            d.synchronize()
            cal = d.clock(refresh=True)
            r0 = reference(lean.pings(n // 2))
            active = unheld.ACTIVE[0]  # (a synchronizing call runs in some thread: launches are not held meanwhile)
            with asyncgpu.gpu_timer(d, source="events") as t:
                d.stream.launch(kernel, cfg, np.uint64(20_000), np.uint64(stamps_buf.ptr), name="bracket")
                active += unheld.ACTIVE[0]
            r1 = reference(lean.pings(n // 2))
            st = stamps_buf.to_numpy().astype(np.int64)
            off = (r0["int_offset_ns"] + r1["int_offset_ns"]) / 2
            ref_bound = max(r0["int_bound_ns"], r1["int_bound_ns"]) + abs(r0["int_offset_ns"] - r1["int_offset_ns"]) / 2
            tl = t.timeline
            start, end = float(tl.start_ns[0]), float(tl.start_ns[0] + tl.duration_ns[0])
            g_start, g_end = st[0] - off, st[1] - off
            lib_off = cal.globaltimer_offset_ns
            rows.append(
                {
                    "start_minus_ref_ns": start - g_start,
                    "end_minus_ref_ns": end - g_end,
                    "ref_bound_ns": ref_bound,
                    "lib_gt_offset_minus_ref_ns": (lib_off - off) if lib_off is not None else None,
                    "lib_gt_bound_ns": cal.globaltimer_bound_ns,
                    "lib_bound_ns": cal.bound_ns,
                    "anchor_source": cal.anchor_source,
                    "synchronizing_call_around_the_launch": bool(active),
                }
            )
        stamps_buf.free()
        s = np.array([r["start_minus_ref_ns"] for r in rows]) / 1e3
        e = np.array([r["end_minus_ref_ns"] for r in rows]) / 1e3
        rb = np.array([r["ref_bound_ns"] for r in rows]) / 1e3
        lg = np.array([r["lib_gt_offset_minus_ref_ns"] for r in rows], dtype=float) / 1e3
        lb = np.array([r["lib_gt_bound_ns"] for r in rows], dtype=float) / 1e3
        eb = np.array([r["lib_bound_ns"] for r in rows], dtype=float) / 1e3
        print(
            f"{d.name}: start p50 {np.median(s):+.2f} [{s.min():+.2f}, {s.max():+.2f}]  end p50 {np.median(e):+.2f} "
            f"[{e.min():+.2f}, {e.max():+.2f}]  ref ± p50 {np.median(rb):.2f} max {rb.max():.2f}\n"
            f"        library gt offset - ref p50 {np.nanmedian(lg):+.2f} [{np.nanmin(lg):+.2f}, {np.nanmax(lg):+.2f}] "
            f"stated ± p50 {np.nanmedian(lb):.2f}; events anchor ± p50 {np.median(eb):.2f} "
            f"({sum(r['anchor_source'] == 'kernel' for r in rows)}/{len(rows)} kernel anchors)"
        )
        for i, r in enumerate(rows):
            if abs(r["start_minus_ref_ns"]) > 2000 or abs(r["end_minus_ref_ns"]) > 2000:
                print(
                    f"        repeat {i}: start {r['start_minus_ref_ns'] / 1e3:+.2f} end "
                    f"{r['end_minus_ref_ns'] / 1e3:+.2f} µs; a synchronizing call around the launch: "
                    f"{r['synchronizing_call_around_the_launch']}"
                )
        out[d.name] = rows
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pings", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out")
    p.add_argument("--parts", default="abcd")
    a = p.parse_args()
    devs = asyncgpu.devices("cuda")
    print(", ".join(f"{d.name} {d.description}" for d in devs))
    for d in devs:
        d.clock()
    res: dict = {"devices": [d.description for d in devs]}
    if "a" in a.parts or "b" in a.parts or "d" in a.parts:
        res["ab"] = part_ab(devs, a.pings)
    if "c" in a.parts:
        res["c"] = part_c(devs, a.repeats)
    if "d" in a.parts:
        res["d"] = part_d(devs, a.repeats, a.pings)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "diag_placement.json"), "w") as f:
            json.dump(res, f, indent=1, default=float)
    asyncgpu.close_all()


if __name__ == "__main__":
    main()
