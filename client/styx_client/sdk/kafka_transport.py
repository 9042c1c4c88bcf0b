"""The Kafka transport: aiokafka for the logs, the workers' TCP ports for pushes (:mod:`.push`).

Records go through :class:`~styx_py.io.batching.BatchLanes` (one produce per partition per drain), the
egress partitions are read by one :class:`~styx_client.sdk.reader.EgressReader`, and the newest ingress
segment is asked of the broker by name (:func:`~styx_client.sdk.kafka.newest_segment`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from styx_client.sdk.config import ClientConfig
from styx_client.sdk.deployment import coordinator_status
from styx_client.sdk.entry import Pending
from styx_client.sdk.kafka import KafkaError, egress_following, newest_segment, open_kafka, stop_quietly
from styx_client.sdk.push import WorkerLinks
from styx_client.sdk.reader import EgressReader
from styx_client.sdk.resting import EgressRest
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.transport import Batching, Opened, TransportEvents
from styx_py.core.segments import segment_topic
from styx_py.io.batching import BatchLanes

__all__ = ["KafkaTransport"]

log = logging.getLogger("styx.client")


class KafkaTransport:
    """A :class:`~styx_client.sdk.transport.ClientTransport` over Kafka (module docstring)."""

    def __init__(self, stats: ClientStats) -> None:
        self.stats = stats
        self.producer: Any = None
        self.consumer: Any = None
        self.lanes: BatchLanes | None = None
        self.reader: EgressReader | None = None
        self.links: WorkerLinks | None = None
        self.reply_partitions: list[int] = []  # the egress partitions read, in every segment read
        self._config: ClientConfig | None = None
        self._events: TransportEvents | None = None
        self._topics: dict[int, str] = {}  # ingress segment -> its topic

    async def open(
        self,
        config: ClientConfig,
        operators: Mapping[str, int],
        events: TransportEvents,
        rest: EgressRest | None,
        reply_to: str,
    ) -> Opened:
        self._config, self._events = config, events
        ends = await open_kafka(_Settings(config, operators), config.client_id, config.reply_partition)
        self.producer, self.consumer = ends.producer, ends.consumer
        self.reply_partitions = ends.reply_partitions
        self.lanes = BatchLanes(self.producer, busy_linger_s=config.kafka.busy_linger_ms / 1000)
        push = config.push
        if push.coordinator is not None:
            coordinator, secret, timeout_s = push.coordinator, push.cluster_secret, config.timeout_s
            self.links = WorkerLinks(
                lambda: coordinator_status(coordinator, timeout_s, secret),
                secret,
                reply_to,
                events.pushed,
                timeout_s,
                push.workers,
                events.marks if rest is not None else None,
            )
        links = self.links
        self.reader = EgressReader(
            self.consumer,
            config.egress_topic,
            events,
            self.stats,
            rest,
            lambda: links is not None and links.healthy,
            None if links is None else links.egress_wait_floor_ms,
        )
        return Opened(ends.reply_partition, ends.segment)

    def start(self, group: asyncio.TaskGroup) -> None:
        assert self.lanes is not None and self.reader is not None, "started before open()"
        name = self._config.client_id if self._config is not None else "styx-client"
        group.create_task(self.lanes.run(), name=f"{name}-sender")
        group.create_task(self.reader.run(), name=f"{name}-reader")
        if self.links is not None:
            group.create_task(self.links.run(group), name=f"{name}-pushed")

    def produce(self, segment: int, partition: int, key: bytes, value: bytes, entry: Pending) -> int:
        lanes, events = self.lanes, self._events
        assert lanes is not None and events is not None
        topic = self._topics.get(segment)
        if topic is None:
            assert self._config is not None
            topic = self._topics[segment] = segment_topic(self._config.ingress_topic, segment)

        def on_done(offset: int, exc: BaseException | None) -> None:
            if exc is None:
                events.acknowledged(entry, segment, offset)
            else:
                events.undelivered(entry, exc, isinstance(exc, KafkaError))

        return lanes.add(topic, partition, key, value, on_done)

    def push_request(self, entry: Pending, segment: int, offset: int) -> None:
        links, lanes = self.links, self.lanes
        if links is None or lanes is None or lanes.log_append_time:
            return  # the broker stores other timestamps than the ones this client would push
        links.push_request(
            entry.partition, segment, offset, entry.stamp, entry.rid.encode(), entry.fingerprint
        )

    @property
    def pushes_healthy(self) -> bool:
        return self.links is not None and self.links.healthy

    def ask_workers_soon(self) -> None:
        if self.links is not None:
            self.links.ask_soon()

    async def newest_segment(self, known: int) -> int | None:
        assert self._config is not None
        try:
            return await newest_segment(self.producer, self._config.ingress_topic, known)
        except KafkaError as exc:
            log.debug("%s: cannot look for a newer segment: %r", self._config.client_id, exc)
            return None

    async def follow_egress(self, newest: int) -> bool:
        assert self._config is not None and self.reader is not None
        try:
            wanted = await egress_following(
                self.producer, self._config.egress_topic, self.reply_partitions, newest
            )
        except KafkaError as exc:
            log.debug("%s: cannot list the egress segments: %r", self._config.client_id, exc)
            return False
        self.reader.follow(wanted)
        return True

    def retire(self, keep: set[int]) -> None:
        assert self._config is not None and self.lanes is not None
        self.lanes.retire({segment_topic(self._config.ingress_topic, s) for s in keep})
        self._topics = {s: t for s, t in self._topics.items() if s in keep}

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    @property
    def batching(self) -> Batching:
        lanes = self.lanes
        if lanes is None:
            return Batching(0, 0, 0)
        return Batching(lanes.records_sent, lanes.batches_sent, lanes.lingered)

    @property
    def requests_pushed(self) -> int:
        return 0 if self.links is None else self.links.outbox.pushed

    async def close(self) -> None:
        producer, self.producer = self.producer, None
        consumer, self.consumer = self.consumer, None
        await stop_quietly(producer, "producer")
        await stop_quietly(consumer, "consumer")


class _Settings:
    """What :func:`~styx_client.sdk.kafka.open_kafka` reads of a client."""

    def __init__(self, config: ClientConfig, operators: Mapping[str, int]) -> None:
        self.bootstrap = config.bootstrap
        self.ingress_topic = config.ingress_topic
        self.egress_topic = config.egress_topic
        self.operators = operators
        self.timeout_s = config.timeout_s
        self.linger_ms = config.kafka.linger_ms
        self.fetch_wait_ms = config.kafka.fetch_wait_ms
        self.kafka_security = config.kafka.security
