"""Kafka egress: replies (early commit) and the sequencer log, through one producer.

``send`` never blocks the epoch loop: records are queued and a drain task hands them to the
producer. A failed produce is not swallowed: it ends the drain task and with it the worker (a worker
that cannot reply must not go on committing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
from aiokafka import AIOKafkaProducer

from styx_py.config import Config
from styx_py.limits import MAX_REQUEST_BYTES
from styx_py.wire import Reply, SeqLogEntry


class KafkaSink:
    """One producer for egress replies and sequencer-log entries, drained off the epoch loop."""

    def __init__(self, bootstrap: str, config: Config) -> None:
        self.config = config
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=config.kafka_linger_ms,
            max_request_size=4 * MAX_REQUEST_BYTES,
        )
        self.queue: list[tuple[str, int, bytes, bytes | None, asyncio.Future[None] | None]] = []
        self.wakeup = asyncio.Event()
        self.encoder = msgspec.msgpack.Encoder()
        self.sent = 0
        self.error: BaseException | None = None
        self.egress_acked: dict[int, int] = {}  # egress partition -> offset below which replies are acked
        self.seqlog_acked = 0

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

    def _on_sent(self, fut: asyncio.Future[Any]) -> None:
        exc = fut.exception()
        if exc is not None:
            self.error = exc
            self.wakeup.set()
            return
        md = fut.result()
        if md.offset + 1 > self.egress_acked.get(md.partition, 0):
            self.egress_acked[md.partition] = md.offset + 1

    def _resolver(self, done: asyncio.Future[None]) -> Callable[[asyncio.Future[Any]], None]:
        def resolve(fut: asyncio.Future[Any]) -> None:
            exc = fut.exception()
            if done.done():
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                self.seqlog_acked = max(self.seqlog_acked, fut.result().offset + 1)
                done.set_result(None)

        return resolve

    def offsets(self) -> dict[int, int]:
        return dict(self.egress_acked)

    def reset_offsets(self, offsets: dict[int, int]) -> None:
        """After a recovery: the restored snapshot's egress positions are the new lower bounds."""
        for p, off in offsets.items():
            self.egress_acked[p] = max(self.egress_acked.get(p, 0), off)

    def _enqueue(
        self, topic: str, partition: int, value: bytes, key: bytes | None, done: asyncio.Future[None] | None
    ) -> None:
        self.queue.append((topic, partition, value, key, done))
        self.wakeup.set()

    # Egress
    def send(self, partition: int, reply: Reply) -> None:
        self._enqueue(
            self.config.egress_topic, partition, self.encoder.encode(reply), reply.request_id.encode(), None
        )

    # Sequencer log
    def acked(self) -> int:
        return self.seqlog_acked

    def append(self, entry: SeqLogEntry) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(self.config.seqlog_topic, 0, self.encoder.encode(entry), None, done)
        return done
