"""The public surface stays small and consistent."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import asyncgpu


def test_all_matches_the_facade():
    public = {n for n in dir(asyncgpu) if not n.startswith("_") and not inspect.ismodule(getattr(asyncgpu, n))}
    assert set(asyncgpu.__all__) == public
    assert len(asyncgpu.__all__) <= 60  # errors are a fifth of it


def test_every_module_all_names_exist():
    for info in pkgutil.iter_modules(asyncgpu.__path__):
        if info.name in ("__main__", "_cuda"):  # _cuda imports cuda.core lazily; checked in test_kernels
            continue
        mod = importlib.import_module(f"asyncgpu.{info.name}")
        for name in getattr(mod, "__all__", ()):
            assert hasattr(mod, name), f"asyncgpu.{info.name}.__all__ names missing {name}"


def test_one_exception_root():
    for name in asyncgpu.__all__:
        obj = getattr(asyncgpu, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, asyncgpu.AsyncGPUError)


def test_cuda_imports_live_in_one_module():
    import pathlib

    root = pathlib.Path(asyncgpu.__file__).parent
    offenders = [p.name for p in root.glob("*.py")
                 if p.name != "_cuda.py" and ("from cuda" in p.read_text() or "import cuda" in p.read_text())]
    assert offenders == []
