"""Ingress segments (styx_py.core.segments): the ingress topic as a sequence of topics.

Pure parts, the simulation with segments started every few epochs under crashes and shape changes
(every reply and the final state equal the serial execution), and on the real broker: the worker's
ingress across segments, and the SDK following new segments and writing again what an old one may
have stranded.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from styx_client.sdk import StyxClient
from styx_client.sdk.kafka_transport import KafkaTransport
from styx_py.core.config import load_config
from styx_py.core.segments import (
    FRESH_S,
    cursor_of,
    live,
    pack,
    replies_to,
    reply_segments,
    segment_topic,
    segment_topics,
    segments_in,
    to_read,
    unpack,
    unread,
)
from styx_py.core.wire import Request, encode_value, request_decoder, request_encoder
from styx_py.io.kafka_admin import TopicAdmin, existing_topics
from styx_py.stack.services import TansuBroker, create_topics
from styx_py.testing.memory import MemoryIngress, MemoryLog
from styx_worker.ingress import KafkaIngress
from tests.test_recovery import run_with_crashes
from tests.test_reshape import run_with_reshapes

# ---- pure ------------------------------------------------------------------------------------------------


def test_packed_offsets_keep_segment_order_and_segment_zero_is_the_plain_offset() -> None:
    assert pack(0, 17) == 17 and unpack(17) == (0, 17)
    assert unpack(pack(3, 2**40 - 1)) == (3, 2**40 - 1)
    assert pack(1, 0) > pack(0, 2**40 - 1)
    assert sorted([pack(2, 0), pack(1, 5), pack(1, 4)]) == [pack(1, 4), pack(1, 5), pack(2, 0)]


def test_segment_topics_are_found_by_name() -> None:
    assert segment_topic("in", 0) == "in" and segment_topic("in", 12) == "in.12"
    topics = ["in", "in.2", "in.10", "in.x", "inx.3", "out", "in.1.2"]
    assert segments_in(topics, "in") == [0, 2, 10]
    assert segments_in(["out"], "in") == []
    assert segment_topics(topics, "in") == ["in", "in.2", "in.10"]
    # A part written before segments has only its segment-0 position.
    assert cursor_of(7, {}) == {0: 7} and cursor_of(7, {2: 1, 3: 0}) == {2: 1, 3: 0}
    # A resumed partition reads every segment from its cursor's oldest to the newest.
    assert to_read({2: 5}, 4) == {2: 5, 3: 0, 4: 0} and to_read({}, 1) == {0: 0, 1: 0}
    assert to_read({3: 1}, 2) == {3: 1}
    # A segment between two the cursor names was drained before the older one: not read again.
    assert to_read({2: 5, 4: 1}, 5) == {2: 5, 4: 1, 5: 0}


def test_workers_read_the_newest_two_clients_replies_from_three_and_write_again_what_is_late() -> None:
    assert live(0) == [0] and live(1) == [0, 1] and live(5) == [4, 5]
    assert reply_segments(1) == [0, 1] and reply_segments(5) == [3, 4, 5] and replies_to(5) == 4
    assert not unread(4, 5) and unread(3, 5) and not unread(0, 1) and unread(0, 2)


def test_the_memory_ingress_reads_the_newest_two_segments_drains_and_resumes_from_a_cursor() -> None:
    log = MemoryLog()
    for s in range(3):
        log.create(segment_topic("in", s), 1)
        for i in range(2):
            log.append(
                segment_topic("in", s), 0, Request(f"s{s}r{i}", "acct", "deposit", "k", msgspec.Raw(b"\x90"))
            )
    ingress = MemoryIngress(log, "in")
    ingress.assign([0])
    ingress.live(1)
    taken = ingress.take(10)
    assert [r.request.request_id for r in taken] == ["s0r0", "s1r0", "s0r1", "s1r1"]
    assert [r.offset for r in taken] == [0, pack(1, 0), 1, pack(1, 1)]
    assert ingress.positions() == {0: {0: 2, 1: 2}}
    ingress.live(3)  # segments 2 and 3; 0 and 1 were taken to their end
    assert ingress.positions() == {0: {2: 0, 3: 0}}
    ingress.live(2)  # never back
    assert ingress.positions() == {0: {2: 0, 3: 0}}
    # A segment that leaves the live ones with records not taken is drained first.
    ingress.live(4)
    assert ingress.positions() == {0: {2: 0, 3: 0, 4: 0}}
    ingress.assign([0])  # a new view keeps what drains
    assert ingress.positions() == {0: {2: 0, 3: 0, 4: 0}}
    assert [r.request.request_id for r in ingress.take(10)] == ["s2r0", "s2r1"]
    assert ingress.positions() == {0: {3: 0, 4: 0}}
    # A recovery: back to the snapshot's cursor, which names a segment no longer read live.
    ingress.seek({0: {0: 1}})
    assert ingress.positions() == {0: {0: 1, 1: 0, 2: 0, 3: 0, 4: 0}}


# ---- the simulation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
async def test_segments_under_crashes_keep_exactly_once_and_serializability(seed: int) -> None:
    """A new segment every 4 ms (about every 4 epochs) of virtual time, while workers and the
    coordinator crash, messages are lost and duplicated and clients resend; the simulated clients
    write to the newest segment (which the workers may not read yet) or the one before."""
    c = await run_with_crashes(
        1000 + seed,
        crashes=1 + seed % 3,
        coordinator_crashes=seed % 2,
        snapshot_every=1 + seed % 4,
        resends=seed % 3,
        drops=seed % 2,
        duplicates=seed % 2,
        log_segment_s=0.004,
        epoch_interval_ms=1,
    )
    assert c.coordinator.cluster.segment >= 2


@pytest.mark.parametrize("seed", range(4))
async def test_segments_across_joins_drains_and_losses(seed: int) -> None:
    c = await run_with_reshapes(2000 + seed, log_segment_s=0.004, epoch_interval_ms=1)
    assert c.coordinator.cluster.segment >= 2


# ---- on the real broker ---------------------------------------------------------------------------------

services = pytest.mark.services


async def _until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _request(rid: str) -> Request:
    return Request(rid, "acct", "deposit", "k", msgspec.Raw(encode_value([1])))


@services
@pytest.mark.timeout(120)
async def test_the_worker_ingress_reads_across_segments(kafka: TansuBroker) -> None:
    config = load_config({"ingress_topic": f"in-{uuid.uuid4().hex[:8]}"}, env={})
    topics = [segment_topic(config.ingress_topic, s) for s in range(4)]
    await create_topics(kafka.bootstrap, dict.fromkeys(topics, 1))
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        for s, topic in enumerate(topics):
            for i in range(3):
                r = _request(f"s{s}r{i}")
                await producer.send_and_wait(
                    topic, request_encoder.encode(r), key=r.request_id.encode(), partition=0
                )
    finally:
        await producer.stop()
    ingress = KafkaIngress(kafka.bootstrap, config)
    await ingress.start()
    fetching = asyncio.create_task(ingress.run())
    try:
        ingress.assign([0])
        ingress.live(1)
        got: list[str] = []
        deadline = time.monotonic() + 20
        while len(got) < 6:
            assert time.monotonic() < deadline, got
            got += [r.request.request_id for r in ingress.take(10)]
            await asyncio.sleep(0.02)
        assert sorted(got) == sorted(f"s{s}r{i}" for s in (0, 1) for i in range(3))
        assert ingress.positions() == {0: {0: 3, 1: 3}}
        ingress.live(3)  # 2 and 3 are read from their start; 0 and 1 are drained, then no longer read
        assert ingress.positions() == {0: {0: 3, 1: 3, 2: 0, 3: 0}}
        assert set(ingress.sources.draining) == {(0, 0), (1, 0)}
        await _until(lambda: ingress.positions() == {0: {2: 0, 3: 0}})
        # Replay names records by packed offset, in a segment read live or not; a recovery reads every
        # segment from its cursor's oldest, and drains those older than the live ones.
        ingress.seek({0: {0: 1, 2: 0}})  # segment 1, between the two, was drained: not read again
        assert set(ingress.sources.draining) == {(0, 0)}
        assert (await ingress.take_exact(0, pack(0, 1))).request.request_id == "s0r1"
        assert (await ingress.take_exact(0, pack(2, 0))).request.request_id == "s2r0"
        assert ingress.positions()[0] == {0: 2, 2: 1, 3: 0}
        # A recovery to a cursor past a draining segment stops reading it (the fetch loop goes on).
        ingress.seek({0: {1: 1, 3: 0}})
        assert set(ingress.sources.draining) == {(1, 0)} and ingress.positions()[0] == {1: 1, 3: 0}
        assert (await ingress.take_exact(0, pack(1, 1))).request.request_id == "s1r1"
        got: list[str] = []
        deadline = time.monotonic() + 20
        while len(got) < 4:
            assert time.monotonic() < deadline and not fetching.done(), got
            got += [r.request.request_id for r in ingress.take(10)]
            await asyncio.sleep(0.02)
        assert sorted(got) == ["s1r2", "s3r0", "s3r1", "s3r2"]
    finally:
        fetching.cancel()
        await ingress.stop()


def test_a_request_in_flight_when_the_client_moves_on_is_on_time_if_acknowledged_soon_enough() -> None:
    """On time means: acknowledged less than FRESH_S after a look found its segment the newest (the
    next one did not exist then), whether or not the client has moved on to a newer segment since. A
    request in flight at the move counted as late would be written again (so answered twice on the
    log) if the cluster then stalled for two rotations (tests/test_scaling.py, a lost worker)."""
    from styx_client.sdk.core import ClientCore

    core = ClientCore(10, "egress", rest=False, push_requests=False)
    now = 100.0
    core.segment_seen(3, now - 0.3)  # a look found segment 3 the newest
    core.segment_seen(4, now)  # the next look found segment 4
    assert core.on_time(3, now) and core.on_time(4, now)
    core.looked[3] = now - FRESH_S - 0.01
    assert not core.on_time(3, now) and not core.on_time(2, now)
    core.segment_seen(9, now)
    assert sorted(core.looked) == [9], "only the last few segments are remembered"


def test_a_broker_that_would_create_named_topics_is_never_asked_about_them() -> None:
    """Metadata requests before v4 auto-create the topics they name: asking is refused before anything
    is sent, and every topic is listed instead."""
    from aiokafka.errors import IncompatibleBrokerVersion

    from styx_client.sdk.kafka import newest_segment
    from styx_py.io.kafka_admin import _NamedMetadata

    request = _NamedMetadata(["t.1"], allow_auto_topic_creation=False)
    assert request.prepare({3: (0, 5)}).API_VERSION == 5
    with pytest.raises(IncompatibleBrokerVersion):
        request.prepare({3: (0, 3)})

    class OldBroker:
        def get_random_node(self) -> int:
            return 0

        async def send(self, node: int, request: _NamedMetadata) -> None:
            request.prepare({3: (0, 1)})

        async def fetch_all_metadata(self) -> object:
            class Listing:
                def topics(self) -> set[str]:
                    return {"in", "in.1", "in.2", "out", "out.1"}

            return Listing()

    class Producer:
        client = OldBroker()

    assert asyncio.run(newest_segment(Producer(), "in", 0)) == 2


@services
@pytest.mark.timeout(60)
async def test_topics_are_created_and_looked_up_by_name_without_listing_or_creating_others(
    kafka: TansuBroker,
) -> None:
    """The coordinator's admin client creates segment after segment (an existing topic is no error);
    asking which named topics exist creates none of the missing ones."""
    base = f"named-{uuid.uuid4().hex[:8]}"
    admin = TopicAdmin(kafka.bootstrap)
    try:
        for k in range(3):
            await admin.create({segment_topic(base, k): 2})
        await admin.create({segment_topic(base, 1): 2})
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    try:
        names = [segment_topic(base, k) for k in range(5)]
        assert await existing_topics(producer.client, names) == set(names[:3])
        assert await existing_topics(producer.client, names[3:]) == set()
        listed = (await producer.client.fetch_all_metadata()).topics()
        assert segments_in(listed, base) == [0, 1, 2]  # the missing ones were not created
    finally:
        await producer.stop()


@services
@pytest.mark.timeout(120)
async def test_the_client_follows_new_segments_and_writes_again_what_an_old_one_may_strand(
    kafka: TansuBroker,
) -> None:
    """A request acknowledged while its segment was the newest, as a listing had just shown, is read by
    the workers for sure: never written again. One acknowledged after the client's view went stale (it
    could not list topics) is written again once the workers may have stopped reading its segment (the
    newest is 2 segments ahead), and is answered from there."""
    from tests.test_client import EchoServer

    ingress, egress = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka.bootstrap, {ingress: 4, egress: 3})

    async def rotate(k: int) -> None:  # as the coordinator does: egress first
        await create_topics(kafka.bootstrap, {segment_topic(egress, k): 3})
        await create_topics(kafka.bootstrap, {segment_topic(ingress, k): 4})

    async with StyxClient(kafka.bootstrap, {"acct": 4}, ingress_topic=ingress, egress_topic=egress) as client:
        on_time = client.submit_future("acct", "k2", "echo", 2)
        await _until(lambda: client.stats.sent == 1)
        core, shell = client._core, client._shell
        assert shell is not None
        assert all(e.on_time for e in core.table.entries.values())
        # The client stops listing topics (a broker that does not answer it) and its view goes stale.
        [looking] = [t for t in asyncio.all_tasks() if t.get_name() == f"{client.client_id}-segments"]
        looking.cancel()
        await _until(lambda: time.monotonic() - core.looked[core.segment] > FRESH_S)
        late = client.submit_future("acct", "k1", "echo", 1)
        await _until(lambda: client.stats.sent == 2)
        for k in (1, 2):
            await rotate(k)
        looking = asyncio.create_task(shell._follow_segments())
        await _until(lambda: client.segment == 2)
        assert client.stats.rewritten == 1
        # The producer keeps metadata of the two newest ingress segments only (it refreshes the
        # metadata of every topic it tracks, and a long run makes thousands of segments).
        transport = client._transport
        assert isinstance(transport, KafkaTransport)
        assert transport.producer.client._topics == {segment_topic(ingress, 1), segment_topic(ingress, 2)}
        # Workers reading segments 1 and 2 reply to egress segment 1, which the client reads by now.
        echo = EchoServer(kafka.bootstrap, segment_topic(ingress, 2), segment_topic(egress, 1))
        await echo.start()
        try:
            reply = await asyncio.wait_for(late, 30)
            assert reply.committed and reply.value["args"] == [1]
            assert not on_time.done()  # in segment 0, which this echo does not read
        finally:
            await echo.stop()
        on_time.cancel()
        await _until(
            lambda: (
                {tp.topic for tp in transport.consumer.assignment()}
                == {segment_topic(egress, s) for s in (0, 1, 2)}
            )
        )
        looking.cancel()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, fetch_max_wait_ms=5)
    await consumer.start()
    try:
        tps = [TopicPartition(segment_topic(ingress, s), p) for s in range(3) for p in range(4)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen: dict[str, list[str]] = {}
        deadline = time.monotonic() + 20
        while sum(len(v) for v in seen.values()) < 3:
            assert time.monotonic() < deadline, seen
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                for r in records:
                    seen.setdefault(tp.topic, []).append(request_decoder.decode(r.value).key)
    finally:
        await consumer.stop()
    assert {t: sorted(keys) for t, keys in seen.items()} == {
        ingress: ["k1", "k2"],
        segment_topic(ingress, 2): ["k1"],
    }
