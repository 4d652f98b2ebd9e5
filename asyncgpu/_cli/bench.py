"""``asyncgpu bench MODULE:FUNCTION``: `asyncgpu.benchmark` on the user's ``FUNCTION(stream)`` across devices. The
function is loaded from an importable module (from the current folder, as ``python -m`` does) or from a file (its
folder importable, as ``python file.py`` does); a failure names the user's file and line.

Threads: the command's main thread (`asyncgpu.benchmark` runs its own event loop).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from asyncgpu._cli.common import Failed, Out, Usage, check_output_path, open_devices
from asyncgpu._runtime import select

__all__ = ["run_bench"]

#: The package's folder: frames inside it are left out when a failure names where it happened.
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


def _where(exc: BaseException) -> str:
    """`` (at file:line)`` of the deepest frame outside asyncgpu and importlib, or ``""``."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith((_PACKAGE_DIR, "<frozen")):
            return f" (at {frame.filename}:{frame.lineno})"
    return ""


def _load_function(target: str) -> Callable[..., Any]:
    """``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` (``FUNCTION`` may be dotted: ``Class.method``)."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise Usage(f"bench takes MODULE:FUNCTION (e.g. mymodule:step or path/to/file.py:step), not {target!r}")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise Usage(f"no such file: {path}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # as `python file.py` does: the file can import its neighbours
        name = path.stem if path.stem not in sys.modules else f"_asyncgpu_bench_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise Usage(f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            del sys.modules[name]
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise Failed(f"importing {path} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                raise Usage(
                    f"cannot import {module_name}: {exc}. Run from the folder that holds it, or give its "
                    f"file: path/to/{module_name.replace('.', '/')}.py:{attr}"
                ) from None
            raise Failed(f"importing {module_name} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
        except Exception as exc:
            raise Failed(f"importing {module_name} raised {type(exc).__name__}: {exc}{_where(exc)}") from exc
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise Usage(f"{module_name} has no {attr!r}: name a function defined in it (MODULE:FUNCTION)")
        fn = getattr(fn, part)
    if not callable(fn):
        raise Usage(f"{module_name}:{attr} is a {type(fn).__name__}, not a function")
    return fn


def run_bench(out: Out, args: argparse.Namespace) -> int:
    """Load the function, benchmark it, print the result (and write ``--json``); returns the exit code. The output
    path is checked before the run. ``sys.path`` is restored afterwards."""
    saved = sys.path[:]
    try:
        return _bench_run(out, args)
    finally:
        sys.path[:] = saved  # _load_function may add the module's folder


def _bench_run(out: Out, args: argparse.Namespace) -> int:
    from asyncgpu._base.errors import BenchmarkError
    from asyncgpu._timing.bench import benchmark, parse_devices

    if args.json is not None:
        check_output_path("--json", args.json)
    fn = _load_function(args.target)
    if args.devices is None:
        open_devices(args.backend or select.default_backend(), None)  # no GPU: say which option to use
    try:
        devs = parse_devices(args.devices, args.backend)
    except ValueError as exc:
        raise Usage(str(exc)) from None
    try:
        result = benchmark(
            fn,
            n_repeat=args.n_repeat,
            n_warmup=args.n_warmup,
            max_duration_s=args.max_duration,
            devices=devs,
            max_noise=args.max_noise,
            name=args.target.rpartition(":")[2],
            source=args.source,
        )
    except (ValueError, TypeError) as exc:
        raise Usage(str(exc)) from None
    except BenchmarkError as exc:
        if exc.result.n_repeat and not out.json:
            out.out.print(exc.result)
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise Failed(f"{exc}{_where(cause)}") from exc
    if out.json:
        out.document(result.to_dict())
    else:
        out.out.print(result)
    if args.json is not None:
        try:
            Path(args.json).write_text(json.dumps(result.to_dict(times=True), indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            raise Failed(f"could not write {args.json}: {exc.strerror or exc}") from None
        out.progress(f"asyncgpu bench: results written to {args.json}")
    return 0
