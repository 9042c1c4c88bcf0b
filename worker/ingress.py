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

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from styx_py.config import Config
from styx_py.limits import MAX_REQUEST_BYTES
from styx_py.wire import UNDECODABLE, request_decoder
from worker.epoch import IngressRecord

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
        self.buffers: dict[int, deque[IngressRecord]] = {}
        self.count = 0
        self.listener: Callable[[], None] | None = None
        self.room = asyncio.Event()
        self.room.set()
        self.skipped = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.consumer.stop()

    def set_listener(self, on_available: Callable[[], None]) -> None:
        self.listener = on_available

    def assign(self, partitions: list[int]) -> None:
        tps = [TopicPartition(self.topic, p) for p in partitions]
        self.consumer.assign(tps)
        for tp in tps:
            self.consumer.seek(tp, 0)
            self.buffers.setdefault(tp.partition, deque())
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._fetch_loop())

    async def _fetch_loop(self) -> None:
        while True:
            await self.room.wait()
            batches = await self.consumer.getmany(timeout_ms=200, max_records=self.max_pending - self.count)
            was_empty = self.count == 0
            for tp, records in batches.items():
                buf = self.buffers[tp.partition]
                for rec in records:
                    try:
                        req = request_decoder.decode(rec.value)
                    except UNDECODABLE as exc:
                        # Nothing to answer (no request id survives); skipping is deterministic.
                        self.skipped += 1
                        log.error("skipping undecodable ingress record %s@%d: %s", tp, rec.offset, exc)
                        continue
                    buf.append(IngressRecord(tp.partition, rec.offset, req, rec.timestamp))
                    self.count += 1
            if self.count >= self.max_pending:
                self.room.clear()
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
        self.count -= len(out)
        if self.count < self.max_pending:
            self.room.set()
        return out

    def pending(self) -> int:
        return self.count
