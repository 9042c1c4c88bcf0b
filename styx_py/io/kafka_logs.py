"""Reading logs back for recovery: replies already on the egress topic and the sequencer log.

The end of a partition is the fetch high watermark (``end_offsets()`` is wrong on Tansu).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from styx_py.core.config import Config
from styx_py.core.wire import EPOCH_HEADER, Reply, SeqLogEntry, reply_decoder, seqlog_decoder


async def read_to_end(
    bootstrap: str, starts: dict[TopicPartition, int], timeout_s: float = 60.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record from each start offset up to the partition's current high watermark."""
    if not starts:
        return []
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=10
    )
    await consumer.start()
    try:
        consumer.assign(list(starts))
        for tp, offset in starts.items():
            consumer.seek(tp, offset)
        values: list[ConsumerRecord[bytes, bytes]] = []
        ends: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + timeout_s
        while len(ends) < len(starts) or [
            tp for tp, end in ends.items() if await consumer.position(tp) < end
        ]:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {sorted(map(str, starts))} did not reach the end in {timeout_s}s"
                )
            batches = await consumer.getmany(timeout_ms=100)
            for tp, records in batches.items():
                end = ends.get(tp)
                values.extend(r for r in records if end is None or r.offset < end)
            for tp in starts:
                if tp not in ends:
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        ends[tp] = hw  # the end as of now: later appends are not ours to read
        return values
    finally:
        await consumer.stop()


class KafkaLogReader:
    def __init__(self, bootstrap: str, config: Config) -> None:
        self.bootstrap = bootstrap
        self.config = config

    async def replies_from(self, offsets: dict[int, int], after_epoch: int) -> list[Reply]:
        """Replies on the egress log from ``offsets`` on that epochs after ``after_epoch`` sent (a record
        without the epoch header counts as such)."""
        topic = self.config.egress_topic
        records = await read_to_end(self.bootstrap, {TopicPartition(topic, p): o for p, o in offsets.items()})
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
        records = await read_to_end(self.bootstrap, {tp: from_offset})
        return [seqlog_decoder.decode(r.value) for r in records]


def sent_epoch(headers: Sequence[tuple[str, bytes]]) -> int | None:
    """The epoch an egress record's header names, if it has a valid one."""
    for name, value in headers:
        if name == EPOCH_HEADER:
            try:
                return int(value)
            except ValueError:
                return None
    return None


__all__ = ["KafkaLogReader", "read_to_end", "sent_epoch"]
