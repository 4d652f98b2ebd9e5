"""What the ``asyncgpu`` subcommands share: where output goes (`Out`), the two kinds of reported error (`Usage`:
exit code 2, `Failed`: exit code 1; `asyncgpu._cli.main` maps them to exit codes), the checks made before any
work (an output path that can be written, a GPU when CUDA is asked for), and the summaries that ``demo`` and
``report`` both print.

Threads: the command's main thread.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from asyncgpu._analysis.balance import balance
from asyncgpu._analysis.report import durations_from
from asyncgpu._analysis.summary import activity_summary, device_summary
from asyncgpu._base.numbers import finite_json
from asyncgpu._base.records import Timeline
from asyncgpu._runtime import select

__all__ = [
    "GIB",
    "Failed",
    "Out",
    "Usage",
    "check_output_path",
    "no_gpu",
    "open_devices",
    "print_footer",
    "summaries",
]

GIB = 1 << 30


class Usage(Exception):
    """A user mistake: printed as one line, exit code 2."""


class Failed(Exception):
    """The work failed (the user's module or function raised, not enough memory): one line, exit code 1."""


@dataclasses.dataclass(frozen=True)
class Out:
    """Where the command writes: ``out`` (stdout) for results, ``err`` (stderr) for progress and errors."""

    out: Console
    err: Console
    json: bool = False  #: results as one JSON document on stdout instead of tables
    quiet: bool = False  #: no progress lines

    def progress(self, text: str) -> None:
        if not self.quiet:
            self.err.print(text, markup=False, highlight=False, soft_wrap=True)

    def document(self, data: Any) -> None:
        """``data`` as JSON on stdout (NaN and infinities as null)."""
        self.out.file.write(json.dumps(finite_json(data), indent=1) + "\n")


def no_gpu(why: str) -> Usage:
    """The usage mistake of asking for CUDA where no GPU is usable (``why``: the backend's reason)."""
    return Usage(f"no usable CUDA GPU ({why}): add --backend host to run on host worker threads instead")


def open_devices(backend: str, count: int | None) -> list[Any]:
    """The devices of ``backend`` (the first ``count``); a missing GPU is a usage mistake naming the option."""
    if backend == "cuda":
        ok, why = select.backend_available("cuda")
        if not ok:
            raise no_gpu(why)
    return select.devices(backend, count=count)


def check_output_path(option: str, path: str) -> None:
    """Raise `Usage` naming why ``path`` (given with ``option``: ``--trace``, ``--json``) cannot be written;
    checked before the run, so that a mistake costs no run (nothing is left there)."""
    p = Path(path)
    if p.is_dir():
        raise Usage(f"{option} {path}: that is a directory: give a file name")
    folder = p.parent
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist: create it first"
        raise Usage(f"{option} {path}: the directory {folder} {what}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        why = {
            errno.EACCES: "no permission",
            errno.EPERM: "no permission",
            errno.EROFS: "a read-only file system",
        }.get(exc.errno or 0, "the file system takes no new files there")
        raise Usage(f"{option} {path}: cannot write a file in {folder} ({why}): choose a writable path") from None
    if p.exists() and not os.access(p, os.W_OK):
        raise Usage(f"{option} {path}: no permission to overwrite it: choose a writable path")


def summaries(tl: Timeline) -> dict[str, Any]:
    """The summaries of a timeline as JSON-ready data (demo and report)."""
    ds = device_summary(tl)
    return {
        "label": tl.label,
        "activities": len(tl),
        "durations": durations_from(tl),
        "clocks": [
            {"device": c.device, "aligned": c.aligned, "bound_ns": c.bound_ns, "reason": c.reason} for c in tl.clocks
        ],
        "activity_summary": activity_summary(tl).to_dict(),
        "device_summary": ds.to_dict(),
        "balance": balance(ds).to_dict(),
        "error": tl.error,
    }


def print_footer(console: Console, tl: Timeline) -> None:
    """The lines under the tables: each device's clock alignment and where durations come from."""
    clocks = "; ".join(
        f"{c.device} ±{c.bound_ns / 1e3:.1f} µs" if c.aligned else f"{c.device} NOT aligned ({c.reason})"
        for c in tl.clocks
    )
    console.print(f"time base: host clock, devices aligned: {clocks}", markup=False, highlight=False)
    console.print(f"durations: {durations_from(tl)}", markup=False, highlight=False)
