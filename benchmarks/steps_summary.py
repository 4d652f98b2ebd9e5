"""The always-on cost of several `bench_steps --parts` runs side by side, and their medians.

One reading of the step timer's always-on cost moves from run to run by about its own size (the neighbours' p50
and the harvest thread's share both do; the marks by phase hold steady): `scripts/gpu_check.sh` runs the parts
``PARTS_REPEAT`` times and this prints, per loop, each run's total (the marks by neighbours plus the harvest thread),
the same with the marks by phase, and the medians, ending with one ``KEY`` line for the check's table.

    python3 benchmarks/steps_summary.py OUT/steps_parts/*/bench_steps.json
"""

from __future__ import annotations

import json
import statistics
import sys

LOOPS = ("host-bound", "gpu-bound")


def summary(docs: list[dict]) -> dict[str, dict[str, list[float]]]:
    """Per loop, each run's ``total_pct``, ``total_by_phase_pct``, ``marks_pct``, ``phases_pct`` and
    ``harvest_pct`` (`bench_steps.always_on`), in run order; runs without the harvest share are left out."""
    out: dict[str, dict[str, list[float]]] = {}
    for doc in docs:
        for loop, row in (doc.get("always_on") or {}).items():
            if row.get("total_pct") is None:
                continue
            cols = out.setdefault(loop, {})
            for k in ("total_pct", "total_by_phase_pct", "marks_pct", "phases_pct", "harvest_pct"):
                cols.setdefault(k, []).append(float(row[k]))
    return out


def render(rows: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = []

    def each(v: list[float]) -> str:
        return ", ".join(f"{x:+.2f}" for x in v)

    for loop in (*LOOPS, *(k for k in rows if k not in LOOPS)):
        cols = rows.get(loop)
        if not cols:
            continue
        med = {k: statistics.median(v) for k, v in cols.items()}
        lines.append(
            f"{loop}: always on {each(cols['total_pct'])} % (median {med['total_pct']:+.2f} %); with the marks by "
            f"phase {each(cols['total_by_phase_pct'])} % (median {med['total_by_phase_pct']:+.2f} %); marks "
            f"{each(cols['marks_pct'])} %, by phase {each(cols['phases_pct'])} %; harvest thread "
            f"{each(cols['harvest_pct'])} %"
        )
    if rows:
        n = max(len(c["total_pct"]) for c in rows.values())
        key = "; ".join(
            f"{loop} {statistics.median(c['total_pct']):+.2f} % ({statistics.median(c['total_by_phase_pct']):+.2f})"
            for loop, c in rows.items()
        )
        lines.append(f"KEY always on, median of {n}: {key}")
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip())
        return 2
    docs = []
    for path in argv:
        with open(path) as f:
            docs.append(json.load(f))
    rows = summary(docs)
    if not rows:
        print("no run with the harvest share (bench_steps --harvest-steps 0?)")
        return 1
    print("\n".join(render(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
