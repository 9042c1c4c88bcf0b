"""Replies pushed by the workers to the clients that subscribed (worker/feed.py, client/sdk/push.py).

The unit tests pin down who is pushed what: only replies that also leave for the egress log, only to
the client whose request-id prefix they carry, nothing after its connection closed. The client counts
a reply that comes both ways once, and the later copy as an echo, not a duplicate. On real services,
a client made by ``StyxClient.connect`` subscribes on every worker's port and takes most replies from
the push, every one of which also reaches it through the egress topic; a dropped subscription is made
again, and replies keep coming meanwhile.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from styx_py.client import StyxClient
from styx_py.client.sdk.pending import EGRESS, PUSHED, ClientStats, PendingTable
from styx_py.client.sdk.push import worker_addresses
from styx_py.core.wire import (
    NIL,
    IngressRecord,
    Message,
    Phase,
    PushedReply,
    Reply,
    ReplyStatus,
    Request,
)
from styx_py.stack.local import LocalStack
from styx_py.testing.memory import MemoryEgress, MemoryLog
from styx_py.worker.feed import ReplyFeed
from styx_py.worker.replies import ReplyOut
from styx_py.worker.txn import RootTxn
from tests.service_fixtures import ClusterFactory

PREFIX_A = "a" * 20
PREFIX_B = "b" * 20


def _reply(rid: str, tid: int = 1) -> Reply:
    return Reply(rid, tid, 3, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, NIL, None, None)


class Sent:
    def __init__(self) -> None:
        self.msgs: list[tuple[str, Message]] = []

    def __call__(self, dest: str, msg: Message) -> None:
        self.msgs.append((dest, msg))

    def rids(self, dest: str) -> list[str]:
        return [m.reply.request_id for d, m in self.msgs if d == dest and isinstance(m, PushedReply)]


def test_each_reply_goes_to_the_client_whose_prefix_it_carries() -> None:
    sent = Sent()
    feed = ReplyFeed(sent)
    assert feed.subscribe("client-a", PREFIX_A)
    assert feed.subscribe("client-b", PREFIX_B)
    for rid in (PREFIX_A + "1", PREFIX_B + "2", "someone-else-3", PREFIX_A + "4"):
        feed.offer(_reply(rid))
    assert sent.rids("client-a") == [PREFIX_A + "1", PREFIX_A + "4"]
    assert sent.rids("client-b") == [PREFIX_B + "2"]
    assert feed.pushed == 3
    feed.drop("client-a")  # its connection closed
    feed.offer(_reply(PREFIX_A + "5"))
    feed.offer(_reply(PREFIX_B + "6"))
    assert sent.rids("client-a") == [PREFIX_A + "1", PREFIX_A + "4"]
    assert sent.rids("client-b") == [PREFIX_B + "2", PREFIX_B + "6"]


def test_a_prefix_too_short_to_be_one_clients_is_refused() -> None:
    sent = Sent()
    feed = ReplyFeed(sent)
    assert not feed.subscribe("greedy", "")
    assert not feed.subscribe("greedy", "ab")
    assert not feed.subscribe("greedy", "x" * 65)
    feed.offer(_reply("ab" + "0" * 30))
    assert sent.msgs == [] and feed.clients == {}


def _root(rid: str, tid: int = 1) -> RootTxn:
    request = Request(rid, "account", "deposit", "k1", msgspec.Raw(b"\x90"))
    return RootTxn(tid, IngressRecord(0, 0, request, 0))


def test_only_what_leaves_for_the_egress_log_is_pushed() -> None:
    """Pushed at the moment of the egress send, so with its fencing and holding: a held worker (a newer
    generation was announced) pushes nothing, nor does a replay for a reply already on the log."""
    sent = Sent()
    log = MemoryLog()
    log.create("egress", 1)
    out = ReplyOut(MemoryEgress(log, "egress"), 100, lambda: None, feed=ReplyFeed(sent))
    assert out.feed is not None and out.feed.subscribe("client-a", PREFIX_A)
    out.send(3, [(_root(PREFIX_A + "1", 1), _reply(PREFIX_A + "1", 1))])
    assert sent.rids("client-a") == [PREFIX_A + "1"]
    assert [r.request_id for r in log.records("egress")] == [PREFIX_A + "1"]

    out.on_log = {PREFIX_A + "2": [_reply(PREFIX_A + "2", 2)]}  # a replay: this one was logged already
    out.send(3, [(_root(PREFIX_A + "2", 2), _reply(PREFIX_A + "2", 2))])
    out.held = True
    out.send(3, [(_root(PREFIX_A + "3", 3), _reply(PREFIX_A + "3", 3))])
    assert sent.rids("client-a") == [PREFIX_A + "1"]
    assert [r.request_id for r in log.records("egress")] == [PREFIX_A + "1"]


def test_the_second_copy_of_a_reply_is_an_echo_not_a_duplicate() -> None:
    async def run() -> ClientStats:
        stats = ClientStats()
        table = PendingTable(10, stats)
        loop = asyncio.get_running_loop()
        futures = {}
        for rid in ("r1", "r2"):
            futures[rid] = table.add(rid, loop.create_future(), b"fp").future
        table.resolve_pushed(_reply("r1"))  # pushed first ...
        table.resolve(_reply("r1"), EGRESS)  # ... then read from the egress topic: an echo
        table.resolve(_reply("r1"), EGRESS)  # the log holding it twice: a duplicate
        table.resolve(_reply("r2"), EGRESS)  # the other way round
        table.resolve(_reply("r2"), PUSHED)
        assert futures["r1"].result().request_id == "r1" and futures["r2"].done()
        return stats

    stats = asyncio.run(run())
    assert (stats.replied, stats.pushed) == (2, 1)
    assert (stats.echoes_ignored, stats.duplicates_ignored, stats.unmatched_ignored) == (2, 1, 0)


def test_worker_addresses_come_from_the_status() -> None:
    status = {"workers": [{"node_id": "w1", "address": "h:1"}, {"node_id": "w2", "address": "h:2"}, {}]}
    assert worker_addresses(status) == {"h:1", "h:2"}
    assert worker_addresses({}) == set()


# ---- on real services ------------------------------------------------------------------------------

ACCOUNTS = 50


async def _until(what: str, ok: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


async def _transfers(client: StyxClient, n: int, tag: str) -> None:
    replies = await asyncio.gather(
        *(
            client.submit("account", f"{tag}{i % ACCOUNTS}", "transfer", f"{tag}{(i * 7 + 1) % ACCOUNTS}", 1)
            for i in range(n)
        )
    )
    assert all(r.status in ("committed", "aborted") for r in replies), replies


@pytest.fixture
def stack(local_cluster: ClusterFactory) -> LocalStack:
    return local_cluster(app="styx_py.benchmarks.bank:app")


@pytest.mark.services
async def test_a_connected_client_takes_pushed_replies_and_the_log_has_each_of_them(
    stack: LocalStack,
) -> None:
    workers = worker_addresses(await asyncio.to_thread(stack.status))
    assert len(workers) == 2
    async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
        push = client._push
        assert push is not None
        await _until("subscribed on both workers", lambda: push.subscribed == workers)
        await asyncio.gather(*(client.call("account", f"t{i}", "deposit", 100) for i in range(ACCOUNTS)))
        await _transfers(client, 200, "t")
        stats = client.stats
        assert stats.replied == ACCOUNTS + 200
        # Most replies came pushed (a reply can still win through the log now and then) ...
        assert stats.pushed > stats.replied // 2, stats
        # ... and every one of them also through the egress topic, the record.
        await _until("every reply's other copy", lambda: stats.echoes_ignored == stats.replied)
        assert (stats.duplicates_ignored, stats.unmatched_ignored) == (0, 0), stats

        # A dropped subscription is made again; meanwhile replies come through the log.
        for task in list(push.links.values()):
            task.cancel()
        await _until("the subscriptions dropped", lambda: not push.subscribed)
        await _transfers(client, 100, "t")
        await _until("subscribed again", lambda: push.subscribed == workers)
        pushed = stats.pushed
        await _transfers(client, 100, "t")
        assert stats.replied == ACCOUNTS + 400
        assert stats.pushed > pushed, stats
        balances = await asyncio.gather(
            *(client.call("account", f"t{i}", "balance") for i in range(ACCOUNTS))
        )
        assert sum(balances) == 100 * ACCOUNTS


@pytest.mark.services
async def test_a_client_can_read_the_log_only(stack: LocalStack) -> None:
    async with await StyxClient.connect(stack.coordinator, timeout_s=120, push_replies=False) as client:
        assert client.coordinator is None and client._push is None
        await asyncio.gather(*(client.call("account", f"o{i}", "deposit", 1) for i in range(20)))
        assert (client.stats.replied, client.stats.pushed, client.stats.echoes_ignored) == (20, 0, 0)
