"""The command line: the demo on the host backend, device listing, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import asyncgpu
from asyncgpu._cli import main

from .conftest import CUDA_OK


def test_demo_on_host_says_so_checks_results_writes_a_trace_and_ends_with_the_balance(capsys, tmp_path):
    trace = tmp_path / "demo.json"
    assert main(["demo", "--backend", "host", "--elements", "20000", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("asyncgpu demo on the host backend")
    for needle in (
        "inc_loop",
        "copy_to_host",
        "memset",
        "totals per kind",
        "totals per device",
        "CPU",
        "checked: every element is 3000",
        "devices aligned: host:0 ±0.0 µs",
        "trace written to",
    ):
        assert needle in out
    assert out.index("imbalance") > out.index("trace written") > out.index("totals per device")  # balance last
    tl = asyncgpu.read_trace(trace)
    assert len(tl) == 10 and set(tl.devices) == {"host:0", "host:1"}


def test_demo_trace_options(capsys, tmp_path):
    assert main(["demo", "--backend", "host", "--elements", "1000", "--no-trace"]) == 0
    assert "trace written" not in capsys.readouterr().out
    assert main(["demo", "--backend", "host", "--elements", "1000", "--trace", str(tmp_path / "no" / "t.json")]) == 1
    assert "could not write the trace" in capsys.readouterr().out


def test_devices_lists_clocks(capsys):
    assert main(["devices", "--backend", "host"]) == 0
    out = capsys.readouterr().out
    assert "host:0" in out and "host:1" in out and "event anchor" in out


@pytest.mark.parametrize("loop", ["trio", "uvloop"])
def test_demo_on_other_loops(capsys, loop):
    pytest.importorskip(loop)
    assert main(["demo", "--backend", "host", "--elements", "1000", "--loop", loop, "--no-trace"]) == 0


@pytest.mark.skipif(CUDA_OK, reason="checks the machine without a GPU")
def test_demo_without_gpu_falls_to_host_and_says_why(capsys):
    assert main(["demo", "--elements", "1000", "--no-trace"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "HOST backend" in first and "no usable GPU" in first


@pytest.mark.skipif(CUDA_OK, reason="checks the machine without a GPU")
def test_asking_for_cuda_without_gpu_is_a_usage_error(capsys):
    assert main(["demo", "--backend", "cuda"]) == 2
    out = capsys.readouterr().out
    assert "Traceback" not in out and "ASYNCGPU_BACKEND=host" in out


def test_bad_options_exit_2():
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--elements", "0"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["nonsense"])
    assert exc.value.code == 2


def test_devices_lists_host_devices(capsys):
    assert main(["devices", "--backend", "host"]) == 0
    assert "host:0" in capsys.readouterr().out


def test_console_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "asyncgpu", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "demo" in out.stdout


# -- --help everywhere, bench, report, one-line usage errors ----------------------------------------------------
BENCH_MODULE = """
import time

calls = []

def step(stream):
    calls.append(stream.device.name)
    stream.spin_us(300)

def flaky(stream):
    calls.append(1)
    if len(calls) > 4:
        raise ValueError("flaky on purpose")
    stream.spin_us(10)

not_a_function = 3
"""


@pytest.fixture
def bench_file(tmp_path):
    path = tmp_path / "benchmod_cli.py"
    path.write_text(BENCH_MODULE)
    return path


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["demo", "--help"], ["devices", "--help"], ["bench", "--help"], ["report", "--help"], ["bench", "-h"]],
)
def test_help_everywhere(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: asyncgpu")
    if argv[0] == "--help":
        assert all(cmd in out for cmd in ("demo", "devices", "bench", "report")) and "Exit codes" in out


def test_devices_shows_memory(capsys):
    assert main(["devices", "--backend", "host"]) == 0
    out = capsys.readouterr().out
    assert "GiB free" in out and "share the host's RAM" in out


def test_bench_a_file_on_host_devices(capsys, bench_file, tmp_path):
    out_json = tmp_path / "r.json"
    argv = ["bench", f"{bench_file}:step", "--backend", "host", "-n", "5", "-w", "1", "--json", str(out_json)]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    for needle in ("benchmark 'step': 5 repeats after 1 warm-up", "host:0", "host:1", "median", "results written"):
        assert needle in out
    data = json.loads(out_json.read_text())
    assert data["n_repeat"] == 5 and data["devices"] == ["host:0", "host:1"]
    assert data["rows"]["host:0"]["median_ms"] > 0.29 and len(data["times_ms"]) == 3


def test_bench_a_module_by_name_with_options(capsys, bench_file, monkeypatch):
    monkeypatch.chdir(bench_file.parent)
    monkeypatch.delitem(sys.modules, "benchmod_cli", raising=False)
    argv = ["bench", "benchmod_cli:step", "--devices", "host:1", "-n", "100000", "--max-duration", "0.05", "-w", "0"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())  # the header line wraps at the console's width
    assert "stopped by max_duration" in out and "host:1" in out and "host:0" not in out
    assert main(["bench", "benchmod_cli:step", "--devices", "host:0", "--max-noise", "0.9", "-w", "0"]) == 0
    assert "stopped by max_noise" in " ".join(capsys.readouterr().out.split())


def test_bench_function_raising_exits_1_with_where_and_partial_results(capsys, bench_file):
    assert main(["bench", f"{bench_file}:flaky", "--devices", "host:0", "-n", "50", "-w", "1"]) == 1
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("asyncgpu bench: flaky raised ValueError: flaky on purpose (on host:0, in repeat 3)")
    assert f"(at {bench_file}:" in last and "Traceback" not in out
    assert "2 repeats after 1 warm-up" in " ".join(out.split())  # the complete repeats are shown


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        ("nocolon", [], "bench takes MODULE:FUNCTION"),
        ("no_such_module_xyz:f", [], "cannot import no_such_module_xyz: No module named 'no_such_module_xyz'"),
        ("missing/file.py:f", [], "no such file: missing/file.py"),
        ("{file}:nope", [], "has no 'nope'"),
        ("{file}:not_a_function", [], "is a int, not a function"),
        ("{file}:step", ["--devices", "host:99"], "host:99"),
        ("{file}:step", ["--devices", "tpu:0"], "unknown device 'tpu:0'"),
        ("{file}:step", ["--devices", ","], "no device"),
        ("{file}:step", ["--devices", "host:0,host:0"], "given twice"),
    ],
)
def test_bench_usage_mistakes_exit_2_in_one_line(capsys, bench_file, target, extra, message):
    argv = ["bench", target.format(file=bench_file), "--backend", "host", "-n", "1", *extra]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().out)
    assert line.startswith("asyncgpu bench: ") and message in line


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["-n", "0"], "argument -n/--n-repeat: must be >= 1, got 0"),
        (["-n", "many"], "expected a whole number"),
        (["-w", "-1"], "argument -w/--n-warmup: must be >= 0"),
        (["--max-duration", "-1"], "must be >= 0 seconds"),
        (["--max-duration", "nan"], "must be >= 0 seconds"),
        (["--max-noise", "0"], "must be > 0"),
        (["--backend", "tpu"], "invalid choice"),
    ],
)
def test_bench_bad_options_exit_2_in_one_line(capsys, bench_file, option, message):
    with pytest.raises(SystemExit) as exc:
        main(["bench", f"{bench_file}:step", *option])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in _one_line(err) and "see asyncgpu bench --help" in err


def test_bench_module_raising_on_import_exits_1(capsys, tmp_path):
    bad = tmp_path / "broken_mod.py"
    bad.write_text("x = 1\nraise RuntimeError('import-time failure')\n")
    assert main(["bench", f"{bad}:f", "--backend", "host"]) == 1
    line = _one_line(capsys.readouterr().out)
    assert "importing" in line and "RuntimeError: import-time failure" in line and f"(at {bad}:2)" in line


@pytest.mark.skipif(CUDA_OK, reason="checks the machine without a GPU")
def test_bench_without_gpu_is_a_usage_error(capsys, bench_file):
    assert main(["bench", f"{bench_file}:step"]) == 2
    assert "ASYNCGPU_BACKEND=host" in _one_line(capsys.readouterr().out)


def test_report_of_a_saved_trace(capsys, tmp_path):
    trace = tmp_path / "t.json"
    devs = asyncgpu.devices("host")
    with asyncgpu.gpu_timer(devs, label="saved") as t:
        for i, d in enumerate(devs):
            d.stream.spin_us(1_000 * (i + 1))
    asyncgpu.write_trace(t, trace)
    assert main(["report", str(trace)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"trace {trace}: scope 'saved', 2 activities on host:0")
    for needle in (
        "totals per kind and activity",
        "totals per device",
        "balance: busy time per device",
        "straggler host:1",
        "devices aligned",
    ):
        assert needle in out
    assert "activities in issue order" not in out
    assert main(["report", str(trace), "--timeline", "1", "--order", "time"]) == 0
    out = capsys.readouterr().out
    assert "activities in time order" in out and "1 more activities" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"traceEvents": []}', "not an asyncgpu trace"),
        ("[1, 2", "not an asyncgpu trace"),
        (None, "cannot read"),
    ],
)
def test_report_of_a_file_that_is_not_ours_exits_2_in_one_line(capsys, tmp_path, content, message):
    path = tmp_path / "foreign.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path)]) == 2
    line = _one_line(capsys.readouterr().out)
    assert line.startswith("asyncgpu report: ") and message in line


def test_console_entry_point_bench_help():
    out = subprocess.run(
        [sys.executable, "-m", "asyncgpu", "bench", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "MODULE:FUNCTION" in out.stdout


def test_demo_source_option_says_where_durations_come_from(capsys):
    assert main(["demo", "--backend", "host", "--elements", "1000", "--no-trace", "--source", "auto"]) == 0
    out = capsys.readouterr().out
    assert "durations: host events (CUPTI times CUDA devices only" in out
    assert main(["demo", "--backend", "host", "--elements", "1000", "--no-trace", "--source", "cupti"]) == 2
    out = capsys.readouterr().out
    assert "source='cupti'" in out and "use source='events'" in out and "Traceback" not in out
