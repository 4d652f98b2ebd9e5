"""%gpu_timeit / %%gpu_timeit, driven through IPython's own test shell (IPython.testing.globalipapp)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("IPython")

from IPython.core.error import UsageError  # noqa: E402
from IPython.testing import globalipapp  # noqa: E402
from IPython.testing.tools import AssertPrints  # noqa: E402

from asyncgpu._timing.bench import BenchmarkError, BenchmarkResult  # noqa: E402

EXTENSION = "asyncgpu._integrations.ipython"  # what `%load_ext asyncgpu` loads, through asyncgpu.load_ipython_extension


@pytest.fixture
def shell():
    globalipapp.start_ipython()
    return globalipapp.get_ipython()


@pytest.fixture
def ip(shell):
    shell.run_line_magic("load_ext", EXTENSION)
    shell.user_ns["hits"] = []
    yield shell
    shell.run_line_magic("unload_ext", EXTENSION)


def test_load_ext_asyncgpu_registers_the_magics(shell):
    from asyncgpu._integrations import ipython as _magic

    shell.run_line_magic("load_ext", "asyncgpu")
    try:
        assert shell.find_line_magic("gpu_timeit") is not None and shell.find_cell_magic("gpu_timeit") is not None
    finally:  # asyncgpu exports only the load hook: undo it by hand
        _magic.unload_ipython_extension(shell)
        shell.extension_manager.loaded.discard("asyncgpu")
    assert shell.find_line_magic("gpu_timeit") is None


def test_importing_asyncgpu_does_not_import_ipython():
    code = "import sys, asyncgpu; assert callable(asyncgpu.load_ipython_extension); print('IPython' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_line_magic_times_a_statement_on_each_device(ip):
    with AssertPrints(["benchmark 'stream.spin_us(500)': 4 repeats after 1 warm-up", "host:1/s0", "host:1 "]):
        ip.run_line_magic("gpu_timeit", "-n 4 -w 1 --devices host:0,host:1 stream.spin_us(500)")
    with AssertPrints("median"):
        ip.run_line_magic("gpu_timeit", "-n 2 -w 0 --devices host:0 stream.spin_us(10)")


def test_statement_sees_stream_device_and_the_users_names(ip):
    ip.user_ns["us"] = 200
    r = ip.run_line_magic("gpu_timeit", "-n 3 -w 1 -o --backend host hits.append(device.name); stream.spin_us(us)")
    assert isinstance(r, BenchmarkResult) and r.devices == ("host:0", "host:1") and r.n_repeat == 3
    assert sorted(set(ip.user_ns["hits"])) == ["host:0", "host:1"] and len(ip.user_ns["hits"]) == 8
    assert (r.gpu_times_ms > 0.19).all()
    assert ip.run_line_magic("gpu_timeit", "-n 1 -w 0 --devices host:0 pass") is None  # without -o


def test_cell_magic_times_the_cell_and_keeps_its_names_local(ip):
    ip.user_ns["us"] = 100
    r = ip.run_cell_magic(
        "gpu_timeit",
        "-n 2 -w 1 -o --devices host:0 --name cellwork",
        "local_only = us\nstream.spin_us(local_only)\nhits.append(1)",
    )
    assert r.name == "cellwork" and r.n_repeat == 2 and ip.user_ns["hits"] == [1, 1, 1]
    assert "local_only" not in ip.user_ns


def test_ipython_syntax_in_the_cell_is_transformed(ip):
    r = ip.run_cell_magic("gpu_timeit", "-n 1 -w 0 -o --devices host:0", "x = %time 1\nstream.spin_us(1)")
    assert r.n_repeat == 1


def test_max_duration_and_max_noise(ip):
    r = ip.run_line_magic("gpu_timeit", "-n 100000 -w 0 --max-duration 0.05 -o --devices host:0 stream.spin_us(1000)")
    assert r.stop_reason == "max_duration"
    r = ip.run_line_magic("gpu_timeit", "-n 100000 -w 0 --max-noise 0.5 -o --devices host:0 stream.spin_us(1000)")
    assert r.stop_reason == "max_noise"


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("-n 0 pass", "-n must be >= 1"),
        ("-n two pass", "-n takes a whole number"),
        ("-w -1 pass", "-w must be >= 0"),
        ("--max-duration -1 pass", "--max-duration must be >= 0"),
        ("--max-duration nan pass", "--max-duration must be >= 0"),
        ("--max-noise 0 pass", "--max-noise must be > 0"),
        ("--bogus 3 pass", "--bogus not recognized"),
        ("--devices host:99 pass", "host:99"),
        ("--devices tpu:0 pass", "unknown device"),
        ("--devices , pass", "no device"),
        ("--backend tpu pass", "--backend is cuda or host"),
        ("-n 3", "nothing to time"),
    ],
)
def test_bad_options_are_usage_errors(ip, line, match):
    with pytest.raises(UsageError, match=match):
        ip.run_line_magic("gpu_timeit", f"--devices host:0 {line}" if "--devices" not in line else line)
    assert ip.user_ns["hits"] == []


def test_bad_options_show_one_line_without_traceback(ip, capsys):
    result = ip.run_cell("%gpu_timeit -n 0 --devices host:0 pass")
    assert isinstance(result.error_in_exec, UsageError)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "UsageError: -n must be >= 1" in text and "Traceback" not in text


def test_cell_magic_takes_only_options_on_its_line(ip):
    with pytest.raises(UsageError, match="only options"):
        ip.run_cell_magic("gpu_timeit", "-n 2 x = 1", "stream.spin_us(1)")


def test_a_failing_statement_stops_and_says_where(ip):
    ip.user_ns["n"] = [0]
    code = "n[0] += 1\nif n[0] > 3: raise KeyError('gone')\nstream.spin_us(10)"
    with pytest.raises(BenchmarkError, match=r"KeyError: 'gone' \(on host:0, in repeat 1\)") as info:
        ip.run_cell_magic("gpu_timeit", "-n 50 -w 2 --devices host:0", code)
    assert isinstance(info.value.__cause__, KeyError)


def test_syntax_errors_surface_as_such(ip):
    with pytest.raises(SyntaxError):
        ip.run_line_magic("gpu_timeit", "-n 1 --devices host:0 def (")


def test_help_is_the_docstring(ip):
    doc = ip.find_line_magic("gpu_timeit").__doc__
    for needle in ("-n N", "-w N", "--max-duration S", "--devices LIST", "stream"):
        assert needle in doc


def test_unload_removes_the_magics(ip):
    ip.run_line_magic("unload_ext", EXTENSION)
    assert ip.find_line_magic("gpu_timeit") is None and ip.find_cell_magic("gpu_timeit") is None
    ip.run_line_magic("load_ext", EXTENSION)
    assert ip.find_cell_magic("gpu_timeit") is not None
