"""Shared fixtures: event loops (asyncio, uvloop, trio) and devices (host everywhere, CUDA when present).

Markers: ``gpu`` / ``multigpu`` skip without enough CUDA GPUs; ``nvrtc`` (a test that compiles CUDA sources) skips
when NVRTC is missing (asyncgpu installed without its ``cu13`` / ``cu12`` extra), saying so. Every ``gpu`` test
needs NVRTC too: the built-in kernels it launches are compiled at run time.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util

import pytest

import asyncgpu
from asyncgpu._backends import cuda as _cuda
from asyncgpu._backends import load_backend

CUDA_OK, CUDA_WHY = load_backend("cuda").available()
CUDA_COUNT = load_backend("cuda").device_count() if CUDA_OK else 0
NVRTC_OK, NVRTC_WHY = _cuda.nvrtc_available()

LOOPS = [pytest.param(("asyncio", {}), id="asyncio"), pytest.param(("trio", {}), id="trio")]
if importlib.util.find_spec("uvloop") is not None:
    LOOPS.insert(1, pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))


@pytest.fixture(params=LOOPS)
def anyio_backend(request):
    return request.param


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason=f"needs a CUDA GPU: {CUDA_WHY}")
    skip_multi = pytest.mark.skip(reason=f"needs two CUDA GPUs (this machine has {CUDA_COUNT})")
    skip_nvrtc = pytest.mark.skip(reason=f"needs NVRTC: {NVRTC_WHY}")
    for item in items:
        if "gpu" in item.keywords and not CUDA_OK:
            item.add_marker(skip_gpu)
        elif ("nvrtc" in item.keywords or "gpu" in item.keywords) and not NVRTC_OK:
            item.add_marker(skip_nvrtc)
        if "multigpu" in item.keywords and CUDA_COUNT < 2:
            item.add_marker(skip_multi)


BACKENDS = ["host", pytest.param("cuda", marks=pytest.mark.gpu)]


@contextlib.contextmanager
def collector_off():
    """Collect, then keep Python's cyclic collector off for the body: a test that asserts the host did not stall
    (a balance verdict, a wake-up) must not time a full collection, which a report rightly calls host-bound time.
    Measured: a generation-2 collection takes ~30 ms after test_report.py alone, and there failed a stagger test
    on the host backend (run 43). Stalls of 120-260 ms late in full GPU suites (a balance test on 2x H200 and
    4x H100, run 43; a wake-up and a set-up test before) are thought to be the same, on the suite's larger heap."""
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@pytest.fixture(autouse=True)
def _close_workers():
    """Every test starts with no open worker and must leave nothing of asyncgpu running behind it."""
    from asyncgpu._testing import assert_quiescent, cupti_users

    before = cupti_users()  # (a leak is blamed on the test that made it, not on every test after it)
    yield
    assert_quiescent(cupti_users_before=before)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def dev(backend):
    """One device of the backend under test (a fresh worker)."""
    return asyncgpu.device(0, backend=backend)


@pytest.fixture
def two_devs(backend):
    """Two devices: host:0/host:1, or cuda:0/cuda:1 (skipped with fewer than two GPUs)."""
    if backend == "cuda" and CUDA_COUNT < 2:
        pytest.skip(f"needs two CUDA GPUs (this machine has {CUDA_COUNT})")
    return asyncgpu.devices(backend, count=2)
