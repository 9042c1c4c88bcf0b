"""The invocations the workers retain for the invocation view (styx_worker.traces): bounded by request
ids and by invocations per id, returned by a reply lookup only when it asks for them, gathered by the
coordinator from every worker, and kept by the gateway for the phase of the reply."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec

from styx_client.gateway.listing import _graph
from styx_client.gateway.lookups import ClusterReplies
from styx_py.core.wire import (
    AdminReply,
    FindReplies,
    FoundReplies,
    Invoke,
    Phase,
    Reply,
    ReplyLookup,
    Status,
    Traced,
    encode_value,
)
from styx_worker.dedup import ReplyTable
from styx_worker.lookup import find_replies
from styx_worker.traces import Traces
from tests.test_gateway import two_worker_lookups


def _invoke(rid: str, path: list[int], key: str, tid: int = 1, phase: Phase = Phase.OPTIMISTIC) -> Invoke:
    raw = msgspec.Raw(encode_value([]))
    return Invoke(3, tid, phase, path, "w1", "w1", "account", "deposit", key, raw, 1, 1, False, 0, 0, rid)


def test_traces_keep_the_latest_request_ids_and_a_bounded_number_of_invocations_each() -> None:
    traces = Traces(max_requests=2, max_nodes=3)
    for i in range(5):
        traces.record(_invoke("a", [i], f"k{i}"), Status.OK, wrote=i % 2 == 0)
    traces.record(_invoke("a", [0], "k0"), Status.OK, wrote=True)  # a repeat replaces, never adds
    assert [t.path for t in traces.find(["a"])] == [[0], [1], [2]] and traces.dropped == 2
    traces.record(_invoke("b", [], "x"), Status.ABORT, wrote=False)
    traces.record(_invoke("a", [], "root"), Status.OK, wrote=True)  # "a" is the most recent again
    traces.record(_invoke("c", [], "y"), Status.OK, wrote=False)  # evicts "b", the oldest
    assert len(traces) == 2 and traces.find(["b"]) == []
    assert [t.request_id for t in traces.find(["c", "a"])] == ["a"] * 3 + ["c"]
    traces.record(_invoke("", [], "z"), Status.OK, wrote=False)  # no request id: nothing to find it by
    assert len(traces) == 2


def test_the_most_recent_roots_come_newest_first_with_their_latest_run() -> None:
    traces = Traces()
    traces.record(_invoke("a", [], "k1"), Status.CHANGED, wrote=True)
    traces.record(_invoke("b", [0], "k9"), Status.OK, wrote=True)  # only a call ran here: not listed
    traces.record(_invoke("c", [], "k2", tid=2), Status.OK, wrote=False)
    traces.record(_invoke("a", [], "k1", phase=Phase.FALLBACK), Status.OK, wrote=True)  # a's re-run
    assert [(t.request_id, t.phase, t.status) for t in traces.recent(5)] == [
        ("a", int(Phase.FALLBACK), int(Status.OK)),
        ("c", int(Phase.OPTIMISTIC), int(Status.OK)),
    ]
    assert [t.request_id for t in traces.recent(1)] == ["a"]
    table = ReplyTable(cap_per_partition=8)
    listed = find_replies(FindReplies(3, [], 0, False, 1), "w1", table, {"a"}, True, traces)
    assert [t.request_id for t in listed.traces] == ["a"] and listed.pending == ["a"]


def test_a_lookup_carries_traces_only_when_asked() -> None:
    traces = Traces()
    traces.record(_invoke("a", [], "k"), Status.OK, wrote=True)
    plain = find_replies(FindReplies(1, ["a"], 0), "w1", ReplyTable(cap_per_partition=8), set(), True, traces)
    asked = find_replies(
        FindReplies(2, ["a"], 0, True), "w1", ReplyTable(cap_per_partition=8), set(), True, traces
    )
    assert plain.traces == [] and [t.key for t in asked.traces] == ["k"]


def _reply(rid: str, tid: int, phase: int) -> Reply:
    return Reply(rid, tid, 3, phase, "committed", msgspec.Raw(encode_value(1)), None, None)


async def test_the_coordinator_gathers_every_workers_traces_and_the_gateway_keeps_the_replys_phase() -> None:
    outbox, clock, tasks, lookups = two_worker_lookups()
    root = Traced("a", 3, 1, 7, [], "account", "transfer", "k1", int(Status.OK), True)
    child = Traced("a", 3, 1, 7, [0], "account", "deposit", "k2", int(Status.OK), True)
    optimistic = Traced("a", 3, 0, 7, [], "account", "transfer", "k1", int(Status.CHANGED), True)
    async with asyncio.TaskGroup() as tg:
        tasks.group = tg
        lookups.start("admin", ReplyLookup(["a"], traces=True))
        finds = [outbox.to(w)[-1] for w in ("w1", "w2")]
        assert all(isinstance(f, FindReplies) and f.traces for f in finds)
        lookups.on_found(
            FoundReplies(finds[0].lookup, "w1", [_reply("a", 7, 1)], [], [], True, [root, optimistic])
        )
        lookups.on_found(FoundReplies(finds[1].lookup, "w2", [], [], [], True, [child]))
        (answer,) = outbox.to("admin")
        assert isinstance(answer, AdminReply) and len(answer.body["traces"]) == 3
        clock.fire.set()  # the lookup's timeout task ends (the lookup was answered)

    async def source(ids: list[str], traces: bool = False) -> Mapping[str, Any]:
        assert traces
        return answer.body

    found = await ClusterReplies(source).trace("a")
    graph = _graph(found, found.reply)
    assert [(c.path, c.key, c.function, c.status) for c in graph["calls"]] == [
        ([], "k1", "transfer", "ok"),
        ([0], "k2", "deposit", "ok"),
    ]
    assert [(e.key, e.wrote) for e in graph["entities"]] == [("k1", True), ("k2", True)]
    assert graph["graph_complete"]
