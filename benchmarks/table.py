"""The table of current figures per GPU model, in Markdown, from the runner's JSON files.

    python -m benchmarks.table benchmarks-out/*.json > table.md     # files, or folders holding them

For each figure and GPU model, the newest run that has it wins; each cell says its GPU count, commit and date.
Runs made with ``--quick`` (sizes too small to mean anything) are left out unless ``--quick`` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks._suites import SUITES

FORMAT_PREFIX = "asyncgpu-benchmarks/"


def load(paths: list[str]) -> list[dict[str, Any]]:
    """The runner's documents among these files and folders (other JSON files are passed over)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    docs = []
    for f in files:
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"benchmarks.table: {f}: {e}", file=sys.stderr)
            continue
        if isinstance(doc, dict) and str(doc.get("format", "")).startswith(FORMAT_PREFIX):
            docs.append(doc)
    return docs


def _column(env: dict[str, Any]) -> str:
    if env.get("backend") == "host":
        return "no GPU (host backend)"
    return str(env.get("gpu_model") or "none")


def cells(docs: list[dict[str, Any]], quick: bool = False) -> tuple[list[str], list[str], dict]:
    """(rows, columns, {(row, column): text}), the newest figure winning."""
    rows: list[str] = []
    columns: list[str] = []
    best: dict[tuple[str, str], tuple[str, str]] = {}  # (row, column) -> (started, text)
    order = {name: i for i, name in enumerate(SUITES)}
    for doc in sorted(docs, key=lambda d: d.get("started") or ""):
        if doc.get("quick") and not quick:
            continue
        env = doc.get("environment", {})
        col = _column(env)
        commit = str(env.get("commit", "unknown"))[:7]
        count = env.get("gpu_count") or 0
        note = f"{count} GPU{'s' if count != 1 else ''}, " if env.get("backend") != "host" else ""
        note += f"{commit}, {str(doc.get('started', ''))[:10]}"
        for name, entry in sorted(doc.get("suites", {}).items(), key=lambda kv: order.get(kv[0], 99)):
            suite = SUITES.get(name)
            if suite is None:
                continue
            runs = {r["name"]: r for r in entry.get("runs", [])}
            for what, value in suite.figures(runs):
                row = f"{name}: {what}"
                if row not in rows:
                    rows.append(row)
                if col not in columns:
                    columns.append(col)
                best[(row, col)] = (doc.get("started", ""), f"{value} ({note})")
    rows.sort(key=lambda r: order.get(r.split(":")[0], 99))  # stable: figure order within a suite kept
    return rows, columns, {k: v[1] for k, v in best.items()}


def render(docs: list[dict[str, Any]], quick: bool = False) -> str:
    rows, columns, table = cells(docs, quick)
    if not rows:
        return "(no figures: no runner JSON with results was given)\n"
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| what | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for r in rows:
        lines.append(f"| {esc(r)} | " + " | ".join(esc(table.get((r, c), "—")) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.table", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", metavar="JSON", help="the runner's JSON files, or folders holding them")
    ap.add_argument("--quick", action="store_true", help="also take runs made with --quick")
    a = ap.parse_args(argv)
    docs = load(a.paths)
    if not docs:
        print("benchmarks.table: none of these is a JSON file of `python -m benchmarks`", file=sys.stderr)
        return 1
    sys.stdout.write(render(docs, a.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
