"""What the examples share: the devices they run on, one line for what is missing, where traces go.

Each example runs on the devices of ``$ASYNCGPU_BACKEND`` (``host``: CPU worker threads; default ``cuda``). When
something it needs is missing (a GPU, a package, a launcher) it prints one line on stderr saying what, and how to
get it, and exits with 2 (a usage mistake, as the ``asyncgpu`` command does). Traces go to the temp folder unless
``--trace PATH`` says where.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from typing import NoReturn

import asyncgpu
import asyncgpu.errors

__all__ = ["devices", "missing_modules", "need", "need_modules", "script", "trace_path"]


def script() -> str:
    """How the running example was started, for messages: ``examples/two_gpus.py``."""
    return sys.argv[0] if sys.argv and sys.argv[0] else "this example"


def need(what: str) -> NoReturn:
    """Say in one line on stderr what the example needs, and exit with 2."""
    print(f"{script()}: needs {what}", file=sys.stderr)
    raise SystemExit(2)


def missing_modules(modules: tuple[str, ...], install: str) -> list[str]:
    """``["torch and cupy (pip install ...)"]`` for the modules that are not installed, or ``[]``."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return [f"{' and '.join(missing)} ({install})"] if missing else []


def need_modules(*modules: str, install: str) -> None:
    """Exit with one line when a module is not installed (``install``: the command that installs them)."""
    missing = missing_modules(modules, install)
    if missing:
        need(missing[0])


def devices(
    count: int | None = None, *, cuda_only: str = "", modules: tuple[str, ...] = (), install: str = ""
) -> list[asyncgpu.Device]:
    """The devices of ``$ASYNCGPU_BACKEND`` (default cuda; host: two devices unless ``count`` says), the first
    ``count`` of them. Exits with one line naming all that is missing: a usable GPU (pointing to
    ``ASYNCGPU_BACKEND=host``, unless ``cuda_only`` says what only CUDA can run) and ``modules`` not installed
    (``install``: the command that installs them)."""
    needs = missing_modules(modules, install)
    backend = asyncgpu.default_backend()
    if backend != "cuda" and cuda_only:
        need(" and ".join([f"a CUDA GPU for {cuda_only} (ASYNCGPU_BACKEND={backend} cannot run it)", *needs]))
    try:
        devs = asyncgpu.devices(backend, count=count)
    except asyncgpu.NoDeviceError as exc:
        why = str(exc).split(". ")[0].removeprefix("no usable CUDA GPU: ")  # the reason, not the advice for code
        gpu = (
            f"a CUDA GPU ({why})"
            if cuda_only
            else f"a CUDA GPU, or host devices: ASYNCGPU_BACKEND=host python {script()} ({why})"
        )
        need(" and ".join([gpu, *needs]))
    except asyncgpu.errors.UnknownDeviceError as exc:  # fewer devices than ``count``
        need(" and ".join([f"{count} devices ({exc})", *needs]))
    if needs:
        need(" and ".join(needs))
    return devs


def trace_path(given: str | None, name: str) -> str:
    """``given``, else ``name`` in the temp folder (never the current folder: a clone stays clean), with the
    suffix of Perfetto's native format when the ``perfetto`` package is installed, else Chrome trace JSON."""
    suffix = ".pftrace" if importlib.util.find_spec("perfetto") is not None else ".trace.json"
    return given if given else os.path.join(tempfile.gettempdir(), name + suffix)
