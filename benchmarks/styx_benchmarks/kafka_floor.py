"""What one Kafka hop costs on a broker, before styx-py does anything: the floor under every latency.

    python -m styx_benchmarks.kafka_floor                  # Tansu (memory), started here
    python -m styx_benchmarks.kafka_floor --kafka HOST:PORT --pid PID   # any running broker

Two measurements, with aiokafka as styx-py uses it (no linger, acks=all, manual assignment):

* ``hop``: one producer sends one record at a time at ``--rate`` (one record per batch, as a lightly
  loaded client does) while a consumer tails the topics with ``fetch_max_wait_ms`` 5; the latency
  from handing a record to the producer to getting it from ``getmany``, for a consumer that reads
  one partition, four, and twelve (three topics of four: what a client reads across egress segments).
  A request makes two such hops (client -> ingress -> worker, worker -> egress -> client).
* ``idle fetch``: a consumer waiting on empty partitions; the fetch rounds per second and the CPU
  each round costs the consumer's process and the broker (from /proc; needs the broker's pid).
  Every consumer of a styx-py cluster (each worker's ingress, each client's replies) makes at least
  these rounds, and more once records flow (a round that finds data returns at once).

Results go to ``benchmarks/results/kafka-floor-<broker>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import uvloop
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from styx_benchmarks.bench import RESULTS_DIR, machine_info
from styx_benchmarks.cpu import cpu_seconds
from styx_py.stack.services import TansuBroker, create_topics

FETCH_WAIT_MS = 5


async def _consumer(bootstrap: str, tps: list[TopicPartition]) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=FETCH_WAIT_MS
    )
    await consumer.start()
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    return consumer


async def hop(bootstrap: str, topics: int, partitions: int, rate: float, seconds: float) -> dict[str, Any]:
    """Produce -> consume latency percentiles (ms) of one-record batches at ``rate``."""
    names = [f"floor-{uuid.uuid4().hex[:8]}" for _ in range(topics)]
    await create_topics(bootstrap, {t: partitions for t in names})
    tps = [TopicPartition(t, p) for t in names for p in range(partitions)]
    consumer = await _consumer(bootstrap, tps)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    sent: dict[bytes, float] = {}
    latency: list[float] = []
    n = int(rate * seconds)
    all_in = asyncio.Event()

    async def read() -> None:
        while True:
            got = await consumer.getmany(timeout_ms=250)
            now = time.perf_counter()
            latency.extend((now - sent[r.value]) * 1000 for records in got.values() for r in records)
            if len(latency) >= n:
                all_in.set()

    reader = asyncio.create_task(read())
    try:
        await asyncio.sleep(1)  # positioned and fetching
        start = time.perf_counter()
        for i in range(n):
            if (delay := start + i / rate - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            value = str(i).encode()
            sent[value] = time.perf_counter()
            # Replies go to the last-but-one segment of three, as workers write them.
            await producer.send(names[max(0, topics - 2)], value, partition=i % partitions)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), 5)  # what has not arrived by then is not counted
    finally:
        reader.cancel()
        await producer.stop()
        await consumer.stop()
    latency.sort()
    return {
        "topics": topics,
        "partitions": partitions,
        "rate": rate,
        "records": len(latency),
        **{f"p{q}": round(latency[int(len(latency) * q / 100)], 2) for q in (50, 90, 99) if latency},
    }


async def idle_fetch(
    bootstrap: str, broker_pid: int | None, partitions: int, seconds: float
) -> dict[str, Any]:
    """Fetch rounds per second of a consumer waiting on empty partitions, and the CPU per round."""
    import aiokafka.client

    topic = f"idle-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, {topic: partitions})
    rounds = 0
    send = aiokafka.client.AIOKafkaClient.send

    def counting(self: Any, node_id: Any, request: Any, **kw: Any) -> Any:
        nonlocal rounds
        if type(request).__name__.startswith("FetchRequest"):
            rounds += 1
        return send(self, node_id, request, **kw)

    aiokafka.client.AIOKafkaClient.send = counting
    consumer = await _consumer(bootstrap, [TopicPartition(topic, p) for p in range(partitions)])

    async def wait() -> None:
        while True:
            await consumer.getmany(timeout_ms=1000)

    waiting = asyncio.create_task(wait())
    try:
        await asyncio.sleep(1)
        n0, own0, broker0 = rounds, time.process_time(), cpu_seconds(broker_pid)
        await asyncio.sleep(seconds)
        n = max(1, rounds - n0)
        own, broker = time.process_time() - own0, cpu_seconds(broker_pid) - broker0
    finally:
        waiting.cancel()
        await consumer.stop()
        aiokafka.client.AIOKafkaClient.send = send
    return {
        "partitions": partitions,
        "rounds_per_s": round(n / seconds, 1),
        "consumer_us_per_round": round(own / n * 1e6),
        "broker_us_per_round": round(broker / n * 1e6) if broker_pid else None,
    }


async def measure(bootstrap: str, pid: int | None, rate: float, seconds: float) -> dict[str, Any]:
    hops = []
    for topics, partitions in ((1, 1), (1, 4), (3, 4)):
        hops.append(await hop(bootstrap, topics, partitions, rate, seconds))
        h = hops[-1]
        print(
            f"hop, {topics} topic(s) x {partitions} partition(s), {rate:g}/s: "
            f"p50 {h.get('p50')} ms  p90 {h.get('p90')}  p99 {h.get('p99')}"
        )
    idle = []
    for partitions in (1, 4, 12):
        idle.append(await idle_fetch(bootstrap, pid, partitions, seconds))
        i = idle[-1]
        print(
            f"idle fetch, {partitions} partition(s): {i['rounds_per_s']} rounds/s, per round "
            f"{i['consumer_us_per_round']} us of consumer CPU, {i['broker_us_per_round']} us of broker CPU"
        )
    return {"fetch_wait_ms": FETCH_WAIT_MS, "hop": hops, "idle_fetch": idle}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kafka", help="a running broker (default: start Tansu in memory here)")
    parser.add_argument("--pid", type=int, help="the broker's pid, for its CPU (with --kafka)")
    parser.add_argument("--rate", type=float, default=250.0, help="records per second in the hop test")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each measurement")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    data_dir = Path(tempfile.mkdtemp(prefix="styx-floor-"))
    broker: TansuBroker | None = None
    try:
        if args.kafka:
            bootstrap, pid, name = args.kafka, args.pid, "external"
        else:
            broker = TansuBroker("memory", log_path=data_dir / "tansu.log").start()
            bootstrap, pid, name = broker.bootstrap, broker.pid, "tansu-memory"
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(measure(bootstrap, pid, args.rate, args.seconds))
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"kafka-floor-{name}.json"
    path.write_text(json.dumps({"machine": machine_info(), "broker": name, **result}, indent=1) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
