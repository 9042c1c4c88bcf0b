"""How much a snapshot delays the epochs that follow it, from every request's record timestamps.

    python -m styx_benchmarks.snapshot_stall                  # 4 000/s for 30 s, a snapshot every 5 s
    python -m styx_benchmarks.snapshot_stall --compare 3      # and the steps of before, alternating

Starts the local stack (2 workers) with a snapshot every ``--interval`` seconds and no compaction, so
every snapshot's deltas stay in S3 and name its epoch. Sends YCSB-T transfers open-loop through the
SDK (:func:`styx_benchmarks.latency_path.measure`) and reads back, for every epoch, when its first
reply was produced. An epoch normally follows the one before by a median gap; a snapshot's **stall**
is how much longer its next ``K`` = 10 epochs took than ``K`` median gaps. The same measure ``4 K``
epochs after each snapshot is the **baseline**: what the run's noise gives. ``--compare N`` also runs
the worker's snapshot unpaced (steps of 1 000 rows, back to back:
``STYX_SNAPSHOT_STEP_ROWS=1000``, ``STYX_SNAPSHOT_STEP_PAUSE_MS=0``), N rounds of each, alternating.

Results go to ``benchmarks/results/snapshot-stall-<time>.json``; the measured numbers are in
benchmarks/results/snapshot-stall.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from styx_benchmarks.latency_path import RESULTS, measure, percentiles
from styx_py.core.blobs import epoch_of
from styx_py.core.config import Config
from styx_py.io.s3 import MinioBlobStore
from styx_py.stack.local import LocalStack
from styx_py.stack.seaweed import minio_client

K = 10  # epochs after a snapshot that its stall is measured over
BEFORE = {"STYX_SNAPSHOT_STEP_ROWS": "1000", "STYX_SNAPSHOT_STEP_PAUSE_MS": "0"}

Row = tuple[float, float, float, float, int]  # scheduled, sent, replied, resolved (ms), epoch


def stalls(rows: list[Row], snapshots: list[int], k: int = K) -> dict[str, Any]:
    """Each snapshot's stall and the baseline (module docstring), and the run's latency percentiles (pure).
    Epochs without a reply are skipped: a window runs from the first replied epoch at or after its
    start to the first at or after ``k`` epochs later, and counts the epochs between."""
    first: dict[int, float] = {}
    for _, _, replied, _, epoch in rows:
        first[epoch] = min(replied, first.get(epoch, replied))
    epochs = sorted(first)
    if len(epochs) < 2:
        return {"snapshots": len(snapshots), "stall_ms": [], "baseline_ms": []}
    gap = statistics.median((first[b] - first[a]) / (b - a) for a, b in itertools.pairwise(epochs))

    def extra(start: int) -> float | None:
        a = next((e for e in epochs if e >= start), None)
        b = next((e for e in epochs if e >= start + k), None)
        return None if a is None or b is None else round(first[b] - first[a] - (b - a) * gap, 1)

    def measured(starts: list[int]) -> list[float]:
        return [x for x in map(extra, starts) if x is not None]

    total = [resolved - scheduled for scheduled, _, _, resolved, _ in rows]
    return {
        "snapshots": len(snapshots),
        "epoch_gap_ms": round(gap, 2),
        "stall_ms": measured(snapshots),
        "baseline_ms": measured([s + 4 * k for s in snapshots]),
        "latency_ms": percentiles(total, (50, 99, 99.9)),
    }


async def snapshot_epochs(stack: LocalStack) -> list[int]:
    """The epochs of the snapshots whose deltas are in S3 (every one, without compaction)."""
    assert stack.s3 is not None
    blobs = MinioBlobStore(minio_client(stack.s3.config), Config().snapshot_bucket)
    return sorted({epoch_of(key) for key in await blobs.list("snapshots/")})


def run_once(rate: float, seconds: float, interval: float, env: dict[str, str]) -> dict[str, Any]:
    env = {"STYX_LOG_LEVEL": "WARNING", "STYX_SNAPSHOT_INTERVAL_S": str(interval)} | env
    env["STYX_SNAPSHOT_COMPACT_AFTER"] = "1000000"
    data_dir = Path(tempfile.mkdtemp(prefix="styx-stall-"))
    try:
        with LocalStack(data_dir, workers=2, env=env) as stack:
            stack.deploy("styx_benchmarks.bank:app")
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                out = runner.run(measure(stack, rate, seconds, keep_rows=True))
                snaps = runner.run(snapshot_epochs(stack))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    # The last snapshot may be cut off by the end of the run.
    return {"answered": out["answered"], "sent": int(rate * seconds)} | stalls(out["rows"], snaps[:-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=4000.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between snapshots")
    parser.add_argument("--compare", type=int, default=0, metavar="N", help="N rounds, and of the old steps")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    variants: dict[str, dict[str, str]] = {"now": {}} | ({"before": BEFORE} if args.compare else {})
    runs: list[dict[str, Any]] = []
    for n in range(max(1, args.compare)):
        for name, env in variants.items():
            measured = run_once(args.rate, args.seconds, args.interval, env)
            one: dict[str, Any] = {"variant": name, "round": n + 1} | measured
            runs.append(one)
            lat = one.get("latency_ms", {})
            stall, base = (statistics.fmean(one[k] or [0]) for k in ("stall_ms", "baseline_ms"))
            print(
                f"{name:<7} round {n + 1}: {one['answered']}/{one['sent']} answered, "
                f"{len(one['stall_ms'])} snapshots, stall mean {stall:.1f} ms (baseline {base:.1f}), "
                f"p50/p99/p99.9 {lat.get('p50')}/{lat.get('p99')}/{lat.get('p99.9')} ms",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"snapshot-stall-{time.strftime('%Y%m%d-%H%M%S')}.json"
    settings = {"rate": args.rate, "seconds": args.seconds, "interval_s": args.interval, "k_epochs": K}
    path.write_text(json.dumps(settings | {"runs": runs}, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
