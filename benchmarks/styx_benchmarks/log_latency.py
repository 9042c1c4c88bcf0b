"""Latency as the logs see it: from each request's record to its reply's record, by Kafka timestamps.

A reply on the egress topic carries its request's timestamp (``Reply.request_ts_ms``, the wall-clock
millisecond at which the SDK handed the request to its producer, as the ingress record's own timestamp);
the egress record's timestamp is the millisecond at which the worker handed the reply to its producer.
Their difference is the request's time *in the cluster*: the ingress hop, the wait for an epoch, the
epoch, up to the reply's produce. It leaves out what the client-observed latency also holds: the
driver's lateness behind the schedule and the SDK before the record is built, and the reply's trip back
(egress produce, broker, the client's fetch).

This is the latency the Styx reference's own YCSB-T harness reports (delftdata/styx,
``demo/demo-ycsb``: the egress record's timestamp minus the request's delivery-report timestamp, both
read from Kafka after the run, with a load generator that does not read replies while it sends), so
``styx bench`` reports it next to its own, stricter one (benchmarks/results/log-to-log.md).

Read after a run from the egress log (the topic and every segment from the run's on), with the fetch
high watermark as the end (:func:`styx_py.io.kafka_logs.read_to_end`), so it costs the load generator
nothing while it measures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from styx_py.core.segments import segment_topic, segments_in
from styx_py.core.wire import UNDECODABLE, reply_decoder
from styx_py.io.kafka_logs import read_to_end

LOG_PATIENCE_S = 10.0  # how long replies the client has seen may take to show on the egress log
LOG_RETRY_S = 0.2  # between reads while some are missing


async def segment_partitions(bootstrap: str, topic: str, first_segment: int = 0) -> list[TopicPartition]:
    """Every partition of every segment of ``topic`` (:mod:`styx_py.core.segments`) from ``first_segment``
    on, as the broker has them now."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        topics = await consumer.topics()
        out: list[TopicPartition] = []
        for s in segments_in(topics, topic):
            if s >= first_segment:
                name = segment_topic(topic, s)
                out.extend(TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or ()))
        return out
    finally:
        await consumer.stop()


async def log_latencies_ms(
    bootstrap: str,
    egress_topic: str,
    first_segment: int,
    prefix: str,
    first_id: str,
    expected: int = 0,
    patience_s: float = LOG_PATIENCE_S,
    clock: Callable[[], float] = time.monotonic,
) -> list[int]:
    """Per request of one client from ``first_id`` on, its reply record's timestamp minus its request's,
    in ms. The client's generated ids start with ``prefix`` and then count up in fixed-width hex
    (:class:`~styx_client.sdk.ids.RequestIds`), so they sort in the order they were sent. A request
    answered more than once (a resend answered again) counts once, by its first reply. Reads the egress
    segments from ``first_segment`` on.

    A reply can reach its client before its record is on the egress log (a worker pushes replies to
    the clients it serves and produces them in batches): while fewer than ``expected`` replies are
    found, the log is read on from where the last read ended, for up to ``patience_s``."""
    starts = dict.fromkeys(await segment_partitions(bootstrap, egress_topic, first_segment), 0)
    n = len(first_id)
    seen: set[str] = set()
    out: list[int] = []
    give_up = clock() + patience_s
    while True:
        for record in await read_to_end(bootstrap, starts):
            starts[TopicPartition(record.topic, record.partition)] = record.offset + 1
            try:
                reply = reply_decoder.decode(record.value or b"")
            except UNDECODABLE:
                continue
            rid = reply.request_id
            if len(rid) != n or rid < first_id or not rid.startswith(prefix) or rid in seen:
                continue
            seen.add(rid)
            out.append(max(0, record.timestamp - reply.request_ts_ms))
        if len(out) >= expected or clock() >= give_up:
            return out
        await asyncio.sleep(LOG_RETRY_S)  # the replies still on their way to the log
