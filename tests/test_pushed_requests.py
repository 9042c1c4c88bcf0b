"""Requests pushed by their clients to the worker that reads their partition (styx_client.sdk.push,
styx_worker.ingress, core/wire/push.py).

What must hold: a pushed record is taken only as the next offset of its partition, so the worker's
buffer (and every epoch's batch) is the topic's records in offset order whichever copy came first;
each record is taken once; the fetched copy is compared with the pushed one; a push for a partition
not read here is left to the fetch. The ingress fetch waits longer only while every record comes
pushed. The client pushes each acknowledged request to its partition's worker, the requests of one
event-loop tick in one frame, and nothing to a worker it is not subscribed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from styx_client.sdk.push import WorkerLinks
from styx_py.core.config import Config, load_config
from styx_py.core.limits import (
    INGRESS_IDLE_S,
    INGRESS_PUSHED_FETCH_WAIT_MS,
    INGRESS_PUSHED_POLL_S,
    PUSH_AGAIN_BELOW_REQUESTS_PER_S,
    PUSH_BELOW_REQUESTS_PER_S,
    PUSH_EXCUSE_S,
    PUSH_SETTLE_S,
    PUSH_WINDOW_S,
)
from styx_py.core.wire import (
    HEADER_BYTES,
    Batch,
    Message,
    PushedRequest,
    Request,
    SubscribeReplies,
    decode_batch,
    encode_value,
    frame_length,
    request_encoder,
)
from styx_py.io.handshake import accept_handshake
from styx_py.stack.services import TansuBroker, create_topics
from styx_worker.ingress import KafkaIngress
from styx_worker.pace import PushPace
from tests.test_transport_security import until

# ---- the fetch wait while requests come pushed (pure) -----------------------------------------------


def test_the_fetch_waits_longer_only_while_requests_are_pushed() -> None:
    pace = PushPace()
    assert pace.floor_ms(0.0) == 0 and not pace.tracking(0.0), "nothing pushed: the configured wait"
    pace.pushed(1.0)
    assert pace.tracking(1.0) and pace.floor_ms(1.0) == 0, "pushed: watched for PUSH_SETTLE_S first"
    assert PUSH_SETTLE_S < PUSH_WINDOW_S
    pace.pushed(1.0 + PUSH_SETTLE_S / 2)
    assert pace.floor_ms(1.0 + PUSH_SETTLE_S - 0.01) == 0
    for t in range(2, 12):
        pace.pushed(float(t))
    assert pace.floor_ms(1.0 + PUSH_SETTLE_S) == INGRESS_PUSHED_FETCH_WAIT_MS
    # Pushes stop (the clients left, or their connections): the configured wait once PUSH_WINDOW_S went by.
    assert pace.floor_ms(11.0 + PUSH_WINDOW_S - 0.01) == INGRESS_PUSHED_FETCH_WAIT_MS
    assert pace.floor_ms(11.0 + PUSH_WINDOW_S) == 0 and not pace.tracking(11.0 + PUSH_WINDOW_S)
    # When they come again, they are watched for PUSH_SETTLE_S again.
    pace.pushed(30.0)
    assert pace.floor_ms(30.0) == 0 and pace.floor_ms(30.0 + PUSH_SETTLE_S - 0.01) == 0
    pace.pushed(30.0 + PUSH_SETTLE_S / 2)
    pace.pushed(30.0 + PUSH_SETTLE_S)
    assert pace.floor_ms(30.0 + PUSH_SETTLE_S) == INGRESS_PUSHED_FETCH_WAIT_MS


def test_an_idle_ingress_waits_longer_until_a_record_comes_either_way() -> None:
    pace = PushPace(idle_ms=100)
    assert pace.floor_ms(0.0) == 100, "no record ever came: idle"
    pace.fetched(5.0)
    assert pace.floor_ms(5.0) == 0 and pace.floor_ms(5.0 + INGRESS_IDLE_S - 0.01) == 0, "the configured wait"
    assert pace.floor_ms(5.0 + INGRESS_IDLE_S) == 100, "a second without a record: idle again"
    pace.pushed(8.0)
    assert pace.floor_ms(8.0) == 0, "a pushed record ends it too"
    # Records pushed for PUSH_WINDOW_S: the pushed wait; once the pushes stop, the idle wait after
    # INGRESS_IDLE_S.
    _pushed_steadily(pace, 8.0, 8.0 + PUSH_WINDOW_S)
    assert pace.floor_ms(8.0 + PUSH_WINDOW_S) == INGRESS_PUSHED_FETCH_WAIT_MS
    assert pace.floor_ms(8.0 + PUSH_WINDOW_S + INGRESS_IDLE_S) == 100
    # The longer of the two when both hold, and none without an idle wait (the default).
    short = PushPace(idle_ms=INGRESS_PUSHED_FETCH_WAIT_MS - 1)
    _pushed_steadily(short, 0.0, PUSH_WINDOW_S)
    assert short.floor_ms(PUSH_WINDOW_S + INGRESS_IDLE_S) == INGRESS_PUSHED_FETCH_WAIT_MS
    assert PushPace().floor_ms(0.0) == 0


def _pushed_steadily(pace: PushPace, start: float, end: float) -> None:
    """Records pushed every half second from ``start`` to ``end``."""
    t = start
    while t < end:
        pace.pushed(t)
        t += 0.5
    pace.pushed(end)


def test_a_record_the_fetch_brought_first_is_excused_by_its_late_push() -> None:
    pace = PushPace()
    _pushed_steadily(pace, 1.0 - PUSH_WINDOW_S, 1.0)
    pace.fetched_first((0, 2), 7, 1.0)  # the fetch was quicker than the push ...
    assert pace.floor_ms(1.0 + PUSH_EXCUSE_S / 2) == INGRESS_PUSHED_FETCH_WAIT_MS, (
        "... which has time to come"
    )
    pace.excused((0, 2), 7)
    pace.pushed(1.1)
    assert pace.floor_ms(1.0 + 2 * PUSH_EXCUSE_S) == INGRESS_PUSHED_FETCH_WAIT_MS and pace.unpushed == 0


def test_a_record_nobody_pushed_puts_the_configured_wait_back_for_a_while() -> None:
    pace = PushPace()
    _pushed_steadily(pace, 1.0 - PUSH_WINDOW_S, 1.0)
    pace.fetched_first((0, 2), 7, 1.0)
    pace.fetched_first((0, 2), 8, 1.1)
    now = 1.01 + PUSH_EXCUSE_S
    assert pace.floor_ms(now) == 0, "7 was not pushed: a client that does not push is served at once"
    assert pace.unpushed == 1 and list(pace.unexcused) == [((0, 2), 8)], "8 may still be"
    pace.excused((0, 2), 8)  # it was
    for t in (now + 1, now + PUSH_WINDOW_S / 2):
        pace.pushed(t)  # other clients keep pushing
        assert pace.floor_ms(t) == 0
    pace.pushed(now + PUSH_WINDOW_S)
    assert pace.floor_ms(now + PUSH_WINDOW_S) == INGRESS_PUSHED_FETCH_WAIT_MS, (
        "PUSH_WINDOW_S with every record pushed"
    )
    # A source read from elsewhere (a seek, a partition that moved): its records fetched first are moot.
    pace.fetched_first((0, 3), 1, now + PUSH_WINDOW_S)
    pace.forget((0, 3))
    assert pace.floor_ms(now + PUSH_WINDOW_S + 1) == INGRESS_PUSHED_FETCH_WAIT_MS and pace.unpushed == 1


# ---- the worker's ingress on a real broker ----------------------------------------------------------


def _request(rid: str, amount: int = 1) -> Request:
    return Request(rid, "acct", "deposit", "k", msgspec.Raw(encode_value([amount])))


async def test_pushed_records_are_taken_in_offset_order_once_and_compared_with_the_topic(
    kafka: TansuBroker, caplog: pytest.LogCaptureFixture
) -> None:
    # No idle wait: what is checked here is the wait while records come pushed.
    overrides = {"ingress_topic": f"push-{uuid.uuid4().hex[:8]}", "kafka_idle_fetch_wait_ms": 0}
    config = load_config(overrides, env={})
    topic = config.ingress_topic
    await create_topics(kafka.bootstrap, {topic: 2})
    stored: list[PushedRequest] = []  # what a client pushes: the record as acknowledged
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(6):
            key, value = f"r{i}".encode(), request_encoder.encode(_request(f"r{i}"))
            meta = await producer.send_and_wait(topic, value, key=key, partition=0, timestamp_ms=1_000 + i)
            stored.append(PushedRequest(0, 0, meta.offset, 1_000 + i, key, value))
    finally:
        await producer.stop()
    assert [p.offset for p in stored] == list(range(6))

    ingress = KafkaIngress(kafka.bootstrap, config)
    available: list[int] = []
    ingress.set_listener(lambda: available.append(ingress.pending()))
    await ingress.start()
    try:
        ingress.assign([0])  # no fetch loop yet: only pushes arrive
        ingress.offer(stored[1])
        assert ingress.pending() == 0 and available == [], "offset 1 waits for offset 0"
        ingress.offer(stored[0])
        assert [r.request.request_id for r in ingress.take(10)] == ["r0", "r1"]
        assert available == [2], "the worker says it has work, as for fetched records"
        ingress.offer(stored[1])  # a second push of a record taken already
        ingress.offer(msgspec.structs.replace(stored[2], partition=1))  # a partition read elsewhere
        assert ingress.pending() == 0 and ingress.counts.pushed_late == 2
        # A push unlike the stored record (never expected of the SDK): taken, and found out when the
        # fetch brings the topic's copy.
        forged = request_encoder.encode(_request("r2", amount=1_000_000))
        ingress.offer(msgspec.structs.replace(stored[2], value=forged))
        assert [r.request.request_id for r in ingress.take(10)] == ["r2"]
        assert ingress.counts.pushed_taken == 3 and ingress.fetch_wait.floor_ms == 0

        with caplog.at_level(logging.CRITICAL, logger="styx.ingress"):
            fetching = asyncio.create_task(ingress.run())
            try:
                taken: list[str] = []

                async def more() -> bool:
                    taken.extend(r.request.request_id for r in ingress.take(10))
                    return len(taken) >= 3

                deadline = asyncio.get_running_loop().time() + 30
                while not await more():
                    assert asyncio.get_running_loop().time() < deadline, taken
                    await asyncio.sleep(0.02)
                # The fetch brought the others, and only them; it compared the three pushed copies.
                assert taken == ["r3", "r4", "r5"]
                await until(lambda: ingress.counts.push_mismatches == 1, "the forged copy found", 30)
                assert ingress.positions() == {0: {0: 6}} and ingress.pending() == 0
                # The three the fetch brought first were never pushed, though requests were: the
                # fetch keeps the configured wait.
                await until(lambda: ingress.pace.unpushed == 3, "r3 to r5 found not pushed", 30)
                assert ingress.fetch_wait.floor_ms == 0
            finally:
                fetching.cancel()
                await asyncio.wait([fetching])
        assert "pushed unlike the topic's copy" in caplog.text
    finally:
        await ingress.stop()


@contextlib.asynccontextmanager
async def _fetching_ingress(
    kafka: TansuBroker, overrides: dict[str, object]
) -> AsyncIterator[tuple[Config, KafkaIngress, AIOKafkaProducer]]:
    """A worker's ingress of a new one-partition topic, its fetch loop running (from ``assign``), and a
    producer to that topic."""
    config = load_config(overrides, env={})
    await create_topics(kafka.bootstrap, {config.ingress_topic: 1})
    ingress = KafkaIngress(kafka.bootstrap, config)
    await ingress.start()
    fetching = asyncio.create_task(ingress.run())
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        yield config, ingress, producer
    finally:
        fetching.cancel()
        await asyncio.wait([fetching])
        await producer.stop()
        await ingress.stop()


async def _fetched(ingress: KafkaIngress) -> list[str]:
    """The request ids of the next records the fetch brings (waiting up to 30 s for them)."""
    deadline = asyncio.get_running_loop().time() + 30
    while not (taken := ingress.take(10)):
        assert asyncio.get_running_loop().time() < deadline, "the fetch brought nothing"
        await asyncio.sleep(0.02)
    return [r.request.request_id for r in taken]


async def test_the_ingress_fetch_waits_longer_while_every_record_comes_pushed(
    kafka: TansuBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No idle wait: what is checked here is the wait while records come pushed.
    overrides = {"ingress_topic": f"push-{uuid.uuid4().hex[:8]}", "kafka_idle_fetch_wait_ms": 0}
    async with _fetching_ingress(kafka, overrides) as (config, ingress, producer):
        topic = config.ingress_topic
        now = [1_000.0]
        ingress.clock = lambda: now[0]  # the pace's clock: PUSH_SETTLE_S of pushes without waiting for them
        ingress.assign([0])
        got: list[str] = []
        for i in range(21):
            key, value = f"p{i}".encode(), request_encoder.encode(_request(f"p{i}"))
            meta = await producer.send_and_wait(topic, value, key=key, partition=0, timestamp_ms=5_000 + i)
            ingress.offer(PushedRequest(0, 0, meta.offset, 5_000 + i, key, value))
            got += [r.request.request_id for r in ingress.take(10)]
            if now[0] < 1_000.0 + PUSH_SETTLE_S:
                assert ingress.fetch_wait.applied_ms == config.kafka_fetch_wait_ms, "not before PUSH_SETTLE_S"
                assert ingress.counts.paced == 0, "nor the paced polls"
            now[0] += PUSH_SETTLE_S / 20
        assert got == [f"p{i}" for i in range(21)], "each taken from its push at once"
        await until(
            lambda: ingress.fetch_wait.applied_ms == INGRESS_PUSHED_FETCH_WAIT_MS, "the longer wait", 30
        )
        # From now on the loop polls at most every INGRESS_PUSHED_POLL_S (the pace's clock stands still here,
        # so each pause is all of it): the gaps between polls, on the loop's clock.
        polls: list[float] = []
        getmany = ingress.consumer.getmany

        async def timed_getmany(*args: Any, **kwargs: Any) -> Any:
            polls.append(asyncio.get_running_loop().time())
            return await getmany(*args, **kwargs)

        monkeypatch.setattr(ingress.consumer, "getmany", timed_getmany)
        # Records keep coming meanwhile (pushed too), so a fetch need not wait for any: until six polls
        # (however fast the records go: on a fast machine a fixed count of them fits in fewer pauses).
        deadline = asyncio.get_running_loop().time() + 60
        i = 21
        while len(polls) < 6:
            assert asyncio.get_running_loop().time() < deadline, f"only {len(polls)} polls in 60 s"
            key, value = f"p{i}".encode(), request_encoder.encode(_request(f"p{i}"))
            meta = await producer.send_and_wait(topic, value, key=key, partition=0, timestamp_ms=5_000 + i)
            ingress.offer(PushedRequest(0, 0, meta.offset, 5_000 + i, key, value))
            ingress.take(10)
            i += 1
        gaps = [b - a for a, b in itertools.pairwise(polls)]
        assert min(gaps) >= INGRESS_PUSHED_POLL_S - 0.002, f"polls closer than INGRESS_PUSHED_POLL_S: {gaps}"
        assert ingress.counts.paced >= 5
        # A producer that does not push: its record is fetched, and the wait is short again.
        key, value = b"np", request_encoder.encode(_request("np"))
        await producer.send_and_wait(topic, value, key=key, partition=0)
        assert await _fetched(ingress) == ["np"]
        now[0] += PUSH_EXCUSE_S  # and its push never comes
        await until(lambda: ingress.fetch_wait.applied_ms == config.kafka_fetch_wait_ms, "the wait back", 30)
        assert ingress.pace.unpushed == 1 and ingress.counts.push_mismatches == 0


async def test_an_idle_ingress_fetches_with_the_idle_wait_until_a_record_comes(kafka: TansuBroker) -> None:
    async with _fetching_ingress(kafka, {"ingress_topic": f"idle-{uuid.uuid4().hex[:8]}"}) as (
        config,
        ingress,
        producer,
    ):
        assert config.kafka_idle_fetch_wait_ms > config.kafka_fetch_wait_ms
        topic = config.ingress_topic
        ingress.assign([0])
        await until(lambda: ingress.fetch_wait.applied_ms == config.kafka_idle_fetch_wait_ms, "idle", 30)
        # A record nobody pushed: fetched (after up to half the idle wait), and the wait is short again
        # before anyone can take it.
        key, value = b"r0", request_encoder.encode(_request("r0"))
        await producer.send_and_wait(topic, value, key=key, partition=0)
        assert await _fetched(ingress) == ["r0"]
        assert ingress.fetch_wait.applied_ms == config.kafka_fetch_wait_ms
        await until(lambda: ingress.fetch_wait.applied_ms == config.kafka_idle_fetch_wait_ms, "idle", 30)
        # A pushed record ends the idle wait as well (taken at once, the wait short from the next fetch).
        key, value = b"r1", request_encoder.encode(_request("r1"))
        meta = await producer.send_and_wait(topic, value, key=key, partition=0, timestamp_ms=7_000)
        ingress.offer(PushedRequest(0, 0, meta.offset, 7_000, key, value))
        assert [r.request.request_id for r in ingress.take(10)] == ["r1"]
        await until(lambda: ingress.fetch_wait.applied_ms == config.kafka_fetch_wait_ms, "short again", 30)


# ---- the client's side, against a stand-in worker ---------------------------------------------------


async def test_the_client_pushes_each_request_to_its_partitions_worker_a_frame_per_tick() -> None:
    secret = "push-requests-secret"
    frames: dict[str, list[list[Message]]] = {}

    def stand_in(name: str):
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await accept_handshake(reader, writer, secret.encode())
            while True:
                header = await reader.readexactly(HEADER_BYTES)
                msgs = decode_batch(await reader.readexactly(frame_length(header)), "worker").msgs
                if msgs:  # not a keepalive
                    frames.setdefault(name, []).append(list(msgs))

        return serve

    servers = {name: await asyncio.start_server(stand_in(name), "127.0.0.1", 0) for name in ("w1", "w2")}
    address = {name: f"127.0.0.1:{s.sockets[0].getsockname()[1]}" for name, s in servers.items()}
    owners = {address["w1"]: [0, 2], address["w2"]: [1, 3]}

    async def status() -> dict[str, object]:
        return {"workers": [{"address": a, "partitions": p} for a, p in owners.items()]}

    push = WorkerLinks(status, secret, "client-p", lambda _: None, 10.0, known=owners)
    assert push.owners == {0: address["w1"], 2: address["w1"], 1: address["w2"], 3: address["w2"]}
    push.push_request(0, 0, 5, 1, b"k", b"v")  # no subscription yet: left to the fetch
    assert push.outbox.not_pushed == 1
    task = asyncio.get_running_loop().create_task(push.run())
    try:
        await until(lambda: push.subscriptions.subscribed == set(address.values()), "subscribed on both", 30)
        await until(lambda: all(frames.get(n) == [[SubscribeReplies()]] for n in address), "asked", 30)
        for p in range(4):
            for offset in (10, 11):
                push.push_request(p, 1, offset, 7, f"k{p}".encode(), f"v{p}-{offset}".encode())
        push.push_request(9, 1, 0, 7, b"k", b"v")  # a partition no worker listed
        await until(lambda: all(len(frames[n]) == 2 for n in address), "the pushes", 30)
        # One frame per worker for the tick, with that worker's partitions only, in order.
        assert frames["w1"][1] == [
            PushedRequest(1, p, o, 7, f"k{p}".encode(), f"v{p}-{o}".encode())
            for p in (0, 2)
            for o in (10, 11)
        ]
        assert [(m.partition, m.offset) for m in frames["w2"][1] if isinstance(m, PushedRequest)] == [
            (1, 10),
            (1, 11),
            (3, 10),
            (3, 11),
        ]
        assert (push.outbox.pushed, push.outbox.not_pushed) == (8, 2)
        # A placement that changed: the next status moves the pushes.
        owners.update({address["w1"]: [0, 1, 2, 3], address["w2"]: []})
        await push._ask_workers()
        push.push_request(1, 1, 12, 7, b"k1", b"v")
        await until(lambda: len(frames["w1"]) == 3, "pushed to the new owner", 30)
        assert [(m.partition, m.offset) for m in frames["w1"][2] if isinstance(m, PushedRequest)] == [(1, 12)]
    finally:
        task.cancel()
        await asyncio.wait([task])
        for server in servers.values():
            server.close()
            await server.wait_closed()


async def test_the_client_pushes_only_while_it_sends_fewer_than_the_rate_a_second() -> None:
    """It stops at PUSH_BELOW_REQUESTS_PER_S and starts again below PUSH_AGAIN_BELOW_REQUESTS_PER_S."""
    now = [100.0]
    push = WorkerLinks(_no_status, "s", "client-r", lambda _: None, 10.0, known={"w:1": [0]})
    push.clock = lambda: now[0]
    push.subscriptions.subscribed.add("w:1")  # as if subscribed (no connection: the tick's write finds none)

    def send(n: int, over_s: float) -> None:
        for _ in range(n):
            push.push_request(0, 0, 0, 1, b"k", b"v")
            now[0] += over_s / n

    send(100, 0.5)  # 200/s
    assert push.outbox.too_fast == 0 and len(push.outbox.waiting["w:1"]) == 100
    send(PUSH_BELOW_REQUESTS_PER_S, 0.5)  # twice the threshold: pushed until the window that measured it ends
    assert 0 < push.outbox.too_fast < PUSH_BELOW_REQUESTS_PER_S
    between = (PUSH_AGAIN_BELOW_REQUESTS_PER_S + PUSH_BELOW_REQUESTS_PER_S) // 2
    send(between, 1.0)  # between the two thresholds, a client that stopped does not start again
    too_fast = push.outbox.too_fast
    send(20, 0.01)
    assert push.outbox.too_fast == too_fast + 20
    now[0] += 1.0  # quiet for a second: the next window measures a low rate again
    send(10, 0.01)
    assert push.outbox.too_fast == too_fast + 20


async def _no_status() -> dict[str, object]:
    return {}


def test_a_push_names_the_record_exactly() -> None:
    """The wire form keeps the bytes and a null key (a request without one is still pushed as stored)."""
    pushed = PushedRequest(3, 1, 42, 1_700_000_000_000, None, b"\x00\xff")
    frame = msgspec.msgpack.encode(Batch("client-x", [pushed]))
    assert decode_batch(frame, "worker").msgs == [pushed]
