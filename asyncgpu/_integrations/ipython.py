"""IPython magics ``%gpu_timeit`` and ``%%gpu_timeit``: `asyncgpu.benchmark` on a statement or a cell.

    %load_ext asyncgpu
    %gpu_timeit -n 1000 --devices 0,1 step(stream, xs[device.index])
    %%gpu_timeit --max-duration 5
    y = model(x)                          # the cell is timed; put setup in a cell before

The statement (or the cell) is the body of ``fn(stream)``: it sees ``stream`` (the asyncgpu `Stream` of the device
it runs on) and ``device`` (that `Device`), and the notebook's names; names it assigns stay local to it. It runs
once per device per repeat, in that device's thread (see `asyncgpu._timing.bench`). The result is printed as a rich
table (HTML in notebooks); ``-o`` also returns the `BenchmarkResult`.

Importing asyncgpu never imports IPython: it is imported when the extension loads.
"""

from __future__ import annotations

import ast
from typing import Any, Callable

__all__ = ["load_ipython_extension", "unload_ipython_extension"]

DEFAULT_MAX_DURATION_S = 2.0  #: the magics stop after this long unless ``--max-duration`` says otherwise
_USAGE = "%gpu_timeit [-n N] [-w N] [--max-duration S] [--max-noise F] [--devices LIST] [--backend B] [-o] statement"
_magics: Any = None


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext asyncgpu``: register ``%gpu_timeit`` / ``%%gpu_timeit``."""
    ipython.register_magics(_magics_class())


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext asyncgpu``: remove the magics again."""
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("gpu_timeit", None)


def _magics_class() -> type:
    global _magics
    if _magics is not None:
        return _magics
    from IPython.core.magic import Magics, line_cell_magic, magics_class

    @magics_class
    class GpuTimeitMagics(Magics):
        @line_cell_magic
        def gpu_timeit(self, line: str, cell: str | None = None) -> Any:
            """Time a statement (line magic) or a cell (cell magic) on several devices at once, with
            ``asyncgpu.benchmark``.

            %gpu_timeit [options] statement
            %%gpu_timeit [options]
            <cell>

            The code sees ``stream`` (the asyncgpu Stream of the device it runs on) and ``device``; it must
            enqueue its device work on ``stream`` (``torch.cuda.ExternalStream(stream.handle)``,
            ``cupy.cuda.ExternalStream(stream.handle, device.index)``). It runs once per device per repeat, in
            that device's thread.

            Options:
              -n N              timed repeats (default 10000)
              -w N              untimed warm-up calls per device (default 10)
              --max-duration S  stop after S seconds of timed repeats (default 2)
              --max-noise F     stop once every device's relative std is <= F (0.005 = 0.5%)
              --devices LIST    comma-separated devices: 0,1 or cuda:0,cuda:1 or host:0,host:1
                                (default: every device of --backend)
              --backend B       cuda or host (default: $ASYNCGPU_BACKEND, else cuda)
              --name NAME       the name shown in the result
              -o                return the BenchmarkResult
            """
            return _run(self.shell, self.parse_options, line, cell)

    _magics = GpuTimeitMagics
    return _magics


def _run(shell: Any, parse_options: Callable[..., Any], line: str, cell: str | None) -> Any:
    from IPython.core.error import UsageError

    from asyncgpu._base.errors import BenchmarkError, NoDeviceError, UnknownDeviceError
    from asyncgpu._timing.bench import benchmark, parse_devices

    opts, stmt = parse_options(
        line,
        "n:w:o",
        "max-duration=",
        "max-noise=",
        "devices=",
        "backend=",
        "name=",
        posix=False,
        strict=False,
        preserve_non_opts=True,
    )
    if cell is not None:
        if stmt.strip():
            raise UsageError(
                f"%%gpu_timeit takes only options on its first line, not {stmt.strip()!r}: put "
                "setup code in a cell before this one"
            )
        stmt = cell
    if not stmt.strip():
        raise UsageError(f"nothing to time: {_USAGE}")
    n_repeat = _number(opts, "n", int, 10000, 1)
    n_warmup = _number(opts, "w", int, 10, 0)
    max_duration = _number(opts, "max-duration", float, DEFAULT_MAX_DURATION_S, 0.0)
    max_noise = _number(opts, "max-noise", float, None, 0.0, strict=True)
    backend = opts.get("backend")
    if backend is not None and backend not in ("cuda", "host"):
        raise UsageError(f"--backend is cuda or host, not {backend!r}")
    fn = _compile(shell, stmt)
    try:
        targets = parse_devices(opts.get("devices"), backend)
        result = benchmark(
            fn,
            n_repeat=n_repeat,
            n_warmup=n_warmup,
            max_duration_s=max_duration,
            devices=targets,
            max_noise=max_noise,
            name=opts.get("name") or _short(stmt),
        )
    except (ValueError, TypeError, NoDeviceError, UnknownDeviceError) as exc:
        raise UsageError(str(exc)) from None
    except BenchmarkError as exc:
        if exc.result.n_repeat:
            _show(exc.result)
        raise
    _show(result)
    return result if "o" in opts else None


def _number(opts: Any, key: str, kind: type, default: Any, minimum: float, strict: bool = False) -> Any:
    """The option's value as ``kind``, at least ``minimum`` (above it with ``strict``); UsageError otherwise."""
    from IPython.core.error import UsageError

    raw = opts.get(key)
    if raw is None:
        return default
    flag = f"-{key}" if len(key) == 1 else f"--{key}"
    try:
        value = kind(raw)
    except ValueError:
        raise UsageError(f"{flag} takes {'a whole number' if kind is int else 'a number'}, not {raw!r}") from None
    if not (value > minimum if strict else value >= minimum):  # also refuses NaN
        raise UsageError(f"{flag} must be {'>' if strict else '>='} {minimum:g}, got {raw}")
    return value


def _compile(shell: Any, code: str) -> Callable[..., Any]:
    """``def fn(stream): device = stream.device; <code>``, with the notebook's names as its globals."""
    src = shell.transform_cell(code)
    try:
        filename = shell.compile.cache(src)  # tracebacks then show the code
    except (AttributeError, TypeError):
        filename = "<gpu_timeit>"
    body = ast.parse(src, filename).body or [ast.Pass()]
    module = ast.parse("def _gpu_timeit_fn(stream):\n    device = stream.device\n")
    module.body[0].body.extend(body)  # type: ignore[attr-defined]
    ast.fix_missing_locations(module)
    scope: dict[str, Any] = {}
    exec(compile(module, filename, "exec"), shell.user_ns, scope)  # noqa: S102 - the user's own code
    return scope["_gpu_timeit_fn"]


def _short(stmt: str) -> str:
    first = stmt.strip().splitlines()[0]
    return first if len(first) <= 40 and "\n" not in stmt.strip() else first[:37] + "..."


def _show(result: Any) -> None:
    from rich.console import Console

    Console().print(result)  # HTML in notebooks (rich detects Jupyter), text in a terminal
