"""The floor of the load generator: bare aiokafka, no SDK and no driver bookkeeping.

    python -m styx_benchmarks.cpu_cost --rate 8000 --seconds 10 --cluster echo --client raw

Sends pre-built request records open-loop at a fixed rate (the driver's schedule: one wake-up per
tick, every request due by then sent) through the SDK's producer settings and :class:`BatchLanes`,
and counts the replies its one consumer reads (no decoding, no matching, no latency). Whatever the
SDK and the driver add per request is the difference between ``cpu_cost --client sdk`` and this,
measured against the same broker and echo responder at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from styx_benchmarks.driver import tick_for
from styx_client.sdk.kafka import open_kafka, stop_quietly
from styx_py.core.requests import encode_request
from styx_py.core.security import KafkaSecurity
from styx_py.core.segments import segment_topic
from styx_py.io.batching import BatchLanes

__all__ = ["RawResult", "RawSettings", "run_raw"]

_POOL = 1024  # distinct pre-built records, cycled


@dataclass(slots=True)
class RawSettings:
    """What :func:`~styx_client.sdk.kafka.open_kafka` asks of a client."""

    bootstrap: str
    operators: dict[str, int]
    ingress_topic: str = "styx-ingress"
    egress_topic: str = "styx-egress"
    timeout_s: float = 30.0
    linger_ms: int = 0
    fetch_wait_ms: int = 5
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity.from_env)


@dataclass(slots=True)
class RawResult:
    sent: int
    answered: int
    wall_s: float  # from the first send to the last reply (or the end of the drain)


async def run_raw(settings: RawSettings, rate: float, seconds: float, drain_s: float = 60.0) -> RawResult:
    """Send ``rate * seconds`` requests at ``rate``/s and wait for as many replies (or ``drain_s``)."""
    # The newest ingress segment at the start; a cluster that starts newer ones while this runs (not
    # the echo responder) would stop reading this one two segments later.
    producer, consumer, reply_partition, _, segment = await open_kafka(settings, "styx-raw-load", None)
    topic = segment_topic(settings.ingress_topic, segment)
    partitions = max(settings.operators.values())
    records = [
        (
            f"{i:032x}".encode(),
            encode_request(
                f"{i:032x}", "account", "transfer", f"acct{i}", (f"acct{i + 1}", 5), 0, reply_partition
            ),
        )
        for i in range(_POOL)
    ]
    total = round(rate * seconds)
    answered = 0
    all_in = asyncio.get_running_loop().create_future()

    async def read() -> None:
        nonlocal answered
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            for batch in batches.values():
                answered += len(batch)
            if answered >= total and not all_in.done():
                all_in.set_result(None)

    lanes = BatchLanes(producer)
    try:
        async with asyncio.TaskGroup() as group:
            sender = group.create_task(lanes.run())
            reader = group.create_task(read())
            start = time.perf_counter()
            await _send(lanes, topic, partitions, records, rate, total, start)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(all_in), drain_s)
            wall = time.perf_counter() - start
            sender.cancel()
            reader.cancel()
    finally:
        await stop_quietly(producer, "producer")
        await stop_quietly(consumer, "consumer")
    return RawResult(total, answered, wall)


async def _send(
    lanes: BatchLanes,
    topic: str,
    partitions: int,
    records: list[tuple[bytes, bytes]],
    rate: float,
    total: int,
    start: float,
) -> None:
    sent = 0
    n = len(records)
    tick_s = tick_for(rate)  # as the driver's
    add: Any = lanes.add
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        for i in range(sent, due):
            key, value = records[i % n]
            add(topic, i % partitions, key, value, None)
        sent = due
        if sent < total:
            await asyncio.sleep(max(tick_s, start + sent / rate - time.perf_counter()))
