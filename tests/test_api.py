"""The public surface stays small and consistent, and the house keeps its layers."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil

import pytest

import asyncgpu

PUBLIC_SUBMODULES = ("errors", "kernel", "ranks", "types")


def test_all_matches_the_facade():
    public = {n for n in dir(asyncgpu) if not n.startswith("_") and not inspect.ismodule(getattr(asyncgpu, n))}
    assert set(asyncgpu.__all__) == public
    assert len(asyncgpu.__all__) <= 45  # the specialist parts live in public submodules


def _modules():
    for info in pkgutil.walk_packages(asyncgpu.__path__, "asyncgpu."):
        if info.name in ("asyncgpu.__main__", "asyncgpu._backends.cuda"):  # cuda: checked in test_kernels
            continue
        yield importlib.import_module(info.name)


def test_every_module_all_names_exist():
    for mod in _modules():
        for name in getattr(mod, "__all__", ()):
            assert hasattr(mod, name), f"{mod.__name__}.__all__ names missing {name}"


def test_public_submodules_show_public_paths():
    for sub in PUBLIC_SUBMODULES:
        mod = importlib.import_module(f"asyncgpu.{sub}")
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, type):
                assert obj.__module__ in ("asyncgpu", f"asyncgpu.{sub}", "asyncgpu.errors"), (sub, name, obj.__module__)
    for name in asyncgpu.__all__:
        obj = getattr(asyncgpu, name)
        if isinstance(obj, type):
            assert obj.__module__ == ("asyncgpu.errors" if issubclass(obj, Exception) else "asyncgpu"), name


def test_every_returned_type_has_a_public_home():
    homes = {
        getattr(importlib.import_module(f"asyncgpu.{s}"), n)
        for s in PUBLIC_SUBMODULES
        for n in importlib.import_module(f"asyncgpu.{s}").__all__
    }
    homes |= {getattr(asyncgpu, n) for n in asyncgpu.__all__}
    from asyncgpu.kernel.records import KernelRecords, StageSummary
    from asyncgpu.ranks.balance import RankBalance
    from asyncgpu.ranks.merge import RankInfo

    for t in (
        asyncgpu.types.LaunchRecord,
        asyncgpu.types.PoolStats,
        asyncgpu.types.ClockCalibration,
        KernelRecords,
        StageSummary,
        RankBalance,
        RankInfo,
        asyncgpu.types.DeviceSummary,
    ):
        assert t in homes


def test_names_removed_in_0_3_say_where_they_are():
    with pytest.raises(AttributeError, match=r"asyncgpu.kernel.KernelProfiler \(the old name was removed in 0.3\)"):
        asyncgpu.KernelProfiler  # noqa: B018
    with pytest.raises(AttributeError, match="asyncgpu.profiler_range"):
        asyncgpu.capture  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        asyncgpu.nothing  # noqa: B018


def test_one_exception_root():
    """Every error has one root; the warning categories are RuntimeWarnings (a warning is not an error)."""
    warning_categories = []
    for mod in (asyncgpu, asyncgpu.errors):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, type) and issubclass(obj, Warning):
                assert issubclass(obj, RuntimeWarning) and not issubclass(obj, asyncgpu.AsyncGPUError)
                warning_categories.append(name)
            elif isinstance(obj, type) and issubclass(obj, Exception):
                assert issubclass(obj, asyncgpu.AsyncGPUError)
    assert warning_categories == ["BlockingCallWarning"]


def test_cuda_imports_live_in_one_module():
    root = pathlib.Path(asyncgpu.__file__).parent
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.parent != root / "_backends" / "cuda" and ("from cuda" in p.read_text() or "import cuda" in p.read_text())
    ]
    assert offenders == []


def test_blocking_device_calls_have_awaitable_forms_named_by_one_rule():
    """``await x.verb()`` is async, ``x.verb_sync()`` blocks; a blocking method older than that rule keeps its name
    and its async form is the same name with an ``a`` in front (``close``/``aclose``), taking the same arguments."""
    device = asyncgpu.Device
    for blocking in ("alloc", "alloc_pinned", "synchronize", "clock", "close"):
        sync, async_ = getattr(device, blocking), getattr(device, "a" + blocking)
        assert not inspect.iscoroutinefunction(sync) and inspect.iscoroutinefunction(async_), blocking
        assert inspect.signature(sync).parameters.keys() == inspect.signature(async_).parameters.keys(), blocking
    for new in ("run", "prepare"):  # async calls without a blocking form: a plain verb
        assert inspect.iscoroutinefunction(getattr(device, new)) and not hasattr(device, f"{new}_sync")
    assert list(inspect.signature(device.run).parameters) == ["self", "fn", "args", "stream", "abandon_on_cancel"]
