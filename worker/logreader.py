"""Reading logs back for recovery: replies already on the egress topic and the sequencer log.

The end of a partition is the fetch high watermark (``end_offsets()`` is wrong on Tansu).
"""

from __future__ import annotations

import time

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from styx_py.config import Config
from styx_py.wire import Reply, SeqLogEntry, reply_decoder, seqlog_decoder


async def read_to_end(
    bootstrap: str, starts: dict[TopicPartition, int], timeout_s: float = 60.0
) -> list[bytes]:
    """Every record value from each start offset up to the partition's current high watermark."""
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
        values: list[bytes] = []
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
                values.extend(r.value for r in records if end is None or r.offset < end)
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

    async def replies_from(self, offsets: dict[int, int]) -> list[Reply]:
        topic = self.config.egress_topic
        values = await read_to_end(self.bootstrap, {TopicPartition(topic, p): o for p, o in offsets.items()})
        out: list[Reply] = []
        for v in values:
            try:
                out.append(reply_decoder.decode(v))
            except msgspec.DecodeError:
                continue  # not ours to judge: recovery only needs the replies it can recognise
        return out

    async def seqlog(self, from_offset: int) -> list[SeqLogEntry]:
        tp = TopicPartition(self.config.seqlog_topic, 0)
        values = await read_to_end(self.bootstrap, {tp: from_offset})
        return [seqlog_decoder.decode(v) for v in values]


__all__ = ["KafkaLogReader", "read_to_end"]
