"""``asyncgpu devices``: the devices of a backend with their memory and their clock calibration against the host
clock (the event anchor's error bound, the %globaltimer offset and its bound, the drift).

Threads: the command's main thread, which each device's calibration (32 samples) blocks.
"""

from __future__ import annotations

from typing import Any

from asyncgpu._analysis.table import Column, FitTable, number
from asyncgpu._base.errors import ClockError
from asyncgpu._cli.common import GIB, Out, no_gpu
from asyncgpu._runtime import select

__all__ = ["run_devices"]


def _memory(d: Any) -> tuple[str, dict[str, int | None]]:
    """Free / total memory in GiB (the GPU's, or the host RAM the host devices share), as text and as data."""
    info = d.memory_info()
    if info is None:
        return "—", {"memory_free_bytes": None, "memory_total_bytes": None}
    return f"{info[0] / GIB:,.1f} / {info[1] / GIB:,.1f}", {
        "memory_free_bytes": int(info[0]),
        "memory_total_bytes": int(info[1]),
    }


def run_devices(out: Out, backend: str | None) -> int:
    """List the devices of ``backend`` (default: ``$ASYNCGPU_BACKEND``, else cuda); returns the exit code. `Usage`
    when CUDA is asked for and no GPU is usable."""
    name = backend or select.default_backend()
    if name == "cuda":
        ok, why = select.backend_available("cuda")
        if not ok:  # by default, by $ASYNCGPU_BACKEND or by name: a usage mistake, as in the other commands
            raise no_gpu(why)
    table = FitTable(
        f"{name} devices, clocks against the host clock (time.perf_counter_ns)",
        [
            Column("device"),
            Column("model", drop=1),
            number("GiB free / total", drop=2),
            number("event anchor ± µs"),
            number("%globaltimer − host (s)", drop=3),
            number("± µs", drop=4),
            number("drift ppm", drop=5),
        ],
        "host devices are threads: they share the host's RAM" if name == "host" else None,
    )
    rows = []
    for d in select.devices(name):
        memory, memory_data = _memory(d)
        row: dict[str, Any] = {"name": d.name, "description": d.description, **memory_data}
        rows.append(row)
        try:
            cal = d.clock(refresh=True, samples=32)
        except ClockError as exc:
            row["clock_error"] = str(exc)
            table.add_row(d.name, d.description, memory, f"failed: {exc}", "", "", "")
            continue
        row.update(
            anchor_bound_ns=cal.bound_ns,
            globaltimer_offset_ns=cal.globaltimer_offset_ns,
            globaltimer_bound_ns=cal.globaltimer_bound_ns,
            drift_ppm=cal.drift_ppm,
        )
        gt = "—" if cal.globaltimer_offset_ns is None else f"{cal.globaltimer_offset_ns / 1e9:,.6f}"
        gb = "—" if cal.globaltimer_bound_ns is None else f"{cal.globaltimer_bound_ns / 1e3:.2f}"
        drift = "—" if cal.drift_ppm is None else f"{cal.drift_ppm:+.2f}"
        table.add_row(d.name, d.description, memory, f"{cal.bound_ns / 1e3:.2f}", gt, gb, drift)
    if out.json:
        out.document({"backend": name, "devices": rows})
    else:
        out.out.print(table)
    return 0
