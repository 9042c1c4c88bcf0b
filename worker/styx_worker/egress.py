"""Kafka egress: replies (early commit), the sequencer log and the changelog, through one producer.

``send`` never blocks the epoch loop: records are queued per partition and a drain task hands each
partition's queue to the producer as one batch (:mod:`styx_py.io.batching`). A failed produce of a
reply, a log entry or a changelog record is not swallowed: it ends the drain task and with it the
worker (a worker that cannot reply must not go on committing). A failed produce of one of the worker's
own requests (``submit``) fails that submit only: its maker writes it again from state.

Replies ride with the next sequencer-log entry. An aiokafka producer keeps one produce request in
flight per broker, so an epoch's log entry (which its Vote waits for) must not queue behind a request
of replies. ``send`` therefore holds a reply whose client was pushed it until the next ``append``,
which hands the held replies to the producer together with the entry, so both go in one produce
request; or until ``flush``, a segment change, or
:data:`~styx_py.core.limits.REPLY_WAIT_FOR_LOG_ENTRY_S` without an entry. A reply that was not pushed
(``push_replies=False``, a client not connected) goes at once, with those held before it: its client
reads the log for it. So a worker makes one produce request per epoch: on Tansu each one costs
the broker and the worker a few hundred µs of CPU (benchmarks/results/paced-fetch.md). Changelog
records (``changes``, :mod:`styx_worker.changelog`) are held the same way, and ``flush`` covers them.
So are the worker's own requests (``submit``: the outcomes of external calls, timer firings): each
produce request costs the worker and the broker CPU, and one a second per external call was a
measurable share of what a call cost the workers (benchmarks/results/effects.md).

The producer is not idempotent (Tansu has no idempotent producer), and it does not send a batch again
when the broker may have stored it without answering (:mod:`styx_py.io.indoubt`): each lane reads its
partition back and sends again only what is not there: a broker killed mid-request stores no reply,
changelog record, log entry or request twice (docs/architecture.md#snapshots-recovery-and-exactly-once
names what the read cannot tell apart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec
from aiokafka import AIOKafkaProducer

from styx_py.core.changelog import ChangeRecord, encode_change, entity_key
from styx_py.core.config import Config
from styx_py.core.errors import BackendError
from styx_py.core.limits import (
    EGRESS_STOP_FLUSH_S,
    MAX_BATCH_BYTES,
    MAX_EGRESS_PRODUCE_BYTES,
    REPLY_WAIT_FOR_LOG_ENTRY_S,
)
from styx_py.core.segments import pack, replies_to, segment_topic, unpack
from styx_py.core.wire import EPOCH_HEADER, PushedRequest, Reply, Request, SeqLogEntry
from styx_py.io.batching import PRODUCE_FAILURES, BatchLanes, Headers, OnDone
from styx_py.io.indoubt import no_blind_retries
from styx_py.io.kafka_logs import read_back
from styx_py.io.tls import kafka_options
from styx_worker.logwatch import LogWatch

log = logging.getLogger("styx.egress")


def _producer(bootstrap: str, config: Config) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=config.kafka_linger_ms,
        max_request_size=MAX_EGRESS_PRODUCE_BYTES,
        max_batch_size=MAX_BATCH_BYTES,
        **kafka_options(config.kafka_security()),
    )
    no_blind_retries(producer)
    return producer


class KafkaSink:
    """Egress replies and sequencer-log entries through one producer, batched per partition off the
    epoch loop, the replies held for the next log entry."""

    def __init__(self, bootstrap: str, config: Config) -> None:
        self.config = config
        self.producer = _producer(bootstrap, config)
        self.lanes = BatchLanes(self.producer)  # replies
        self.request_lanes = BatchLanes(self.producer)  # the worker's own requests (RequestSink)
        # Told each of them once stored, as a client pushes what it wrote: the worker that reads the
        # partition (this one, for its own outbox and timers) takes it without waiting for the fetch.
        self.on_request_stored: Callable[[PushedRequest], None] | None = None
        self.ingress_segment = 0  # the newest ingress segment (the worker's own requests go there)
        self.log_lanes = BatchLanes(self.producer)  # sequencer-log entries
        security = config.kafka_security()

        async def reread(topic: str, partition: int, start: int) -> list[tuple[int, bytes | None, bytes]]:
            return await read_back(bootstrap, topic, partition, start, security)

        for lanes in (self.lanes, self.request_lanes, self.log_lanes):
            lanes.reread = reread  # a produce in doubt is settled, not sent again blind (module docstring)
        # Replies held for the next log entry: partition, key, value, on acknowledged, headers, and
        # the Kafka timestamp (ms) of the moment the reply was sent (and pushed).
        self.held: list[tuple[int, bytes, bytes, OnDone, Headers, int]] = []
        # Changelog records held likewise (partition, key, value, stamp): they ride with the next entry.
        self.held_changes: list[tuple[int, bytes, bytes, int]] = []
        # The worker's own requests held likewise (topic, partition, key, value, on acknowledged, stamp).
        self.held_requests: list[tuple[str, int, bytes, bytes, OnDone, int]] = []
        self.changelog = config.changelog_topic
        self.changelog_records = 0  # queued since the start (the metrics)
        self.hold_timer: asyncio.TimerHandle | None = None
        self.encoder = msgspec.msgpack.Encoder()
        self.error: BaseException | None = None
        self.failed = asyncio.Event()
        # Egress partition -> packed offset (core.segments) below which replies are acked.
        self.egress_acked: dict[int, int] = {}
        self.seqlog_acked = 0
        # Acknowledged offsets the broker must not go back on (styx_worker.logwatch).
        self.reply_watch, self.log_watch = LogWatch("egress"), LogWatch("sequencer log")
        self.change_watch = LogWatch("changelog")
        self._change_acked: dict[int, Callable[[int, BaseException | None], None]] = {}
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
        """Records waiting for their batch to be sent (held replies and changelog records included)."""
        held = len(self.held) + len(self.held_changes) + len(self.held_requests)
        return held + self.lanes.pending() + self.log_lanes.pending() + self.request_lanes.pending()

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        """Closing (the drain task is over): what is held or queued goes to the log first, for at most
        :data:`~styx_py.core.limits.EGRESS_STOP_FLUSH_S`; a worker stopped by its supervisor leaves every
        reply it pushed there."""
        self.release()
        try:
            lanes = (self.lanes, self.log_lanes, self.request_lanes)
            queued = asyncio.gather(*(one.send_queued() for one in lanes))
            await asyncio.wait_for(queued, EGRESS_STOP_FLUSH_S)
        except (TimeoutError, *PRODUCE_FAILURES):  # the producer closes all the same
            log.warning("worker egress: closing without every queued record acknowledged", exc_info=True)
        finally:
            await self.producer.stop()

    def release(self) -> None:
        """Hand the held replies to their lanes, sent in the drain's next pass: with the next log
        entry, a reply that was not pushed, a flush, a segment change, or
        :data:`~styx_py.core.limits.REPLY_WAIT_FOR_LOG_ENTRY_S` after the first of them was held."""
        if self.hold_timer is not None:
            self.hold_timer.cancel()
            self.hold_timer = None
        held, self.held = self.held, []
        for partition, key, value, acked, headers, stamp in held:
            self.lanes.add(self.topic, partition, key, value, acked, headers, stamp)
        changes, self.held_changes = self.held_changes, []
        for partition, key, value, stamp in changes:
            self.lanes.add(self.changelog, partition, key, value, self._on_change_sent(partition), [], stamp)
        requests, self.held_requests = self.held_requests, []
        for topic, partition, key, value, stored, stamp in requests:
            self.request_lanes.add(topic, partition, key, value, stored, None, stamp)

    async def run(self) -> None:
        """Drain the lanes; a failed produce ends this task and with it the worker."""
        loop = asyncio.get_running_loop()
        drains = [
            loop.create_task(self.lanes.run()),
            loop.create_task(self.log_lanes.run()),
            loop.create_task(self.request_lanes.run()),
        ]
        try:
            await self.failed.wait()
            # An operating error (the broker refused or is gone), not a bug: the process ends as one.
            raise BackendError(f"produce failed: {self.error!r}") from self.error
        finally:
            for drain in drains:
                drain.cancel()

    def _on_reply_sent(self, partition: int) -> Callable[[int, BaseException | None], None]:
        segment, topic = self.segment, self.topic

        def done(offset: int, exc: BaseException | None) -> None:
            if exc is not None:
                self._fail(exc)
            elif self.reply_watch.stored(topic, partition, offset):
                return  # the broker lost the log: the worker stops (styx_worker.logwatch)
            elif (acked := pack(segment, offset + 1)) > self.egress_acked.get(partition, 0):
                self.egress_acked[partition] = acked

        return done

    def live(self, newest: int) -> None:
        """``newest`` is the newest ingress segment: replies go to egress segment ``replies_to(newest)``
        from now on (never back to an older one)."""
        self.ingress_segment = max(self.ingress_segment, newest)
        segment = replies_to(newest)
        if segment > self.segment:
            self.release()  # to the segment they were sent for
            self._acked_by.clear()
            previous, self.segment = self.topic, segment
            self.topic = segment_topic(self.config.egress_topic, segment)
            # The producer is the sequencer log's, the changelog's and the worker's own requests' too:
            # their topics stay in the producer's metadata.
            requests = segment_topic(self.config.ingress_topic, self.ingress_segment)
            keep = {previous, self.topic, self.config.seqlog_topic, self.changelog, requests}
            # No changelog topic: none to keep (aiokafka refuses ""). The request lanes' older ingress
            # segments stay while a request to one is on its way.
            self.lanes.retire(keep - {""}, self.request_lanes, self.log_lanes)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.failed.set()

    def offsets(self) -> dict[int, int]:
        return dict(self.egress_acked)

    def flush(self) -> asyncio.Future[None]:
        """Done when every reply and log entry queued before this call is acknowledged."""
        self.release()
        return asyncio.ensure_future(_both(self.lanes.flush(), self.log_lanes.flush()))

    def reset_offsets(self, offsets: dict[int, int]) -> None:
        """After a recovery: the restored snapshot's egress positions are the new lower bounds."""
        for p, off in offsets.items():
            self.egress_acked[p] = max(self.egress_acked.get(p, 0), off)
            segment, at = unpack(off)
            self.reply_watch.vouched(segment_topic(self.config.egress_topic, segment), p, at)

    # Egress
    def send(self, partition: int, reply: Reply, epoch: int, pushed: bool = False) -> None:
        """Queue ``reply``; one its client was ``pushed`` waits for the next sequencer-log entry, one it
        was not goes at once (with any held before it: a client reads only the log for it)."""
        acked = self._acked_by.get(partition)
        if acked is None:
            acked = self._acked_by[partition] = self._on_reply_sent(partition)
        if self._header[0] != epoch:
            self._header = (epoch, [(EPOCH_HEADER, str(epoch).encode())])
        stamp = self.lanes.clock_ns() // 1_000_000  # now: the reply is pushed now, if at all
        self.held.append(
            (partition, reply.request_id.encode(), self.encoder.encode(reply), acked, self._header[1], stamp)
        )
        if not pushed:
            self.release()
        else:
            self._release_later()

    # Changelog
    def changes(self, partition: int, records: list[ChangeRecord]) -> None:
        """Queue ``records`` for changelog ``partition``: held, like pushed replies, for the next
        sequencer-log entry (one produce request per epoch) or at most
        :data:`~styx_py.core.limits.REPLY_WAIT_FOR_LOG_ENTRY_S`."""
        stamp = self.lanes.clock_ns() // 1_000_000
        self.changelog_records += len(records)
        held = self.held_changes
        for r in records:
            held.append((partition, entity_key(r.operator, r.key), encode_change(r), stamp))
        self._release_later()

    def _release_later(self) -> None:
        """Send what is held by :data:`~styx_py.core.limits.REPLY_WAIT_FOR_LOG_ENTRY_S` at the latest,
        if no sequencer-log entry takes it first."""
        if self.hold_timer is None:
            self.hold_timer = asyncio.get_running_loop().call_later(REPLY_WAIT_FOR_LOG_ENTRY_S, self.release)

    def _on_change_sent(self, partition: int) -> Callable[[int, BaseException | None], None]:
        """The acknowledgement callback of changelog ``partition`` (made once): a failure ends the worker;
        a record stored below one acknowledged before says the broker lost the changelog
        (styx_worker.logwatch)."""
        done = self._change_acked.get(partition)
        if done is None:
            topic, watch = self.changelog, self.change_watch

            def done(offset: int, exc: BaseException | None) -> None:
                if exc is not None:
                    self._fail(exc)
                else:
                    watch.stored(topic, partition, offset)

            self._change_acked[partition] = done
        return done

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
            if self.log_watch.stored(self.config.seqlog_topic, 0, offset):
                return  # the broker lost the log: never durable, so the epoch is never voted
            self.seqlog_acked = max(self.seqlog_acked, offset + 1)
            if not done.done():
                done.set_result(None)

        self.release()  # the replies held so far ride with the entry: one produce request
        self.log_lanes.add(self.config.seqlog_topic, 0, None, self.encoder.encode(entry), resolve)
        return done

    # RequestSink
    def submit(self, partition: int, request: Request) -> asyncio.Future[None]:
        """Write ``request`` to ingress ``partition`` of the newest segment, held like a pushed reply for
        the next sequencer-log entry's produce request; done once acknowledged, or failed with a
        :class:`~styx_py.core.errors.BackendError`. Unlike a reply or a log entry, a failed request does
        not end the worker: the worker's own requests are made again from its state
        (:mod:`styx_worker.outbox`)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        segment, key = self.ingress_segment, request.request_id.encode()
        stamp = self.request_lanes.clock_ns() // 1_000_000  # as a client stamps what it hands over

        def resolve(offset: int, exc: BaseException | None) -> None:
            if exc is not None:
                if not isinstance(exc, PRODUCE_FAILURES):
                    self._fail(exc)  # a bug in a send task (BatchLanes.run raises it too)
                if not done.done():
                    failed = BackendError(f"request {request.request_id} not written: {exc!r}")
                    failed.__cause__ = exc
                    done.set_exception(failed)
                return
            if self.on_request_stored is not None:
                self.on_request_stored(PushedRequest(segment, partition, offset, stamp, key, value))
            if not done.done():
                done.set_result(None)

        topic = segment_topic(self.config.ingress_topic, segment)
        value = self.encoder.encode(request)
        self.held_requests.append((topic, partition, key, value, resolve, stamp))
        self._release_later()
        return done


async def _both(first: asyncio.Future[None], second: asyncio.Future[None]) -> None:
    await first
    await second
