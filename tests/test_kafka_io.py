"""The worker's Kafka adapters against the real broker: what recovery reads back of the egress log,
and consumers on a broker that answers fetches empty when its storage is slow (Tansu on S3)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import msgspec
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from styx_py.core.config import Config, load_config
from styx_py.core.limits import REPLY_WAIT_FOR_LOG_ENTRY_S
from styx_py.core.segments import segment_topic
from styx_py.core.wire import NIL, PushedRequest, Reply, Request, SeqLogEntry, encode_value, request_encoder
from styx_py.io.fetching import FetchWait
from styx_py.io.kafka_logs import KafkaLogReader, read_to_end, sent_epoch
from styx_py.stack.services import TansuBroker, create_topics
from styx_worker.egress import KafkaSink
from styx_worker.ingress import KafkaIngress
from tests.service_fixtures import DurableKafkaFactory, record_produces

pytestmark = pytest.mark.services

# Enough stored batches in one partition that Tansu on S3 lists them for longer than a 5-10 ms fetch
# wait (measured: ~100 batches already; docs/operations.md, durable mode).
MANY_BATCHES = 400


def test_fetch_wait_doubles_for_a_partition_starved_at_one_position_for_its_patience() -> None:
    wait = FetchWait(5, "test", cap_ms=30)
    assert wait.patience_s == 0.25
    assert not wait.observe({"p0": 10}, 0.0), "one empty poll is no evidence: the record may be new"
    assert not wait.observe({"p0": 10}, 0.2), "a fetch round trip may still be under way"
    assert not wait.observe({"p0": 11}, 0.3), "it moved: the broker answers"
    assert not wait.observe({}, 0.4), "nothing waiting"
    assert not wait.observe({"p0": 11, "p1": 3}, 0.5)
    assert not wait.observe({"p0": 11, "p1": 3}, 0.7)
    assert wait.observe({"p0": 11}, 0.75) and wait.wait_ms == 10, "p0 behind at 11 since 0.5"
    assert not wait.observe({"p0": 11}, 0.8), "the new wait gets its own patience"
    assert wait.observe({"p0": 11}, 1.05) and wait.wait_ms == 20
    wait.observe({"p0": 11}, 1.1)
    assert wait.observe({"p0": 11}, 1.35) and wait.wait_ms == 30, "capped"
    wait.observe({"p0": 11}, 1.4)
    assert not wait.observe({"p0": 11}, 9.0) and wait.wait_ms == 30 and wait.raised == 3
    assert FetchWait(100, "slow").patience_s == 0.4, "at least four fetch waits"


class _Consumer:
    """What FetchWait reads of an aiokafka consumer: one partition behind its high watermark."""

    def __init__(self) -> None:
        self.tp = TopicPartition("t", 0)
        self.positions = 0

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    def highwater(self, tp: TopicPartition) -> int:
        return 5

    async def position(self, tp: TopicPartition) -> int:
        self.positions += 1
        return 0


async def test_fetch_wait_looks_at_most_every_50_ms_and_forgets_a_paused_consumer() -> None:
    now = [0.0]
    wait = FetchWait(5, "test", clock=lambda: now[0])
    consumer = _Consumer()
    for _ in range(100):  # a tight poll loop: one look
        await wait.after_poll(consumer, {})
    assert consumer.positions == 1
    now[0] = 1.0  # paused (e.g. a full ingress buffer) longer than the patience
    assert not await wait.after_poll(consumer, {}), "what it saw before the pause is no evidence"
    now[0] = 1.1
    assert not await wait.after_poll(consumer, {})
    now[0] = 1.3
    wait.wait_ms = wait.cap_ms  # no setter on the fake: only the verdict matters here
    assert not await wait.after_poll(consumer, {}), "behind since 1.0 for 0.3 s, but at the cap"


class _Fetcher:
    _fetch_max_wait_ms = 5


class _WaitingConsumer(_Consumer):
    """Also the fetcher attribute set_fetch_wait changes."""

    def __init__(self) -> None:
        super().__init__()
        self._fetcher = _Fetcher()


async def test_a_fetch_wait_floor_and_a_starvation_raise_give_the_larger_wait() -> None:
    """The SDK's egress reader waits longer while the workers push (a floor); a starved consumer's
    raised wait wins over a smaller floor, and dropping the floor keeps the raise."""
    now = [0.0]
    consumer = _WaitingConsumer()
    wait = FetchWait(5, "test", clock=lambda: now[0])
    wait.at_least(consumer, 25)
    assert consumer._fetcher._fetch_max_wait_ms == 25
    wait.at_least(consumer, 0)
    assert consumer._fetcher._fetch_max_wait_ms == 5
    wait.at_least(consumer, 25)
    for t in (0.0, 0.2, 0.3):  # behind at one position for longer than the patience: raised to 10
        now[0] = t
        await wait.after_poll(consumer, {})
    assert wait.wait_ms == 10 and consumer._fetcher._fetch_max_wait_ms == 25, "the floor is larger"
    wait.at_least(consumer, 0)
    assert consumer._fetcher._fetch_max_wait_ms == 10, "the raise stays"


async def _one_record_batches(bootstrap: str, topic: str, values: list[tuple[bytes, bytes]]) -> None:
    """Each record in a produce request of its own: one stored batch object each on Tansu-on-S3."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        for key, value in values:
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


async def test_a_log_on_a_durable_broker_is_read_to_the_end(durable_kafka: DurableKafkaFactory) -> None:
    """On Tansu with S3 storage a fetch that lists the partition for longer than its wait is answered
    empty; a reader with a fixed 10 ms wait would spin for ever on a few hundred batches (recovery)."""
    broker = durable_kafka()
    topic = f"log-{uuid.uuid4().hex[:8]}"
    await create_topics(broker.bootstrap, {topic: 1})
    await _one_record_batches(broker.bootstrap, topic, [(b"k", b"%d" % i) for i in range(MANY_BATCHES)])
    wait = FetchWait(10, "test reader")
    records = await read_to_end(broker.bootstrap, {TopicPartition(topic, 0): 0}, wait=wait)
    assert [int(r.value) for r in records] == list(range(MANY_BATCHES))
    print(f"fetch wait {wait.wait_ms} ms after {wait.raised} raises")


async def test_the_ingress_on_a_durable_broker_gets_every_record(durable_kafka: DurableKafkaFactory) -> None:
    """The worker's fetch loop on the same broker: every record arrives, in order (replay takes them
    one by one with take_exact)."""
    broker = durable_kafka()
    config = load_config({"ingress_topic": f"in-{uuid.uuid4().hex[:8]}"}, env={})
    await create_topics(broker.bootstrap, {config.ingress_topic: 1})
    requests = [
        Request(f"r{i}", "acct", "deposit", "k", msgspec.Raw(encode_value([i]))) for i in range(MANY_BATCHES)
    ]
    values = [(r.request_id.encode(), request_encoder.encode(r)) for r in requests]
    await _one_record_batches(broker.bootstrap, config.ingress_topic, values)
    ingress = KafkaIngress(broker.bootstrap, config)
    await ingress.start()
    fetching = asyncio.create_task(ingress.run())
    try:
        ingress.assign([0])
        taken = [await ingress.take_exact(0, offset) for offset in range(MANY_BATCHES)]
        assert [rec.request.request_id for rec in taken] == [r.request_id for r in requests]
        assert ingress.positions() == {0: {0: MANY_BATCHES}}
    finally:
        fetching.cancel()
        await ingress.stop()
    print(f"fetch wait {ingress.fetch_wait.wait_ms} ms after {ingress.fetch_wait.raised} raises")


def test_sent_epoch_reads_the_header() -> None:
    assert sent_epoch([("other", b"1"), ("styx-epoch", b"42")]) == 42
    assert sent_epoch([]) is None
    assert sent_epoch([("styx-epoch", b"x")]) is None


async def _started_sink(
    kafka: TansuBroker, egress_partitions: int
) -> tuple[Config, KafkaSink, asyncio.Task[None]]:
    """A worker's sink on new egress and sequencer-log topics, started, its drain task running."""
    suffix = uuid.uuid4().hex[:8]
    config = load_config({"egress_topic": f"out-{suffix}", "seqlog_topic": f"seq-{suffix}"}, env={})
    await create_topics(kafka.bootstrap, {config.egress_topic: egress_partitions, config.seqlog_topic: 1})
    sink = KafkaSink(kafka.bootstrap, config)
    await sink.start()
    return config, sink, asyncio.create_task(sink.run())


async def test_recovery_tells_replies_apart_by_the_epoch_that_sent_them(kafka: TansuBroker) -> None:
    """A resent request's reply equals the first one, epoch field included; only the header says
    which epoch sent it, and recovery keeps just the replies of the epochs it is going to replay."""
    first = Reply("r1", 7, 3, 0, "committed", NIL, None, None)
    other = Reply("r2", 9, 4, 1, "committed", NIL, None, None)
    config, sink, drain = await _started_sink(kafka, 2)
    try:
        sink.send(0, first, 3)
        sink.send(1, other, 4)
        sink.send(0, first, 5)  # the same request resent, answered again by epoch 5
        assert sink.lanes.pending() == 3, "not pushed to their clients: not held"
        await asyncio.wait_for(sink.flush(), 30)  # what recovery waits for before reading the log
        assert not drain.done(), drain
        assert sink.offsets() == {0: 2, 1: 1}
        await asyncio.wait_for(sink.flush(), 1)  # nothing queued: at once
    finally:
        drain.cancel()
        await sink.stop()
    reader = KafkaLogReader(kafka.bootstrap, config)
    start = {0: 0, 1: 0}
    assert sorted(r.request_id for r in await reader.replies_from(start, -1)) == ["r1", "r1", "r2"]
    assert sorted(r.request_id for r in await reader.replies_from(start, 3)) == ["r1", "r2"]
    assert await reader.replies_from(start, 4) == [first]
    assert await reader.replies_from(start, 5) == []


async def test_replies_ride_with_the_next_sequencer_log_entry(
    kafka: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch's log entry must not queue behind a produce request of replies (the producer keeps one
    in flight per broker): replies pushed to their clients wait for the next entry and go in its
    request; with no entry coming (an idle cluster) they go on their own after
    REPLY_WAIT_FOR_LOG_ENTRY_S."""
    config, sink, drain = await _started_sink(kafka, 2)
    produced = record_produces(sink, monkeypatch)  # the topics of each produce request, in order
    try:
        sink.send(0, Reply("r1", 7, 3, 0, "committed", NIL, None, None), 3, pushed=True)
        sink.send(1, Reply("r2", 8, 3, 1, "committed", NIL, None, None), 3, pushed=True)
        assert sink.queued == 2 and sink.lanes.pending() == 0, "held"
        await asyncio.wait_for(sink.append(SeqLogEntry(4, "w1", 0, [], 1, 0)), 30)
        await asyncio.wait_for(sink.flush(), 30)
        assert produced == [{config.egress_topic, config.seqlog_topic}], "one request for both"
        assert sink.offsets() == {0: 1, 1: 1} and sink.acked() == 1
        # No entry follows: the reply goes alone once REPLY_WAIT_FOR_LOG_ENTRY_S went by.
        sink.send(0, Reply("r3", 9, 4, 0, "committed", NIL, None, None), 4, pushed=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while sink.offsets()[0] < 2:
            assert loop.time() < deadline, "the held reply was never sent"
            await asyncio.sleep(REPLY_WAIT_FOR_LOG_ENTRY_S / 5)
        assert produced[1:] == [{config.egress_topic}]
        # A reply its client was not pushed goes at once (the client reads the log for it), and with
        # it the ones held before it.
        sink.send(1, Reply("r4", 10, 5, 1, "committed", NIL, None, None), 5, pushed=True)
        assert sink.lanes.pending() == 0
        sink.send(1, Reply("r5", 11, 5, 1, "committed", NIL, None, None), 5, pushed=False)
        assert sink.queued == 2 and sink.lanes.pending() == 2 and sink.hold_timer is None
        await asyncio.wait_for(sink.flush(), 30)
        assert produced[2:] == [{config.egress_topic}] and sink.offsets()[1] == 3
        assert not drain.done(), drain
    finally:
        drain.cancel()
        await sink.stop()


async def test_the_workers_own_requests_ride_with_the_next_sequencer_log_entry(
    kafka: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion or a timer firing (submit) is held like a pushed reply: it goes in the produce
    request of the next log entry, is told stored with its offset and stamp, and without an entry goes
    on its own after REPLY_WAIT_FOR_LOG_ENTRY_S."""
    suffix = uuid.uuid4().hex[:8]
    overrides = {
        "egress_topic": f"out-{suffix}",
        "seqlog_topic": f"seq-{suffix}",
        "ingress_topic": f"in-{suffix}",
    }
    config = load_config(overrides, env={})
    ingress = segment_topic(config.ingress_topic, 0)
    await create_topics(kafka.bootstrap, {config.egress_topic: 1, config.seqlog_topic: 1, ingress: 2})
    sink = KafkaSink(kafka.bootstrap, config)
    await sink.start()
    drain = asyncio.create_task(sink.run())
    produced = record_produces(sink, monkeypatch)  # the topics of each produce request, in order
    stored: list[PushedRequest] = []
    sink.on_request_stored = stored.append
    raw = msgspec.Raw(encode_value([]))
    try:
        submitted = sink.submit(1, Request("own-1", "styx.outbox", "complete", "k", raw, 5))
        assert sink.queued == 1 and not produced, "held"
        await asyncio.wait_for(sink.append(SeqLogEntry(4, "w1", 0, [], 1, 0)), 30)
        await asyncio.wait_for(submitted, 30)
        assert produced == [{ingress, config.seqlog_topic}], "one request for both"
        assert [(p.partition, p.offset, p.key) for p in stored] == [(1, 0, b"own-1")]
        alone = sink.submit(0, Request("own-2", "styx.timers", "fire", "k", raw, 6))
        await asyncio.wait_for(alone, 30)  # no entry follows: after REPLY_WAIT_FOR_LOG_ENTRY_S
        assert produced[1:] == [{ingress}] and stored[-1].offset == 0 and stored[-1].partition == 0
        assert not drain.done(), drain
    finally:
        drain.cancel()
        await sink.stop()


async def test_a_closing_sink_leaves_what_it_held_on_the_log_stamped_when_it_was_sent(
    kafka: TansuBroker,
) -> None:
    """A SIGTERM ends the worker's tasks (the drain among them), then closes the sink: the replies it
    still held were pushed to their clients already, so they go to the log first; each is stamped
    with the time it was sent, not the time its batch was built."""
    config, sink, drain = await _started_sink(kafka, 1)
    now_ms = [1_000_000]
    sink.lanes.clock_ns = lambda: now_ms[0] * 1_000_000
    sink.send(0, Reply("r1", 7, 3, 0, "committed", NIL, None, None), 3, pushed=True)
    now_ms[0] += 5
    sink.send(0, Reply("r2", 8, 3, 0, "committed", NIL, None, None), 3, pushed=True)
    now_ms[0] += 50  # later than either, when they are handed to the producer
    drain.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await drain
    await sink.stop()
    records = await read_to_end(kafka.bootstrap, {TopicPartition(config.egress_topic, 0): 0})
    assert [(r.key, r.timestamp) for r in records] == [(b"r1", 1_000_000), (b"r2", 1_000_005)]


async def test_flush_waits_for_what_was_queued_before_it_not_for_a_steady_stream(kafka: TansuBroker) -> None:
    """A snapshot is confirmed after a flush of the replies queued so far; under steady load the
    egress is never idle, so a flush that waited for idleness would hold snapshots up for good."""
    _, sink, drain = await _started_sink(kafka, 1)

    async def feed() -> None:
        for i in range(50_000):
            sink.send(0, Reply(f"later-{i}", i, 2, 0, "committed", NIL, None, None), 2)
            await asyncio.sleep(0)  # yield to the drain: records keep arriving while batches fly

    try:
        for i in range(5):
            sink.send(0, Reply(f"first-{i}", i, 1, 0, "committed", NIL, None, None), 1)
        feeder = asyncio.create_task(feed())
        await asyncio.sleep(0)
        flush = sink.flush()
        done, _ = await asyncio.wait({flush, feeder}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        assert flush in done and not feeder.done(), "flush waited for records queued after it"
        assert sink.offsets()[0] >= 5
        feeder.cancel()
        assert not drain.done(), drain
    finally:
        drain.cancel()
        await sink.stop()
