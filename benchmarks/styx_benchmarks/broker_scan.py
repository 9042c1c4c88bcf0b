"""How a Kafka-protocol broker's consume cost grows with the batches stored in a partition.

    python -m styx_benchmarks.broker_scan                       # Tansu (memory), started here
    python -m styx_benchmarks.broker_scan --kafka HOST:PORT --pid PID   # any running broker

One producer sends one-record batches (as a lightly loaded client does) into one partition at
``--rate`` while a consumer tails it with a 5 ms fetch wait, as the workers and the SDK do
(``--records-per-batch N``: N records per batch instead, the same batches per second). Every
``--step`` batches it prints and records the broker's CPU (share of a core, from /proc; needs its pid)
and the consumer's lag. On Tansu 0.6 the CPU of a fetch that returns data grows with the number
of batches stored in the partition, and the consumer stops receiving at ~5 500 batches
(results/broker-scan-tansu-memory.json). A styx-py cluster's ingress and egress partitions reach
that size after seconds of load, which is why benchmark latency on Tansu rises over a run and why
every benchmark rate gets a fresh cluster.
Results go to ``benchmarks/results/broker-scan-<broker>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from styx_benchmarks.bench import RESULTS_DIR, machine_info
from styx_benchmarks.cpu import cpu_seconds
from styx_py.stack.services import TansuBroker, create_topics


async def scan(
    bootstrap: str, pid: int | None, rate: float, batches: int, step: int, per_batch: int = 1
) -> list[dict[str, Any]]:
    topic = f"scan-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, {topic: 1})
    tp = TopicPartition(topic, 0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=5
    )
    await producer.start()
    await consumer.start()
    consumed = 0

    async def tail() -> None:
        nonlocal consumed
        consumer.assign([tp])
        consumer.seek(tp, 0)
        while True:
            got = await consumer.getmany(tp, timeout_ms=5)
            consumed += sum(len(records) for records in got.values())

    tailer = asyncio.get_running_loop().create_task(tail())
    rows: list[dict[str, Any]] = []
    try:
        sent = 0
        while sent < batches:
            cpu0, t0 = (cpu_seconds(pid) if pid else 0.0), time.perf_counter()
            for _ in range(step):
                batch = producer.create_batch()
                for _ in range(per_batch):
                    batch.append(key=None, value=b"x" * 100, timestamp=None)
                await (await producer.send_batch(batch, topic, partition=0))  # one produce, one batch
                sent += 1
                delay = t0 + (sent - len(rows) * step) / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)  # open-loop pacing at --rate
            elapsed = time.perf_counter() - t0
            row = {
                "batches": sent,
                "seconds": round(elapsed, 2),
                "broker_cpu_share": round((cpu_seconds(pid) - cpu0) / elapsed, 3) if pid else None,
                "consumed": consumed,
                "lag": sent * per_batch - consumed,
            }
            rows.append(row)
            cpu = (
                ""
                if row["broker_cpu_share"] is None
                else f"broker {row['broker_cpu_share'] * 100:4.0f} % of a core, "
            )
            print(f"  {sent:6d} batches stored: {cpu}consumer lag {row['lag']}", flush=True)
    finally:
        tailer.cancel()
        await producer.stop()
        await consumer.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kafka", help="a running broker (default: start Tansu in memory)")
    parser.add_argument("--pid", type=int, help="the running broker's pid, for its CPU")
    parser.add_argument("--name", default=None, help="broker name for the results file")
    parser.add_argument("--rate", type=float, default=500.0, help="batches per second (500)")
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--step", type=int, default=1000)
    parser.add_argument(
        "--records-per-batch",
        type=int,
        default=1,
        help="records in each produced batch (1: as a lightly loaded client sends them)",
    )
    parser.add_argument("--out", default=str(RESULTS_DIR))
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    tmp = Path(tempfile.mkdtemp(prefix="styx-scan-"))
    try:
        if args.kafka:
            name = args.name or "external"
            rows = asyncio.run(
                scan(args.kafka, args.pid, args.rate, args.batches, args.step, args.records_per_batch)
            )
        else:
            name = args.name or "tansu-memory"
            with TansuBroker("memory", log_path=tmp / "tansu.log") as broker:
                rows = asyncio.run(
                    scan(
                        broker.bootstrap,
                        broker.pid,
                        args.rate,
                        args.batches,
                        args.step,
                        args.records_per_batch,
                    )
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    suffix = "" if args.records_per_batch == 1 else f"-{args.records_per_batch}-per-batch"
    path = Path(args.out) / f"broker-scan-{name}{suffix}.json"
    doc = {
        "broker": name,
        "rate": args.rate,
        "records_per_batch": args.records_per_batch,
        "machine": machine_info(),
        "rows": rows,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
