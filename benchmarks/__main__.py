"""python -m benchmarks [SUITE ...] [--out DIR] [--list] [--backend auto|cuda|host] [--quick] [--table FILE|DIR ...]

Runs the suites (default: every suite this machine can run), each script in a process of its own, its output
shown as it runs, and writes DIR/benchmarks-<UTC time>.json: the machine (``environment``) and, per suite, each
run's command, exit code, seconds, the script's own JSON (``result``) or text output (``text``), and its printed
output's tail. Exits 1 when a run failed. ``--table`` renders the table of current figures from such files.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._env import ROOT, environment, gpus
from benchmarks._suites import SUITES, Run, Suite

FORMAT = "asyncgpu-benchmarks/1"
HERE = Path(__file__).resolve().parent
TAIL_CHARS = 20_000


def _backend(asked: str) -> tuple[str, int]:
    """The backend the suites run on and the number of GPUs (0 on the host backend)."""
    if asked == "host" or (asked == "auto" and os.environ.get("ASYNCGPU_BACKEND") == "host"):
        return "host", 0
    n = len(gpus()[0])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # nvidia-smi lists every GPU of the host; the scripts see these
        n = min(n, len([v for v in visible.split(",") if v.strip()]))
    if asked == "cuda" or n:
        return "cuda", n
    return "host", 0


def plan(suite: Suite, backend: str, n_gpus: int, quick: bool) -> tuple[list[tuple[Run, list[str]]], str | None]:
    """The runs of a suite on this machine with their arguments (less --out), or why it cannot run here."""
    out = []
    for run in suite.runs(n_gpus):
        if backend == "host":
            if run.host_args is None:
                continue
            args = list(run.host_args)
        else:
            args = list(run.args)
        out.append((run, args + (list(run.quick_args) if quick else [])))
    if not out:
        return [], "needs a CUDA GPU" if backend == "host" else "nothing to run"
    return out, None


def _out_args(run: Run, raw: Path) -> tuple[list[str], Path]:
    stem = run.name.replace(", ", "-").replace(" ", "_")
    if run.out == "dir":
        d = raw / stem
        d.mkdir(parents=True, exist_ok=True)
        return ["--out", str(d)], d / f"{run.script.removesuffix('.py')}.json"
    path = raw / f"{stem}.{'txt' if run.out == 'text' else 'json'}"
    return ["--out", str(path)], path


def execute(run: Run, args: list[str], raw: Path, env: dict[str, str], limit_s: float) -> dict[str, Any]:
    """Runs one script in its own process, its output passed through as it comes; returns its record."""
    out_args, out_path = _out_args(run, raw)
    cmd = [sys.executable, str(HERE / run.script), *args, *out_args]
    print(f"\n== {run.name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(limit_s, proc.kill)
    timer.start()
    tail: list[str] = []
    size = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line)
        size += len(line)
        while size > TAIL_CHARS and len(tail) > 1:
            size -= len(tail.pop(0))
    rc = proc.wait()
    timed_out = not timer.is_alive() and rc != 0
    timer.cancel()
    rec: dict[str, Any] = {
        "name": run.name,
        "script": f"benchmarks/{run.script}",
        "argv": [*args, *out_args],
        "rc": rc,
        "timed_out": timed_out,
        "seconds": round(time.perf_counter() - t0, 3),
        "result": None,
        "text": None,
        "output_tail": "".join(tail),
    }
    if out_path.exists():
        body = out_path.read_text(encoding="utf-8", errors="replace")
        if run.out == "text":
            rec["text"] = body
        else:
            try:
                rec["result"] = json.loads(body)
            except ValueError as e:
                rec["text"] = f"(not JSON: {e})\n{body[:TAIL_CHARS]}"
    print(f"-- {run.name}: exit {rc}{' (timed out)' if timed_out else ''}, {rec['seconds']:.1f} s", flush=True)
    return rec


def list_suites(backend: str, n_gpus: int) -> None:
    where = f"{n_gpus} GPU(s)" if backend == "cuda" else "the host backend"
    print(f"suites (on this machine: {where}):")
    for s in SUITES.values():
        runs, why = plan(s, backend, n_gpus, quick=False)
        state = f"runs {', '.join(r.name for r, _ in runs)}" if runs else f"skipped here: {why}"
        print(f"  {s.name:<14}{s.what}\n  {'':<14}{state}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[1])
    ap.add_argument("suites", nargs="*", metavar="SUITE", help=f"any of: {', '.join(SUITES)} (default: every one)")
    ap.add_argument("--out", metavar="DIR", help="where the JSON goes (default: $OUT/benchmarks, else out/benchmarks)")
    ap.add_argument("--list", action="store_true", help="list the suites and what each runs here, run nothing")
    ap.add_argument("--backend", choices=("auto", "cuda", "host"), default="auto", help="auto: cuda when a GPU is seen")
    ap.add_argument("--quick", action="store_true", help="small sizes: checks that the scripts run, no figures")
    ap.add_argument("--limit", type=float, default=900, metavar="S", help="seconds each run may take (default 900)")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table of current figures from these files")
    a = ap.parse_args(argv)
    if a.table:
        from benchmarks import table

        return table.main(a.table)
    unknown = [s for s in a.suites if s not in SUITES]
    if unknown:
        ap.error(f"no suite {', '.join(unknown)}: the suites are {', '.join(SUITES)}")
    backend, n_gpus = _backend(a.backend)
    if a.list:
        list_suites(backend, n_gpus)
        return 0
    out = Path(a.out or Path(os.environ.get("OUT") or "out") / "benchmarks")  # out/ is ignored by git
    started = _dt.datetime.now(_dt.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    raw = out / f"raw-{stamp}"
    raw.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p))
    if backend == "host":
        env["ASYNCGPU_BACKEND"] = "host"
    doc: dict[str, Any] = {
        "format": FORMAT,
        "started": started.isoformat(timespec="seconds"),
        "finished": None,
        "argv": sys.argv[1:] if argv is None else argv,
        "quick": a.quick,
        "environment": environment(backend),
        "suites": {},
    }
    failed = False
    for name in a.suites or list(SUITES):
        suite = SUITES[name]
        runs, why = plan(suite, backend, n_gpus, a.quick)
        entry: dict[str, Any] = {"what": suite.what, "skipped": why, "runs": []}
        doc["suites"][name] = entry
        if why and not a.suites:
            print(f"\n== suite {name}: skipped ({why})", flush=True)
            continue
        if why:
            print(f"\n== suite {name}: cannot run here ({why})", flush=True)
            failed = True
            continue
        for run, args in runs:
            rec = execute(run, args, raw, env, a.limit)
            entry["runs"].append(rec)
            failed |= rec["rc"] != 0
    doc["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    path = out / f"benchmarks-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    print("\n== runs: suite, run, exit code, seconds")
    for name, entry in doc["suites"].items():
        for rec in entry["runs"]:
            print(f"{name:<14}{rec['name']:<28}{rec['rc']:>4}{rec['seconds']:>9.1f}")
        if entry["skipped"]:
            print(f"{name:<14}skipped: {entry['skipped']}")
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
