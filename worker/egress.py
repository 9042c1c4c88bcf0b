"""Kafka egress: replies (early commit) and the sequencer log, through two producers.

``send`` never blocks the epoch loop: records are queued per partition and a drain task hands each
partition's queue to the producer as one batch (:mod:`styx_py.io.batching`). A failed produce is not
swallowed: it ends the drain task and with it the worker (a worker that cannot reply must not go on
committing).

The sequencer log has a producer of its own: an aiokafka producer keeps one produce request in flight
per broker, so with one producer an epoch's log entry (which its Vote waits for) queued behind the
previous epoch's replies, and the replies behind the log entry.
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


def _producer(bootstrap: str, config: Config) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=config.kafka_linger_ms,
        max_request_size=4 * MAX_REQUEST_BYTES,
        max_batch_size=MAX_BATCH_BYTES,
    )


class KafkaSink:
    """Egress replies and sequencer-log entries, each through its own producer, batched per partition
    off the epoch loop."""

    def __init__(self, bootstrap: str, config: Config) -> None:
        self.config = config
        self.producers = (_producer(bootstrap, config), _producer(bootstrap, config))
        self.lanes = BatchLanes(self.producers[0])  # replies
        self.log_lanes = BatchLanes(self.producers[1])  # sequencer-log entries
        self.encoder = msgspec.msgpack.Encoder()
        self.error: BaseException | None = None
        self.failed = asyncio.Event()
        # Egress partition -> packed offset (core.segments) below which replies are acked.
        self.egress_acked: dict[int, int] = {}
        self.seqlog_acked = 0
        self.segment = 0  # the egress segment replies go to (core.segments.replies_to)
        self.topic = config.egress_topic
        # Per reply, made once: the acknowledgement callback of each partition in the current segment
        # (forgotten when the segment changes), and the epoch header of the epoch being sent.
        self._acked_by: dict[int, Callable[[int, BaseException | None], None]] = {}
        self._header: tuple[int, list[tuple[str, bytes]]] = (-1, [])

    @property
    def sent(self) -> int:
        return self.lanes.records_sent + self.log_lanes.records_sent

    @property
    def queued(self) -> int:
        """Records waiting for their batch to be sent."""
        return self.lanes.pending() + self.log_lanes.pending()

    async def start(self) -> None:
        for producer in self.producers:
            await producer.start()

    async def stop(self) -> None:
        for producer in self.producers:
            await producer.stop()

    async def run(self) -> None:
        """Drain the lanes; a failed produce ends this task and with it the worker."""
        loop = asyncio.get_running_loop()
        drains = [loop.create_task(self.lanes.run()), loop.create_task(self.log_lanes.run())]
        try:
            await self.failed.wait()
            raise RuntimeError(f"produce failed: {self.error}") from self.error
        finally:
            for drain in drains:
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
            self._acked_by.clear()
            previous, self.segment = self.topic, segment
            self.topic = segment_topic(self.config.egress_topic, segment)
            self.lanes.retire({previous, self.topic})

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.failed.set()

    def offsets(self) -> dict[int, int]:
        return dict(self.egress_acked)

    def flush(self) -> asyncio.Future[None]:
        """Done when every reply and log entry queued before this call is acknowledged."""
        return asyncio.ensure_future(_both(self.lanes.flush(), self.log_lanes.flush()))

    def reset_offsets(self, offsets: dict[int, int]) -> None:
        """After a recovery: the restored snapshot's egress positions are the new lower bounds."""
        for p, off in offsets.items():
            self.egress_acked[p] = max(self.egress_acked.get(p, 0), off)

    # Egress
    def send(self, partition: int, reply: Reply, epoch: int) -> None:
        acked = self._acked_by.get(partition)
        if acked is None:
            acked = self._acked_by[partition] = self._on_reply_sent(partition)
        if self._header[0] != epoch:
            self._header = (epoch, [(EPOCH_HEADER, str(epoch).encode())])
        self.lanes.add(
            self.topic,
            partition,
            reply.request_id.encode(),
            self.encoder.encode(reply),
            acked,
            self._header[1],
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

        self.log_lanes.add(self.config.seqlog_topic, 0, None, self.encoder.encode(entry), resolve)
        return done


async def _both(first: asyncio.Future[None], second: asyncio.Future[None]) -> None:
    await first
    await second
