"""Kafka ingress: the worker's partitions of the ingress topic, buffered for the sequencer.

Manual partition assignment (ingress partition = entity partition, no consumer group: group joins
take seconds and would move partitions behind the coordinator's back). The fetch loop pauses when
the local buffer holds ``max_pending_requests`` (backpressure into Kafka).

:class:`KafkaIngress` is the Kafka edge: the consumer and its fetch loop. What it reads and from where,
and what it buffered, is :class:`~styx_worker.sources.Sources`; the records clients pushed (taken as if
fetched, in offset order, and compared with the fetched copies) are
:class:`~styx_worker.pushed.PushedRecords`; how long the fetch waits follows whether the records come
pushed (:mod:`styx_worker.pace`). What they count is :attr:`KafkaIngress.counts`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from aiokafka import AIOKafkaConsumer, TopicPartition

from styx_py.core.config import Config
from styx_py.core.limits import (
    INGRESS_DRAIN_FETCH_WAITS,
    INGRESS_DRAIN_S,
    INGRESS_POLL_TIMEOUT_MS,
    INGRESS_PUSHED_FETCH_WAIT_MS,
    INGRESS_PUSHED_POLL_S,
    MAX_INGRESS_FETCH_PARTITION_BYTES,
)
from styx_py.core.segments import Cursor, segment_topic, unpack
from styx_py.core.wire import IngressRecord, PushedRequest
from styx_py.io.fetching import FetchWait
from styx_py.io.tls import kafka_options
from styx_worker.logwatch import LogWatch
from styx_worker.pace import PushPace
from styx_worker.pushed import PushedRecords
from styx_worker.sources import IngressCounts, Source, Sources


class KafkaIngress:
    """The worker's ingress partitions, in every segment it reads (styx_py.core.segments)."""

    def __init__(self, bootstrap: str, config: Config) -> None:
        self.topic = config.ingress_topic
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=config.kafka_fetch_wait_ms,
            max_partition_fetch_bytes=MAX_INGRESS_FETCH_PARTITION_BYTES,
            **kafka_options(config.kafka_security()),
        )
        # Raised when the broker starves this consumer (Tansu on S3: styx_py.io.fetching).
        self.fetch_wait = FetchWait(config.kafka_fetch_wait_ms, f"ingress {self.topic}")
        self.counts = IngressCounts()
        drain_s = max(INGRESS_DRAIN_S, INGRESS_DRAIN_FETCH_WAITS * config.kafka_fetch_wait_ms / 1000)
        self.sources = Sources(config.max_pending_requests, drain_s, self.counts)
        self.pace = PushPace(config.kafka_idle_fetch_wait_ms)
        self.pushed = PushedRecords(self.sources, self.pace, self.counts)
        self.tps: dict[TopicPartition, Source] = {}  # the consumer's assignment, as sources
        self.listener: Callable[[], None] | None = None
        self.room = asyncio.Event()  # the buffer is not full: the fetch loop may poll
        self.room.set()
        self.arrived = asyncio.Event()  # records came (a replay waits for the next one)
        self.assigned = asyncio.Event()  # the fetch loop starts at the first assignment
        self.clock: Callable[[], float] = time.monotonic  # the pace's clock
        # The ends the broker gave and the positions restored, which it must not go back on.
        self.watch = LogWatch("ingress")

    async def start(self) -> None:
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()

    def set_listener(self, on_available: Callable[[], None]) -> None:
        self.listener = on_available

    def assign(self, partitions: list[int]) -> None:
        """Read exactly ``partitions``: what was buffered from one that moved away is dropped (its new
        owner reads it from its own position)."""
        self._read(self.sources.assign(partitions))
        self.assigned.set()

    def live(self, segment: int) -> None:
        """Read the segments :func:`~styx_py.core.segments.live` names when ``segment`` is the newest,
        from where this worker stands in them (0 in one it never read). A segment that leaves them is
        *drained*: read on until, ``drain_s`` or more after it left, everything up to its high
        watermark is taken, so whatever a client had written there when it left is taken (a client
        writes again what it wrote there later: core.segments.unread)."""
        sources = self.sources.live(segment, asyncio.get_running_loop().time())
        if sources is not None:
            self._read(sources)

    def _drop_drained(self) -> None:
        """Stop reading the draining sources that are taken up to their high watermark."""
        now = asyncio.get_running_loop().time()
        sources = self.sources.drained(now, lambda src: self.consumer.highwater(self._tp(src)))
        if sources is not None:
            self._read(sources)

    def _tp(self, src: Source) -> TopicPartition:
        return TopicPartition(segment_topic(self.topic, src[0]), src[1])

    def _read(self, sources: dict[Source, int]) -> None:
        """Read exactly ``sources``, each from the offset given (:meth:`Sources.read`)."""
        for src in self.sources.read(sources):
            self.pushed.forget(src)
        self.tps = {self._tp(src): src for src in sources}
        self.consumer.assign(list(self.tps))
        for tp, src in self.tps.items():
            self.consumer.seek(tp, self.sources.expect[src])
        self.room.set()

    def seek(self, positions: dict[int, Cursor]) -> None:
        """Consume each partition from its cursor on (:func:`~styx_py.core.segments.to_read`), dropping
        what was buffered (recovery); segments older than the live ones are drained."""
        sources = self.sources.recover(positions, asyncio.get_running_loop().time())
        self._read(sources)
        for src, offset in sources.items():
            if src[1] in positions:  # drops what was buffered even at an unchanged offset
                self.sources.reset(src, offset)
                self.pushed.forget(src)
                tp = self._tp(src)
                self.consumer.seek(tp, offset)
                self.watch.vouched(tp.topic, tp.partition, offset)  # taken before: the broker held it

    def positions(self) -> dict[int, Cursor]:
        return self.sources.positions()

    async def run(self) -> None:
        """The fetch loop (a child of the worker process's task group)."""
        await self.assigned.wait()
        sources, pace = self.sources, self.pace
        while not self.watch.lost:
            await self.room.wait()
            max_records = sources.room()
            polled_at = self.clock()
            batches = await self.consumer.getmany(timeout_ms=INGRESS_POLL_TIMEOUT_MS, max_records=max_records)
            was_empty = sources.count == 0
            now = self.clock()
            if batches:
                pace.fetched(now)
            tracking = pace.tracking(now)
            for tp, records in batches.items():
                src = self.tps.get(tp)
                if src is None or not sources.wants(src):
                    continue
                for rec in records:
                    if rec.offset < sources.expect[src]:
                        # Pushed already (compared here), or fetched before a seek moved the position.
                        self.pushed.confirm(src, rec.offset, rec.key, rec.value or b"", rec.timestamp)
                        continue
                    if tracking:
                        pace.fetched_first(src, rec.offset, now)
                    sources.accept(src, rec.offset, rec.key, rec.value or b"", rec.timestamp)
                self.pushed.take_ahead(src)
            if (floor := pace.floor_ms(now)) != self.fetch_wait.floor_ms:
                self.fetch_wait.at_least(self.consumer, floor)
            if sum(len(records) for records in batches.values()) < max_records:
                # After the records are buffered: no seek can come in between the poll and them.
                expect = {tp: sources.expect[src] for tp, src in self.tps.items() if src in sources.expect}
                await self.fetch_wait.after_poll(self.consumer, batches, expect)
            if batches:
                self._buffered(was_empty)
            self._check_ends()
            if sources.draining:
                self._drop_drained()
            if floor == INGRESS_PUSHED_FETCH_WAIT_MS:  # the fetch only confirms pushed records: not so often
                self.counts.paced += 1
                await asyncio.sleep(INGRESS_PUSHED_POLL_S - (self.clock() - polled_at))
        # The broker lost the log: read nothing more, and stay (the worker halted; it is not done).
        await asyncio.get_running_loop().create_future()

    def _check_ends(self) -> None:
        """Has the broker gone back on an end it gave, or a position restored? (styx_worker.logwatch;
        the fetch loop then ends: nothing more is read.)"""
        for tp in self.tps:
            hw = self.consumer.highwater(tp)
            if hw is not None and self.watch.end(tp.topic, tp.partition, hw):
                return

    def offer(self, pushed: PushedRequest) -> None:
        """A record a client pushed once the broker acknowledged it (styx_worker.pushed): buffered now
        if it is the next one of a source read here, kept if it is ahead, dropped if the fetch had it
        (or the source is not read here, or the buffer is full: the fetch brings it)."""
        was_empty = self.sources.count == 0
        if self.pushed.offer(pushed, self.clock()):
            self._buffered(was_empty)

    def _buffered(self, was_empty: bool) -> None:
        """Records came (fetched or pushed): pause the fetch at the limit, wake a replay waiting for
        one, and tell the worker there is work if the buffer was empty."""
        sources = self.sources
        if sources.count >= sources.max_pending:
            self.room.clear()
        self.arrived.set()
        if was_empty and sources.count and self.listener is not None:
            self.listener()

    def take(self, n: int) -> list[IngressRecord]:
        out = self.sources.take(n)
        self._taken()
        return out

    async def take_exact(self, partition: int, offset: int) -> IngressRecord:
        segment, at = unpack(offset)
        src = (segment, partition)
        if not self.sources.wants(src):  # a segment no longer read live, named by the log (replay)
            self._read(self.sources.replay(src, at, asyncio.get_running_loop().time()))
        while (rec := self.sources.take_next(src)) is None:
            self.arrived.clear()
            await self.arrived.wait()
        assert rec.offset == offset, f"replay expected {partition}@{offset}, log has {rec.offset}"
        self._taken()
        return rec

    def _taken(self) -> None:
        if not self.sources.full():
            self.room.set()

    def pending(self) -> int:
        return self.sources.count

    def buffered(self) -> Iterator[IngressRecord]:
        for buf in self.sources.buffers.values():
            yield from buf

    def lag(self) -> dict[int, int]:
        """Per assigned partition whose high watermark a fetch has reported: records on Kafka not yet
        sequenced, over the segments read (read at metrics scrape time, never on the epoch path)."""
        out: dict[int, int] = {}
        for tp, (s, p) in self.tps.items():
            next_offset = self.sources.next_take.get((s, p))
            hw = self.consumer.highwater(tp)
            if hw is not None and next_offset is not None:
                out[p] = out.get(p, 0) + max(0, hw - next_offset)
        return out
