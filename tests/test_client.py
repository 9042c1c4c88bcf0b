"""The client SDK against a real Kafka-protocol broker (Tansu), with an in-test echo server.

The echo server stands in for the cluster: it reads requests from the ingress topic and produces
replies to the egress topic the way the real server does, with knobs for the error paths (abort,
failure, no reply, duplicate reply). It also checks that each request arrived in the partition that
owns its key, and answers on the egress partition the request names, as the workers do. Every test
uses its own topics because the broker is shared by the session.

Run with ``-p tests.service_fixtures`` until ``tests/conftest.py`` loads the plugin.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from styx_client import (
    BadRequest,
    Overloaded,
    Reply,
    RequestTimeout,
    StyxClient,
    StyxError,
    SyncStyxClient,
    TransactionAborted,
    TransactionFailed,
)
from styx_client.sdk import ClientStats, decode_reply
from styx_client.sdk.pending import PendingTable
from styx_client.sdk.requests import encode_request
from styx_py.core.errors import ConfigError
from styx_py.core.limits import BUSY_LINGER_MS
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import (
    NIL,
    AdminReply,
    Request,
    decode_value,
    encode_value,
    request_decoder,
)
from styx_py.io.handshake import client_secret
from styx_py.io.tcp import TcpTransport
from styx_py.stack.services import TansuBroker, create_topics
from tests.apps.limits import nested

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

OPERATORS = {"acct": 4, "single": 1}
INGRESS_PARTITIONS = 4
EGRESS_PARTITIONS = 3


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _reply(
    req: Request, status: str, result: Any = None, error: str | None = None, error_type: str | None = None
) -> Reply:
    raw = msgspec.Raw(encode_value(result)) if status == "committed" else NIL
    return Reply(req.request_id, 1, 1, 0, status, raw, error, error_type, req.ts_ms)


def _egress_partition(req: Request) -> int:
    """Where the workers send the reply: the partition the request names, if the topic has it."""
    if 0 <= req.reply_partition < EGRESS_PARTITIONS:
        return req.reply_partition
    return zlib.crc32(req.request_id.encode()) % EGRESS_PARTITIONS


async def _until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll a condition the test cannot await directly (e.g. a reply that must be ignored)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


class EchoServer:
    """Answers every request on the ingress topic like the cluster would.

    ``echo`` (any other function): committed, result = {"key", "fn", "args"};
    ``fail``: aborted (user Abort); ``crash``: failed/UserError; ``bad``: failed/BadRequest;
    ``dup``: committed, the same reply produced twice; ``drop``: no reply at all.
    """

    def __init__(self, bootstrap: str, ingress: str, egress: str) -> None:
        self.bootstrap = bootstrap
        self.ingress = ingress
        self.egress = egress
        self.received: list[Request] = []
        self.misrouted: list[tuple[str, int]] = []
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=5
        )
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=1)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._producer.start()
        await self._consumer.start()
        tps = [TopicPartition(self.ingress, p) for p in range(INGRESS_PARTITIONS)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            if not self._task.cancelled():
                self._task.result()  # surface a crash of the echo server as a test error
        await self._consumer.stop()
        await self._producer.stop()

    def _answer(self, req: Request, partition: int) -> list[Reply]:
        expected = partition_of(req.key, OPERATORS[req.operator])
        if partition != expected:
            self.misrouted.append((req.request_id, partition))
            return [_reply(req, "failed", error=f"wrong partition {partition}", error_type="BadRequest")]
        args = decode_value(req.args)
        match req.function:
            case "drop":
                return []
            case "fail":
                return [_reply(req, "aborted", error=f"insufficient funds for {req.key}", error_type="Abort")]
            case "crash":
                error = "ZeroDivisionError: division by zero"
                return [_reply(req, "failed", error=error, error_type="UserError")]
            case "bad":
                return [_reply(req, "failed", error="unknown function 'bad'", error_type="BadRequest")]
            case "dup":
                reply = _reply(req, "committed", {"key": req.key, "fn": req.function, "args": args})
                return [reply, reply]
            case _:
                return [_reply(req, "committed", {"key": req.key, "fn": req.function, "args": args})]

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=500)
            deliveries = []
            for records in batches.values():
                for record in records:
                    req = request_decoder.decode(record.value)
                    self.received.append(req)
                    for reply in self._answer(req, record.partition):
                        deliveries.append(
                            await self._producer.send(
                                self.egress,
                                encode_value(reply),
                                key=req.request_id.encode(),
                                partition=_egress_partition(req),
                            )
                        )
            if deliveries:
                await asyncio.gather(*deliveries)


@dataclass
class Cluster:
    bootstrap: str
    ingress: str
    egress: str
    echo: EchoServer

    def client(self, **kw: Any) -> StyxClient:
        return StyxClient(
            self.bootstrap, OPERATORS, ingress_topic=self.ingress, egress_topic=self.egress, **kw
        )


async def _make_topics(bootstrap: str) -> tuple[str, str]:
    ingress, egress = _unique("ingress"), _unique("egress")
    await create_topics(bootstrap, {ingress: INGRESS_PARTITIONS, egress: EGRESS_PARTITIONS})
    return ingress, egress


@pytest_asyncio.fixture
async def cluster(kafka: TansuBroker) -> AsyncIterator[Cluster]:
    ingress, egress = await _make_topics(kafka.bootstrap)
    echo = EchoServer(kafka.bootstrap, ingress, egress)
    await echo.start()
    try:
        yield Cluster(kafka.bootstrap, ingress, egress, echo)
    finally:
        await echo.stop()
    assert echo.misrouted == [], "requests produced to a partition that does not own their key"


@pytest_asyncio.fixture
async def client(cluster: Cluster) -> AsyncIterator[StyxClient]:
    async with cluster.client(timeout_s=20.0) as c:
        yield c


async def _produce_raw(bootstrap: str, topic: str, values: list[tuple[int, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for partition, value in values:
            await producer.send_and_wait(topic, value, partition=partition)
    finally:
        await producer.stop()


# ---- results and errors -------------------------------------------------------------------------------


async def test_500_concurrent_calls_get_their_own_results(client: StyxClient, cluster: Cluster) -> None:
    keys: list[str | int] = [f"user-{i}" if i % 2 else i for i in range(500)]
    ops = ["single" if i % 10 == 0 else "acct" for i in range(500)]
    results = await asyncio.gather(*(client.call(ops[i], keys[i], "echo", i, f"v{i}") for i in range(500)))
    for i, result in enumerate(results):
        assert result == {"key": keys[i], "fn": "echo", "args": [i, f"v{i}"]}
    assert client.stats.sent == 500
    assert client.stats.replied == 500
    assert client.pending_count == 0
    assert len(cluster.echo.received) == 500
    # Generated ids: distinct, 32 hex digits, and not shared with another client's.
    ids = [r.request_id for r in cluster.echo.received]
    assert len(set(ids)) == 500
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids), ids[:3]
    async with cluster.client() as other:
        await other.call("acct", "k", "echo", 0)
    assert cluster.echo.received[-1].request_id not in set(ids)


async def test_a_burst_is_batched_and_lingers_and_one_request_at_a_time_never_waits(cluster: Cluster) -> None:
    """Busy linger (styx_py/io/batching.py): a burst goes out in few batches and its partitions
    linger after them; requests sent one at a time go one per batch and never linger; 0 turns it off."""
    async with (
        cluster.client(timeout_s=20.0) as busy,
        cluster.client(timeout_s=20.0, busy_linger_ms=0) as eager,
    ):
        assert busy.busy_linger_ms == BUSY_LINGER_MS == 8.0 and busy.batching.records == 0
        for c in (busy, eager):
            results = await asyncio.gather(*(c.call("acct", i, "echo", i) for i in range(200)))
            assert [r["args"] for r in results] == [[i] for i in range(200)]
            await _until(lambda c=c: c.batching.records == 200)  # every batch acknowledged
        assert busy.batching.batches < 200 and busy.batching.lingered >= 1
        assert eager.batching.batches < 200 and eager.batching.lingered == 0
        before = busy.batching
        for i in range(5):
            assert await busy.call("acct", i, "echo") == {"key": i, "fn": "echo", "args": []}
        await _until(lambda: busy.batching.records == 205)
        after = busy.batching
        assert (after.batches - before.batches, after.lingered) == (5, before.lingered)
    for bad in (-1.0, 1001.0):
        with pytest.raises(ConfigError, match=r"busy_linger_ms must be in 0\.\.1000"):
            cluster.client(busy_linger_ms=bad)


async def test_aborted_failed_and_bad_replies_raise_the_matching_error(client: StyxClient) -> None:
    with pytest.raises(TransactionAborted, match="insufficient funds for alice") as aborted:
        await client.call("acct", "alice", "fail", 100)
    assert isinstance(aborted.value.reply, Reply)
    assert aborted.value.reply.status == "aborted"
    exc = aborted.value
    assert (exc.request_id, exc.tid, exc.epoch) == (exc.reply.request_id, 1, 1)
    assert (exc.status, exc.error_type, exc.exception_type) == ("aborted", "Abort", None)

    with pytest.raises(TransactionFailed, match="UserError: ZeroDivisionError") as failed:
        await client.call("acct", "bob", "crash", request_id="crash-1")
    assert not isinstance(failed.value, TransactionAborted | BadRequest)
    # The user's own exception class is named on the exception.
    assert (failed.value.request_id, failed.value.error_type) == ("crash-1", "UserError")
    assert failed.value.exception_type == "ZeroDivisionError"

    with pytest.raises(BadRequest, match="unknown function") as bad:
        await client.call("acct", "carol", "bad")
    assert bad.value.error_type == "BadRequest" and bad.value.request_id is not None
    with pytest.raises(BadRequest) as local:
        await client.call("nope", "k", "echo")
    assert local.value.reply is None and local.value.request_id is None  # nothing was sent

    # submit() hands back the reply whatever its status, without raising.
    reply = await client.submit("acct", "alice", "fail", 1)
    assert (reply.status, reply.error_type, reply.value, reply.committed) == ("aborted", "Abort", None, False)
    ok = await client.submit("acct", "alice", "echo", 1)
    assert ok.committed and ok.value == {"key": "alice", "fn": "echo", "args": [1]}  # decoded

    with pytest.raises(RequestTimeout) as timeout:
        await client.call("acct", "dave", "drop", request_id="dropped-1", timeout_s=0.2)
    assert timeout.value.request_id == "dropped-1"


async def test_unknown_operator_and_bad_key_are_rejected_without_sending(
    client: StyxClient, cluster: Cluster
) -> None:
    with pytest.raises(BadRequest, match="unknown operator 'nope'"):
        await client.call("nope", "k", "echo")
    with pytest.raises(BadRequest, match="str or int"):
        await client.call("acct", 1.5, "echo")  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="str or int"):
        await client.call("acct", True, "echo")
    with pytest.raises(BadRequest, match="cannot be encoded"):
        await client.call("acct", "k", "echo", object())
    result = await client.call("acct", "k", "echo", request_id="the-only-one")
    assert result == {"key": "k", "fn": "echo", "args": []}
    assert [r.request_id for r in cluster.echo.received] == ["the-only-one"]
    assert client.stats.sent == 1
    assert client.pending_count == 0


async def test_timeout_raises_and_clears_pending(client: StyxClient) -> None:
    with pytest.raises(RequestTimeout, match="no reply"):
        await client.submit("acct", "k", "drop", timeout_s=0.3)
    assert client.pending_count == 0
    assert client.stats.timeouts == 1
    assert await client.call("acct", "k", "echo", 1) == {"key": "k", "fn": "echo", "args": [1]}


async def test_overloaded_when_max_pending_is_reached(cluster: Cluster) -> None:
    async with cluster.client(max_pending=2, timeout_s=20.0) as c:
        first = asyncio.create_task(c.submit("acct", "a", "drop", request_id="p1"))
        second = asyncio.create_task(c.submit("acct", "b", "drop", request_id="p2"))
        await asyncio.sleep(0)  # let both tasks register their request
        assert c.pending_count == 2
        with pytest.raises(Overloaded, match="max_pending=2"):
            await c.submit("acct", "c", "echo")
        # An id already in flight shares the pending entry, so it is not refused.
        same = asyncio.create_task(c.submit("acct", "a", "drop", request_id="p1"))
        await asyncio.sleep(0)
        assert not same.done()
        for task in (first, second, same):
            task.cancel()
        await asyncio.wait([first, second, same])
        assert c.pending_count == 0
        assert await c.call("acct", "c", "echo") == {"key": "c", "fn": "echo", "args": []}
        assert c.stats.sent == 3


async def test_duplicate_reply_is_ignored(client: StyxClient) -> None:
    reply = await client.submit("acct", "k", "dup", 7)
    assert reply.status == "committed"
    await _until(lambda: client.stats.duplicates_ignored == 1)
    assert await client.call("acct", "k", "echo", 8) == {"key": "k", "fn": "echo", "args": [8]}
    assert client.stats.replied == 2
    assert client.stats.duplicates_ignored == 1


async def test_same_request_id_in_flight_is_sent_once(client: StyxClient, cluster: Cluster) -> None:
    replies = await asyncio.gather(
        client.submit("acct", "k", "echo", 1, request_id="shared"),
        client.submit("acct", "k", "echo", 1, request_id="shared"),
    )
    assert replies[0] is replies[1]
    assert [r.request_id for r in cluster.echo.received] == ["shared"]
    assert client.stats.sent == 1


async def test_submit_future_resolves_times_out_and_joins(client: StyxClient, cluster: Cluster) -> None:
    """The task-free path: same replies, timeouts, local errors and in-flight sharing as submit()."""
    futures = [client.submit_future("acct", f"k{i}", "echo", i) for i in range(200)]
    replies = await asyncio.gather(*futures)
    assert [decode_value(r.result) for r in replies] == [
        {"key": f"k{i}", "fn": "echo", "args": [i]} for i in range(200)
    ]
    assert client.pending_count == 0

    with pytest.raises(RequestTimeout, match="no reply"):
        await client.submit_future("acct", "k", "drop", timeout_s=0.3)
    assert client.pending_count == 0 and client.stats.timeouts == 1

    with pytest.raises(BadRequest, match="unknown operator"):
        client.submit_future("nope", "k", "echo")  # raised at once, nothing sent

    # A submit() and a submit_future() of one id share one send and one reply.
    sent = client.stats.sent
    joined = await asyncio.gather(
        client.submit("acct", "k", "echo", 2, request_id="both"),
        client.submit_future("acct", "k", "echo", 2, request_id="both"),
    )
    assert joined[0] is joined[1] and client.stats.sent == sent + 1
    assert [r.request_id for r in cluster.echo.received].count("both") == 1

    # Giving up on one waiter keeps the request for the other; the last one clears it.
    first = client.submit_future("acct", "a", "drop", request_id="held")
    second = client.submit_future("acct", "a", "drop", request_id="held")
    first.cancel()
    await asyncio.sleep(0)  # the cancellation's callbacks run
    assert client.pending_count == 1 and not second.done()
    second.cancel()
    await asyncio.sleep(0)
    assert client.pending_count == 0


async def test_submit_many_preserves_order_and_validates_first(client: StyxClient, cluster: Cluster) -> None:
    calls = [("acct" if i % 3 else "single", f"k{i}", "echo", (i,)) for i in range(60)]
    replies = await client.submit_many(calls, concurrency=7)
    assert [decode_value(r.result) for r in replies] == [
        {"key": f"k{i}", "fn": "echo", "args": [i]} for i in range(60)
    ]
    sent = client.stats.sent
    with pytest.raises(BadRequest, match="unknown operator"):
        await client.submit_many([("acct", "x", "echo", ()), ("nope", "y", "echo", ())])
    assert client.stats.sent == sent


# ---- limits and request ids, checked before anything is sent -------------------------------------------


async def test_limits_are_checked_before_sending(client: StyxClient, cluster: Cluster) -> None:
    """Every limit the workers enforce raises BadRequest here first, naming it; never a RecursionError."""
    too_far: list[tuple[str, Any, tuple[Any, ...], dict[str, Any], str]] = [
        ("echo", "k", (nested(65),), {}, "nest deeper than 64 levels.*MAX_ARG_DEPTH"),
        ("echo", "k", (nested(990),), {}, "MAX_ARG_DEPTH"),  # msgspec's own limit is near here
        ("echo", "k", (nested(100_000),), {}, "MAX_ARG_DEPTH"),
        ("echo", "k", ("x" * 12_000_000,), {}, "12000.* bytes encoded.*MAX_REQUEST_BYTES"),
        ("echo", "k" * 5000, (), {}, "5000 characters.*MAX_KEY_CHARS"),
        ("e" * 257, "k", (), {}, "function name.*MAX_NAME_CHARS"),
        ("echo", "k", (), {"request_id": "i" * 129}, "request id.*MAX_REQUEST_ID_CHARS"),
        ("echo", "k", (), {"request_id": ""}, "request id.*MAX_REQUEST_ID_CHARS"),
    ]
    for function, key, args, kw, match in too_far:
        with pytest.raises(BadRequest, match=match):
            await client.submit("acct", key, function, *args, **kw)
        with pytest.raises(BadRequest, match=match):
            client.submit_future("acct", key, function, *args, **kw)
    with pytest.raises(BadRequest, match="MAX_ARG_DEPTH"):
        await client.submit_many([("acct", "a", "echo", (1,)), ("acct", "b", "echo", (nested(70),))])
    assert cluster.echo.received == [] and client.stats.sent == 0 and client.pending_count == 0

    # At the limits, requests go through.
    at_limits = await client.call("acct", "k" * 1024, "echo", nested(64), request_id="i" * 128)
    assert at_limits == {"key": "k" * 1024, "fn": "echo", "args": [nested(64)]}


async def test_the_prepared_path_checks_what_submit_checks(cluster: Cluster) -> None:
    """StyxClient.prepare's lean path (for load generators) refuses locally whatever submit() refuses,
    and hands every reply, timeout or overload to its callback exactly once."""
    async with cluster.client(timeout_s=20.0, functions={"acct": ["echo", "drop"]}) as c:
        with pytest.raises(BadRequest, match="unknown operator"):
            c.prepare("nope", "echo")
        with pytest.raises(BadRequest, match="has no function"):
            c.prepare("acct", "nope")
    async with cluster.client(timeout_s=20.0) as c:
        with pytest.raises(BadRequest, match=r"function name.*MAX_NAME_CHARS"):
            c.prepare("acct", "e" * 257)
        echo, drop = c.prepare("acct", "echo"), c.prepare("acct", "drop", timeout_s=0.3)
        got: dict[int, tuple[Reply | None, BaseException | None]] = {}

        def done(i: int) -> Callable[[Reply | None, BaseException | None], None]:
            def settle(reply: Reply | None, error: BaseException | None) -> None:
                assert i not in got, "called twice"
                got[i] = (reply, error)

            return settle

        bad: list[tuple[Any, tuple[Any, ...], type[Exception], str]] = [
            ("k", (nested(65),), BadRequest, "nest deeper than 64 levels.*MAX_ARG_DEPTH"),
            ("k", (nested(100_000),), BadRequest, "MAX_ARG_DEPTH"),
            ("k", ("x" * 12_000_000,), BadRequest, "12000.* bytes encoded.*MAX_REQUEST_BYTES"),
            ("k" * 5000, (), BadRequest, "5000 characters.*MAX_KEY_CHARS"),
            (2**70, (), BadRequest, "cannot be encoded"),
            (True, (), BadRequest, "entity keys must be str or int, got bool"),
            (1.5, (), BadRequest, "entity keys must be str or int, got float"),
            ("k", (object(),), BadRequest, "cannot be encoded"),
        ]
        for key, args, error, match in bad:
            with pytest.raises(error, match=match):
                await c.submit("acct", key, "echo", *args)
            with pytest.raises(error, match=match):
                echo.send(key, args, done(-1))
        assert got == {} and c.stats.sent == 0 and c.pending_count == 0

        rids = [echo.send(f"k{i}", (i,), done(i)) for i in range(100)]
        assert len(set(rids)) == 100
        rids.append(echo.send(7, [], done(100)))  # int keys and list arguments too
        await _until(lambda: len(got) == 101)
        assert [decode_value(reply.result) for reply, _ in (got[i] for i in range(100))] == [  # type: ignore[union-attr]
            {"key": f"k{i}", "fn": "echo", "args": [i]} for i in range(100)
        ]
        assert [reply.request_id for reply, _ in (got[i] for i in range(101))] == rids  # type: ignore[union-attr]
        assert all(error is None for _, error in got.values())
        assert c.pending_count == 0 and c.stats.sent == 101

        drop.send("k", (), done(200))  # never answered: its own timeout, once
        await _until(lambda: 200 in got)
        assert got[200][0] is None and isinstance(got[200][1], RequestTimeout)
        assert "no reply to acct.drop(key='k')" in str(got[200][1])
        assert c.pending_count == 0 and c.stats.timeouts == 1

    async with cluster.client(max_pending=1, timeout_s=20.0) as c:
        drop = c.prepare("acct", "drop")
        drop.send("a", (), done(300))
        with pytest.raises(Overloaded, match="max_pending=1"):
            drop.send("b", (), done(301))
    # Closing fails what is in flight; a closed client refuses at once.
    assert isinstance(got[300][1], StyxError) and 301 not in got
    with pytest.raises(StyxError, match="closed"):
        drop.send("c", (), done(302))


async def test_a_request_id_reused_for_another_request_is_refused(
    client: StyxClient, cluster: Cluster
) -> None:
    """The cluster answers a resent id with its first reply, so another request under a pending or
    recent id would silently get someone else's reply: refused; the same request is a safe retry."""
    held = client.submit_future("acct", "k", "drop", 1, request_id="held")
    for key, args in (("k", (2,)), ("other", (1,)), ("k", ())):
        with pytest.raises(BadRequest, match="'held' is in flight with a different request"):
            client.submit_future("acct", key, "drop", *args, request_id="held")
    joined = client.submit_future("acct", "k", "drop", 1, request_id="held")  # the same request: joins
    held.cancel()
    joined.cancel()
    await asyncio.sleep(0)  # the cancellations' callbacks run: the id leaves the table
    assert client.pending_count == 0
    with pytest.raises(BadRequest, match="'held' was recently sent with a different request"):
        await client.submit("acct", "k", "drop", 2, request_id="held")

    echoed = {"key": "k", "fn": "echo", "args": [1]}
    assert await client.call("acct", "k", "echo", 1, request_id="done") == echoed
    with pytest.raises(BadRequest, match="'done' was recently sent with a different request"):
        await client.call("acct", "k", "echo", 2, request_id="done")
    # The same request again is sent again (the cluster answers it with its first reply).
    assert await client.call("acct", "k", "echo", 1, request_id="done") == echoed
    assert [r.request_id for r in cluster.echo.received] == ["held", "done", "done"]


def test_the_ids_remembered_for_reuse_are_bounded() -> None:
    table = PendingTable(max_pending=10, stats=ClientStats())

    def record(rid: str, arg: str) -> bytes:
        return encode_request(rid, "acct", "fn", "k", (arg,))

    n, kept = 3000, 1024  # kept: max(1024, 2 * max_pending)
    for i in range(n):
        entry = table.register(f"r{i}", record(f"r{i}", "a"), 0, 0)
        waiter = table.wait(entry, lambda reply, error: None, 5.0, ("acct", "fn", "k", f"r{i}"), 0.0)
        table.give_up(waiter)  # given up (or timed out): remembered
    # At least the last ``kept`` are remembered, whatever n is; none older than the last 2 * kept.
    for rid in (f"r{n - kept}", f"r{n - 1}"):
        with pytest.raises(BadRequest, match="recently sent"):
            table.check_reuse(rid, record(rid, "b"))
    table.check_reuse(f"r{n - 2 * kept - 1}", record(f"r{n - 2 * kept - 1}", "b"))  # forgotten
    table.check_reuse(f"r{n - 1}", record(f"r{n - 1}", "a"))


def test_reply_decoder_round_trips_results() -> None:
    """Replies decode with any result, nil (no result) included."""
    for result in (None, 0, "x", {"a": [1, 2]}):
        reply = Reply("id", 1, 2, 1, "committed", msgspec.Raw(encode_value(result)), None, None, 9)
        decoded = decode_reply(encode_value(reply))
        assert decode_value(decoded.result) == result
        assert (decoded.request_id, decoded.tid, decoded.epoch, decoded.phase, decoded.request_ts_ms) == (
            "id",
            1,
            2,
            1,
            9,
        )


# ---- positioning and robustness of the reply reader ---------------------------------------------------


async def test_replies_already_in_the_topic_are_never_delivered(cluster: Cluster) -> None:
    stale_id = _unique("stale")
    stale = Reply(stale_id, 1, 1, 0, "committed", msgspec.Raw(encode_value("stale")), None, None)
    # Old replies for the id in every partition, plus garbage, all written before the client starts.
    await _produce_raw(
        cluster.bootstrap,
        cluster.egress,
        [(p, encode_value(stale)) for p in range(EGRESS_PARTITIONS) for _ in range(5)]
        + [(p, b"\xc1 not msgpack") for p in range(EGRESS_PARTITIONS)],
    )
    async with cluster.client(timeout_s=20.0) as c:
        with pytest.raises(RequestTimeout):
            await c.submit("acct", "k", "drop", request_id=stale_id, timeout_s=0.5)
        assert (c.stats.unmatched_ignored, c.stats.undecodable, c.stats.duplicates_ignored) == (0, 0, 0)
    # Another request under the same id (a client may not reuse it itself: see the reuse test).
    async with cluster.client(timeout_s=20.0) as c:
        fresh = await c.call("acct", "k", "echo", "fresh", request_id=stale_id)
        assert fresh == {"key": "k", "fn": "echo", "args": ["fresh"]}
        # The reader never even saw the old records.
        assert (c.stats.unmatched_ignored, c.stats.undecodable, c.stats.duplicates_ignored) == (0, 0, 0)


async def test_foreign_and_undecodable_replies_are_skipped(client: StyxClient, cluster: Cluster) -> None:
    foreign = Reply("someone-else", 1, 1, 0, "committed", msgspec.Raw(encode_value(1)), None, None)
    # Only the client's reply partition is read: what lands on the others never reaches it.
    await _produce_raw(
        cluster.bootstrap,
        cluster.egress,
        [(p, b"garbage") for p in range(EGRESS_PARTITIONS)]
        + [(p, encode_value(foreign)) for p in range(EGRESS_PARTITIONS)],
    )
    stats = client.stats
    await _until(lambda: stats.undecodable == 1 and stats.foreign_ignored == 1)
    assert await client.call("acct", "k", "echo") == {"key": "k", "fn": "echo", "args": []}
    assert (stats.undecodable, stats.unmatched_ignored, stats.foreign_ignored) == (1, 1, 1)


async def test_clients_with_distinct_reply_partitions_never_see_each_others_replies(
    cluster: Cluster,
) -> None:
    clients = [cluster.client(timeout_s=20.0, reply_partition=p) for p in range(EGRESS_PARTITIONS)]
    for c in clients:
        await c.start()
    try:
        assert [c.reply_partition for c in clients] == list(range(EGRESS_PARTITIONS))
        calls = [c.call("acct", f"k{i}", "echo", i) for c in clients for i in range(50)]
        results = await asyncio.gather(*calls)
        assert [r["args"] for r in results] == [[i] for _ in clients for i in range(50)]
        for c in clients:
            assert (c.stats.replied, c.stats.unmatched_ignored, c.stats.foreign_ignored) == (50, 0, 0)
        # Every request named its client's partition (what the workers route by).
        named = {r.request_id: r.reply_partition for r in cluster.echo.received}
        assert sorted(set(named.values())) == list(range(EGRESS_PARTITIONS))
    finally:
        for c in clients:
            await c.close()
    # Two clients sharing a partition each skip the other's replies, counted as foreign.
    async with cluster.client(reply_partition=0) as a, cluster.client(reply_partition=0) as b:
        await asyncio.gather(*(a.call("acct", i, "echo") for i in range(20)))
        await _until(lambda: b.stats.foreign_ignored == 20)
        assert a.stats.foreign_ignored == 0 and b.stats.replied == 0


async def test_reply_partition_defaults_to_a_stable_hash_of_the_client_id(cluster: Cluster) -> None:
    async with (
        cluster.client(client_id="orders-service") as a,
        cluster.client(client_id="orders-service") as b,
    ):
        assert a.reply_partition == b.reply_partition == partition_of("orders-service", EGRESS_PARTITIONS)
        assert await a.call("acct", "k", "echo") == {"key": "k", "fn": "echo", "args": []}
    with pytest.raises(ConfigError, match="reply_partition=3"):
        async with cluster.client(reply_partition=EGRESS_PARTITIONS):
            pass
    with pytest.raises(ConfigError, match="reply_partition must be >= 0"):
        cluster.client(reply_partition=-2)
    # -1: no routing, every partition read (what Tansu with S3 storage needs).
    async with cluster.client(reply_partition=-1) as spread:
        assert await spread.call("acct", "k", "echo") == {"key": "k", "fn": "echo", "args": []}
        assert spread.reply_partition == -1 and cluster.echo.received[-1].reply_partition == -1


async def test_close_fails_pending_requests(cluster: Cluster) -> None:
    c = cluster.client(timeout_s=20.0)
    await c.start()
    waiting = asyncio.create_task(c.submit("acct", "k", "drop"))
    await asyncio.sleep(0)
    assert c.pending_count == 1
    await c.close()
    with pytest.raises(StyxError, match="closed before the reply"):
        await waiting
    with pytest.raises(StyxError, match="closed"):
        await c.submit("acct", "k", "echo")
    await c.close()  # idempotent


async def test_missing_topics_are_reported_not_auto_created(kafka: TansuBroker) -> None:
    ingress, egress = _unique("missing-in"), _unique("missing-out")
    c = StyxClient(kafka.bootstrap, OPERATORS, ingress_topic=ingress, egress_topic=egress, timeout_s=10.0)
    with pytest.raises(ConfigError, match="do not exist"):
        await c.start()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap)
    await consumer.start()
    try:
        topics = await consumer.topics()
    finally:
        await consumer.stop()
    assert ingress not in topics and egress not in topics


async def test_too_few_ingress_partitions_is_a_config_error(kafka: TansuBroker) -> None:
    ingress, egress = _unique("small-in"), _unique("small-out")
    await create_topics(kafka.bootstrap, {ingress: 2, egress: 1})
    c = StyxClient(kafka.bootstrap, OPERATORS, ingress_topic=ingress, egress_topic=egress, timeout_s=10.0)
    with pytest.raises(ConfigError, match="has 2 partitions"):
        await c.start()


# ---- connect() and the synchronous facade -------------------------------------------------------------


async def _fake_coordinator(body: dict[str, Any]) -> tuple[TcpTransport, str]:
    """Answers every StatusRequest with ``body``, like the coordinator's admin API (and authenticated as
    it is, with the secret the client uses by default)."""

    def answer(src: str, msg: object) -> None:
        transport.send(src, AdminReply(True, "", body))

    transport = TcpTransport("coordinator", answer, inbox="coordinator", secret=client_secret(None))
    await transport.start()
    return transport, f"127.0.0.1:{transport.port}"


async def test_connect_uses_the_coordinator_status(cluster: Cluster) -> None:
    body = {
        "operators": [
            {"name": "acct", "partitions": 4, "functions": ["echo", "fail"]},
            {"name": "single", "partitions": 1, "functions": ["echo"]},
        ],
        "kafka_bootstrap": cluster.bootstrap,
    }
    server, address = await _fake_coordinator(body)
    try:
        c = await StyxClient.connect(address, ingress_topic=cluster.ingress, egress_topic=cluster.egress)
        async with c:
            assert c.operators == OPERATORS
            assert await c.call("acct", "k", "echo", 5) == {"key": "k", "fn": "echo", "args": [5]}
            with pytest.raises(BadRequest, match="no function 'nope'"):
                await c.call("single", "k", "nope")
            assert c.stats.sent == 1

        nothing = {"operators": [], "kafka_bootstrap": cluster.bootstrap}
        empty, empty_address = await _fake_coordinator(nothing)
        try:
            with pytest.raises(StyxError, match="nothing is deployed"):
                await StyxClient.connect(empty_address)
        finally:
            await empty.close()
    finally:
        await server.close()


async def test_sync_client_round_trip(cluster: Cluster) -> None:
    def work() -> tuple[Any, str, list[Reply]]:
        with SyncStyxClient(
            cluster.bootstrap, OPERATORS, ingress_topic=cluster.ingress, egress_topic=cluster.egress
        ) as sync:
            result = sync.call("acct", "k", "echo", 1, "two")
            with pytest.raises(TransactionAborted) as aborted:
                sync.call("acct", "k", "fail")
            replies = sync.submit_many([("acct", i, "echo", (i,)) for i in range(10)])
            assert sync.pending_count == 0
            return result, str(aborted.value), replies

    # In a thread: the sync client blocks its caller, and the echo server runs on this test's loop.
    result, aborted_message, replies = await asyncio.to_thread(work)
    assert not [t for t in threading.enumerate() if t.name == "styx-client-loop"], "loop thread left running"
    assert result == {"key": "k", "fn": "echo", "args": [1, "two"]}
    assert aborted_message == "insufficient funds for k"
    assert [r.status for r in replies] == ["committed"] * 10
    assert [decode_value(r.result) for r in replies] == [
        {"key": i, "fn": "echo", "args": [i]} for i in range(10)
    ]


def test_a_cluster_without_reply_routing_makes_connected_clients_read_every_partition() -> None:
    from styx_client.sdk.deployment import client_arguments

    body = {"operators": [{"name": "acct", "partitions": 4}], "kafka_bootstrap": "k:9092"}
    kw: dict[str, Any] = {}
    client_arguments("c:1", {**body, "reply_routing": False}, kw)
    assert kw["reply_partition"] == -1
    routed: dict[str, Any] = {}
    client_arguments("c:1", {**body, "reply_routing": True}, routed)
    assert "reply_partition" not in routed
    chosen: dict[str, Any] = {"reply_partition": 2}
    client_arguments("c:1", {**body, "reply_routing": False}, chosen)
    assert chosen["reply_partition"] == 2, "an explicit choice wins"


def test_connected_clients_take_the_clusters_fetch_wait() -> None:
    from styx_client.sdk.deployment import client_arguments

    body = {"operators": [{"name": "acct", "partitions": 4}], "kafka_bootstrap": "k:9092"}
    kw: dict[str, Any] = {}
    client_arguments("c:1", {**body, "kafka_fetch_wait_ms": 100}, kw)
    assert kw["fetch_wait_ms"] == 100
    chosen: dict[str, Any] = {"fetch_wait_ms": 20}
    client_arguments("c:1", {**body, "kafka_fetch_wait_ms": 100}, chosen)
    assert chosen["fetch_wait_ms"] == 20, "an explicit choice wins"
    # An older coordinator says nothing, and a value the client would refuse is not taken.
    odds = ({}, {"kafka_fetch_wait_ms": 2}, {"kafka_fetch_wait_ms": "100"}, {"kafka_fetch_wait_ms": True})
    for odd in odds:
        left: dict[str, Any] = {}
        client_arguments("c:1", {**body, **odd}, left)
        assert "fetch_wait_ms" not in left, odd
