"""The machine a run measured: GPU models and driver, Python, package versions, the commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("asyncgpu", "numpy", "anyio", "torch", "cupti-python", "cuda-core", "cuda-bindings", "trio", "uvloop")


def _run(cmd: list[str]) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def _gpus_nvidia_smi() -> tuple[list[str], str | None] | None:
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if out is None:
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    return [r[0] for r in rows], (rows[0][1] if rows and len(rows[0]) > 1 else None)


def _gpus_cuda_core() -> tuple[list[str], str | None] | None:
    try:
        try:
            from cuda.core import Device, system  # type: ignore[import-not-found]
        except ImportError:
            from cuda.core.experimental import Device, system  # type: ignore[import-not-found]

        names = [Device(i).name for i in range(system.num_devices)]
        major, minor = system.driver_version
        return names, f"CUDA {major}.{minor}"
    except Exception:  # no cuda.core, no driver, no GPU: nothing to name
        return None


def gpus() -> tuple[list[str], str | None]:
    """The GPUs' names (an empty list when there are none) and the driver's version (None without one)."""
    return _gpus_nvidia_smi() or _gpus_cuda_core() or ([], None)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    if out["asyncgpu"] is None:  # a checkout on PYTHONPATH, not installed
        try:
            import asyncgpu

            out["asyncgpu"] = getattr(asyncgpu, "__version__", None)
        except Exception:
            pass
    return out


def environment(backend: str) -> dict[str, Any]:
    names, driver = gpus()
    # A copy of the working tree on another machine may carry a stale .git: the caller names the commit there.
    named = os.environ.get("ASYNCGPU_COMMIT")
    commit = named or _run(["git", "rev-parse", "HEAD"]) or "unknown"
    dirty = None if named else _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "gpus": names or "none",
        "gpu_model": " + ".join(dict.fromkeys(names)) if names else "none",
        "gpu_count": len(names),
        "driver": driver or "none",
        "backend": backend,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "packages": versions(),
        "commit": commit,
        "commit_dirty": bool(dirty) if dirty is not None else None,
        "asyncgpu_backend_env": os.environ.get("ASYNCGPU_BACKEND"),
    }
