"""Forming an epoch's batch (worker.batch) and planning a replay (worker.recovery.plan_replay).

Properties: rescheduled transactions run at most one per root entity, the oldest, and none is lost;
a live batch classifies resent request ids (answered / waiting) and gives fresh ones Mencius tids;
a batch re-formed from its sequencer-log entry has the same requests with the same tids; the replay
plan keeps only entries of the generation that ran each epoch, restricted to the owned partitions.
"""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from styx_py.core.wire import (
    NIL,
    Answered,
    IngressRecord,
    Manifest,
    Reply,
    Request,
    Run,
    SeqLogEntry,
    Waiting,
    encode_value,
)
from styx_py.testing.memory import MemoryEgress, MemoryIngress, MemoryLog
from styx_worker.batch import BatchFormer, take_rescheduled
from styx_worker.effects import Emit, Outbox
from styx_worker.recovery import plan_replay
from styx_worker.replies import ReplyOut
from styx_worker.txn import Resend, RootTxn

INGRESS, EGRESS = "in", "out"


def _request(rid: str, key: str = "k") -> Request:
    return Request(rid, "acct", "deposit", key, msgspec.Raw(encode_value([1])))


def _root(tid: int, key: str, partition: int = 0) -> RootTxn:
    return RootTxn(tid, IngressRecord(partition, tid, _request(f"r{tid}", key), 0))


@given(st.lists(st.tuples(st.integers(1, 10_000), st.sampled_from("abcd")), unique_by=lambda t: t[0]))
def test_rescheduled_run_one_per_entity_the_oldest_and_none_is_lost(txns: list[tuple[int, str]]) -> None:
    roots = [_root(tid, key) for tid, key in txns]
    run, wait = take_rescheduled(roots)
    assert sorted(r.tid for r in run + wait) == sorted(tid for tid, _ in txns)
    entities = [(r.request.operator, r.request.key) for r in run]
    assert len(entities) == len(set(entities)), "two transactions of one root entity in one batch"
    assert [r.tid for r in run] == sorted(r.tid for r in run)
    for r in run:
        same = [tid for tid, key in txns if key == r.request.key]
        assert r.tid == min(same), "not the oldest of its entity"


def _diverged(*what: object) -> None:
    raise AssertionError(f"diverged: {what}")


class _Fixture:
    """A batch former over an in-memory ingress, its replies carried out to an in-memory egress."""

    def __init__(self, sid: int = 1, n_seq: int = 2, log: MemoryLog | None = None) -> None:
        self.log = log or MemoryLog()
        self.log.create(INGRESS, 2)
        self.log.create(EGRESS, 2)
        self.ingress = MemoryIngress(self.log, INGRESS)
        self.ingress.assign([0, 1])
        self.out = Outbox()
        self.egress = MemoryEgress(self.log, EGRESS)
        self.replies = ReplyOut(self.out, 100, _diverged)
        self.batch = BatchFormer("w1", 100, self.replies, _diverged)
        self.batch.sequencer.sid, self.batch.sequencer.n_seq = sid, n_seq

    def arrive(self, partition: int, rid: str) -> None:
        self.log.append(INGRESS, partition, _request(rid))

    def form(
        self, epoch: int, gen: int = 0, version: int = 1
    ) -> tuple[list[RootTxn], SeqLogEntry, list[Resend]]:
        """A live batch, as the epoch machine forms it (Take, then Taken)."""
        records = self.ingress.take(self.batch.room())
        (roots, resends, copies), entry = self.batch.form(epoch, gen, version, records)
        for rec in copies:
            self.replies.wait_for_first(rec)
        return roots, entry, resends

    async def replayed(self, epoch: int) -> tuple[list[RootTxn], list[Resend]]:
        """A replayed batch, as the epoch machine re-forms it (Fetch, then Taken)."""
        records = [await self.ingress.take_exact(p, o) for p, o in self.batch.to_fetch(epoch)]
        roots, resends, copies = self.batch.replayed(epoch, records)
        for rec in copies:
            self.replies.wait_for_first(rec)
        return roots, resends

    def send(self, epoch: int, replies: list[tuple[RootTxn, Reply]]) -> None:
        """Send replies and carry out their Emit effects."""
        self.replies.send(epoch, replies)
        for e in self.out.take():
            assert isinstance(e, Emit)
            self.egress.send(e.partition, e.reply, e.epoch)


def test_live_batch_classifies_resends_and_assigns_mencius_tids() -> None:
    f = _Fixture(sid=2, n_seq=3)
    done = Reply("old", 7, 0, 0, "committed", msgspec.Raw(encode_value(1)), None, None)
    f.replies.answered.record(1, done)
    for partition, rid in [(0, "a"), (1, "old"), (0, "b"), (0, "a")]:
        f.arrive(partition, rid)
    roots, entry, resends = f.form(epoch=4, gen=1, version=1)
    assert [(r.request.request_id, r.tid) for r in roots] == [("a", 2), ("b", 5)]
    assert resends == [(1, done, "")], "a request resent after its reply is answered from the table"
    assert [rec.offset for rec in f.replies.waiting["a"]] == [2], "a copy of a running request waits"
    assert entry.entries == [Run(2, 0, 0, "a"), Run(5, 0, 1, "b"), Answered(1, 0, "old"), Waiting(0, 2, "a")]
    assert (entry.epoch, entry.gen, entry.lc_start, entry.lc_end) == (4, 1, 0, 2)


async def test_a_batch_reformed_from_its_log_entry_is_the_same_batch() -> None:
    live = _Fixture()
    for i, partition in enumerate([0, 1, 1, 0, 1]):
        live.arrive(partition, f"r{i}")
    live.arrive(0, "r1")  # a copy of a request of this batch
    live.batch.rescheduled = [_root(101, "x", partition=1)]
    roots, entry, _ = live.form(epoch=0)

    replay = _Fixture(log=live.log)
    replay.batch.rescheduled = [_root(101, "x", partition=1)]
    replay.batch.replay = {0: entry}
    again, _ = await replay.replayed(0)
    assert [(r.tid, r.request.request_id) for r in again] == [(r.tid, r.request.request_id) for r in roots]
    assert replay.batch.sequencer.lc == entry.lc_end
    assert list(replay.replies.waiting) == ["r1"]


async def test_a_batch_whose_resends_come_before_fresh_requests_is_reformed_in_log_order() -> None:
    """A resent id taken before a fresh request of the same partition is logged after it (runs first);
    replay must still take the ingress in order (else: ``replay expected 2@422, log has 421``)."""
    live = _Fixture()
    done = Reply("old", 7, 0, 0, "committed", msgspec.Raw(encode_value(1)), None, None)
    live.replies.answered.record(0, done)
    live.arrive(0, "x")
    live.arrive(0, "old")  # answered long ago
    live.arrive(0, "x")  # a copy of x, which runs in this batch: waits for its reply
    live.arrive(0, "a")
    live.arrive(1, "b")
    roots, entry, resends = live.form(epoch=0)
    assert entry.entries == [
        Run(1, 0, 0, "x"),
        Run(3, 1, 0, "b"),
        Run(5, 0, 3, "a"),
        Answered(0, 1, "old"),
        Waiting(0, 2, "x"),
    ], "the entries are in ingress order: this test tests nothing"

    replay = _Fixture(log=live.log)
    replay.replies.answered.record(0, done)
    replay.batch.replay = {0: entry}
    again, again_resends = await replay.replayed(0)
    assert [(r.tid, r.request.request_id) for r in again] == [(r.tid, r.request.request_id) for r in roots]
    assert again_resends == resends == [(0, done, "")]
    assert [rec.offset for rec in replay.replies.waiting["x"]] == [2]
    assert replay.ingress.positions() == {0: {0: 4}, 1: {0: 1}}


def _entry(epoch: int, gen: int, node: str, partitions: list[int]) -> SeqLogEntry:
    return SeqLogEntry(
        epoch, node, 0, [Run(epoch * 10 + p, p, epoch, f"{epoch}-{p}") for p in partitions], gen, 1
    )


@given(st.integers(-1, 5), st.integers(0, 9))
def test_replay_plan_keeps_the_generation_that_ran_each_epoch(snapshot_epoch: int, until: int) -> None:
    # Generation 0 ran epochs 0..4 but died in epoch 5 (a partial entry); generation 1 re-ran 5 on.
    m = Manifest(snapshot_epoch, 0, 4, {}, [(0, 0), (5, 1)])
    entries = [_entry(e, 0, "w1", [0, 1]) for e in range(6)]
    entries += [_entry(e, 1, w, [p]) for e in range(5, 10) for w, p in (("w1", 0), ("w2", 2))]
    plan = plan_replay(entries, m, until, owned={0, 2}, node_id="w9")
    assert sorted(plan) == list(range(snapshot_epoch + 1, until + 1))
    for e, entry in plan.items():
        assert entry.gen == (1 if e >= 5 else 0)
        assert {x.partition for x in entry.entries} == ({0, 2} if e >= 5 else {0})
        assert entry.node_id == "w9"


def test_replies_go_to_the_partition_each_copy_of_the_request_names() -> None:
    f = _Fixture()
    f.log.create(EGRESS, 4)  # four egress partitions, as many as the cluster's entity partitions
    f.replies.egress_partitions = 4
    sent = f.log.topics[EGRESS]

    def arrive(partition: int, rid: str, reply_partition: int) -> None:
        f.log.append(
            INGRESS, partition, msgspec.structs.replace(_request(rid), reply_partition=reply_partition)
        )

    # Named partitions; -1 (none) and one the topic lacks fall back to the ingress partition.
    for partition, rid, to in [(0, "a", 3), (1, "b", -1), (1, "c", 9), (0, "a", 2)]:
        arrive(partition, rid, to)
    roots, _, resends = f.form(epoch=0)
    assert resends == [] and [r.request.request_id for r in roots] == ["a", "b", "c"]
    f.send(0, [(r, Reply(r.request.request_id, r.tid, 0, 0, "committed", NIL, None, None)) for r in roots])
    where = {(q, r.request_id) for q, part in enumerate(sent) for r in part}
    # "a" ran once; its copy that arrived while it ran is answered on the copy's own partition.
    assert where == {(3, "a"), (2, "a"), (1, "b"), (1, "c")}

    # A resend after the reply is answered from the table, on the partition the resend names.
    arrive(0, "a", 1)
    _, _, resends = f.form(epoch=1)
    assert [(q, r.request_id) for q, r, _ in resends] == [(1, "a")]


def test_unrouted_replies_of_an_epoch_go_out_together_on_one_owned_partition() -> None:
    """One egress batch per epoch, not one per partition the requests came from; epochs take the
    owned partitions in turn; a partition a request names is still honoured."""
    f = _Fixture()
    f.log.create(EGRESS, 4)
    f.replies.egress_partitions = 4
    f.replies.lanes = [1, 3]  # the egress partitions of the two entity partitions it owns (0, 1 here)
    sent = f.log.topics[EGRESS]
    for epoch in (0, 1):
        for partition, rid, to in [(0, f"a{epoch}", -1), (1, f"b{epoch}", -1), (1, f"c{epoch}", 0)]:
            f.log.append(INGRESS, partition, msgspec.structs.replace(_request(rid), reply_partition=to))
        roots, _, _ = f.form(epoch=epoch)
        f.send(
            epoch,
            [(r, Reply(r.request.request_id, r.tid, epoch, 0, "committed", NIL, None, None)) for r in roots],
        )
    where = {r.request_id: q for q, part in enumerate(sent) for r in part}
    assert where == {"a0": 1, "b0": 1, "c0": 0, "a1": 3, "b1": 3, "c1": 0}, where
