"""Kafka ingress: the worker's partitions of the ingress topic, buffered for the sequencer.

Manual partition assignment (ingress partition = entity partition, no consumer group: group joins
take seconds and would move partitions behind the coordinator's back). The fetch loop pauses when
the local buffer holds ``max_pending_requests`` (backpressure into Kafka).

Records also come pushed by the clients that wrote them (:class:`~styx_py.core.wire.PushedRequest`,
once the broker acknowledged them: a broker fetch sooner). A pushed record is buffered only as the
next offset of its partition, exactly like a fetched one, or kept until the records before it are
(:data:`MAX_AHEAD`); the fetch still reads it, skips it and compares the copies
(:attr:`KafkaIngress.push_mismatches`), so the buffer, and every epoch's batch, is the topic's records
in offset order whichever copy came first.

How long the fetch waits follows whether the records come pushed (:mod:`styx_worker.pace`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from styx_py.core.config import Config
from styx_py.core.limits import MAX_REQUEST_BYTES
from styx_py.core.requests import read_request
from styx_py.core.segments import Cursor, live, pack, segment_topic, to_read, unpack
from styx_py.core.wire import IngressRecord, PushedRequest
from styx_py.io.fetching import FetchWait
from styx_worker.pace import PUSHED_FETCH_WAIT_MS, PUSHED_POLL_S, PushPace, Source

log = logging.getLogger("styx.ingress")

# A segment that left the live ones is read on at least this long, and then until it is taken to its
# high watermark (a fetch answered this long after it left was asked for after it left).
DRAIN_S = 1.0
# Pushed records kept per source while the records before them have not come (pushed by other
# clients, or fetched): beyond this, the fetch brings them.
MAX_AHEAD = 1024
# Pushed records kept per source until the fetch brings their copy to compare.
MAX_UNCONFIRMED = 4096


class KafkaIngress:
    """The worker's ingress partitions, in every segment it reads (styx_py.core.segments)."""

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
        self.partitions: list[int] = []
        self.live_segments = [0]  # the segments read live (core.segments.live)
        # Sources of older segments still read until read to their end: since when (loop time).
        self.draining: dict[Source, float] = {}
        self.drain_s = max(DRAIN_S, 4 * config.kafka_fetch_wait_ms / 1000)
        # Per (segment, partition) read: records buffered, the next offset the sequencer takes, the next
        # offset the fetch loop accepts.
        self.buffers: dict[Source, deque[IngressRecord]] = {}
        self.next_take: dict[Source, int] = {}
        self.expect: dict[Source, int] = {}
        self.tps: dict[TopicPartition, Source] = {}
        self.count = 0
        self.listener: Callable[[], None] | None = None
        self.room = asyncio.Event()
        self.room.set()
        self.arrived = asyncio.Event()
        self.assigned = asyncio.Event()
        self.skipped = 0
        # Pushed records: ahead of their source's next offset (offset -> record), and taken but not
        # yet compared with the fetched copy (in offset order).
        self.ahead: dict[Source, dict[int, PushedRequest]] = {}
        self.unconfirmed: dict[Source, deque[PushedRequest]] = {}
        self.pushed_taken = 0  # buffered from a push, before the fetch had them
        self.pushed_late = 0  # pushed after the fetch had them, or not wanted here
        self.push_mismatches = 0  # pushed records that differ from the topic's (never expected)
        self.pace = PushPace(config.kafka_idle_fetch_wait_ms)
        self.paced = 0  # polls followed by a pause (PUSHED_POLL_S)
        self.clock: Callable[[], float] = time.monotonic

    async def start(self) -> None:
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()

    def set_listener(self, on_available: Callable[[], None]) -> None:
        self.listener = on_available

    def assign(self, partitions: list[int]) -> None:
        """Read exactly ``partitions``: what was buffered from one that moved away is dropped (its new
        owner reads it from its own position)."""
        self.partitions = list(partitions)
        self.draining = {src: t for src, t in self.draining.items() if src[1] in partitions}
        self._read({src: self.next_take.get(src, 0) for src in [*self._wanted(), *self.draining]})
        self.assigned.set()

    def live(self, segment: int) -> None:
        """Read the segments :func:`~styx_py.core.segments.live` names when ``segment`` is the newest,
        from where this worker stands in them (0 in one it never read). A segment that leaves them is
        *drained*: read on until, :attr:`drain_s` or more after it left, everything up to its high
        watermark is taken, so whatever a client had written there when it left is taken (a client
        writes again what it wrote there later: core.segments.unread)."""
        wanted = live(segment)
        if wanted == self.live_segments or segment < self.live_segments[-1]:
            # Never back: a segment dropped and read again would be read from its start. (A coordinator
            # that resumed from state saved before its predecessor's last rotation names an older one
            # until it has rotated past it.)
            return
        now = asyncio.get_running_loop().time()
        for s in range(self.live_segments[0], wanted[0]):  # left the live ones (read or skipped)
            for p in self.partitions:
                self.next_take.setdefault((s, p), 0)
                self.draining.setdefault((s, p), now)
        self.live_segments = wanted
        self._read({src: self.next_take.get(src, 0) for src in [*self._wanted(), *self.draining]})

    def _drop_drained(self) -> None:
        """Stop reading the draining sources that are taken up to their high watermark."""
        now = asyncio.get_running_loop().time()
        done = []
        for (s, p), since in self.draining.items():
            hw = self.consumer.highwater(TopicPartition(segment_topic(self.topic, s), p))
            fetched = self.expect[s, p]  # past skipped records too
            if now - since >= self.drain_s and hw is not None and fetched >= hw and not self.buffers[s, p]:
                done.append((s, p))
        if done:
            for src in done:
                del self.draining[src]
            self._read({src: off for src, off in self.next_take.items() if src not in done})

    def _wanted(self) -> list[Source]:
        return [(s, p) for s in self.live_segments for p in self.partitions]

    def _read(self, sources: dict[Source, int]) -> None:
        """Read exactly ``sources``, each from the offset given: buffers of the others are dropped."""
        self.draining = {src: since for src, since in self.draining.items() if src in sources}
        for src in set(self.buffers) - set(sources):
            self.count -= len(self.buffers.pop(src))
            self.next_take.pop(src, None)
            self.expect.pop(src, None)
            self._forget_pushed(src)
        self.tps = {TopicPartition(segment_topic(self.topic, s), p): (s, p) for s, p in sources}
        self.consumer.assign(list(self.tps))
        self.buffers = {src: self.buffers.get(src, deque()) for src in sources}
        for src, offset in sources.items():
            if self.next_take.get(src) != offset or src not in self.expect:
                self._seek(src, offset)
            else:  # kept as it was: a new assignment forgets the fetch position, not the buffer
                self.consumer.seek(
                    TopicPartition(segment_topic(self.topic, src[0]), src[1]), self.expect[src]
                )
        self.room.set()

    def _seek(self, src: Source, offset: int) -> None:
        self.count -= len(self.buffers[src])
        self.buffers[src].clear()
        self._forget_pushed(src)
        self.next_take[src] = self.expect[src] = offset
        self.consumer.seek(TopicPartition(segment_topic(self.topic, src[0]), src[1]), offset)

    def seek(self, positions: dict[int, Cursor]) -> None:
        """Consume each partition from its cursor on (:func:`~styx_py.core.segments.to_read`), dropping
        what was buffered (recovery); segments older than the live ones are drained."""
        sources = {src: off for src, off in self.next_take.items() if src[1] not in positions}
        now = asyncio.get_running_loop().time()
        for p, cursor in positions.items():
            for s, offset in to_read(cursor, self.live_segments[-1]).items():
                sources[s, p] = offset
                if s not in self.live_segments:
                    self.draining.setdefault((s, p), now)
        self._read(sources)
        for src, offset in sources.items():
            if src[1] in positions:
                self._seek(src, offset)  # drops what was buffered even at an unchanged offset

    def positions(self) -> dict[int, Cursor]:
        out: dict[int, Cursor] = {p: {} for p in self.partitions}
        for (s, p), offset in sorted(self.next_take.items()):
            out.setdefault(p, {})[s] = offset
        return out

    async def run(self) -> None:
        """The fetch loop (a child of the worker process's task group)."""
        await self.assigned.wait()
        while True:
            await self.room.wait()
            max_records = self.max_pending - self.count
            polled_at = self.clock()
            batches = await self.consumer.getmany(timeout_ms=200, max_records=max_records)
            was_empty = self.count == 0
            now = self.clock()
            if batches:
                self.pace.fetched(now)
            tracking = self.pace.tracking(now)
            for tp, records in batches.items():
                src = self.tps.get(tp)
                buf = None if src is None else self.buffers.get(src)
                if src is None or buf is None:
                    continue
                for rec in records:
                    if rec.offset < self.expect[src]:
                        # Pushed already (compared here), or fetched before a seek moved the position.
                        self._confirm(src, rec.offset, rec.key, rec.value or b"", rec.timestamp)
                        continue
                    if tracking:
                        self.pace.fetched_first(src, rec.offset, now)
                    self._accept(src, buf, rec.offset, rec.key, rec.value or b"", rec.timestamp)
                if src in self.ahead:
                    self._take_ahead(src, buf)
            if (floor := self.pace.floor_ms(now)) != self.fetch_wait.floor_ms:
                self.fetch_wait.at_least(self.consumer, floor)
            if sum(len(records) for records in batches.values()) < max_records:
                # After the records are buffered: no seek can come in between the poll and them.
                expect = {tp: self.expect[src] for tp, src in self.tps.items() if src in self.expect}
                await self.fetch_wait.after_poll(self.consumer, batches, expect)
            if batches:
                self._buffered(was_empty)
            if self.draining:
                self._drop_drained()
            if floor == PUSHED_FETCH_WAIT_MS:  # the fetch only confirms pushed records: not so often
                self.paced += 1
                await asyncio.sleep(PUSHED_POLL_S - (self.clock() - polled_at))

    def _accept(
        self, src: Source, buf: deque[IngressRecord], offset: int, key: bytes | None, value: bytes, ts: int
    ) -> None:
        """Buffer the record at ``offset``, the next one of ``src`` (fetched or pushed alike)."""
        self.expect[src] = offset + 1
        req = read_request(value, key)  # an empty value (a null record): no request
        if isinstance(req, str):
            # Nothing to answer (no usable request id); skipping is deterministic. A bad record that
            # names one is a BadRecord: answered with BadRequest.
            self.skipped += 1
            log.error("skipping ingress record %s@%d: %s", src, offset, req)
            return
        buf.append(IngressRecord(src[1], pack(src[0], offset), req, ts))
        self.count += 1

    def offer(self, pushed: PushedRequest) -> None:
        """A record a client pushed once the broker acknowledged it (module docstring): buffered now if
        it is the next one of a source read here, kept if it is ahead, dropped if the fetch had it (or
        the source is not read here, or the buffer is full: the fetch brings it)."""
        src = (pushed.segment, pushed.partition)
        buf = self.buffers.get(src)
        expect = self.expect.get(src)
        self.pace.pushed(self.clock())
        if buf is None or expect is None or pushed.offset < expect or self.count >= self.max_pending:
            self.pushed_late += 1
            self.pace.excused(src, pushed.offset)
            return
        if pushed.offset > expect:
            ahead = self.ahead.setdefault(src, {})
            if len(ahead) < MAX_AHEAD:
                ahead[pushed.offset] = pushed
            return
        was_empty = self.count == 0
        self._take_pushed(src, buf, pushed)
        if src in self.ahead:
            self._take_ahead(src, buf)
        self._buffered(was_empty)

    def _buffered(self, was_empty: bool) -> None:
        """Records came (fetched or pushed): pause the fetch at the limit, wake a replay waiting for
        one, and tell the worker there is work if the buffer was empty."""
        if self.count >= self.max_pending:
            self.room.clear()
        self.arrived.set()
        if was_empty and self.count and self.listener is not None:
            self.listener()

    def _forget_pushed(self, src: Source) -> None:
        """``src`` is read from another offset, or no more: what was pushed or fetched first is moot."""
        self.ahead.pop(src, None)
        self.unconfirmed.pop(src, None)
        self.pace.forget(src)

    def _take_pushed(self, src: Source, buf: deque[IngressRecord], pushed: PushedRequest) -> None:
        self.pushed_taken += 1
        unconfirmed = self.unconfirmed.get(src)
        if unconfirmed is None:
            unconfirmed = self.unconfirmed[src] = deque(maxlen=MAX_UNCONFIRMED)
        unconfirmed.append(pushed)
        self._accept(src, buf, pushed.offset, pushed.key, pushed.value, pushed.ts_ms)

    def _take_ahead(self, src: Source, buf: deque[IngressRecord]) -> None:
        """Buffer the pushed records that are next now; forget those the fetch brought."""
        ahead = self.ahead[src]
        while (pushed := ahead.pop(self.expect[src], None)) is not None:
            self._take_pushed(src, buf, pushed)
        expect = self.expect[src]
        for offset in [o for o in ahead if o < expect]:
            del ahead[offset]
            self.pushed_late += 1
            self.pace.excused(src, offset)  # fetched first, but pushed
        if not ahead:
            del self.ahead[src]

    def _confirm(self, src: Source, offset: int, key: bytes | None, value: bytes, ts: int) -> None:
        """The fetched copy of a record buffered before: the same as the pushed one, if it was pushed."""
        unconfirmed = self.unconfirmed.get(src)
        while unconfirmed and unconfirmed[0].offset < offset:
            unconfirmed.popleft()  # its fetched copy went by before a seek
        if not unconfirmed or unconfirmed[0].offset != offset:
            return
        pushed = unconfirmed.popleft()
        if (pushed.key, pushed.value, pushed.ts_ms) != (key, value, ts):
            self.push_mismatches += 1
            log.critical(
                "ingress record %s@%d was pushed unlike the topic's copy (key %r / %r, timestamp %d / %d, "
                "%d / %d bytes): a client pushed what the broker did not store",
                src,
                offset,
                pushed.key,
                key,
                pushed.ts_ms,
                ts,
                len(pushed.value),
                len(value),
            )

    def take(self, n: int) -> list[IngressRecord]:
        out: list[IngressRecord] = []
        queues = [q for _, q in sorted(self.buffers.items()) if q]
        while len(out) < n and queues:
            for q in queues:
                if q and len(out) < n:
                    out.append(q.popleft())
            queues = [q for q in queues if q]
        for rec in out:
            segment, offset = unpack(rec.offset)
            self.next_take[segment, rec.partition] = offset + 1
        self._taken(len(out))
        return out

    async def take_exact(self, partition: int, offset: int) -> IngressRecord:
        segment, at = unpack(offset)
        src = (segment, partition)
        if src not in self.buffers:  # a segment no longer read live, named by the log (replay)
            self.draining.setdefault(src, asyncio.get_running_loop().time())
            self._read({**self.next_take, src: at})
        buf = self.buffers[src]
        while not buf:
            self.arrived.clear()
            await self.arrived.wait()
        rec = buf.popleft()
        assert rec.offset == offset, f"replay expected {partition}@{offset}, log has {rec.offset}"
        self.next_take[src] = at + 1
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
        sequenced, over the segments read (read at metrics scrape time, never on the epoch path)."""
        out: dict[int, int] = {}
        for tp, (s, p) in self.tps.items():
            next_offset = self.next_take.get((s, p))
            hw = self.consumer.highwater(tp)
            if hw is not None and next_offset is not None:
                out[p] = out.get(p, 0) + max(0, hw - next_offset)
        return out
