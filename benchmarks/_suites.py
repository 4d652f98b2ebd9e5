"""The suites: which scripts each runs, with which arguments on CUDA and on the host backend, and the figures the
table takes from their results.

A suite's ``runs(n_gpus)`` lists its runs (one script with its arguments each); ``figures(runs)`` takes the runs'
records (by label) and returns ``(what, value)`` rows for the table, where ``value`` is already text. A figure
whose data is missing is left out (the table says "—").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]


@dataclass(frozen=True)
class Run:
    script: str  # a file of benchmarks/
    args: tuple[str, ...] = ()  # on CUDA
    host_args: tuple[str, ...] | None = None  # on the host backend; None: CUDA only
    quick_args: tuple[str, ...] = ()  # added with --quick (small sizes: a check that it runs, not a figure)
    out: str = "json"  # how --out is given: "json" a JSON file, "dir" a folder (DIR/<script>.json), "text" a text file
    label: str = ""  # the run's name in its suite (default: the script's name)

    @property
    def name(self) -> str:
        return self.label or self.script.removesuffix(".py")


@dataclass(frozen=True)
class Suite:
    name: str
    what: str
    runs: Callable[[int], list[Run]]  # from the number of GPUs (0 on the host backend)
    figures: Callable[[dict[str, Record]], list[tuple[str, str]]] = field(default=lambda runs: [])


def _n(x: float, nd: int = 1) -> str:
    return f"{x:,.{nd}f}"


def _result(runs: dict[str, Record], name: str) -> Any:
    rec = runs.get(name)
    return None if rec is None or rec.get("rc") != 0 else rec.get("result")


def _guard(fn: Callable[[], list[tuple[str, str]]]) -> list[tuple[str, str]]:
    try:
        return fn()
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, AttributeError):
        return []


# -- waits ----------------------------------------------------------------------------------------------------------
def _waits(runs: dict[str, Record]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    w = _result(runs, "bench_wait")
    if w:

        def single() -> list[tuple[str, str]]:
            cells = [
                f"{r['loop']} {_n(r['p50_us'])} / {_n(r['p99_us'])}"
                for r in w["single_wait"]
                if r["route"].startswith("asyncgpu")
            ]
            return [("single wait, 200 µs kernel: excess p50 / p99, µs (asyncgpu)", ", ".join(cells))]

        def cost() -> list[tuple[str, str]]:
            hc = w["host_cost"]
            rec = next(v for k, v in hc.items() if k.startswith("asyncgpu dev.record()"))
            return [
                (
                    "host cost of `dev.record()`",
                    f"{_n(rec['ns'] / 1e3, 2)} µs ({_n(rec['x_raw_binding_record'], 2)}× raw cuEventRecord)",
                )
            ]

        rows += _guard(single) + _guard(cost)
    ld = _result(runs, "bench_load")
    if ld:

        def load() -> list[tuple[str, str]]:
            cells = [
                f"{r['case']} {_n(r['p50_us'], 0)} / {_n(r['p99_us'], 0)}"
                for r in ld["cases"]
                if r["route"] == "asyncgpu" and r["loop"] == "asyncio"
            ]
            return (
                [("waits under load (asyncgpu, asyncio): excess p50 / p99, µs per case", ", ".join(cells))]
                if cells
                else []
            )

        def ticker() -> list[tuple[str, str]]:
            cells = [f"{t['loop']} {_n(t['late_max_ms'], 2)} ms" for t in ld["ticker"]]
            return [("1 ms ticker beside 10,000 events behind a hold: latest tick", ", ".join(cells))] if cells else []

        rows += _guard(load) + _guard(ticker)
    return rows


# -- timing accuracy ------------------------------------------------------------------------------------------------
def _timing(runs: dict[str, Record]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    acc = _result(runs, "bench_accuracy")
    if acc:

        def errs() -> list[tuple[str, str]]:
            cases = acc["part0"]["cupti_vs_events"]
            p50 = [c["events_err_us_p50"] for c in cases]
            worst = max(c["events_err_us_max_abs"] for c in cases)
            return [
                (
                    "events − CUPTI per kind, idle start (asyncgpu's CUPTI source): p50 range, max |err|",
                    f"{min(p50):+.2f} to {max(p50):+.2f} µs, max {worst:.2f} µs",
                )
            ]

        def users() -> list[tuple[str, str]]:
            """The cases users hit (idle, busy stream, after an await, first launches, the demo), held as the
            library holds them, against torch.profiler: the busy stream's bias shows here, not in the idle row."""
            cases = [c for c in acc["part1"]["cases"] if c["hold"] == "always"]
            if not cases:
                return []
            lo, hi = min(cases, key=lambda c: c["err_us_p50"]), max(cases, key=lambda c: c["err_us_p50"])
            worst = max(c["err_us_max_abs"] for c in cases)
            share = min(c["within_tolerance_ge_5us"] for c in cases)
            return [
                (
                    "events − CUPTI, the cases users hit (idle, busy stream, after an await, first launch, the demo): "
                    "p50 range, max |err|, worst case's share within max(1 %, 1 µs)",
                    f"{lo['err_us_p50']:+.2f} ({lo['case']}) to {hi['err_us_p50']:+.2f} µs ({hi['case']}), max "
                    f"{worst:.2f} µs, {_n(share * 100, 1)} %",
                )
            ]

        def overhead() -> list[tuple[str, str]]:
            cells = [f"{d} {_n(v / 1e3, 2)} µs" for d, v in acc["overhead_ns"].items()]
            return [("the event pair's own overhead", ", ".join(cells))]

        def back_to_back() -> list[tuple[str, str]]:
            """Back-to-back spins on every GPU at once, against torch.profiler's CUPTI and (where measured)
            against asyncgpu's own CUPTI source: the two truths side by side."""
            kineto = [r["diff_ns_median"] / 1e3 for r in acc["rows"]]
            cell = (
                f"vs torch.profiler {min(kineto):+.2f} to {max(kineto):+.2f} µs "
                f"({_n(acc['share_within_tolerance_ge_20us'] * 100, 1)} % of ≥ 20 µs within max(1 %, 1 µs))"
            )
            own = acc.get("against_own_cupti")
            if isinstance(own, list) and own:
                mine = [r["diff_ns_median"] / 1e3 for r in own]
                cell += f"; vs asyncgpu's CUPTI source {min(mine):+.2f} to {max(mine):+.2f} µs"
            n = len(acc["devices"])
            return [(f"kernel durations, back-to-back spins on {n} GPUs at once: events − CUPTI p50 range", cell)]

        rows += _guard(errs) + _guard(users) + _guard(overhead) + _guard(back_to_back)
    clk = _result(runs, "bench_clock")
    if clk:

        def align() -> list[tuple[str, str]]:
            gt = clk["ground_truth"]
            s = gt["summary"]
            cell = (
                f"`%globaltimer` {_n(s['aligned']['median_abs_ns'] / 1e3, 2)} / "
                f"{_n(s['aligned']['max_abs_ns'] / 1e3, 2)} µs, "
                f"events {_n(s['events_aligned']['median_abs_ns'] / 1e3, 2)} / "
                f"{_n(s['events_aligned']['max_abs_ns'] / 1e3, 2)} µs"
            )
            if gt.get("peer_pairs"):  # (GPU-to-GPU pings: asyncgpu's own error, the flag's reading left out)
                pa, pe = s["peer_aligned"], s["peer_events_aligned"]
                cell += (
                    f"; against GPU-to-GPU pings: `%globaltimer` {_n(pa['median_abs_ns'] / 1e3, 2)} / "
                    f"{_n(pa['max_abs_ns'] / 1e3, 2)} µs, events {_n(pe['median_abs_ns'] / 1e3, 2)} / "
                    f"{_n(pe['max_abs_ns'] / 1e3, 2)} µs"
                )
            own = clk.get("ground_truth_own_bracket")
            if own:  # (the same trials' events anchored at each calibration's own kernel-exit bracket)
                e = own["summary"]["events_aligned"]
                cell += f" (anchored by each calibration's own bracket: {_n(e['median_abs_ns'] / 1e3, 2)} / "
                cell += f"{_n(e['max_abs_ns'] / 1e3, 2)} µs)"
            label = f"{len(gt['devices'])} GPUs, one instant ({gt['trials']} trials): |disagreement| with the first"
            return [(f"{label}, p50 / max", cell)]

        def calib() -> list[tuple[str, str]]:
            cells = [
                f"{c['device']} {_n(c['rtt_ns'] / 1e3, 1)} µs, ±{_n(c['globaltimer_bound_ns'] / 1e3, 2)}"
                for c in clk["calibrations"]
            ]
            what = "calibration: the events pings' best round trip, the `%globaltimer` offset's stated ± bound"
            return [(what, ", ".join(cells))]

        rows += _guard(align) + _guard(calib)
    return rows


# -- orchestration --------------------------------------------------------------------------------------------------
def _orchestration(runs: dict[str, Record]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for name in sorted(runs):
        res = _result(runs, name)
        if not res:
            continue
        gpus = name.split(", ")[-1] if ", " in name else ""
        if name.startswith("bench_workers"):

            def workers(res: Any = res, gpus: str = gpus) -> list[tuple[str, str]]:
                m = res["median_steps_per_s"]
                loop = m["loop thread"]
                cell = (
                    f"{_n(res['ratio_workers_vs_loop'], 2)}× ({res['loop']}); plain threads "
                    f"{_n(m['plain threads (peer)'] / loop, 2)}×"
                )
                return [(f"launch workers: steps/s vs one loop thread, {gpus}", cell)]

            rows += _guard(workers)
        elif name.startswith("bench_balance"):

            def balance(res: Any = res, gpus: str = gpus) -> list[tuple[str, str]]:
                pred, wall = res["uneven"]["predicted_ms"], res["resplit"]["wall_ms"]
                return [
                    (
                        f"balance: re-split's wall makespan vs the prediction, {gpus}",
                        f"{100 * (wall / pred - 1):+.1f} %",
                    )
                ]

            rows += _guard(balance)
    return rows


# -- steps ----------------------------------------------------------------------------------------------------------
def _steps(runs: dict[str, Record]) -> list[tuple[str, str]]:
    res = _result(runs, "bench_steps")
    if not res:
        return []

    def ratios() -> list[tuple[str, str]]:
        out = []
        for loop, modes in res["results"].items():
            bare = modes["bare"]["median_ms"]
            cells, spread = [], "95 % CI"
            for m, v in modes.items():
                if m != "bare":
                    lo, hi = v.get("ratio_ci95") or (min(v["paired_ratios"]), max(v["paired_ratios"]))
                    spread = "95 % CI" if "ratio_ci95" in v else "min, max"  # (runs before the interval: their range)
                    cells.append(f"{m} {_n(v['ratio_to_bare'], 3)}× [{_n(lo, 3)}, {_n(hi, 3)}]")
            what = f"step timing: step time vs bare, median of paired ratios [{spread}], {loop} loop"
            out.append((what, f"bare {_n(bare, 2)} ms: " + ", ".join(cells)))
        return out

    def cost() -> list[tuple[str, str]]:
        h = res["host_cost_per_step"]
        cell = (
            f"{_n(h['enter_exit_us']['median'], 1)} µs on the loop's thread, "
            f"{_n(h['harvest_us']['median'], 1)} µs on the harvest thread"
        )
        n = h["devices"]
        return [(f"step timing's host cost per step, {n} device{'s' if n != 1 else ''}, no work", cell)]

    def harvest() -> list[tuple[str, str]]:
        cells = []
        for loop, r in res["harvest_thread"].items():
            cells.append(
                f"{loop} {r['share_pct']:+.2f} % ({r['harvests']} harvests, {r['calibrations']} clock calibrations "
                f"in {_n(r['wall_s'], 1)} s)"
            )
        what = "step timing: the harvest thread's share of the loop's time (steps that overlap its harvests)"
        return [(what, "; ".join(cells))] if cells else []

    def always_on() -> list[tuple[str, str]]:
        cells = [
            f"{loop} {a['total_pct']:+.2f} % (marks {a['marks_pct']:+.2f} %, by phase {a['phases_pct']:+.2f} %; "
            f"harvest thread {a['harvest_pct']:+.2f} %)"
            for loop, a in res.get("always_on", {}).items()
            if a["total_pct"] is not None  # (a run without the harvest share is no always-on figure)
        ]
        n = len(res["devices"])
        what = f"step timing, always on, {n} device{'s' if n != 1 else ''}: the marks plus the harvest thread"
        return [(what, "; ".join(cells))] if cells else []

    return _guard(ratios) + _guard(cost) + _guard(harvest) + _guard(always_on)


# -- analysis at scale ----------------------------------------------------------------------------------------------
def _analysis(runs: dict[str, Record]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for name in ("bench_scale", "bench_report", "bench_trace"):
        rec = runs.get(name)
        if rec and rec.get("rc") == 0 and rec.get("text"):
            lines = [
                ln.split(": ", 1)[1] for ln in rec["text"].splitlines() if ln.startswith(("targets: ", "target: "))
            ]
            if lines:
                rows.append((f"{name}: targets", "; ".join(lines)))
    mem = _result(runs, "bench_memory")
    if mem:
        rows += _guard(
            lambda: [
                (
                    f"memory a scope holds per activity ({mem['backend']} backend)",
                    f"{_n(mem['held_bytes_per_activity'], 0)} B; "
                    f"{_n(mem['dropped_bytes_per_activity'], 0)} B once the timer is dropped",
                )
            ]
        )
    return rows


# -- handoff, kernel profiler, peers, gather ------------------------------------------------------------------------
def _handoff(runs: dict[str, Record]) -> list[tuple[str, str]]:
    res = _result(runs, "bench_handoff")
    if not res:
        return []

    def rows() -> list[tuple[str, str]]:
        out = []
        for side, what in (("host", "host-side take"), ("gpu", "GPU-side take (stream waits)")):
            cells = [
                f"{k.removeprefix(side + ': ')} {_n(v['p50_us'], 0)} µs"
                for k, v in res["routes"].items()
                if k.startswith(side + ":")
            ]
            if cells:
                out.append(
                    (f"handoff, GPU ready → consumer running, p50, {res['items']} items: {what}", ", ".join(cells))
                )
        return out

    return _guard(rows)


def _kprofile(runs: dict[str, Record]) -> list[tuple[str, str]]:
    res = _result(runs, "bench_kprofile")
    if not res:
        return []

    def shape(r: dict[str, Any]) -> str:
        return r["shape"] + (f", {r['work_fma']} FMA" if r.get("work_fma") else "")

    def cost() -> list[tuple[str, str]]:
        cells = [f"{shape(r)} {_n(r['ns_per_record'], 0)} ns" for r in res["device_cost"]]
        return [("in-kernel records: device cost per record", ", ".join(cells))]

    def dec() -> list[tuple[str, str]]:
        cells = [f"{r['decoder']} {_n(r['M_records_per_s'], 0)} M/s" for r in res["decode"]]
        return [("in-kernel records: decode", ", ".join(cells))]

    return _guard(cost) + _guard(dec)


def _peers(runs: dict[str, Record]) -> list[tuple[str, str]]:
    res = _result(runs, "bench_peers")
    if not res:
        return []

    def rows() -> list[tuple[str, str]]:
        out = []
        for wl, peers in res["workloads"].items():
            out.append((f"peers, {wl}: median µs", ", ".join(f"{p} {_n(v['median_us'], 1)}" for p, v in peers.items())))
        return out

    return _guard(rows)


def _gather(runs: dict[str, Record]) -> list[tuple[str, str]]:
    res = _result(runs, "bench_gather")
    if not res:
        return []
    return _guard(
        lambda: [
            (
                f"gather, {res['ranks']} simulated ranks × {res['devices_per_rank']} devices × {res['per_device']:,}",
                f"root {_n(res['root_s'], 2)} s; {_n(res['payload_bytes_per_activity'], 0)} B sent, "
                f"{_n(res['held_bytes_per_activity'], 0)} B held per activity",
            )
        ]
    )


def _orchestration_runs(n_gpus: int) -> list[Run]:
    if n_gpus == 0:  # the host backend: two host devices
        counts = [2]
    else:
        counts = [n for n in (2, 4, 8) if n_gpus >= n] or [1]
    runs = []
    for n in counts:
        label = f"{n} GPU" + ("s" if n > 1 else "")
        host = ("--backend", "host", "--devices", str(n))
        runs.append(
            Run(
                "bench_workers.py",
                ("--devices", str(n)),
                host,
                ("--steps", "20", "--repeat", "1"),
                label=f"bench_workers, {label}",
            )
        )
        if n > 1:
            runs.append(
                Run(
                    "bench_balance.py",
                    ("--devices", str(n)),
                    host,
                    ("--repeat", "1", "--units", "12"),
                    label=f"bench_balance, {label}",
                )
            )
    return runs


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite(
            "waits",
            "wake-up latency and CPU of one wait against its peers, the host cost of a record, waits under load",
            lambda n: [
                Run(
                    "bench_wait.py",
                    quick_args=("--iters", "50", "--warmup", "5", "--in-flight", "200", "--waits", "2000"),
                ),
                Run(
                    "bench_load.py",
                    ("--queue", "--cost", "--ticker"),
                    quick_args=("--cases", "100@8k", "--loops", "asyncio"),
                ),
            ],
            _waits,
        ),
        Suite(
            "timing",
            "timing accuracy: durations against CUPTI and what timing costs; clock alignment, calibration, drift",
            lambda n: [
                Run("bench_accuracy.py"),
                Run("bench_clock.py", quick_args=("--trials", "5")),
            ],
            _timing,
        ),
        Suite(
            "orchestration",
            "launch workers against one loop thread, and the balance report's re-split, on 2, 4 and 8 GPUs",
            _orchestration_runs,
            _orchestration,
        ),
        Suite(
            "steps",
            "step timing's overhead on a host-bound and a GPU-bound training loop, against torch.profiler",
            lambda n: [
                Run(
                    "bench_steps.py",
                    ("--repeat", "20", "--steps", "40", "--cupti-repeat", "8"),
                    ("--backend", "host"),
                    ("--steps", "5", "--warmup", "2", "--repeat", "1", "--neighbours", "4"),
                    out="dir",
                )
            ],
            _steps,
        ),
        Suite(
            "analysis",
            "summaries, reports and traces of millions of activities; memory a scope leaves behind (host work)",
            lambda n: [
                Run("bench_scale.py", (), (), ("--devices", "2", "--per-device", "2000", "--repeat", "1"), out="text"),
                Run(
                    "bench_report.py",
                    (),
                    (),
                    ("--activities", "2000", "--repeat", "1", "--rich-table", "20"),
                    out="text",
                ),
                Run(
                    "bench_trace.py",
                    (),
                    (),
                    ("--devices", "2", "--activities", "2000", "--big", "0", "--repeat", "1"),
                    out="text",
                ),
                Run("bench_memory.py", (), ("--backend", "host"), ("--activities", "1000")),
            ],
            _analysis,
        ),
        Suite(
            "handoff",
            "Channel: GPU ready → consumer running, against a queue.Queue baseline, per consumer kind",
            lambda n: [Run("bench_handoff.py", (), ("--backend", "host"), ("--items", "20", "--small", "200"))],
            _handoff,
        ),
        Suite(
            "kprofile",
            "in-kernel records: device cost per record and region, decode throughput",
            lambda n: [Run("bench_kprofile.py", quick_args=("--regions", "200", "--repeats", "3"))],
            _kprofile,
        ),
        Suite(
            "peers",
            "asyncgpu's bench against cupyx.profiler.benchmark and triton's do_bench; two GPUs at once",
            lambda n: [Run("bench_peers.py", (), ("--backend", "host"), ("--n-repeat", "10", "--max-duration", "0.2"))],
            _peers,
        ),
        Suite(
            "gather",
            "multi-process gather: root time, bytes sent and held per activity (simulated ranks in one process)",
            lambda n: [
                Run(
                    "bench_gather.py",
                    (),
                    (),
                    ("--ranks", "2", "--devices", "1", "--per-device", "100", "--marks", "5", "--repeat", "1"),
                )
            ],
            _gather,
        ),
    )
}
