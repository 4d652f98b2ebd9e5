"""The benchmark runner on the host backend: its list, one cheap suite end to end (the JSON it writes and the
table rendered from it), and what it says for a suite this machine cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _runner(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, ASYNCGPU_BACKEND="host")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_list_names_every_suite_and_what_runs_here():
    from benchmarks._suites import SUITES

    p = _runner("benchmarks", "--list")
    assert p.returncode == 0, p.stderr
    assert "the host backend" in p.stdout
    for name in SUITES:
        assert f"  {name} " in p.stdout
    assert "skipped here: needs a CUDA GPU" in p.stdout  # waits, timing, kprofile
    assert 2 <= len(SUITES) <= 10


def test_a_quick_host_suite_writes_json_with_the_environment_and_a_table(tmp_path):
    p = _runner("benchmarks", "gather", "steps", "--quick", "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (path,) = tmp_path.glob("benchmarks-*.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "asyncgpu-benchmarks/1" and doc["quick"] is True
    env = doc["environment"]
    assert env["backend"] == "host" and env["python"]
    assert env["commit"] and env["gpu_model"]
    assert {"asyncgpu", "numpy", "anyio", "torch", "cupti-python", "cuda-core", "cuda-bindings"} <= set(env["packages"])
    assert env["packages"]["numpy"]
    assert list(doc["suites"]) == ["gather", "steps"]
    (gather,) = doc["suites"]["gather"]["runs"]
    assert gather["rc"] == 0 and gather["result"]["ranks"] == 2
    (steps,) = doc["suites"]["steps"]["runs"]
    assert steps["rc"] == 0 and "host_cost_per_step" in steps["result"]

    t = _runner("benchmarks.table", "--quick", str(tmp_path))
    assert t.returncode == 0, t.stderr
    lines = t.stdout.splitlines()
    assert lines[0] == "| what | no GPU (host backend) |"
    assert any(ln.startswith("| gather: gather, 2 simulated ranks") for ln in lines)
    assert any(ln.startswith("| steps: step timing's host cost per step") for ln in lines)
    assert "(no figures" in _runner("benchmarks.table", str(tmp_path)).stdout  # quick runs left out by default


def test_a_suite_this_machine_cannot_run_is_recorded_and_fails(tmp_path):
    p = _runner("benchmarks", "waits", "--out", str(tmp_path))
    assert p.returncode == 1
    assert "cannot run here (needs a CUDA GPU)" in p.stdout
    (path,) = tmp_path.glob("benchmarks-*.json")
    suite = json.loads(path.read_text())["suites"]["waits"]
    assert suite["skipped"] == "needs a CUDA GPU" and suite["runs"] == []


def test_an_unknown_suite_is_a_usage_error(tmp_path):
    p = _runner("benchmarks", "nosuch", "--out", str(tmp_path))
    assert p.returncode == 2 and "no suite nosuch" in p.stderr
    assert not list(tmp_path.iterdir())


def _doc(started: str, model: str, suites: dict) -> dict:
    env = {"backend": "cuda", "gpu_model": model, "gpu_count": 2, "commit": "0123456789"}
    return {"format": "asyncgpu-benchmarks/1", "started": started, "quick": False, "environment": env, "suites": suites}


def test_the_table_takes_each_figure_from_the_newest_run_per_gpu_model():
    from benchmarks.table import render

    results = ROOT / "benchmarks" / "results"

    def run(name: str, file: str) -> dict:
        return {"name": name, "rc": 0, "result": json.loads((results / file).read_text()), "text": None}

    old = _doc(
        "2026-01-01T00:00:00+00:00",
        "NVIDIA H200",
        {"waits": {"runs": [run("bench_wait", "bench_wait-h200-run19.json")]}},
    )
    new = _doc(
        "2026-02-01T00:00:00+00:00",
        "NVIDIA H200",
        {"waits": {"runs": [run("bench_wait", "bench_wait-h200-run22.json")]}},
    )
    other = _doc(
        "2026-01-15T00:00:00+00:00",
        "NVIDIA H100 80GB HBM3",
        {
            "timing": {"runs": [run("bench_clock", "clock-h200x2-run17.json")]},
            "kprofile": {"runs": [run("bench_kprofile", "kprofile-h200x2-run17.json")]},
            "waits": {"runs": [{"name": "bench_wait", "rc": 1, "result": None, "text": None}]},  # failed: no figure
        },
    )
    lines = render([new, other, old]).splitlines()
    assert lines[0] == "| what | NVIDIA H200 | NVIDIA H100 80GB HBM3 |"
    single = next(ln for ln in lines if ln.startswith("| waits: single wait"))
    assert "asyncio 24.8 / 76.3" in single and "2026-02-01" in single and single.endswith("| — |")
    assert any(ln.startswith("| timing: 2 GPUs, one instant") and "| — | `%globaltimer` 0.33" in ln for ln in lines)
    assert any(ln.startswith("| kprofile: in-kernel records: decode") for ln in lines)


def test_bench_accuracy_says_its_key_figures_in_one_line():
    """`scripts/gpu_check.sh`'s table takes a step's last ``KEY`` line: the held cases' p50 range, the case
    farthest from CUPTI whichever its sign, and the spins' share within tolerance, in the table's 90 columns."""
    from benchmarks.bench_accuracy import key_line

    cases = [
        {"case": "busy stream memset", "hold": "always", "err_us_p50": 0.22},
        {"case": "idle copy 40 MB memcpy", "hold": "always", "err_us_p50": 0.0},
        {"case": "busy stream kernel", "hold": "always", "err_us_p50": -0.40},
        {"case": "busy stream kernel", "hold": "never", "err_us_p50": 40.0},
    ]
    line = key_line(cases, 0.945)
    assert line == "KEY held p50 -0.40..+0.22 µs (busy stream kernel); spins 94% in tol", line
    assert len(line) <= 90
