"""``asyncgpu report TRACE``: the summaries and the balance report of a trace that asyncgpu wrote (Chrome JSON or
Perfetto), optionally its first activities.

Threads: the command's main thread.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

from asyncgpu._analysis.report import activity_table, balance_renderable, device_table, timeline_table
from asyncgpu._cli.common import Out, Usage, print_footer, summaries

__all__ = ["run_report"]


def run_report(out: Out, args: argparse.Namespace) -> int:
    """Read ``args.trace`` and print its report; returns the exit code. `Usage` for a file that cannot be read or
    is not an asyncgpu trace."""
    from asyncgpu._trace.export import read_trace

    try:
        tl = read_trace(args.trace)
    except OSError as exc:
        raise Usage(f"cannot read {args.trace}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise Usage(str(exc)) from None
    if out.json:
        rows = tl.time_order() if args.order == "time" else np.arange(len(tl))
        timeline = [dataclasses.asdict(tl.row(int(i))) for i in rows[: args.timeline]]
        out.document({"trace": args.trace, **summaries(tl), "timeline": timeline})
        return 0
    described = ", ".join(f"{n} ({d})" if d else n for n, d in zip(tl.devices, tl.descriptions))
    out.out.print(
        f"trace {args.trace}: scope {tl.label!r}, {len(tl):,} activities on {described}", markup=False, highlight=False
    )
    parts: list[Any] = []
    if args.timeline:
        parts.append(timeline_table(tl, order=args.order, limit=args.timeline))
    parts += [activity_table(tl), device_table(tl), balance_renderable(tl)]
    for part in parts:
        # Tables fit the width already: not cropping keeps long timelines fast, and a long (plain) one printed with
        # soft wrap gets its rows by chunks rather than by lines, which is several times faster for large traces.
        out.out.print(part, crop=False, soft_wrap=bool(getattr(part, "plain", False)))
        out.out.print()
    print_footer(out.out, tl)
    if tl.error:
        out.out.print(f"the scope raised {tl.error}", markup=False, highlight=False)
    return 0
