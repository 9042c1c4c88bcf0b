"""Kafka egress: replies (early commit) and the sequencer log, through one producer.

``send`` never blocks the epoch loop: records are queued per partition and a drain task hands each
partition's queue to the producer as one batch (:mod:`styx_py.io.batching`). A failed produce is not
swallowed: it ends the drain task and with it the worker (a worker that cannot reply must not go on
committing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
from aiokafka import AIOKafkaProducer

from styx_py.core.config import Config
from styx_py.core.limits import MAX_REQUEST_BYTES
from styx_py.core.segments import pack, replies_to, segment_topic
from styx_py.core.wire import EPOCH_HEADER, Reply, SeqLogEntry
from styx_py.io.batching import MAX_BATCH_BYTES, BatchLanes


class KafkaSink:
    """One producer for egress replies and sequencer-log entries, batched per partition off the epoch loop."""

    def __init__(self, bootstrap: str, config: Config) -> None:
        self.config = config
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=config.kafka_linger_ms,
            max_request_size=4 * MAX_REQUEST_BYTES,
            max_batch_size=MAX_BATCH_BYTES,
        )
        self.lanes = BatchLanes(self.producer)
        self.encoder = msgspec.msgpack.Encoder()
        self.error: BaseException | None = None
        self.failed = asyncio.Event()
        # Egress partition -> packed offset (core.segments) below which replies are acked.
        self.egress_acked: dict[int, int] = {}
        self.seqlog_acked = 0
        self.segment = 0  # the egress segment replies go to (core.segments.replies_to)
        self.topic = config.egress_topic

    @property
    def sent(self) -> int:
        return self.lanes.records_sent

    @property
    def queued(self) -> int:
        """Records waiting for their batch to be sent."""
        return self.lanes.pending()

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def run(self) -> None:
        """Drain the lanes; a failed produce ends this task and with it the worker."""
        drain = asyncio.get_running_loop().create_task(self.lanes.run())
        try:
            await self.failed.wait()
            raise RuntimeError(f"produce failed: {self.error}") from self.error
        finally:
            drain.cancel()

    def _on_reply_sent(self, partition: int) -> Callable[[int, BaseException | None], None]:
        segment = self.segment

        def done(offset: int, exc: BaseException | None) -> None:
            if exc is not None:
                self._fail(exc)
            elif (acked := pack(segment, offset + 1)) > self.egress_acked.get(partition, 0):
                self.egress_acked[partition] = acked

        return done

    def live(self, newest: int) -> None:
        """``newest`` is the newest ingress segment: replies go to egress segment ``replies_to(newest)``
        from now on (never back to an older one)."""
        segment = replies_to(newest)
        if segment > self.segment:
            self.segment = segment
            self.topic = segment_topic(self.config.egress_topic, segment)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.failed.set()

    def offsets(self) -> dict[int, int]:
        return dict(self.egress_acked)

    def flush(self) -> asyncio.Future[None]:
        """Done when every reply and log entry queued before this call is acknowledged."""
        return self.lanes.flush()

    def reset_offsets(self, offsets: dict[int, int]) -> None:
        """After a recovery: the restored snapshot's egress positions are the new lower bounds."""
        for p, off in offsets.items():
            self.egress_acked[p] = max(self.egress_acked.get(p, 0), off)

    # Egress
    def send(self, partition: int, reply: Reply, epoch: int) -> None:
        self.lanes.add(
            self.topic,
            partition,
            reply.request_id.encode(),
            self.encoder.encode(reply),
            self._on_reply_sent(partition),
            [(EPOCH_HEADER, str(epoch).encode())],
        )

    # Sequencer log
    def acked(self) -> int:
        return self.seqlog_acked

    def append(self, entry: SeqLogEntry) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def resolve(offset: int, exc: BaseException | None) -> None:
            if exc is not None:
                self._fail(exc)
                if not done.done():
                    done.set_exception(exc)
                return
            self.seqlog_acked = max(self.seqlog_acked, offset + 1)
            if not done.done():
                done.set_result(None)

        self.lanes.add(self.config.seqlog_topic, 0, None, self.encoder.encode(entry), resolve)
        return done
