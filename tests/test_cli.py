"""The command line: the demo on the host backend, device listing, exit codes."""

from __future__ import annotations

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
    for needle in ("inc_loop", "copy_to_host", "memset", "totals per kind", "totals per device", "CPU",
                   "checked: every element is 3000", "devices aligned: host:0 ±0.0 µs", "trace written to"):
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
