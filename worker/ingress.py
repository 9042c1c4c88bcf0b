"""Kafka ingress: the worker's partitions of the ingress topic, buffered for the sequencer.

Manual partition assignment (ingress partition = entity partition, no consumer group: group joins
take seconds and would move partitions behind the coordinator's back). The fetch loop pauses when
the local buffer holds ``max_pending_requests`` (backpressure into Kafka).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from styx_py.core.config import Config
from styx_py.core.limits import MAX_REQUEST_BYTES
from styx_py.core.requests import read_request
from styx_py.core.wire import IngressRecord
from styx_py.io.fetching import FetchWait

log = logging.getLogger("styx.ingress")


class KafkaIngress:
    def __init__(self, bootstrap: str, config: Config) -> None:
        self.topic = config.ingress_topic
        self.max_pending = config.max_pending_requests
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=config.kafka_fetch_wait_ms,
            max_partition_fetch_bytes=4 * MAX_REQUEST_BYTES,
        )
        # Raised when the broker starves this consumer (Tansu on S3: styx_py.io.fetching).
        self.fetch_wait = FetchWait(config.kafka_fetch_wait_ms, f"ingress {self.topic}")
        self.buffers: dict[int, deque[IngressRecord]] = {}
        self.next_take: dict[int, int] = {}  # next offset the sequencer takes, per partition
        self.expect: dict[int, int] = {}  # next offset the fetch loop accepts, per partition
        self.count = 0
        self.listener: Callable[[], None] | None = None
        self.room = asyncio.Event()
        self.room.set()
        self.arrived = asyncio.Event()
        self.assigned = asyncio.Event()
        self.skipped = 0

    async def start(self) -> None:
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()

    def set_listener(self, on_available: Callable[[], None]) -> None:
        self.listener = on_available

    def assign(self, partitions: list[int]) -> None:
        """Read exactly ``partitions``: what was buffered from one that moved away is dropped (its new
        owner reads it from its own position)."""
        tps = [TopicPartition(self.topic, p) for p in partitions]
        self.consumer.assign(tps)
        for p in set(self.buffers) - set(partitions):
            self.count -= len(self.buffers.pop(p))
            self.next_take.pop(p, None)
            self.expect.pop(p, None)
        self.buffers = {p: self.buffers.get(p, deque()) for p in partitions}
        self.seek({p: self.next_take.get(p, 0) for p in partitions})
        self.assigned.set()

    def seek(self, positions: dict[int, int]) -> None:
        """Consume ``partition`` from ``offset`` on, dropping what was buffered (recovery)."""
        for p, offset in positions.items():
            self.count -= len(self.buffers[p])
            self.buffers[p].clear()
            self.next_take[p] = self.expect[p] = offset
            self.consumer.seek(TopicPartition(self.topic, p), offset)
        self.room.set()

    def positions(self) -> dict[int, int]:
        return dict(self.next_take)

    async def run(self) -> None:
        """The fetch loop (a child of the worker process's task group)."""
        await self.assigned.wait()
        while True:
            await self.room.wait()
            max_records = self.max_pending - self.count
            batches = await self.consumer.getmany(timeout_ms=200, max_records=max_records)
            was_empty = self.count == 0
            for tp, records in batches.items():
                buf = self.buffers.get(tp.partition)
                if buf is None:
                    continue
                for rec in records:
                    if rec.offset < self.expect[tp.partition]:
                        continue  # fetched before a seek moved the position
                    self.expect[tp.partition] = rec.offset + 1
                    req = read_request(rec.value or b"", rec.key)  # a null value: no request
                    if isinstance(req, str):
                        # Nothing to answer (no usable request id); skipping is deterministic. A bad
                        # record that names one is a BadRecord: answered with BadRequest.
                        self.skipped += 1
                        log.error("skipping ingress record %s@%d: %s", tp, rec.offset, req)
                        continue
                    buf.append(IngressRecord(tp.partition, rec.offset, req, rec.timestamp))
                    self.count += 1
            if sum(len(records) for records in batches.values()) < max_records:
                # After the records are buffered: no seek can come in between the poll and them.
                expect = {TopicPartition(self.topic, p): self.expect[p] for p in self.buffers}
                await self.fetch_wait.after_poll(self.consumer, batches, expect)
            if self.count >= self.max_pending:
                self.room.clear()
            if batches:
                self.arrived.set()
            if was_empty and self.count and self.listener is not None:
                self.listener()

    def take(self, n: int) -> list[IngressRecord]:
        out: list[IngressRecord] = []
        queues = [q for _, q in sorted(self.buffers.items()) if q]
        while len(out) < n and queues:
            for q in queues:
                if q and len(out) < n:
                    out.append(q.popleft())
            queues = [q for q in queues if q]
        for rec in out:
            self.next_take[rec.partition] = rec.offset + 1
        self._taken(len(out))
        return out

    async def take_exact(self, partition: int, offset: int) -> IngressRecord:
        buf = self.buffers[partition]
        while not buf:
            self.arrived.clear()
            await self.arrived.wait()
        rec = buf.popleft()
        assert rec.offset == offset, f"replay expected {partition}@{offset}, log has {rec.offset}"
        self.next_take[partition] = offset + 1
        self._taken(1)
        return rec

    def _taken(self, n: int) -> None:
        self.count -= n
        if self.count < self.max_pending:
            self.room.set()

    def pending(self) -> int:
        return self.count

    def lag(self) -> dict[int, int]:
        """Per assigned partition whose high watermark a fetch has reported: records on Kafka not yet
        sequenced (read at metrics scrape time, never on the epoch path)."""
        out: dict[int, int] = {}
        for p, next_offset in self.next_take.items():
            if p in self.buffers:
                hw = self.consumer.highwater(TopicPartition(self.topic, p))
                if hw is not None:
                    out[p] = max(0, hw - next_offset)
        return out
