"""Where a request's latency goes, from the Kafka record timestamps of its request and its reply.

    python -m styx_benchmarks.latency_path --rate 500 --seconds 10

Starts a local cluster (SeaweedFS, Tansu in memory, coordinator, 2 workers), loads YCSB-T's accounts and
sends transfers open-loop at ``--rate`` through the SDK. Afterwards it reads the ingress and egress
topics back and splits every answered request's latency (from its scheduled send time) into:

* ``client``: scheduled time → the ingress record's timestamp (the SDK handed it to its producer:
  styx_py/io/batching.py stamps records then, as Kafka producers do);
* ``cluster``: → the reply record's timestamp (the worker handed it to its producer and pushed it):
  the client's batch and produce, the ingress fetch, the wait for an epoch, the epoch itself;
* ``reply``: → the client resolved the reply (pushed by the worker, else egress produce, broker and the
  client's fetch).

Timestamps are wall-clock milliseconds of one machine. The coordinator's epoch phase histograms (from
its ``/metrics``) split the epoch itself. Prints p50/p90/p99 per part and writes them to
``benchmarks/results/latency-path-<rate>-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import uvloop

from styx_benchmarks.log_latency import segment_partitions
from styx_benchmarks.workload import Options
from styx_benchmarks.workloads import make_workload
from styx_client import StyxClient
from styx_py.core.requests import read_request
from styx_py.core.wire import reply_decoder
from styx_py.io.kafka_logs import read_to_end
from styx_py.stack.local import LocalStack

RESULTS = Path(__file__).resolve().parent / "results"
_PUSHED = re.compile(r'^styx_worker_ingress_pushed_total\{outcome="(\w+)"\} (\S+)$', re.M)
_WAIT = re.compile(r"^styx_worker_ingress_fetch_wait_ms (\S+)$", re.M)
_SUM = re.compile(r'^styx_coordinator_epoch_phase_duration_seconds_(sum|count)\{phase="(\w+)"\} (\S+)$', re.M)


def phase_totals(url: str) -> dict[str, tuple[float, float]]:
    """phase -> (seconds summed, epochs counted) from the coordinator's /metrics."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, list[float]] = {}
    for kind, phase, value in _SUM.findall(text):
        out.setdefault(phase, [0.0, 0.0])[0 if kind == "sum" else 1] = float(value)
    return {p: (v[0], v[1]) for p, v in out.items()}


def ingress_pushes(url: str) -> dict[str, float]:
    """One worker's ingress records pushed by clients, by outcome (taken, late, mismatched), and its
    ingress fetch wait now (``fetch_wait_ms``), from its ``/metrics``."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {outcome: float(value) for outcome, value in _PUSHED.findall(text)}
    return out | {"fetch_wait_ms": float(wait[1])} if (wait := _WAIT.search(text)) else out


def pushed_outcomes(urls: list[str]) -> dict[str, int]:
    """Pushed ingress records by outcome summed over the workers, and the longest fetch wait."""
    out: dict[str, int] = {}
    for one in map(ingress_pushes, urls):
        for outcome, value in one.items():
            if outcome == "fetch_wait_ms":
                out["max_fetch_wait_ms"] = max(out.get("max_fetch_wait_ms", 0), int(value))
            else:
                out[outcome] = out.get(outcome, 0) + int(value)
    return out


def percentiles(values: list[float], qs: tuple[float, ...] = (50, 90, 99)) -> dict[str, float]:
    """``p50``, … for each percentile in ``qs``, and the ``mean`` (empty without values)."""
    if not values:
        return {}
    s = sorted(values)
    return {f"p{q:g}": round(s[min(len(s) - 1, int(len(s) * q / 100))], 2) for q in qs} | {
        "mean": round(sum(s) / len(s), 2)
    }


async def measure(
    stack: LocalStack, rate: float, seconds: float, push_requests: bool = True, keep_rows: bool = False
) -> dict[str, Any]:
    """The latency split of ``rate`` transfers a second for ``seconds``; with ``keep_rows`` also every
    request's ``rows``: (scheduled, sent, replied, resolved, epoch), wall-clock ms."""
    workload = make_workload("ycsbt", Options())
    metrics = stack.metrics_url("coordinator")
    async with await StyxClient.connect(
        stack.coordinator, max_pending=1_000_000, push_requests=push_requests
    ) as client:
        await workload.load(client, progress=lambda _: None)
        sched: dict[str, float] = {}
        got: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        futures = []
        rng = random.Random(1)
        before = phase_totals(metrics)
        # Every request's task stays referenced until the end: a full collection would scan them all,
        # and pauses this process for tens of ms every few seconds, growing (counted as latency).
        gc.collect()
        gc.freeze()
        gc.disable()
        start_wall, start = time.time(), loop.time()
        n = int(rate * seconds)
        for i in range(n):
            due = start + i / rate
            if (delay := due - loop.time()) > 0:
                await asyncio.sleep(delay)
            op = workload.next_op(rng)
            rid = f"lp-{i}"
            sched[rid] = (start_wall + i / rate) * 1000

            def done(_: Any, rid: str = rid) -> None:
                got[rid] = time.time() * 1000

            fut = asyncio.ensure_future(
                client.submit(op.operator, op.key, op.function, *op.args, request_id=rid, timeout_s=60)
            )
            fut.add_done_callback(done)
            futures.append(fut)
        await asyncio.gather(*futures, return_exceptions=True)
        gc.enable()
        gc.unfreeze()
        after = phase_totals(metrics)
    pushed = pushed_outcomes([stack.metrics_url(w) for w in stack.metrics_ports if w != "coordinator"])
    sent_ts: dict[str, float] = {}
    ingress = dict.fromkeys(await segment_partitions(stack.kafka, "styx-ingress"), 0)
    for r in await read_to_end(stack.kafka, ingress):
        req = read_request(r.value or b"", r.key)
        if not isinstance(req, str) and req.request_id in sched:
            sent_ts[req.request_id] = r.timestamp
    reply_ts: dict[str, float] = {}
    epochs: dict[str, int] = {}
    egress = dict.fromkeys(await segment_partitions(stack.kafka, "styx-egress"), 0)
    for r in await read_to_end(stack.kafka, egress):
        reply = reply_decoder.decode(r.value)
        if reply.request_id in sched:
            reply_ts[reply.request_id] = r.timestamp
            epochs[reply.request_id] = reply.epoch
    parts: dict[str, list[float]] = {"total": [], "client": [], "cluster": [], "reply": []}
    rows = []
    for rid, t0 in sched.items():
        if rid in got and rid in sent_ts and rid in reply_ts:
            rows.append((t0, sent_ts[rid], reply_ts[rid], got[rid], epochs[rid]))
            parts["total"].append(got[rid] - t0)
            parts["client"].append(sent_ts[rid] - t0)
            parts["cluster"].append(reply_ts[rid] - sent_ts[rid])
            parts["reply"].append(got[rid] - reply_ts[rid])
    phases = {
        p: round(
            (after[p][0] - before.get(p, (0, 0))[0]) / max(1, after[p][1] - before.get(p, (0, 0))[1]) * 1000,
            3,
        )
        for p in after
    }
    epoch_count = max((after[p][1] - before.get(p, (0, 0))[1] for p in after), default=0)
    return {
        "rate": rate,
        "seconds": seconds,
        "answered": len(got),
        "ms": {k: percentiles(v) for k, v in parts.items()},
        "epoch_phase_mean_ms": phases,
        "epochs": epoch_count,
        "epochs_with_replies": len(set(epochs.values())),
        "push_requests": push_requests,
        "requests_pushed": pushed,
    } | ({"rows": rows} if keep_rows else {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-push-requests", action="store_true", help="the workers only fetch the requests")
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    data_dir = Path(tempfile.mkdtemp(prefix="styx-lat-"))
    try:
        with LocalStack(data_dir, workers=2, env={"STYX_LOG_LEVEL": "WARNING"}) as stack:
            stack.deploy("styx_benchmarks.bank:app")
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                out = runner.run(measure(stack, args.rate, args.seconds, not args.no_push_requests))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    for part, p in out["ms"].items():
        print(f"  {part:<8} " + "  ".join(f"{k} {v:7.2f}" for k, v in p.items()))
    print(f"  epoch phases (mean ms): {out['epoch_phase_mean_ms']}  epochs {out['epochs']:.0f}")
    print(f"  requests pushed to the workers, by outcome: {out['requests_pushed']}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"latency-path-{args.rate:g}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"  results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
