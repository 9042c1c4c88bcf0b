"""Reading logs back for recovery: replies already on the egress topic, the sequencer log and the
changelog's last records.

The end of a partition is the fetch high watermark (``end_offsets()`` is wrong on Tansu). A read gives
up only when it stops making progress, not after a fixed time: on Tansu with S3 storage every fetch
lists the whole partition, so reading a long log is slow but must still finish (a restore there can
take close to 30 s, and one cut off by a fixed timeout would be retried for ever). The fetch wait adapts to
such a broker (:mod:`styx_py.io.fetching`) and a reader keeps what it learned for its next reads.

:class:`KafkaLogReader` (the :class:`~styx_py.core.ports.LogReader` port) raises what the broker fails
a read with (aiokafka's ``KafkaError``) and a sequencer-log record that does not decode as
:class:`~styx_py.core.errors.BackendError`, and a read that stalls as ``TimeoutError``: both are
``OSError``, the port's operating errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import msgspec
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from styx_py.core.changelog import Position, change_decoder
from styx_py.core.config import Config
from styx_py.core.errors import BackendError
from styx_py.core.limits import (
    IN_DOUBT_REREAD_BACKOFF_S,
    IN_DOUBT_REREAD_S,
    IN_DOUBT_STALL_S,
    LOG_READ_FETCH_WAIT_MS,
    LOG_READ_STALL_TIMEOUT_S,
)
from styx_py.core.security import PLAINTEXT, KafkaSecurity
from styx_py.core.segments import segment_topic, segments_in, unpack
from styx_py.core.wire import EPOCH_HEADER, Reply, SeqLogEntry, reply_decoder, seqlog_decoder
from styx_py.io.fetching import FetchWait
from styx_py.io.tls import kafka_options

T = TypeVar("T")
log = logging.getLogger("styx.kafka")


async def read_to_end(
    bootstrap: str,
    starts: dict[TopicPartition, int],
    stall_timeout_s: float = LOG_READ_STALL_TIMEOUT_S,
    wait: FetchWait | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record from each start offset up to the partition's current high watermark.

    Raises ``TimeoutError`` when ``stall_timeout_s`` pass without a record or a raised fetch wait
    (progress, however slow, keeps it going). ``wait`` is the fetch wait to start from; it is raised
    in place when the broker starves the reader."""
    if not starts:
        return []
    wait = wait or FetchWait(LOG_READ_FETCH_WAIT_MS, "log reader")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=wait.wait_ms,
        **kafka_options(security),
    )
    try:
        await consumer.start()  # in the try: one that fails to start is closed too
        consumer.assign(list(starts))
        for tp, offset in starts.items():
            consumer.seek(tp, offset)
        values: list[ConsumerRecord[bytes, bytes]] = []
        ends: dict[TopicPartition, int] = {}
        progress_at = time.monotonic()
        while len(ends) < len(starts) or [
            tp for tp, end in ends.items() if await consumer.position(tp) < end
        ]:
            if time.monotonic() - progress_at > stall_timeout_s:
                raise TimeoutError(
                    f"reading {sorted(map(str, starts))} made no progress for {stall_timeout_s}s "
                    f"(fetch wait {wait.wait_ms} ms)"
                )
            batches = await consumer.getmany(timeout_ms=100)
            if batches:
                progress_at = time.monotonic()
            for tp, records in batches.items():
                end = ends.get(tp)
                values.extend(r for r in records if end is None or r.offset < end)
            for tp in starts:
                if tp not in ends:
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        ends[tp] = hw  # the end as of now: later appends are not ours to read
            if await wait.after_poll(consumer, batches):
                progress_at = time.monotonic()  # a new wait deserves a full timeout of its own
        return values
    finally:
        await consumer.stop()


async def high_watermarks(
    consumer: AIOKafkaConsumer,
    starts: dict[TopicPartition, int],
    stall_timeout_s: float = LOG_READ_STALL_TIMEOUT_S,
) -> dict[TopicPartition, int]:
    """The end (next offset) of each partition, from a fetch of the started ``consumer`` at its start
    offset (every partition must exist: a fetch of one that does not is never answered). Raises
    ``TimeoutError`` when no fetch answered within ``stall_timeout_s``."""
    if not starts:
        return {}
    consumer.assign(list(starts))
    for tp, offset in starts.items():
        consumer.seek(tp, offset)
    ends: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + stall_timeout_s
    while len(ends) < len(starts):
        if time.monotonic() > deadline:
            missing = sorted(str(tp) for tp in starts if tp not in ends)
            raise TimeoutError(f"no fetch of {missing} answered within {stall_timeout_s}s")
        # Short polls: the fetcher records a high watermark with every answer, empty ones too, and
        # getmany returns early only for records (a 100 ms poll cost a recovery 100 ms).
        await consumer.getmany(timeout_ms=5, max_records=1)
        for tp in starts:
            if tp not in ends and (hw := consumer.highwater(tp)) is not None:
                ends[tp] = hw
    return ends


async def list_topics(bootstrap: str, security: KafkaSecurity = PLAINTEXT) -> set[str]:
    """The broker's topics (listing creates none, unlike asking for one topic's metadata)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **kafka_options(security)
    )
    await consumer.start()
    try:
        return set(await consumer.topics())
    finally:
        await consumer.stop()


class KafkaLogReader:
    def __init__(self, bootstrap: str, config: Config) -> None:
        self.bootstrap = bootstrap
        self.config = config
        self.security = config.kafka_security()
        # Shared by this reader's reads: what one learned about the broker, the next starts from.
        self.wait = FetchWait(LOG_READ_FETCH_WAIT_MS, "log reader")

    async def replies_from(self, offsets: dict[int, int], after_epoch: int) -> list[Reply]:
        """Replies on the egress log from ``offsets`` (packed: core.segments) on that epochs after
        ``after_epoch`` sent (a record without the epoch header counts as such): in each partition, from
        the offset in its segment, then every later segment of the egress topic whole."""
        topic = self.config.egress_topic
        listed = (
            await _from_broker("listing topics", list_topics(self.bootstrap, self.security))
            if offsets
            else set()
        )
        segments = segments_in(listed, topic)
        starts: dict[TopicPartition, int] = {}
        for p, bound in offsets.items():
            first, start = unpack(bound)
            for s in (s for s in segments if s >= first):
                starts[TopicPartition(segment_topic(topic, s), p)] = start if s == first else 0
        records = await _from_broker(
            f"reading replies on {topic}",
            read_to_end(self.bootstrap, starts, wait=self.wait, security=self.security),
        )
        out: list[Reply] = []
        for r in records:
            sent = sent_epoch(r.headers)
            if sent is not None and sent <= after_epoch:
                continue
            try:
                out.append(reply_decoder.decode(r.value))
            except msgspec.DecodeError:
                continue  # not ours to judge: recovery only needs the replies it can recognise
        return out

    async def seqlog(self, from_offset: int) -> list[SeqLogEntry]:
        tp = TopicPartition(self.config.seqlog_topic, 0)
        read = read_to_end(self.bootstrap, {tp: from_offset}, wait=self.wait, security=self.security)
        records = await _from_broker(f"reading {tp.topic}", read)
        out: list[SeqLogEntry] = []
        for r in records:
            try:
                out.append(seqlog_decoder.decode(r.value))
            except msgspec.DecodeError as exc:  # every record of this topic is a worker's entry
                raise BackendError(f"{tp.topic} offset {r.offset} does not decode: {exc}") from exc
        return out

    async def changelog_tail(self, partitions: list[int]) -> dict[int, Position]:
        """Each partition's last record: its end from a fetch's high watermark, then that record read."""
        topic = self.config.changelog_topic
        if not topic or not partitions:
            return {}
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            fetch_max_wait_ms=self.wait.wait_ms,
            **kafka_options(self.security),
        )
        await _from_broker(f"reading the end of {topic}", consumer.start())
        try:
            tps = {TopicPartition(topic, p): 0 for p in partitions}
            ends = await _from_broker(f"reading the end of {topic}", high_watermarks(consumer, tps))
        finally:
            await consumer.stop()
        starts = {tp: end - 1 for tp, end in ends.items() if end > 0}
        read = read_to_end(self.bootstrap, starts, wait=self.wait, security=self.security)
        tail: dict[int, Position] = {}
        for r in await _from_broker(f"reading the last records of {topic}", read):
            try:
                tail[r.partition] = max(
                    tail.get(r.partition, (-1, -1)), change_decoder.decode(r.value).position
                )
            except msgspec.DecodeError as exc:  # every record of this topic is a worker's
                raise BackendError(
                    f"{topic}[{r.partition}] offset {r.offset} does not decode: {exc}"
                ) from exc
        return tail


async def read_back(
    bootstrap: str, topic: str, partition: int, start: int, security: KafkaSecurity = PLAINTEXT
) -> list[tuple[int, bytes | None, bytes]]:
    """(offset, key, value) of every record of ``topic[partition]`` from ``start`` that the broker
    serves: how a producer settles a produce in doubt (:mod:`styx_py.io.batching`). A broker that is not
    back yet is tried again for :data:`~styx_py.core.limits.IN_DOUBT_REREAD_S`.

    Offsets below the fetch high watermark that no fetch returns a record from for
    :data:`~styx_py.core.limits.IN_DOUBT_STALL_S` are taken as holding nothing: a Tansu on S3 killed
    mid-request was seen to leave a partition's high watermark past a batch it never stored, for good
    (a reader there waits until a later batch comes)."""
    deadline = time.monotonic() + IN_DOUBT_REREAD_S
    tp = TopicPartition(topic, partition)
    while True:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            group_id=None,
            fetch_max_wait_ms=LOG_READ_FETCH_WAIT_MS,
            **kafka_options(security),
        )
        try:
            await consumer.start()
            consumer.assign([tp])
            consumer.seek(tp, start)
            return await _served(consumer, tp, deadline)
        except (KafkaError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(IN_DOUBT_REREAD_BACKOFF_S)  # the broker restarting: try again
        finally:
            await consumer.stop()


async def _served(
    consumer: AIOKafkaConsumer, tp: TopicPartition, deadline: float
) -> list[tuple[int, bytes | None, bytes]]:
    """What ``consumer`` (assigned ``tp`` alone, at its start) is served up to the high watermark of its
    first answer, or until no record came for :data:`~styx_py.core.limits.IN_DOUBT_STALL_S`; a
    ``TimeoutError`` if no fetch was answered by ``deadline``."""
    out: list[tuple[int, bytes | None, bytes]] = []
    end: int | None = None
    progress_at = time.monotonic()
    while end is None or await consumer.position(tp) < end:
        if end is None and time.monotonic() > deadline:
            raise TimeoutError(f"no fetch of {tp} answered")
        if end is not None and time.monotonic() - progress_at > IN_DOUBT_STALL_S:
            at = await consumer.position(tp)
            log.warning(
                "%s[%d]: offsets %d to %d are below the high watermark but no fetch returned a record of "
                "them for %.0f s: taken as not stored",
                tp.topic,
                tp.partition,
                at,
                end - 1,
                IN_DOUBT_STALL_S,
            )
            break
        batches = await consumer.getmany(tp, timeout_ms=100)
        for r in batches.get(tp, ()):
            if end is None or r.offset < end:
                out.append((r.offset, r.key, r.value))
                progress_at = time.monotonic()
        if end is None and (hw := consumer.highwater(tp)) is not None:
            end = hw  # the end as of the first answer: later appends are not the produce in doubt
            progress_at = time.monotonic()
    return out


async def _from_broker(what: str, read: Awaitable[T]) -> T:
    """``await read``; what the broker failed it with, as a :class:`BackendError` naming ``what``."""
    try:
        return await read
    except KafkaError as exc:
        raise BackendError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


def sent_epoch(headers: Sequence[tuple[str, bytes]]) -> int | None:
    """The epoch an egress record's header names, if it has a valid one."""
    for name, value in headers:
        if name == EPOCH_HEADER:
            try:
                return int(value)
            except ValueError:
                return None
    return None


__all__ = ["KafkaLogReader", "high_watermarks", "list_topics", "read_back", "read_to_end", "sent_epoch"]
