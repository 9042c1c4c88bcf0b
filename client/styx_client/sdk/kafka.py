"""The client's Kafka ends: a producer for requests and one consumer positioned at the end of the
client's reply partition, so that every reply to a request sent afterwards lies ahead of it.

The reply partition is one egress partition, named in every request the client sends (the workers send
the reply there): the one asked for, else a stable hash of the client id (:func:`reply_partition_of`).
Clients on different partitions never read each other's replies; clients sharing one ignore the others'.
``reply_partition=-1`` opts out: requests name no partition (each reply goes to its request's ingress
partition) and the client reads every egress partition, skipping the other clients' replies. That
spreads one client's replies over all partitions, which Tansu with S3 storage needs (see
:class:`~styx_client.sdk.StyxClient`).

The end of a partition is taken from the fetch **high watermark** (``consumer.highwater``), not from
``end_offsets()``/``seek_to_end()``: the latter are wrong on the Tansu broker used locally (see
``shared/LOCAL_SERVICES.md``), while the high watermark is correct on Tansu and on Apache Kafka.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

# aiokafka ships no type information; the extra code keeps these lines clean whether or not the
# project's mypy config already ignores missing stubs.
from aiokafka import (  # type: ignore[import-untyped,unused-ignore]
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)
from aiokafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from styx_py.core.errors import ConfigError, ProtocolError, StyxError, Unavailable
from styx_py.core.limits import MAX_BATCH_BYTES, POSITION_POLL_MS, SEGMENTS_ASKED_AHEAD
from styx_py.core.partitioning import partition_of
from styx_py.core.security import KafkaSecurity
from styx_py.core.segments import reply_segments, segment_topic, segments_in
from styx_py.io.kafka_admin import existing_topics
from styx_py.io.tls import kafka_options

__all__ = [
    "KafkaError",
    "KafkaSettings",
    "egress_following",
    "newest_segment",
    "open_kafka",
    "reply_partition_of",
    "stop_quietly",
]

log = logging.getLogger("styx.client")


class KafkaSettings(Protocol):
    """What :func:`open_kafka` needs to know (a :class:`~styx_client.sdk.StyxClient` has it)."""

    @property
    def bootstrap(self) -> str: ...
    @property
    def ingress_topic(self) -> str: ...
    @property
    def egress_topic(self) -> str: ...
    @property
    def operators(self) -> Mapping[str, int]: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def linger_ms(self) -> int: ...
    @property
    def fetch_wait_ms(self) -> int: ...
    @property
    def kafka_security(self) -> KafkaSecurity: ...


def reply_partition_of(client_id: str, wanted: int | None, egress_partitions: int) -> int:
    """The egress partition a client reads its replies from: ``wanted`` if given (it must exist;
    -1: every partition), else a stable hash of ``client_id`` (the same id always reads the same one)."""
    if wanted is None:
        return partition_of(client_id, egress_partitions)
    if not -1 <= wanted < egress_partitions:
        raise ConfigError(
            f"reply_partition={wanted} but the egress topic has partitions 0..{egress_partitions - 1}"
        )
    return wanted


class KafkaEnds(NamedTuple):
    producer: Any
    consumer: Any
    reply_partition: int  # -1: every egress partition
    reply_partitions: list[int]  # the egress partitions read, in every segment read
    segment: int  # the newest ingress segment when the client started


def egress_read(egress_topic: str, partitions: list[int], newest: int, topics: Iterable[str]) -> list[Any]:
    """The egress topic partitions a client reads when ``newest`` is the newest ingress segment: its
    reply partitions in each segment workers may write replies to
    (:func:`~styx_py.core.segments.reply_segments`) whose topic exists."""
    existing = set(topics)
    names = [segment_topic(egress_topic, s) for s in reply_segments(newest)]
    return [TopicPartition(t, p) for t in names if t in existing for p in partitions]


async def open_kafka(settings: KafkaSettings, client_id: str, reply_partition: int | None) -> KafkaEnds:
    """A started producer, and a started consumer assigned the client's reply partition (chosen by
    :func:`reply_partition_of`) in every egress segment it reads (:func:`egress_read`) and positioned
    at their end; within ``timeout_s``. Both are stopped again if anything fails."""
    producer = _producer(settings, client_id)
    consumer = _consumer(settings, client_id)
    deadline = asyncio.get_running_loop().time() + settings.timeout_s
    try:
        egress_partitions, topics = await _start(producer, consumer, settings, deadline)
        segment = max(segments_in(topics, settings.ingress_topic), default=0)
        chosen = reply_partition_of(client_id, reply_partition, egress_partitions)
        read = list(range(egress_partitions)) if chosen == -1 else [chosen]
        tps = egress_read(settings.egress_topic, read, segment, topics)
        consumer.assign(tps)
        await _position_at_end(consumer, tps, deadline, settings)
    except BaseException:
        await stop_quietly(consumer, "consumer")
        await stop_quietly(producer, "producer")
        raise
    return KafkaEnds(producer, consumer, chosen, read, segment)


async def newest_segment(producer: Any, ingress_topic: str, known: int) -> int:
    """The newest segment of the ingress topic (:mod:`styx_py.core.segments`), ``known`` or later: asks
    the broker whether the next few exist by name (:func:`~styx_py.io.kafka_admin.existing_topics`,
    which creates none, at a cost that does not grow with the broker's topics, unlike a listing of them
    all)."""
    newest = known
    while True:
        names = [
            segment_topic(ingress_topic, k) for k in range(newest + 1, newest + 1 + SEGMENTS_ASKED_AHEAD)
        ]
        found = segments_in(await existing_topics(producer.client, names), ingress_topic)
        if not found:
            return newest
        newest = max(found)


async def egress_following(producer: Any, egress_topic: str, partitions: list[int], newest: int) -> list[Any]:
    """:func:`egress_read` for ``newest``, asking the broker which of those egress segments exist."""
    names = [segment_topic(egress_topic, s) for s in reply_segments(newest)]
    return egress_read(egress_topic, partitions, newest, await existing_topics(producer.client, names))


def _producer(settings: KafkaSettings, client_id: str) -> Any:
    # No idempotence: aiokafka's idempotent producer cannot start on Tansu, and duplicates are
    # harmless here (the server deduplicates by request id, the client ignores second replies).
    return AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        client_id=client_id,
        acks="all",
        linger_ms=settings.linger_ms,
        enable_idempotence=False,
        max_batch_size=MAX_BATCH_BYTES,
        **kafka_options(settings.kafka_security),
    )


def _consumer(settings: KafkaSettings, client_id: str) -> Any:
    # No group and manual assignment: a group join takes seconds on Tansu, and the client reads the
    # one partition it named in its requests. "earliest" only matters if a position is ever lost
    # (retention on a real broker): re-reading old replies is harmless, skipping new ones would lose
    # answers.
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        client_id=client_id,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.fetch_wait_ms,
        **kafka_options(settings.kafka_security),
    )


async def _start(
    producer: Any, consumer: Any, settings: KafkaSettings, deadline: float
) -> tuple[int, set[str]]:
    """Start both, check the topics; the egress partition count and the broker's topics."""
    try:
        await producer.start()
        await consumer.start()
        async with asyncio.timeout_at(deadline):
            topics = await _require_topics(consumer, settings)
            ingress_partitions = await _partitions(producer, settings.ingress_topic, settings.bootstrap)
            egress_partitions = await _partitions(producer, settings.egress_topic, settings.bootstrap)
    except TimeoutError as exc:
        raise StyxError(
            f"Kafka at {settings.bootstrap} did not give topic metadata within {settings.timeout_s} s"
        ) from exc
    except KafkaError as exc:
        raise Unavailable(f"cannot use Kafka at {settings.bootstrap}: {exc!r}") from exc
    needed = max(settings.operators.values())
    if ingress_partitions < needed:
        raise ConfigError(
            f"ingress topic {settings.ingress_topic!r} has {ingress_partitions} partitions but an "
            f"operator needs {needed}; operators={settings.operators}"
        )
    return egress_partitions, topics


async def _require_topics(consumer: Any, settings: KafkaSettings) -> set[str]:
    """Fail unless both topics exist, *before* any request names them; the broker's topics.

    Asking for a missing topic's metadata (or producing to it) makes Kafka and Tansu auto-create
    it with the broker's default partition count (Tansu: 4), after which the coordinator's own
    CreateTopics would find it "already existing" with the wrong number of partitions. The
    all-topics listing creates nothing.
    """
    existing = set(await consumer.topics())
    missing = [t for t in (settings.ingress_topic, settings.egress_topic) if t not in existing]
    if missing:
        raise ConfigError(
            f"topics {missing} do not exist on {settings.bootstrap}; deploy a graph first "
            "(the coordinator creates them with the right partition counts)"
        )
    return existing


async def _partitions(producer: Any, topic: str, bootstrap: str) -> int:
    """Partition count of ``topic``; waits for its metadata (aiokafka polls until it has it).

    Asked through the producer because a consumer without subscription does not track topic
    metadata, so ``partitions_for_topic`` on it would stay ``None``.
    """
    partitions = await producer.partitions_for(topic)
    if not partitions:
        raise ConfigError(f"topic {topic!r} has no partitions on {bootstrap}")
    count = len(partitions)
    if set(partitions) != set(range(count)):
        raise ProtocolError(f"topic {topic!r} reports non-contiguous partitions {sorted(partitions)}")
    return count


async def _position_at_end(
    consumer: Any, tps: list[TopicPartition], deadline: float, settings: KafkaSettings
) -> None:
    """Seek each partition to its current high watermark.

    ``end_offsets``/``seek_to_end`` are wrong on Tansu, but every fetch response carries the
    correct high watermark. So: fetch from the beginning (records fetched now are old replies
    and dropped) until each partition's high watermark is known, then seek there. Any record
    produced after the fetch has an offset >= that watermark, hence is read later.
    """
    loop = asyncio.get_running_loop()
    await consumer.seek_to_beginning(*tps)
    while True:
        unknown = [tp for tp in tps if consumer.highwater(tp) is None]
        if not unknown:
            break
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise StyxError(
                f"no high watermark for egress partitions {[tp.partition for tp in unknown]} of "
                f"{settings.egress_topic!r} within {settings.timeout_s} s "
                f"(is the broker at {settings.bootstrap} serving fetches?)"
            )
        await consumer.getmany(*tps, timeout_ms=max(1, min(int(remaining * 1000), POSITION_POLL_MS)))
    for tp in tps:
        consumer.seek(tp, consumer.highwater(tp))


async def stop_quietly(part: Any, what: str) -> None:
    """Stop an aiokafka producer/consumer during shutdown; a failure to stop must not mask the cause."""
    if part is None:
        return
    try:
        await part.stop()
    except (KafkaError, OSError) as exc:
        log.warning("error while stopping the Kafka %s: %r", what, exc)
