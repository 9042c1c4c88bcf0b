"""The README's results table, from the sweep files in benchmarks/results/ (latest sweep per workload).

python -m styx_benchmarks.summary [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def latest_sweeps(results: Path) -> dict[str, dict[str, Any]]:
    """Per (workload, options) label, the newest sweep document."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(results.glob("*-sweep-*.json")):
        doc = json.loads(path.read_text())
        cfg = doc["config"]
        label = cfg["workload"]
        if cfg["workload"] == "tpcc":
            label += f" W={cfg['options']['warehouses']}"
        doc["file"] = path.name
        out[label] = doc  # sorted by name = by time stamp: the last one wins
    return out


def table(sweeps: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| workload | max sustainable (p99 < 1 s) | rate → p50 / p99 (ms) | file |",
        "|---|---|---|---|",
    ]
    for label, doc in sweeps.items():
        runs = sorted(doc["runs"], key=lambda r: r["rate"])
        ok = [r["rate"] for r in runs if r["sustainable_p99_1s"]]
        best = f"{max(ok):g}/s" if ok else "below the lowest rate"
        if ok and max(ok) == runs[-1]["rate"]:
            best = f"≥ {best} (highest rate tried)"
        cells = []
        for r in runs:
            lat = r["latency_ms"]
            mark = "" if r["sustainable_p99_1s"] else " ✗"
            cells.append(f"{r['rate']:g}: {lat['p50']:.0f} / {lat['p99']:.0f}{mark}")
        lines.append(f"| {label} | {best} | {'; '.join(cells)} | `{doc['file']}` |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--results", default="benchmarks/results")
    args = parser.parse_args()
    sweeps = latest_sweeps(Path(args.results))
    if not sweeps:
        print(f"no sweep files in {args.results}; run 'make bench' first", file=sys.stderr)
        return 1
    print(table(sweeps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
