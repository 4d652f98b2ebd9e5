"""The examples: ``--help`` everywhere (running nothing), a real run on the host backend where the host backend can
do it, one line and exit code 2 when something they need is missing, and no trace left in the current folder."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CUDA_OK

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ALL = sorted(p.name for p in EXAMPLES.glob("*.py") if p.name != "example_setup.py")
ON_HOST = ["handoff_two_gpus.py", "kernel_stages.py", "train_loop.py", "two_gpus.py"]  # what the host backend can run
CUDA_ONLY = ["framework_streams.py", "torch_cupy_two_gpus.py"]  # torch and CuPy work on CUDA streams


def run(
    name: str, *args: str, cwd: Path, backend: str | None = "host", timeout_s: float = 60
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCGPU_BACKEND", "RANK", "WORLD_SIZE")}
    if backend is not None:
        env["ASYNCGPU_BACKEND"] = backend
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_every_example_is_covered():
    assert set(ALL) == {*ON_HOST, *CUDA_ONLY, "gather_ranks.py"}


@pytest.mark.parametrize("name", ALL)
def test_help_runs_nothing(tmp_path, name):
    out = run(name, "--help", cwd=tmp_path, backend=None)  # no backend chosen: --help must not look for one
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: {name}") and out.stderr == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ON_HOST)
def test_runs_on_the_host_backend_and_writes_no_trace_in_the_current_folder(tmp_path, name):
    out = run(name, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "host:1" in out.stdout
    assert list(tmp_path.iterdir()) == []  # traces go to the temp folder by default


@pytest.mark.parametrize("name", ["handoff_two_gpus.py", "kernel_stages.py"])
def test_trace_goes_where_asked(tmp_path, name):
    trace = tmp_path / "t.trace.json"
    out = run(name, "--trace", str(trace), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    events = json.loads(trace.read_text())["traceEvents"]
    processes = {e["args"]["name"].split()[0] for e in events if e.get("name") == "process_name"}
    assert {"host:0", "host:1"} <= processes
    assert list(tmp_path.iterdir()) == [trace]


def test_kernel_stages_draws_in_kernel_records_on_the_host(tmp_path):
    out = run("kernel_stages.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for needle in ("ws_sumsq on host:0", "ws_sumsq on host:1", "wait_empty", "compute", "inc_loop on host:1"):
        assert needle in out.stdout


def _one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize("name", CUDA_ONLY)
def test_cuda_only_examples_say_what_they_need_on_the_host_backend(tmp_path, name):
    out = run(name, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    line = _one_line(out.stderr)
    assert line.startswith(f"{EXAMPLES / name}: needs a CUDA GPU for torch and CuPy work on CUDA streams")
    assert "ASYNCGPU_BACKEND=host cannot run it" in line
    if importlib.util.find_spec("cupy") is None:
        assert "cupy (pip install torch cupy-cuda12x" in line


@pytest.mark.skipif(CUDA_OK, reason="checks the machine without a GPU")
@pytest.mark.parametrize("name", ALL)
def test_without_a_gpu_each_example_says_so_in_one_line(tmp_path, name):
    out = run(name, cwd=tmp_path, backend=None)
    assert out.returncode == 2 and out.stdout == ""
    line = _one_line(out.stderr)
    if name == "gather_ranks.py":
        assert "needs a launcher that starts the ranks: torchrun --nproc-per-node 2" in line
    elif name in CUDA_ONLY:
        assert "needs a CUDA GPU (no CUDA driver" in line or "needs a CUDA GPU (" in line
    else:
        assert f"needs a CUDA GPU, or host devices: ASYNCGPU_BACKEND=host python {EXAMPLES / name}" in line


def test_gather_ranks_under_plain_python_names_the_launchers(tmp_path):
    out = run("gather_ranks.py", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    line = _one_line(out.stderr)
    assert "torchrun --nproc-per-node 2" in line and "mpirun -n 2" in line


_MEMORY = """
import gc, json, sys, time, tracemalloc
sys.path.insert(0, sys.argv[1])
import anyio, asyncgpu, train_loop
import asyncgpu._timing.steps as steps_module
# (a harvest every 50 ms: the 0.1 s before each mark drains the pending steps, which the default cadence leaves
# waiting, up to max_pending / 2 of them: a transient queue, not growth)
steps_module.EVENTS_HARVEST_S = 0.05
marks = {}
def on_step(i):
    if i + 1 in MARKS:
        time.sleep(0.1)  # the harvest thread and the trace's writer catch up: their queues are transient, not growth
        gc.collect()
        marks[i + 1] = tracemalloc.get_traced_memory()[0]
tracemalloc.start()
devs = asyncgpu.devices("host", count=2)
st = anyio.run(lambda: train_loop.train(devs, LAST, trace=sys.argv[2], width=8, layers=1, batch=2, on_step=on_step))
print(json.dumps({"marks": marks, "steps": st.stats().steps}))
asyncgpu.close_all()
"""


def test_train_loop_memory_stays_flat(tmp_path):
    """The example's memory between steps 1,250 and 3,750 (traced Python and numpy allocations, the live ring, the
    trace stream and the event pools included), extrapolated to steps 2,000 -> 20,000: within 10 %. Measured over
    2,500 steps of tiny host work (20,000 would take ~20 s under tracemalloc): the growth per step times 18,000.
    Each end is the least of three marks 250 steps apart: a queue that has not drained yet (a loaded machine) adds
    to one mark, growth to all."""
    early, late = (1250, 1500, 1750), (3250, 3500, 3750)  # (from 1,250 on: after the ring of 1,000 has filled)
    b = late[-1]
    code = _MEMORY.replace("MARKS", repr(early + late)).replace("LAST", str(b))
    out = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLES), str(tmp_path / "t.pftrace")],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES.parent), os.environ.get("PYTHONPATH")])),
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert res["steps"] == b
    m = {int(k): v for k, v in res["marks"].items()}
    first, last = min(m[k] for k in early), min(m[k] for k in late)
    per_step = (last - first) / (late[0] - early[-1])
    assert per_step * 18_000 <= 0.1 * first, (m, per_step)
