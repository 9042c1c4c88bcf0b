"""Replies pushed by the workers to the clients that subscribed (styx_worker.feed, styx_client.sdk.push).

The unit tests pin down who is pushed what: only replies that also leave for the egress log, only to
the client their request names (``Request.reply_to``), nothing after its connection closed. The client counts
a reply that comes both ways once, and the later copy as an echo, not a duplicate. On real services,
a client made by ``StyxClient.connect`` subscribes on every worker's port and takes most replies from
the push, every one of which also reaches it through the egress topic (read with a longer fetch wait
while every worker pushes); a dropped subscription is made again, and replies keep coming meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from styx_benchmarks.latency_path import ingress_pushes
from styx_client import StyxClient
from styx_client.sdk import push as push_module
from styx_client.sdk.kafka_transport import KafkaTransport
from styx_client.sdk.pending import EGRESS, PUSHED, PendingTable
from styx_client.sdk.push import WorkerLinks, worker_addresses
from styx_client.sdk.replies import result_of
from styx_client.sdk.resting import EgressRest
from styx_client.sdk.stats import ClientStats
from styx_py.core.config import load_config
from styx_py.core.limits import (
    EGRESS_MARK_EVERY_S,
    EGRESS_MARKS_STALE_S,
    EGRESS_MISS_S,
    INGRESS_PUSHED_FETCH_WAIT_MS,
    MAX_REPLY_SUBSCRIBERS,
    PUSHED_EGRESS_FETCH_WAIT_MS,
    WORKER_LINK_RETRY_S,
    WORKER_LIST_REFRESH_S,
)
from styx_py.core.segments import REPLY_SEGMENTS, segments_in
from styx_py.core.wire import (
    HEADER_BYTES,
    NIL,
    Batch,
    EgressAcked,
    IngressRecord,
    Message,
    Phase,
    PushedReply,
    Reply,
    ReplyStatus,
    Request,
    SubscribeRefused,
    SubscribeReplies,
    decode_batch,
    encode_frame,
    encode_value,
    frame_length,
)
from styx_py.io.handshake import accept_handshake
from styx_py.stack.local import LocalStack
from styx_py.testing.memory import MemoryEgress, MemoryIngress, MemoryLog, MemorySeqLog
from styx_worker.feed import ReplyFeed
from styx_worker.ports import WorkerPorts
from styx_worker.shell import Worker
from styx_worker.txn import RootTxn
from tests.service_fixtures import ClusterFactory
from tests.test_integration import read_topic, read_until
from tests.test_transport_security import until


def _reply(rid: str, tid: int = 1) -> Reply:
    return Reply(rid, tid, 3, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, NIL, None, None)


class Sent:
    def __init__(self) -> None:
        self.msgs: list[tuple[str, Message]] = []

    def __call__(self, dest: str, msg: Message) -> None:
        self.msgs.append((dest, msg))

    def rids(self, dest: str) -> list[str]:
        return [m.reply.request_id for d, m in self.msgs if d == dest and isinstance(m, PushedReply)]


def test_each_reply_goes_to_the_client_its_request_names() -> None:
    sent = Sent()
    feed = ReplyFeed(sent)
    assert feed.subscribe("client-a") and feed.subscribe("client-b")
    for rid, reply_to in (("1", "client-a"), ("2", "client-b"), ("3", "client-gone"), ("4", "client-a")):
        feed.offer(_reply(rid), reply_to)
    assert sent.rids("client-a") == ["1", "4"]
    assert sent.rids("client-b") == ["2"]
    assert feed.pushed == 3
    feed.drop("client-a")  # its connection closed
    feed.offer(_reply("5"), "client-a")
    feed.offer(_reply("6"), "client-b")
    assert sent.rids("client-a") == ["1", "4"]
    assert sent.rids("client-b") == ["2", "6"]


def test_a_worker_pushes_to_a_bounded_number_of_clients() -> None:
    sent = Sent()
    feed = ReplyFeed(sent)
    for i in range(MAX_REPLY_SUBSCRIBERS):
        assert feed.subscribe(f"client-{i}")
    assert sent.msgs == []
    assert not feed.subscribe("client-one-too-many")
    assert sent.msgs == [("client-one-too-many", SubscribeRefused(MAX_REPLY_SUBSCRIBERS))], "told so"
    feed.offer(_reply("1"), "client-one-too-many")
    assert sent.rids("client-one-too-many") == []
    assert feed.subscribe("client-0")  # already there
    feed.drop("client-0")
    assert feed.subscribe("client-one-too-many")


async def test_a_worker_that_cannot_be_reached_is_asked_for_again_without_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker down (its port closed): each subscription attempt ends quietly (no error logged) and
    the client asks for the workers again."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()  # nothing listens there now

    async def status() -> dict[str, object]:
        return {"workers": [{"address": address}]}

    push = WorkerLinks(status, "unreachable-secret", "client-alone", lambda _: None, 10.0, known={address})
    with caplog.at_level(logging.DEBUG, logger="styx.client"):
        task = asyncio.get_running_loop().create_task(push.run())
        try:
            await until(lambda: push.asked >= 1, "asked again after the attempt failed", 30)
        finally:
            task.cancel()
            await asyncio.wait([task])
    assert not push.healthy and push.subscriptions.writers == {}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("no replies pushed from " + address in r.getMessage() for r in caplog.records)


async def test_a_refused_client_reads_that_workers_replies_from_the_log_and_does_not_ask_again() -> None:
    """Against a stand-in worker that refuses: the client is not healthy (the egress reader keeps the
    cluster's fetch wait), remembers the refusal and keeps its one connection open."""
    secret = "refusal-test-secret"
    asked: list[tuple[str, list[Message]]] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await accept_handshake(reader, writer, secret.encode())
        header = await reader.readexactly(HEADER_BYTES)
        msgs = decode_batch(await reader.readexactly(frame_length(header)), "worker").msgs
        asked.append((hello.node_id, list(msgs)))
        writer.write(encode_frame(Batch("w1", [SubscribeRefused(MAX_REPLY_SUBSCRIBERS)])))
        await reader.read()  # keepalives, until the client closes

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    async def status() -> dict[str, object]:
        return {"workers": [{"address": address}]}

    push = WorkerLinks(status, secret, "client-refused", lambda _: None, 10.0, known={address})
    task = asyncio.get_running_loop().create_task(push.run())
    try:
        await until(lambda: push.subscriptions.refused == {address}, "the refusal taken")
        assert asked == [("client-refused", [SubscribeReplies()])]
        assert (
            push.subscriptions.subscribed == set() and not push.healthy and push.egress_wait_floor_ms() == 0
        )
        assert not push.links[address].done(), "the connection stays open: no asking again"
    finally:
        task.cancel()
        await asyncio.wait([task])
        server.close()
        await server.wait_closed()
    assert len(asked) == 1


def _root(rid: str, tid: int = 1, reply_to: str = "client-a") -> RootTxn:
    request = Request(rid, "account", "deposit", "k1", msgspec.Raw(b"\x90"), reply_to=reply_to)
    return RootTxn(tid, IngressRecord(0, 0, request, 0))


def test_only_what_leaves_for_the_egress_log_is_pushed() -> None:
    """Pushed at the moment of the egress send, so with its fencing and holding: a held worker (a newer
    generation was announced) pushes nothing, nor does a replay for a reply already on the log. A
    request that names no client is not pushed."""
    sent = Sent()
    log = MemoryLog()
    for topic, n in (("ingress", 1), ("egress", 1), ("seqlog", 1)):
        log.create(topic, n)

    class Transport:
        node_id = "w1"
        send = sent

    ports = WorkerPorts(
        Transport(), MemoryIngress(log, "ingress"), MemoryEgress(log, "egress"), MemorySeqLog(log, "seqlog")
    )
    worker = Worker("w1", load_config({}, env={}), ports, heartbeats=False)
    assert worker.feed.subscribe("client-a")
    out = worker.core.replies

    def send(replies: list[tuple[RootTxn, Reply]]) -> None:  # as the epoch machine sends them
        out.send(3, replies)
        worker.apply(worker.core.flush())

    send([(_root("r1", 1), _reply("r1", 1)), (_root("r0", 4, reply_to=""), _reply("r0", 4))])
    assert sent.rids("client-a") == ["r1"]
    assert [r.request_id for r in log.records("egress")] == ["r1", "r0"]

    out.on_log = {"r2": [_reply("r2", 2)]}  # a replay: this one was logged already
    send([(_root("r2", 2), _reply("r2", 2))])
    out.held = True
    send([(_root("r3", 3), _reply("r3", 3))])
    assert sent.rids("client-a") == ["r1"]
    assert [r.request_id for r in log.records("egress")] == ["r1", "r0"]


def _waiting(table: PendingTable, rid: str) -> list[Reply | None]:
    """Register ``rid`` with one waiter (no event loop: the table is plain code); what it is told."""
    told: list[Reply | None] = []
    entry = table.register(rid, b"fp", 0, 0)
    table.wait(entry, lambda reply, error: told.append(reply), 5.0, ("op", "fn", "k", rid), 0.0)
    return told


def test_the_second_copy_of_a_reply_is_an_echo_not_a_duplicate() -> None:
    stats = ClientStats()
    table = PendingTable(10, stats)
    told = {rid: _waiting(table, rid) for rid in ("r1", "r2")}
    table.resolve(_reply("r1"), PUSHED)  # pushed first ...
    table.resolve(_reply("r1"), EGRESS)  # ... then read from the egress topic: an echo
    table.resolve(_reply("r1"), EGRESS)  # the log holding it twice: a duplicate
    table.resolve(_reply("r2"), EGRESS)  # the other way round
    table.resolve(_reply("r2"), PUSHED)
    assert [r.request_id for r in told["r1"] if r] == ["r1"] and len(told["r2"]) == 1
    assert (stats.replied, stats.pushed) == (2, 1)
    assert (stats.echoes_ignored, stats.duplicates_ignored, stats.unmatched_ignored) == (2, 1, 0)


def test_a_taken_copy_is_counted_by_its_key_as_resolve_would_count_it() -> None:
    """The egress reader skips decoding a record whose key names a reply already taken: the stats
    come out as if it had been decoded and resolved; anything else is left to decode."""
    by_key, by_reply = ClientStats(), ClientStats()
    for stats, skip in ((by_key, True), (by_reply, False)):
        table = PendingTable(10, stats)
        for rid in ("r1", "r2"):
            _waiting(table, rid)
        table.resolve(_reply("r1"), PUSHED)
        for rid in ("r1", "r1", "r2", "stranger"):  # an echo, a duplicate, a pending one, a foreign one
            if not (skip and table.taken_copy(rid.encode())):
                table.resolve(_reply(rid), EGRESS)
        assert table.get("r2") is None  # the pending one was resolved, not skipped
        assert not table.taken_copy(b"\xff\xfe")  # not a request id: decoded (and counted) as usual
    assert by_key == by_reply
    assert (by_key.replied, by_key.echoes_ignored, by_key.duplicates_ignored) == (2, 1, 1)
    assert (by_key.unmatched_ignored, by_key.foreign_ignored) == (1, 1)


def test_the_feed_sends_egress_acknowledgements_to_the_clients_that_asked_now_and_then() -> None:
    sent: list[tuple[str, Message]] = []
    acked = {0: 5, 1: 7}
    now = [0.0]
    feed = ReplyFeed(lambda dest, msg: sent.append((dest, msg)), lambda: dict(acked), lambda: now[0])
    feed.subscribe("marked", marks=True)
    feed.subscribe("plain")
    feed.offer(_reply("r1"), "plain")
    assert sent[-1] == ("marked", EgressAcked([(0, 5), (1, 7)]))
    sent.clear()
    acked[0] = 9
    feed.offer(_reply("r2"), "marked")  # within EGRESS_MARK_EVERY_S: the reply only
    now[0] += EGRESS_MARK_EVERY_S
    feed.offer(_reply("r3"), "marked")  # the ends moved: sent
    feed.offer(_reply("r4"), "marked")
    now[0] += EGRESS_MARK_EVERY_S
    feed.offer(_reply("r5"), "marked")  # unchanged: not sent again
    marks = [msg for dest, msg in sent if isinstance(msg, EgressAcked)]
    assert marks == [EgressAcked([(0, 9), (1, 7)])]
    assert all(dest == "marked" for dest, _ in sent)
    feed.drop("marked")
    assert feed.marked == set()


def test_worker_addresses_come_from_the_status() -> None:
    status = {"workers": [{"node_id": "w1", "address": "h:1"}, {"node_id": "w2", "address": "h:2"}, {}]}
    assert worker_addresses(status) == {"h:1", "h:2"}
    assert worker_addresses({}) == set()


@pytest.mark.looptime
async def test_asking_soon_for_the_workers_asks_at_once_but_not_more_often_than_every_retry() -> None:
    loop = asyncio.get_running_loop()
    asked_at: list[float] = []

    async def status() -> dict[str, object]:
        asked_at.append(loop.time())
        return {"workers": [{"node_id": "w1", "address": "h:1", "partitions": [0, 1]}]}

    links = WorkerLinks(status, "secret", "client-x", lambda reply: None, 5.0)
    links.clock = loop.time

    async def subscribed_for_good(address: str) -> None:  # the connection, as if it stayed up
        links.subscriptions.subscribed.add(address)
        await asyncio.Event().wait()

    links._subscribe = subscribed_for_good  # type: ignore[method-assign]
    runs = loop.create_task(links.run())
    try:
        await asyncio.sleep(WORKER_LIST_REFRESH_S / 2)
        assert (
            len(asked_at) == 1 and links.healthy
        )  # at the start; the next refresh is WORKER_LIST_REFRESH_S later
        links.ask_soon()  # a reply came through the log only
        await asyncio.sleep(0.001)
        assert asked_at[1:] == [WORKER_LIST_REFRESH_S / 2]  # at once
        links.ask_soon()
        links.ask_soon()
        await asyncio.sleep(WORKER_LINK_RETRY_S / 2)
        assert len(asked_at) == 2  # not again within WORKER_LINK_RETRY_S ...
        await asyncio.sleep(WORKER_LINK_RETRY_S)
        assert asked_at[2:] == [WORKER_LIST_REFRESH_S / 2 + WORKER_LINK_RETRY_S]  # ... but once, after it
        await asyncio.sleep(WORKER_LIST_REFRESH_S - WORKER_LINK_RETRY_S)
        assert len(asked_at) == 3  # and the regular refresh comes WORKER_LIST_REFRESH_S after the last time
        await asyncio.sleep(2 * WORKER_LINK_RETRY_S)
        assert len(asked_at) == 4 and links.asked == 4
    finally:
        runs.cancel()
        await asyncio.gather(runs, return_exceptions=True)


def test_the_reader_rests_only_while_pushed_marked_not_overdue_and_settled() -> None:
    table = PendingTable(100, ClientStats())
    now, wall = 100.0, 1_000_000
    healthy, settled = True, True
    rest = EgressRest(table, "styx-egress")

    def may_rest() -> bool:
        return rest.may_rest(healthy, settled, now, wall)

    assert may_rest()  # nothing in flight: nothing to read for, marks or not
    entry = table.register("r1", b"fp", 0, 0)
    waiter = table.wait(entry, lambda reply, error: None, 5.0, ("op", "fn", "k", "r1"), now)
    entry.stamp = wall
    assert not may_rest()  # in flight, and no mark yet
    rest.mark([(0, 5)], now)
    assert may_rest()  # in flight, not overdue
    wall += int(EGRESS_MISS_S * 1000)
    assert not may_rest()  # overdue: its reply may be in the log only
    entry.stamp = wall
    healthy = False
    assert not may_rest()  # a subscription down
    healthy = True
    settled = False
    assert not may_rest()  # moving to other segments: an old one is dropped once read to its end
    settled = True
    now += EGRESS_MARKS_STALE_S
    assert not may_rest()  # no mark for EGRESS_MARKS_STALE_S
    rest.mark([(0, 6)], now)
    assert may_rest()
    now += EGRESS_MARKS_STALE_S
    table.give_up(waiter)  # its one caller gives up: the request leaves the table
    assert len(table) == 0 and may_rest(), "no mark for EGRESS_MARKS_STALE_S, but nothing in flight"
    healthy = False
    assert not may_rest(), "a subscription down: read, in flight or not"
    # Where the resting reader may move: a checkpoint every request before which has left the table.
    assert rest.skips({("styx-egress", 0)}) == {("styx-egress", 0): 6}


# ---- on real services ------------------------------------------------------------------------------

ONE_BY_ONE = 30  # requests sent one at a time and pushed to their worker
ACCOUNTS = 50


def _fetch_wait(client: StyxClient) -> int:
    """The egress consumer's current fetch wait (styx_py.io.fetching.set_fetch_wait)."""
    return int(_kafka(client).consumer._fetcher._fetch_max_wait_ms)


async def _transfers(client: StyxClient, n: int, tag: str) -> None:
    replies = await asyncio.gather(
        *(
            client.submit("account", f"{tag}{i % ACCOUNTS}", "transfer", f"{tag}{(i * 7 + 1) % ACCOUNTS}", 1)
            for i in range(n)
        )
    )
    assert all(r.status in ("committed", "aborted") for r in replies), replies


def _kafka(client: StyxClient) -> KafkaTransport:
    transport = client._transport
    assert isinstance(transport, KafkaTransport)
    return transport


def _ingress_pushes(stack: LocalStack) -> list[dict[str, float]]:
    """Per worker, its ingress's pushed records by outcome, and its fetch wait now (from /metrics)."""
    return [ingress_pushes(stack.metrics_url(n)) for n in sorted(stack.metrics_ports) if n != "coordinator"]


@pytest.fixture
def stack(local_cluster: ClusterFactory) -> LocalStack:
    return local_cluster(app="styx_benchmarks.bank:app")


@pytest.mark.services
async def test_a_connected_client_takes_pushed_replies_and_the_log_has_each_of_them(
    stack: LocalStack,
) -> None:
    workers = worker_addresses(await asyncio.to_thread(stack.status))
    assert len(workers) == 2
    # Reading every copy from the log (rest_egress=False) is what shows the log has each reply; the
    # resting reader, which skips them, has a test of its own below.
    async with await StyxClient.connect(stack.coordinator, timeout_s=120, rest_egress=False) as client:
        push = _kafka(client).links
        assert push is not None
        assert push.known == workers  # from the status connect() read: no second request for them
        await until(lambda: push.subscriptions.subscribed == workers, "subscribed on both workers", 60)
        # While every worker pushes, the egress reader waits longer per fetch (the log only confirms).
        await until(lambda: _fetch_wait(client) == PUSHED_EGRESS_FETCH_WAIT_MS, "the longer fetch wait", 60)
        await asyncio.gather(*(client.call("account", f"t{i}", "deposit", 100) for i in range(ACCOUNTS)))
        await _transfers(client, 200, "t")
        stats = client.stats
        assert stats.replied == ACCOUNTS + 200
        # Requests go the other way on the same connections: each acknowledged one is pushed to the
        # worker that reads its partition (while the client sends fewer than PUSH_BELOW_REQUESTS_PER_S,
        # which the bursts above may not have), which takes it before its fetch (mostly) and compares.
        pushed_before, one_by_one = client.requests_pushed, 0
        deadline = asyncio.get_running_loop().time() + 60
        while client.requests_pushed - pushed_before < ONE_BY_ONE:
            assert asyncio.get_running_loop().time() < deadline, client.requests_pushed
            await client.call(
                "account", f"t{one_by_one % ACCOUNTS}", "transfer", f"t{(one_by_one + 1) % ACCOUNTS}", 1
            )
            one_by_one += 1
        outcomes = await asyncio.to_thread(_ingress_pushes, stack)
        assert sum(o["taken"] for o in outcomes) > ONE_BY_ONE // 2, outcomes
        assert all(o["mismatched"] == 0 for o in outcomes), outcomes
        # Once every record has come pushed for PUSH_SETTLE_S, the workers' ingress fetch only confirms: it
        # waits longer.
        deadline, extra = asyncio.get_running_loop().time() + 60, 0
        while any(o["fetch_wait_ms"] != INGRESS_PUSHED_FETCH_WAIT_MS for o in outcomes):
            assert asyncio.get_running_loop().time() < deadline, outcomes
            source, target = extra % ACCOUNTS, (extra + 1) % ACCOUNTS
            await client.call("account", f"t{source}", "transfer", f"t{target}", 1)
            extra += 1
            outcomes = await asyncio.to_thread(_ingress_pushes, stack)
        # Most replies came pushed (a reply can still win through the log now and then) ...
        assert stats.pushed > stats.replied // 2, stats
        # ... and every one of them also through the egress topic, the record.
        await until(lambda: stats.echoes_ignored == stats.replied, "every reply's other copy", 60)
        assert (stats.duplicates_ignored, stats.unmatched_ignored) == (0, 0), stats

        # A dropped subscription is made again; meanwhile replies come through the log. The client
        # asks the coordinator for the addresses before it dials again: held until the replies came,
        # so the unsubscribed time is not a race between this test and the re-dial.
        ask, asked_again = push.status, asyncio.Event()

        async def held_status() -> object:
            await asked_again.wait()
            return await ask()

        push.status = held_status
        pushed = stats.pushed
        for task in list(push.links.values()):
            task.cancel()
        await until(lambda: not push.subscriptions.subscribed, "the subscriptions dropped", 60)
        await until(lambda: _fetch_wait(client) == client.fetch_wait_ms, "the cluster's fetch wait", 60)
        await _transfers(client, 100, "t")
        assert stats.pushed == pushed, "nothing pushed while no worker is subscribed"
        asked_again.set()
        await until(lambda: push.subscriptions.subscribed == workers, "subscribed again", 60)
        pushed = stats.pushed
        await _transfers(client, 100, "t")
        assert stats.replied == ACCOUNTS + 400 + one_by_one + extra
        assert stats.pushed > pushed, stats
        # Request ids the caller chose are pushed too: the request names the client, not its id.
        pushed = stats.pushed
        chosen = await asyncio.gather(
            *(client.submit("account", f"t{i}", "deposit", 0, request_id=f"my-own-id-{i}") for i in range(20))
        )
        assert all(r.status == "committed" for r in chosen) and stats.pushed > pushed, stats
        balances = await asyncio.gather(
            *(client.call("account", f"t{i}", "balance") for i in range(ACCOUNTS))
        )
        assert sum(balances) == 100 * ACCOUNTS


@pytest.mark.services
async def test_the_resting_reader_skips_what_came_pushed_and_still_reads_what_did_not(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker addresses are asked again only when something asks for it, not every WORKER_LIST_REFRESH_S.
    monkeypatch.setattr(push_module, "WORKER_LIST_REFRESH_S", 3600.0)
    async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
        push, rest = _kafka(client).links, client._core.rest
        assert push is not None and rest is not None
        await until(lambda: push.healthy, "subscribed on both workers", 60)
        await asyncio.gather(*(client.call("account", f"r{i}", "deposit", 100) for i in range(ACCOUNTS)))
        stats = client.stats
        # The workers' egress acknowledgements let the reader move over the copies of replies it took
        # pushed, without reading them.
        for _ in range(20):
            await _transfers(client, 100, "r")
            if stats.egress_skipped > 0:
                break
        await until(lambda: stats.egress_skipped > 0 and rest.resting, "a skip, and resting", 60)
        assert stats.echoes_ignored < stats.replied, stats  # copies skipped, not read
        assert (stats.duplicates_ignored, stats.unmatched_ignored) == (0, 0), stats
        # The log still has every reply, once each (read until it has them all: read_until).
        replies = await read_until(
            lambda: read_topic(stack.kafka, client.egress_topic),
            lambda rs: len({r.request_id for r in rs}) >= stats.replied,
        )
        logged = Counter(r.request_id for r in replies)
        assert len(logged) >= stats.replied and set(logged.values()) == {1}
        loop = asyncio.get_running_loop()

        # A reply that only the log has (nothing pushed it): its request stays in flight, the reader
        # reads again after EGRESS_MISS_S and finds it. Written to every partition the reader reads.
        asked = push.asked
        entry = client._core.table.register("only-in-the-log", b"fp", 0, 0)
        only: list[Reply | None] = []
        client._core.wait(entry, lambda r, e: only.append(r), 120.0, ("account", "-", "-", "x"), loop.time())
        entry.stamp = time.time_ns() // 1_000_000
        skipped = stats.egress_skipped
        value = msgspec.Raw(encode_value(7))
        reply = Reply("only-in-the-log", 1, 1, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, value, None, None)
        producer = AIOKafkaProducer(bootstrap_servers=stack.kafka)
        await producer.start()
        try:
            for tp in _kafka(client).consumer.assignment():
                await producer.send_and_wait(
                    tp.topic, encode_value(reply), key=b"only-in-the-log", partition=tp.partition
                )
        finally:
            await producer.stop()
        # Other requests go on meanwhile, answered by push: marks keep coming, so what makes the reader
        # read is the request in flight for EGRESS_MISS_S.
        deadline = loop.time() + 60
        while not only:
            assert loop.time() < deadline, "the reply only the log has was never read"
            await _transfers(client, 10, "r")
        [got] = only
        assert got is not None and got.request_id == "only-in-the-log" and result_of(got) == 7
        # A reply the log had and no subscribed worker pushed: the client asks the coordinator for the
        # workers again (one may have joined that does not push to it yet), not WORKER_LIST_REFRESH_S later.
        await until(lambda: push.asked > asked, "the workers asked for again", 60)
        # Requests answered meanwhile by push are still answered, and skipping goes on afterwards.
        await _transfers(client, 100, "r")
        await until(lambda: stats.egress_skipped > skipped, "skipping again", 60)

        balances = await asyncio.gather(
            *(client.call("account", f"r{i}", "balance") for i in range(ACCOUNTS))
        )
        assert sum(balances) == 100 * ACCOUNTS


@pytest.mark.services
async def test_a_resting_client_keeps_only_the_egress_segments_it_reads(
    local_cluster: ClusterFactory,
) -> None:
    # New segments every 2 s, as `styx up` has them. The reader rests through the rotations, and keeps
    # the egress segments it reads and at most one it is draining, not every segment it ever read.
    stack = await asyncio.to_thread(
        local_cluster, app="styx_benchmarks.bank:app", settings={"log_segment_s": "2"}
    )
    async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
        rest = client._core.rest
        assert rest is not None
        await asyncio.gather(*(client.call("account", f"s{i}", "deposit", 100) for i in range(ACCOUNTS)))

        def oldest_assigned() -> int:
            return segments_in(
                [tp.topic for tp in _kafka(client).consumer.assignment()], client.egress_topic
            )[0]

        loop = asyncio.get_running_loop()
        first, deadline, rested = client.segment, loop.time() + 120, 0
        while (
            client.segment < first + REPLY_SEGMENTS + 2 or oldest_assigned() < client.segment - REPLY_SEGMENTS
        ):
            assert loop.time() < deadline, (
                first,
                client.segment,
                sorted(_kafka(client).consumer.assignment()),
            )
            await _transfers(client, 20, "s")
            rested += rest.resting
        assert rested > 0 and client.stats.egress_skipped > 0, client.stats  # it did rest meanwhile
        balances = await asyncio.gather(
            *(client.call("account", f"s{i}", "balance") for i in range(ACCOUNTS))
        )
        assert sum(balances) == 100 * ACCOUNTS


@pytest.mark.services
async def test_a_client_can_read_the_log_only(stack: LocalStack) -> None:
    async with await StyxClient.connect(stack.coordinator, timeout_s=120, push_replies=False) as client:
        assert client.coordinator is None and _kafka(client).links is None
        await asyncio.gather(*(client.call("account", f"o{i}", "deposit", 1) for i in range(20)))
        assert (client.stats.replied, client.stats.pushed, client.stats.echoes_ignored) == (20, 0, 0)
