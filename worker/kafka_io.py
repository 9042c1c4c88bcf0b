"""Kafka (aiokafka) implementations of the worker's ingress, egress and sequencer-log seams.

Ingress uses manual partition assignment (ingress partition = entity partition, no consumer group:
group joins take seconds and would move partitions behind the coordinator's back). The fetch loop
pauses when the local buffer holds ``max_pending_requests`` (backpressure into Kafka).

Egress and the sequencer log share one producer; ``send`` never blocks the epoch loop: records are
queued and a drain task hands them to the producer. A failed produce is not swallowed: it ends the
drain task and with it the worker (a worker that cannot reply must not go on committing).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]

from styx_py.config import Config
from styx_py.limits import MAX_REQUEST_BYTES
from styx_py.wire import Reply, SeqLogEntry, request_decoder
from worker.epoch import IngressRecord

log = logging.getLogger("styx.kafka")


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
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
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


class KafkaSink:
    """One producer for egress replies and sequencer-log entries, drained off the epoch loop."""

    def __init__(self, bootstrap: str, config: Config) -> None:
        self.config = config
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", linger_ms=config.kafka_linger_ms,
            max_request_size=4 * MAX_REQUEST_BYTES,
        )
        self.queue: list[tuple[str, int, bytes, bytes | None, asyncio.Future[None] | None]] = []
        self.wakeup = asyncio.Event()
        self.encoder = msgspec.msgpack.Encoder()
        self.sent = 0
        self.error: BaseException | None = None

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def run(self) -> None:
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            if self.error is not None:
                raise RuntimeError(f"produce failed: {self.error}") from self.error
            batch, self.queue = self.queue, []
            for topic, partition, value, key, done in batch:
                fut = await self.producer.send(topic, value, key=key, partition=partition)
                fut.add_done_callback(self._on_sent if done is None else self._resolver(done))
            self.sent += len(batch)

    def _on_sent(self, fut: asyncio.Future[object]) -> None:
        if fut.exception() is not None:
            self.error = fut.exception()
            self.wakeup.set()

    @staticmethod
    def _resolver(done: asyncio.Future[None]) -> Callable[[asyncio.Future[object]], None]:
        def resolve(fut: asyncio.Future[object]) -> None:
            exc = fut.exception()
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(None)
        return resolve

    def _enqueue(self, topic: str, partition: int, value: bytes, key: bytes | None, done: asyncio.Future[None] | None) -> None:
        self.queue.append((topic, partition, value, key, done))
        self.wakeup.set()

    # Egress
    def send(self, partition: int, reply: Reply) -> None:
        self._enqueue(self.config.egress_topic, partition, self.encoder.encode(reply), reply.request_id.encode(), None)

    # Sequencer log
    def append(self, entry: SeqLogEntry) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(self.config.seqlog_topic, 0, self.encoder.encode(entry), None, done)
        return done
