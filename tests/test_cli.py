"""The command line: the demo on the host backend, device listing, exit codes, stdout and stderr, JSON, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import asyncgpu
from asyncgpu._cli.main import main

from .conftest import CUDA_OK


def test_demo_on_host_says_so_checks_results_writes_a_trace_and_ends_with_the_balance(capsys, tmp_path):
    trace = tmp_path / "demo.json"
    assert main(["demo", "--backend", "host", "--elements", "20000", "--trace", str(trace)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert out.splitlines()[0].startswith("asyncgpu demo on the host backend")
    assert "…" not in out  # at 80 columns (not a terminal) no number, header or name is cut
    assert "in the scope's body" in out and "issuing" not in out
    progress = captured.err.splitlines()  # progress on stderr, a line per step and device, then the trace
    assert progress[0] == "asyncgpu demo: running on host:0, host:1"
    assert sum("inc_loop x1500 done at" in line for line in progress) == 2
    assert progress[-1] == f"asyncgpu demo: writing the trace to {trace}"
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
    assert main(["demo", "--backend", "host", "--elements", "1000", "--no-trace", "-q"]) == 0
    captured = capsys.readouterr()
    assert "trace written" not in captured.out and captured.err == ""  # -q: no progress
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--backend", "host", "--trace", str(tmp_path / "t.json"), "--no-trace"])
    assert exc.value.code == 2
    assert "not allowed with argument --trace" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("{tmp}/no/t.json", "the directory {tmp}/no does not exist: create it first"),
        ("{tmp}", "that is a directory: give a file name"),
        ("{tmp}/file.txt/t.json", "the directory {tmp}/file.txt is not a directory"),
        pytest.param(
            "/proc/x.json",
            "cannot write a file in /proc",
            marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc"),
        ),
    ],
)
def test_demo_checks_the_trace_path_before_the_run(capsys, tmp_path, path, message):
    (tmp_path / "file.txt").write_text("")
    t0 = time.perf_counter()
    argv = ["demo", "--backend", "host", "--trace", path.format(tmp=tmp_path)]  # 10 M elements: seconds if run
    assert main(argv) == 2
    assert time.perf_counter() - t0 < 1.0
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    line = _one_line(captured.err)
    assert (
        line.startswith(f"asyncgpu demo: --trace {path.format(tmp=tmp_path)}: ")
        and message.format(tmp=tmp_path) in line
    )


def test_demo_with_more_elements_than_memory_says_so_in_one_line(capsys):
    assert main(["demo", "--backend", "host", "--elements", "100000000000"]) == 1
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert "--elements 100,000,000,000 needs 1,490.1 GiB of the host RAM of 2 host devices" in line
    assert "use --elements" in line and captured.out == ""


def test_demo_json_for_scripts(capsys, tmp_path):
    trace = tmp_path / "d.json"
    assert (
        main(["demo", "--backend", "host", "--elements", "1000", "--trace", str(trace), "--format", "json", "-q"]) == 0
    )
    data = json.loads(capsys.readouterr().out)  # stdout is one JSON document, nothing else
    assert data["checked"] and data["backend"] == "host" and data["trace"] == str(trace) and trace.exists()
    assert [d["name"] for d in data["devices"]] == ["host:0", "host:1"] and data["activities"] == 10
    assert {r["name"] for r in data["activity_summary"]["rows"]} == {"memset", "inc_loop", "copy_to_host"}
    assert data["balance"]["straggler"] in ("host:0", "host:1") and data["host_ms"] > 0


def test_demo_at_a_narrow_width_leaves_columns_out_and_never_cuts_numbers(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")
    assert main(["demo", "--backend", "host", "--elements", "1000", "--no-trace", "-q"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line.rstrip()) for line in out.splitlines()) <= 50
    words = " ".join(out.split())
    assert "left out at this width (50 columns): stream, kind" in words
    assert "left out at this width (50 columns): min (ms), max (ms)" in words


def test_devices_lists_clocks(capsys):
    assert main(["devices", "--backend", "host"]) == 0
    out = capsys.readouterr().out
    assert "host:0" in out and "host:1" in out and "event" in out and "anchor" in out and "…" not in out


def test_devices_json(capsys):
    assert main(["devices", "--backend", "host", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "host" and [d["name"] for d in data["devices"]] == ["host:0", "host:1"]
    assert data["devices"][0]["memory_total_bytes"] > 0 and data["devices"][0]["anchor_bound_ns"] == 0.0


@pytest.mark.skipif(CUDA_OK, reason="checks the machine without a GPU")
@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["devices"], None),
        (["devices", "--format", "json"], None),
        (["devices"], "cuda"),
        (["devices", "--backend", "cuda"], None),
        (["devices", "--backend", "cuda"], "host"),
    ],
)
def test_devices_without_gpu_is_a_usage_error_naming_the_option_that_works(capsys, monkeypatch, argv, env):
    if env is None:
        monkeypatch.delenv("ASYNCGPU_BACKEND", raising=False)
    else:
        monkeypatch.setenv("ASYNCGPU_BACKEND", env)
    assert main(argv) == 2  # by default, by $ASYNCGPU_BACKEND or by name: as demo and bench
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert captured.out == "" and line.startswith("asyncgpu devices: no usable CUDA GPU")
    assert line.endswith("add --backend host to run on host worker threads instead")


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"asyncgpu {asyncgpu.__version__}\n"


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
    captured = capsys.readouterr()
    line = _one_line(captured.err)  # the command line's own option, not Python syntax
    assert "add --backend host" in line and "backend='host'" not in line and captured.out == ""


def test_bad_options_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--elements", "0"])
    assert exc.value.code == 2
    assert "argument --elements: must be >= 1, got 0" in _one_line(capsys.readouterr().err)
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
    assert "Exit codes: 0 success; 1 the work failed" in out and "130 interrupted (Ctrl-C)" in " ".join(out.split())
    if argv[0] == "--help":
        assert all(cmd in out for cmd in ("demo", "devices", "bench", "report", "--version"))


def test_devices_shows_memory(capsys):
    assert main(["devices", "--backend", "host"]) == 0
    out = capsys.readouterr().out
    assert "GiB free" in out and "share the host's RAM" in out


def test_bench_a_file_on_host_devices(capsys, bench_file, tmp_path):
    out_json = tmp_path / "r.json"
    argv = ["bench", f"{bench_file}:step", "--backend", "host", "-n", "5", "-w", "1", "--json", str(out_json)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = " ".join(captured.out.split())
    for needle in ("benchmark 'step': 5 repeats after 1 warm-up", "host:0", "host:1", "median"):
        assert needle in out
    assert _one_line(captured.err) == f"asyncgpu bench: results written to {out_json}"
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
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert line.startswith("asyncgpu bench: flaky raised ValueError: flaky on purpose (on host:0, in repeat 3)")
    assert f"(at {bench_file}:" in line
    assert "3 repeats after 1 warm-up" in " ".join(captured.out.split())  # the repeats whose calls returned


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
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert captured.out == ""
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
    line = _one_line(capsys.readouterr().err)
    assert "importing" in line and "RuntimeError: import-time failure" in line and f"(at {bad}:2)" in line


@pytest.mark.skipif(CUDA_OK, reason="checks the machine without a GPU")
@pytest.mark.parametrize("devices", [[], ["--devices", "cuda:0"], ["--devices", "0,1"]])
def test_bench_without_gpu_is_a_usage_error(capsys, bench_file, devices):
    assert main(["bench", f"{bench_file}:step", *devices]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "no usable CUDA GPU" in line and "add --backend host" in line and "asyncgpu.devices(" not in line


def test_bench_json(capsys, bench_file):
    assert main(["bench", f"{bench_file}:step", "--backend", "host", "-n", "3", "-w", "0", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n_repeat"] == 3 and data["devices"] == ["host:0", "host:1"] and "times_ms" not in data


def test_report_of_a_saved_trace(capsys, tmp_path):
    trace = tmp_path / "t.json"
    devs = asyncgpu.devices("host")
    with asyncgpu.gpu_timer(devs, label="saved") as t:
        for i, d in enumerate(devs):
            d.stream.spin_us(1_000 * (i + 1))
    asyncgpu.write_trace(t, trace)
    assert main(["report", str(trace)]) == 0
    out = capsys.readouterr().out
    assert " ".join(out.split()).startswith(f"trace {trace}: scope 'saved', 2 activities on host:0")
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
    assert main(["report", str(trace), "--timeline", "5", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["label"] == "saved" and [r["device"] for r in data["timeline"]] == ["host:0", "host:1"]
    assert data["device_summary"]["rows"][1]["busy_ms"] >= 1.9


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
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("asyncgpu report: ") and message in line


def test_console_entry_point_bench_help():
    out = subprocess.run(
        [sys.executable, "-m", "asyncgpu", "bench", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "MODULE:FUNCTION" in out.stdout


def test_a_demo_source_that_cannot_be_had_is_refused_before_anything_is_printed(capsys):
    argv = ["demo", "--backend", "host", "--elements", "1000", "--no-trace", "--source", "cupti"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no banner: the options are checked first
    line = _one_line(captured.err)  # (no progress line either)
    assert line.startswith("asyncgpu demo: source='cupti': CUPTI times CUDA devices only")


def test_bench_checks_the_json_path_before_it_imports_or_runs_anything(capsys, tmp_path):
    marker = tmp_path / "ran"
    module = tmp_path / "json_path_bench.py"
    module.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef step(stream):\n    stream.spin_us(10)\n")
    target = tmp_path / "no" / "r.json"
    argv = ["bench", f"{module}:step", "--backend", "host", "-n", "5", "-w", "0", "--json", str(target)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert line == f"asyncgpu bench: --json {target}: the directory {target.parent} does not exist: create it first"
    assert captured.out == "" and not marker.exists()  # nothing was imported, nothing ran


def test_demo_source_option_says_where_durations_come_from(capsys):
    assert main(["demo", "--backend", "host", "--elements", "1000", "--no-trace", "--source", "auto"]) == 0
    out = capsys.readouterr().out
    assert "durations: host events (CUPTI times CUDA devices only" in out
    assert main(["demo", "--backend", "host", "--elements", "1000", "--no-trace", "--source", "cupti", "-q"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "source='cupti'" in line and "use source='events'" in line


# -- Ctrl-C: one line, exit 130, at once, on every loop ----------------------------------------------------------
def _interrupt(argv: list[str], started: Callable[[subprocess.Popen], None]) -> tuple[int, float, str]:
    """Run ``python -m asyncgpu argv``, wait for ``started``, send SIGINT: (exit code, seconds to exit, stderr)."""
    env = dict(os.environ, ASYNCGPU_BACKEND="host")
    p = subprocess.Popen(
        [sys.executable, "-m", "asyncgpu", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        started(p)
        t0 = time.perf_counter()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
        return p.returncode, time.perf_counter() - t0, err
    finally:
        p.kill()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
def test_ctrl_c_during_the_demo_prints_one_line_and_exits_130_at_once(loop):
    pytest.importorskip(loop)

    def started(p: subprocess.Popen) -> None:
        assert p.stdout is not None
        p.stdout.readline()  # the header: the devices are open and the work is being enqueued
        time.sleep(0.3)

    code, seconds, err = _interrupt(
        ["demo", "--backend", "host", "--loop", loop, "--no-trace", "-q"], started
    )  # 10 M elements: seconds
    assert (code, err) == (130, "asyncgpu demo: interrupted\n")
    assert seconds < 1.5


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
def test_ctrl_c_during_bench_prints_one_line_and_exits_130(tmp_path):
    marker = tmp_path / "running"
    module = tmp_path / "slow_bench.py"
    module.write_text(f"def step(stream):\n    open({str(marker)!r}, 'w').close()\n    stream.spin_us(2000)\n")

    def started(p: subprocess.Popen) -> None:
        deadline = time.perf_counter() + 20
        while not marker.exists() and time.perf_counter() < deadline:
            time.sleep(0.02)

    code, seconds, err = _interrupt(
        ["bench", f"{module}:step", "--backend", "host", "-n", "1000000", "--max-duration", "60"], started
    )
    assert (code, err) == (130, "asyncgpu bench: interrupted\n")
    assert seconds < 1.5


_SLOW_IMPORT = """
import os, sys, time

class _Slow:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("asyncgpu.") and not os.path.exists(os.environ["MARKER"]):  # inside `import asyncgpu`
            open(os.environ["MARKER"], "w").close()
            time.sleep(30)  # Ctrl-C arrives here
        return None

sys.meta_path.insert(0, _Slow())
"""


def _console_script() -> tuple[str, str]:
    """The module and function of the ``asyncgpu`` console script, from pyproject.toml."""
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    target = text.split("[project.scripts]", 1)[1].split('asyncgpu = "', 1)[1].split('"', 1)[0]
    module, _, function = target.partition(":")
    return module, function


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
def test_ctrl_c_while_the_console_script_imports_asyncgpu_prints_one_line_and_exits_130(tmp_path):
    """The console script as pip writes it (``from MODULE import FUNCTION; sys.exit(FUNCTION())``), interrupted
    while ``import asyncgpu`` runs (a sitecustomize holds that import until the signal comes)."""
    (tmp_path / "sitecustomize.py").write_text(_SLOW_IMPORT)
    marker = tmp_path / "importing"
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, MARKER=str(marker), PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    module, function = _console_script()
    script = f"import sys; from {module} import {function}; sys.exit({function}())"

    def started(p: subprocess.Popen) -> None:
        deadline = time.perf_counter() + 20
        while not marker.exists() and p.poll() is None and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert marker.exists(), p.communicate()

    p = subprocess.Popen(
        [sys.executable, "-c", script, "devices", "--backend", "host"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
    )
    try:
        started(p)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert (p.returncode, out, err) == (130, "", "asyncgpu: interrupted\n")


def test_the_console_scripts_exit_code_for_ctrl_c_is_the_commands():
    import _asyncgpu_cli
    from asyncgpu._cli import main as _cli

    assert _asyncgpu_cli.EXIT_INTERRUPTED == _cli.EXIT_INTERRUPTED == 128 + signal.SIGINT


def test_demo_follows_asyncgpu_backend(capsys, monkeypatch):
    monkeypatch.setenv("ASYNCGPU_BACKEND", "host")
    assert main(["demo", "--elements", "1000", "--no-trace", "-q"]) == 0
    assert capsys.readouterr().out.startswith("asyncgpu demo on the host backend, as ASYNCGPU_BACKEND asks")


def test_demo_with_a_wrong_result_exits_1_and_says_where_on_stderr(capsys, monkeypatch):
    from asyncgpu._cli import demo as _cli

    real = _cli._demo_device

    async def corrupted(dev, *args):
        out = await real(dev, *args)
        if dev.name == "host:1":
            out[7] = -1.0
        return out

    monkeypatch.setattr(_cli, "_demo_device", corrupted)
    assert main(["demo", "--backend", "host", "--elements", "1000", "--no-trace", "-q"]) == 1
    captured = capsys.readouterr()
    assert _one_line(captured.err) == "asyncgpu demo: wrong result on host:1: expected every element = 3000"
    assert "checked:" not in captured.out and "totals per device" in captured.out  # the report still shows


def test_report_of_a_trace_with_in_kernel_records(capsys, tmp_path):
    import numpy as np

    from asyncgpu.kernel import KernelProfiler

    trace = tmp_path / "k.trace.json"
    dev = asyncgpu.device("host:0")
    a = dev.alloc(1 << 16, np.float32)
    with asyncgpu.gpu_timer(dev, label="kernels") as t:
        dev.stream.memset(a, 0)
        with KernelProfiler(dev) as prof:
            prof.inc_loop(a, 3)
            assert len(prof.collect_sync()) > 0
    asyncgpu.write_trace(t, trace)  # the records are a layer of the trace: events without an activity row
    assert main(["report", str(trace)]) == 0
    assert "scope 'kernels', 2 activities on host:0" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("count", [2, 4])
def test_the_demos_devices_start_their_work_together_and_it_overlaps(capsys, monkeypatch, count):
    """No task holds the loop's thread before its first launch (pinning its result buffer, compiling): the loop
    issues every device's first activity within a small part of the time one pinned allocation takes (measured
    here: the host backend makes a pinned block resident page by page, as CUDA does), which each device's task
    used to pay before its first launch, one after the other."""
    from asyncgpu._cli import demo as _cli

    n = 1 << 23  # 32 MiB per device (CUDA pins 40 MB in ~20 ms)
    probe = asyncgpu.device("host:0")
    pin_ns = []
    for _ in range(3):
        t0 = time.perf_counter_ns()
        block = probe.alloc_pinned(n)
        pin_ns.append(time.perf_counter_ns() - t0)
        del block
    probe.close()
    timers: list = []
    real = _cli.gpu_timer
    monkeypatch.setattr(_cli, "gpu_timer", lambda *a, **k: timers.append(real(*a, **k)) or timers[-1])
    monkeypatch.setattr(_cli, "DEMO_ITERATIONS", (2, 2, 2))  # (the start is what is checked: keep the work short)
    argv = ["demo", "--backend", "host", "--devices", str(count), "--elements", str(n), "--no-trace", "-q"]
    assert main(argv) == 0
    tl = timers[0].timeline
    rows = [tl.device == k for k in range(len(tl.devices))]
    issued = np.array([tl.issued_ns[r].min() for r in rows])
    first = np.array([tl.start_ns[r].min() for r in rows])
    last = np.array([tl.end_ns[r].max() for r in rows])
    assert len(rows) == count
    assert np.ptp(issued) < min(pin_ns) / 4, (np.ptp(issued), pin_ns)
    # host devices share the machine's cores: under load a stream thread starts late, but far less than
    # pinning one device's buffer after another did
    assert np.ptp(first) < (count - 1) * min(pin_ns), (np.ptp(first), pin_ns)
    assert first.max() < last.min()  # every device works while the others do
    capsys.readouterr()
