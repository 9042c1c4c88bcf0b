"""The broker side of the log-loss check (:mod:`styx_py.core.logmarks`): the cluster's incarnation
marker written at deploy and read back, and the end of each partition the cluster recorded an offset in.

A partition's end is the high watermark of a fetch (``end_offsets()`` is wrong on Tansu). The fetch is
made at the recorded offset: a broker that still holds it answers with its records or, at the end, once
its fetch wait is over; one that lost it answers with an end below the offset (Tansu never says
OFFSET_OUT_OF_RANGE, Kafka does; both give the high watermark). Topics are listed before anything else
is asked: Tansu creates a topic any request names, so a vanished topic would come back empty.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from styx_py.core.errors import BackendError
from styx_py.core.limits import LOG_READ_FETCH_WAIT_MS
from styx_py.core.logmarks import LogMark, losses, marker_loss, marker_topic
from styx_py.core.security import PLAINTEXT, KafkaSecurity
from styx_py.io.kafka_logs import high_watermarks, read_to_end
from styx_py.io.tls import kafka_options

__all__ = ["KafkaLogGuard", "high_watermarks"]


class KafkaLogGuard:
    """The coordinator's :class:`~styx_py.core.ports.LogGuard` on a Kafka-protocol broker."""

    def __init__(self, bootstrap: str, seqlog_topic: str, security: KafkaSecurity = PLAINTEXT) -> None:
        self.bootstrap = bootstrap
        self.topic = marker_topic(seqlog_topic)
        self.security = security

    async def stamp(self) -> str:
        """Write the marker of a new cluster id (its topic exists: created with the cluster's topics);
        the id."""
        cluster_id = secrets.token_hex(8)  # control plane only: nothing deterministic depends on it
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", **kafka_options(self.security)
        )
        try:
            await producer.start()
            try:
                await producer.send_and_wait(self.topic, cluster_id.encode(), partition=0)
            finally:
                await producer.stop()
        except KafkaError as exc:
            raise BackendError(f"writing the cluster marker to {self.topic} failed: {exc!r}") from exc
        return cluster_id

    async def lost(self, cluster_id: str, recorded: Sequence[LogMark]) -> list[str]:
        """What the broker lost of the marker and of ``recorded`` (core.logmarks), one line each."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            fetch_max_wait_ms=LOG_READ_FETCH_WAIT_MS,
            max_partition_fetch_bytes=1024,  # only the high watermarks are wanted
            **kafka_options(self.security),
        )
        try:
            await consumer.start()
            try:
                topics = set(await consumer.topics())  # every topic's metadata, creating none
                starts = {
                    TopicPartition(m.topic, m.partition): m.offset
                    for m in recorded
                    if m.offset > 0 and m.partition in (consumer.partitions_for_topic(m.topic) or ())
                }
                ends = await high_watermarks(consumer, starts)
            finally:
                await consumer.stop()
            found = None
            if cluster_id and self.topic in topics:
                records = await read_to_end(self.bootstrap, {TopicPartition(self.topic, 0): 0})
                found = [r.value or b"" for r in records]
        except KafkaError as exc:
            raise BackendError(f"checking the broker's log failed: {exc!r}") from exc
        marker = marker_loss(self.topic, cluster_id, found)
        by_name = {(tp.topic, tp.partition): end for tp, end in ends.items()}
        return [*([marker] if marker else []), *losses(recorded, topics, by_name)]
