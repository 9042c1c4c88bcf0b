"""What a change of the cluster's shape costs while YCSB-T runs at a steady rate: 2 → 4 → 3 workers,
then one of the three lost for good (killed, never restarted; the others take over after
``takeover_after_ms``).

    python -m styx_benchmarks.reshape --rate 1000 --duration 60

For each change: when it was asked for, the latency (p50/p99/max) of the requests scheduled in the
seconds around it against the undisturbed seconds, and the coordinator's recovery timing (restore
and replay). A request scheduled just before the barrier waits the whole stop window, so the max
latency of those seconds bounds it. Writes benchmarks/results/reshape-<stamp>.json; checks money
conservation and that every request was answered exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from styx_benchmarks.bench import machine_info
from styx_benchmarks.driver import SdkSender, new_histogram, run_open_loop
from styx_benchmarks.workload import Options
from styx_benchmarks.workloads import make_workload
from styx_client import StyxClient
from styx_py.core.wire import ScaleRequest, reply_decoder
from styx_py.io.kafka_logs import read_to_end
from styx_py.stack.local import LocalStack, admin

RESULTS = Path(__file__).parent / "results"


def on(workers: int) -> Callable[[dict[str, Any]], bool]:
    """The status of a cluster running on ``workers`` workers, none failed."""
    return lambda st: st["state"] == "running" and len(st["workers"]) == workers and not st["failed_workers"]


async def changes(stack: LocalStack, at_s: list[float], t0: float) -> list[dict[str, Any]]:
    """Scale to 4, to 3, then lose a worker for good, at ``at_s`` seconds after ``t0``."""
    plan = [("scale 2 → 4", 4), ("scale 4 → 3 (drain w4)", 3), ("lose w2 for good", 2)]
    out: list[dict[str, Any]] = []
    for (what, workers), when in zip(plan, at_s, strict=True):
        await asyncio.sleep(max(0.0, t0 + when - time.perf_counter()))
        asked = time.perf_counter() - t0
        if what.startswith("lose"):
            stack.procs.pop("w2").kill()
        else:
            await admin(stack.coordinator, ScaleRequest(workers), secret=stack.secret)
        # Not supervising after the loss: a supervisor would start a replacement for w2.
        lost = what.startswith("lose")
        st = await asyncio.to_thread(stack.wait_for, on(workers), f"on {workers}", 300, supervise=not lost)
        done = time.perf_counter() - t0
        out.append(
            {
                "change": what,
                "asked_s": round(asked, 3),
                "running_again_s": round(done, 3),
                "until_running_s": round(done - asked, 3),
                # A loss is a recovery; a planned change moves partitions at a barrier.
                "recovery": st["last_recovery"] if lost else st["last_move"],
            }
        )
        print(f"  {what}: running again after {done - asked:.2f} s; {out[-1]['recovery']}", flush=True)
    return out


def window_stats(result: Any, start_s: float, end_s: float) -> dict[str, Any]:
    """Latency of the requests scheduled in measured seconds [start_s, end_s)."""
    h = new_histogram()
    for sec in result.seconds[max(0, int(start_s)) : max(0, int(end_s))]:
        h.add(sec.hist)
    return {k: round(v, 1) for k, v in result.percentiles_ms(h).items() if k in ("p50", "p99", "max")}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="styx-reshape-"))
    env = {
        "STYX_LOG_LEVEL": "WARNING",
        "STYX_SNAPSHOT_INTERVAL_S": str(args.snapshot_interval_s),
        "STYX_TAKEOVER_AFTER_MS": str(args.takeover_after_ms),
    }
    stack = LocalStack(data, workers=2, env=env)
    await asyncio.to_thread(stack.start)
    workload = make_workload("ycsbt", Options(keys=args.keys))
    try:
        await asyncio.to_thread(stack.deploy, workload.app)
        async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
            await workload.load(client, progress=lambda m: print(m, flush=True))
            sender = SdkSender(client, 120)
            t0 = time.perf_counter()
            at = [args.warmup + args.duration * f for f in (0.2, 0.45, 0.7)]
            changing = asyncio.create_task(changes(stack, at, t0))
            result = await run_open_loop(
                workload, sender, rate=args.rate, duration_s=args.duration, warmup_s=args.warmup, quiet=True
            )
            events = await changing
            check = await workload.check(client)
            partitions = max(client.operators.values())  # the app's topics have this many
        egress = {TopicPartition("styx-egress", p): 0 for p in range(partitions)}
        replies = [reply_decoder.decode(r.value or b"") for r in await read_to_end(stack.kafka, egress)]
    finally:
        await asyncio.to_thread(stack.stop)
    result.build_histograms()
    counts = Counter(r.request_id for r in replies)
    answered_twice = sum(1 for n in counts.values() if n > 1)
    for e in events:
        start = e["asked_s"] - args.warmup
        end = e["running_again_s"] - args.warmup + 1
        e["latency_ms_around"] = window_stats(result, start - 1, end)
        # Second by second (scheduled time), to tell the stop from what follows it.
        e["latency_ms_by_second"] = [
            {"second": s, **window_stats(result, s, s + 1)}
            for s in range(max(0, int(start) - 1), int(end) + 1)
        ]
    quiet = window_stats(result, 0, events[0]["asked_s"] - args.warmup - 1)
    doc = {
        "command": f"python -m styx_benchmarks.reshape --rate {args.rate:g} --duration {args.duration:g}",
        "machine": machine_info(),
        "rate": args.rate,
        "sent": result.sent,
        "answered": result.answered,
        "unanswered": result.unanswered,
        "statuses": dict(result.statuses),
        "answered_twice": answered_twice,
        "money_check": check or "ok",
        "latency_ms_before_changes": quiet,
        "latency_ms_whole_run": window_stats(result, 0, len(result.seconds)),
        "changes": events,
    }
    return doc


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1000)
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--snapshot-interval-s", type=float, default=1.0)
    p.add_argument("--takeover-after-ms", type=int, default=4000)
    args = p.parse_args()
    doc = asyncio.run(main(args))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"reshape-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=2))
    print(json.dumps({k: v for k, v in doc.items() if k != "machine"}, indent=2))
    print(f"written: {path}")


if __name__ == "__main__":
    cli()
