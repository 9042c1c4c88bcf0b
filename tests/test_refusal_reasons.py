"""Why a request was refused: logged with the refusal, replayed identically, and acted on by the SDK's
in-flight window and the gateway (styx_worker.batch, styx_client.sdk.window, docs/operations.md
"Overload")."""

from __future__ import annotations

import msgspec
import pytest

from styx_client.gateway.outcomes import overloaded, reply_outcome
from styx_client.sdk.pending import PendingTable
from styx_client.sdk.replies import result_of
from styx_client.sdk.stats import ClientStats
from styx_py.core.errors import Overloaded
from styx_py.core.wire import (
    BatchEntry,
    IngressRecord,
    Refusal,
    Refused,
    Reply,
    Request,
    SeqLogEntry,
    encode_value,
)
from styx_py.testing.memory import MemoryIngress, MemoryLog
from styx_worker.batch import BatchFormer, refusal
from styx_worker.effects import Outbox
from styx_worker.replies import ReplyOut
from styx_worker.txn import RootTxn

INGRESS = "ingress"


def _request(rid: str, key: str = "k") -> Request:
    return Request(rid, "acct", "deposit", key, msgspec.Raw(encode_value([1])), 5)


def _never(*what: object) -> None:
    raise AssertionError(f"diverged: {what}")


def _former(log: MemoryLog) -> tuple[MemoryIngress, BatchFormer]:
    ingress = MemoryIngress(log, INGRESS)
    ingress.assign([0, 1])
    return ingress, BatchFormer("w1", 100, ReplyOut(Outbox(), 100, _never), _never)


def _hot_queue() -> list[RootTxn]:
    """Rescheduled calls of ``deposit`` behind the entity ``hot``."""
    return [RootTxn(90 + t, IngressRecord(0, 100 + t, _request(f"old{t}", "hot"), 0)) for t in (1, 2, 3)]


def _formed() -> tuple[MemoryLog, SeqLogEntry, list[Reply]]:
    """A batch of epoch 3 that refuses one request behind the hot entity and one over the admitted
    count: its log entry and the replies it sent."""
    log = MemoryLog()
    log.create(INGRESS, 2)
    for partition, rid, key in [(0, "hot1", "hot"), (0, "a", "a"), (1, "b", "b"), (1, "c", "c")]:
        log.append(INGRESS, partition, _request(rid, key))
    ingress, batch = _former(log)
    batch.rescheduled = _hot_queue()
    batch.room()  # old1 runs, old2 and old3 wait behind "hot": 2 deep
    records = sorted(ingress.take(10), key=lambda r: (r.partition, r.offset))
    (_, resends, _), entry = batch.form(3, 0, 1, records, admitted=2, depth_max=1)
    return log, entry, [r for _, r, _ in resends]


async def test_the_reason_is_logged_with_the_refusal_and_replayed_identically() -> None:
    log, entry, replies = _formed()
    refused = {e.request_id: e.reason for e in entry.entries if isinstance(e, Refused)}
    assert refused == {"hot1": Refusal.ENTITY, "c": Refusal.BACKLOG}, entry.entries
    by_id = {r.request_id: r for r in replies}
    assert (by_id["hot1"].reason, by_id["c"].reason) == ("entity", "backlog")
    assert "behind entity acct/'hot'" in (by_id["hot1"].error or ""), "the message names the entity"
    assert "(backlog)" in (by_id["c"].error or "")

    # Replay from the entry as the sequencer log holds it (encoded): the same refusals, the same replies.
    logged = msgspec.msgpack.decode(msgspec.msgpack.encode(entry), type=SeqLogEntry)
    ingress, batch = _former(log)
    batch.rescheduled = _hot_queue()
    batch.replay = {3: logged}
    fetched = [await ingress.take_exact(p, o) for p, o in batch.to_fetch(3)]
    _, resends, _ = batch.replayed(3, fetched)
    again = [r for _, r, _ in resends]
    assert again == replies, "replay makes the identical replies, reasons included"
    assert [msgspec.msgpack.encode(r) for r in again] == [msgspec.msgpack.encode(r) for r in replies]


async def test_a_refusal_logged_without_a_reason_decodes_and_replays_as_it_was_answered() -> None:
    old = msgspec.msgpack.encode(["refused", 0, 0, "x"])  # an entry of a log without reasons
    entry = msgspec.msgpack.decode(old, type=BatchEntry)
    assert entry == Refused(0, 0, "x", "")
    reply = refusal(4, _request("x"), entry.reason)
    assert reply.reason == "" and reply.error == (
        "not admitted in epoch 4: the cluster is over its admission bound; retry later"
    ), "the reply such a log's egress holds"
    old_reply = msgspec.msgpack.encode(list(msgspec.structs.astuple(reply))[:-1])  # no reason field
    assert msgspec.msgpack.decode(old_reply, type=Reply) == reply
    with pytest.raises(Overloaded) as raised:
        result_of(reply)
    assert raised.value.reason == "backlog", "a refusal without a reason is the backlog's"


def _refused(rid: str, reason: str) -> Reply:
    return refusal(9, _request(rid), reason)


def test_the_window_narrows_on_a_backlog_refusal_not_on_an_entity_refusal() -> None:
    table = PendingTable(1000, ClientStats())
    entries = [table.register(f"r{i}", b"fp", 0, 0) for i in range(200)]
    for e in entries:
        table.wait(e, lambda r, x: None, 1.0, ("acct", "deposit", "k", e.rid), 0.0)
    assert table.resolve(_refused("r0", Refusal.ENTITY))
    assert table.window.limit == 1000, "a hot key's refusal leaves everyone's window alone"
    assert (table.stats.refused, table.stats.refused_entity) == (1, 1)
    assert table.resolve(_refused("r1", Refusal.BACKLOG))
    assert table.window.limit == pytest.approx(199 * 0.7), "the cluster's backlog narrows it"
    assert (table.stats.refused, table.stats.refused_entity) == (2, 1)


def test_the_caller_and_the_gateway_are_told_which_bound_refused() -> None:
    entity = _refused("e", Refusal.ENTITY)
    with pytest.raises(Overloaded) as raised:
        result_of(entity)
    assert raised.value.reason == "entity" and "acct/'k'" in str(raised.value)
    assert Overloaded("too many in flight").reason == "client"

    body = msgspec.json.decode(reply_outcome(entity).body)["error"]
    assert (body["code"], body["reason"], body["reply"]["reason"]) == ("overloaded", "entity", "entity")
    backlog = msgspec.json.decode(reply_outcome(_refused("b", Refusal.BACKLOG)).body)["error"]
    assert (backlog["reason"], backlog["reply"]["reason"]) == ("backlog", "backlog")
    mine = overloaded("64 invocations pending", 1)
    assert mine.status == 429 and msgspec.json.decode(mine.body)["error"]["reason"] == "client"


def test_the_benchmark_counts_entity_refusals_apart_from_backlog_ones() -> None:
    from styx_benchmarks.driver import SdkSender

    entity = SdkSender.outcome(_refused("e", Refusal.ENTITY), None)
    backlog = SdkSender.outcome(_refused("b", Refusal.BACKLOG), None)
    assert (entity.status, entity.cause) == ("refused", "Overloaded (entity)")
    assert (backlog.status, backlog.cause) == ("refused", "Overloaded")
