"""The pytest plugin (asyncgpu._integrations.pytest_plugin): the ``gpu`` marker and the ``asyncgpu_timer`` fixture,
run in inner pytest sessions through ``pytester``."""

from __future__ import annotations

import re

import pytest

from .conftest import CUDA_COUNT, CUDA_OK

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "asyncgpu._integrations.pytest_plugin")


@pytest.fixture
def run(pytester, monkeypatch):
    """Run an inner session with only this plugin (entry-point plugins off, so an installed asyncgpu does not
    register it twice)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("ASYNCGPU_BACKEND", raising=False)

    def go(source: str, *options: str):
        pytester.makepyfile(source)
        return pytester.runpytest_inprocess(*PLUGIN, *options)

    return go


def test_gpu_marker_skips_without_enough_gpus_and_says_why(run):
    result = run(
        """
        import pytest

        @pytest.mark.gpu
        def test_one_gpu():
            pass

        @pytest.mark.gpu(count=99)
        def test_many_gpus():
            pass

        def test_plain():
            pass
    """,
        "-rs",
    )
    if CUDA_OK:
        result.assert_outcomes(passed=2, skipped=1)
        result.stdout.fnmatch_lines([f"*needs 99 CUDA GPUs (this machine has {CUDA_COUNT})*"])
    else:
        result.assert_outcomes(passed=1, skipped=2)
        result.stdout.fnmatch_lines(["*needs a CUDA GPU: *"])


def test_gpu_marker_is_registered_for_strict_markers(run):
    result = run(
        """
        import pytest

        @pytest.mark.gpu(1)
        def test_x():
            pass
    """,
        "--strict-markers",
        "--markers",
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(["@pytest.mark.gpu(count=1): needs `count` CUDA GPUs*"])


def test_gpu_marker_with_a_bad_count_is_an_error(run):
    result = run("""
        import pytest

        @pytest.mark.gpu(count=0)
        def test_x():
            pass
    """)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*takes a GPU count >= 1, not 0*"])


def test_timer_fixture_records_the_tests_launches_and_reports_them(run):
    result = run(
        """
        import threading
        import asyncgpu

        def test_timed(asyncgpu_timer):
            assert asyncgpu_timer.devices == tuple(asyncgpu.devices("host"))
            for d in asyncgpu_timer.devices:
                d.stream.spin_us(2000)
            t = threading.Thread(target=lambda: asyncgpu_timer.devices[0].stream.inc_loop(
                asyncgpu_timer.devices[0].alloc(10), 1))
            t.start(); t.join()      # a plain thread's launches are recorded too (all_threads)

        def test_fails(asyncgpu_timer):
            asyncgpu_timer.devices[0].stream.spin_us(1000)
            assert False, "on purpose"
    """,
        "--asyncgpu-backend",
        "host",
        "-rA",
    )
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    # The report section of each test: its activities, then the per-device totals.
    failure = out[out.index("_ test_fails _") : out.index("= PASSES =")]
    assert "Captured asyncgpu call" in failure and "gpu_timer 'test_fails'" in failure  # a failure shows its timing
    assert "spin" in failure and "inc_loop" not in failure
    passed = out[out.index("_ test_timed _") :]
    assert "Captured asyncgpu call" in passed and "gpu_timer 'test_timed'" in passed
    assert re.search(r"spin\s+│ kernel │\s+2 │", passed)  # one spin per device
    assert re.search(r"inc_loop\s+│ kernel │\s+1 │", passed)  # and the plain thread's inc_loop


def test_timer_fixture_results_are_readable_after_the_test(run):
    result = run(
        """
        import pytest

        @pytest.fixture
        def check(asyncgpu_timer):
            yield
            assert [r.name for r in asyncgpu_timer.records] == ["spin"]   # the scope ended with the test
            assert asyncgpu_timer.records[0].duration_ms > 0.9

        def test_it(check, asyncgpu_timer):
            asyncgpu_timer.devices[0].stream.spin_us(1000)
    """,
        "--asyncgpu-backend",
        "host",
    )
    result.assert_outcomes(passed=1)


@pytest.mark.skipif(CUDA_OK, reason="checks the machine without a GPU")
def test_timer_fixture_skips_without_devices(run):
    result = run(
        """
        def test_needs_devices(asyncgpu_timer):
            pass
    """,
        "-rs",
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no usable CUDA GPU*ASYNCGPU_BACKEND=host*"])


def test_timer_fixture_follows_the_environment_backend(run, monkeypatch):
    monkeypatch.setenv("ASYNCGPU_BACKEND", "host")
    result = run("""
        def test_host(asyncgpu_timer):
            assert [d.backend for d in asyncgpu_timer.devices] == ["host", "host"]
    """)
    result.assert_outcomes(passed=1)
