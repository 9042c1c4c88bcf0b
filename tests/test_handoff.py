"""Moving partitions at a planned shape change straight from the old owner to the new one:
the pieces and their assembly (pure), and in the simulation a move that reads nothing from S3,
replays nothing, and still equals the serial execution — and the fallback to a full recovery when a
worker cannot hand off."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest

from styx_py.core import limits
from styx_py.core.wire import ClusterView, Handoff, IngressRecord, Phase, Reply, ReplyStatus, Request
from styx_py.testing.cluster import SimCluster, check_against_serial
from styx_worker import core, recovery
from styx_worker.dedup import ReplyTable
from styx_worker.effects import Send
from styx_worker.handoff import HandoffRefused, Pieces, pieces, refusal
from styx_worker.snapshot import Unconfirmed, put_back
from styx_worker.state import StateStore
from tests.test_oracle import APP, submit_random_mix


def reply(rid: str, tid: int) -> Reply:
    return Reply(rid, tid, 1, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, msgspec.Raw(b"\xc0"), None, None)


def request(rid: str) -> Request:
    return Request(rid, "acct", "deposit", "k1", msgspec.Raw(b"\x91\x01"))


# ---- pieces and their assembly (pure) -----------------------------------------------------------------
def test_a_partition_travels_in_pieces_under_the_size_and_is_put_back_together_whole() -> None:
    data = [("acct", f"k{i}", bytes(100)) for i in range(50)]
    delta = [("acct", f"k{i}", None if i % 2 else bytes(100)) for i in range(10)]
    out = pieces(
        7, 3, 41, data, delta, [reply("r1", 5)], [reply("r1", 5)], {0: 99, 2: 7},
        [(9, 12, 0, request("r2"))], [(13, 0, request("r2"))], {3: 17},
        piece_bytes=1000,
    )  # fmt: skip
    assert len(out) > 5 and all(p.parts == len(out) for p in out)
    assert [p.part for p in out] == list(range(len(out)))
    assert all(not p.replies and not p.rescheduled for p in out[:-1])

    async def assemble() -> None:
        inbox = Pieces()
        for piece in reversed(out):  # any order, before the recovery asks
            inbox.add(piece, current_gen=6)
        moved = (await inbox.take(7, [3], epoch=41))[3]
        assert moved.data == data and moved.delta == delta
        assert moved.last.position == 99 and moved.last.cursor == {0: 99, 2: 7}
        assert moved.last.egress_offsets == {3: 17}
        [txn] = recovery.resumed(3, moved.last.rescheduled)
        assert (txn.tid, txn.partition, txn.offset) == (9, 3, 12)
        waiting: dict[str, list[IngressRecord]] = {}
        recovery.add_waiting(waiting, 3, moved.last.waiting)
        assert list(waiting) == ["r2"] and waiting["r2"][0].offset == 13
        assert not inbox.pieces[7]  # taken

    asyncio.run(assemble())


def test_a_refused_stale_or_old_handoff_is_never_installed() -> None:
    async def run() -> None:
        inbox = Pieces()
        inbox.add(refusal(5, 0), current_gen=5)
        with pytest.raises(HandoffRefused, match="could not hand it off"):
            await inbox.take(5, [0], epoch=10)
        (piece,) = pieces(5, 1, 9, [], [], [], [], {}, [], [], {})
        inbox.add(piece, current_gen=5)
        with pytest.raises(HandoffRefused, match="at epoch 9, not 10"):
            await inbox.take(5, [1], epoch=10)
        inbox.add(Handoff(4, 2, 10, 0, 1, [], []), current_gen=5)  # of a generation that is over
        assert 4 not in inbox.pieces
        # A piece still missing: the take waits (the recovery's timeout bounds it).
        first, _ = pieces(5, 2, 10, [("acct", "a", bytes(10)), ("acct", "b", bytes(10))], [], [], [], {},
                          [], [], {}, piece_bytes=1)  # fmt: skip
        inbox.add(first, current_gen=5)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await inbox.take(5, [2], epoch=10)

    asyncio.run(run())


def test_a_moved_partition_leaves_no_delta_behind_not_even_its_deletes() -> None:
    store = StateStore()
    store.apply({("acct", "a"): b"1", ("acct", "b"): None, ("acct", "c"): b"3"})
    store.drop(lambda key: key[1] in ("a", "b"))
    assert store.delta == {("acct", "c"): b"3"} and dict(store.items()) == {("acct", "c"): b"3"}


def test_abandoned_snapshots_go_back_into_the_delta_with_newer_writes_on_top() -> None:
    store, answered = StateStore(), ReplyTable(10)
    unconfirmed: Unconfirmed = {
        4: ({("acct", "a"): b"4", ("acct", "b"): b"4"}, {0: [reply("r4", 4)]}),
        6: ({("acct", "a"): b"6"}, {0: [reply("r6", 6)]}),
    }
    store.delta = {("acct", "b"): b"7"}
    answered.delta = {0: [reply("r7", 7)]}
    put_back(unconfirmed, store, answered)
    assert store.delta == {("acct", "a"): b"6", ("acct", "b"): b"7"}
    assert [r.request_id for r in answered.delta[0]] == ["r4", "r6", "r7"]
    assert not unconfirmed


# ---- the simulation -----------------------------------------------------------------------------------
def snapshot_reads(c: SimCluster) -> list[str]:
    """Snapshot objects read from the blob store from now on."""
    reads: list[str] = []
    get = c.blobs.get

    async def counted(key: str) -> bytes | None:
        if key.startswith("snapshots/"):
            reads.append(key)
        return await get(key)

    c.blobs.get = counted  # type: ignore[method-assign]
    return reads


async def test_a_planned_change_moves_partitions_in_pieces_without_s3_or_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "HANDOFF_PIECE_BYTES", 64)  # several pieces per partition
    sent: list[Handoff] = []
    hand_off = core.WorkerCore._hand_off

    def watched(self: core.WorkerCore, view: ClusterView) -> None:
        before = len(self.out.effects)
        hand_off(self, view)
        new = self.out.effects[before:]
        sent.extend(e.msg for e in new if isinstance(e, Send) and isinstance(e.msg, Handoff))

    monkeypatch.setattr(core.WorkerCore, "_hand_off", watched)
    async with SimCluster(APP, workers=2, seed=11, snapshot_interval_epochs=3, epoch_size_max=20) as c:
        rng = random.Random(11)
        submit_random_mix(c, rng, 80, n_keys=30, hot=0.3)
        await c.wait()
        reads = snapshot_reads(c)
        c.add_worker("w3")
        submit_random_mix(c, rng, 80, n_keys=30, hot=0.3)
        await c.wait()
        c.coordinator.drain("w1")
        submit_random_mix(c, rng, 80, n_keys=30, hot=0.3)
        await c.wait()
        assert c.retired == ["w1"] and sorted(set(c.coordinator.cluster.placement)) == ["w2", "w3"]
        assert reads == [], "a planned change read snapshot objects"
        assert sent and all(p.epoch >= 0 for p in sent)
        assert max(p.parts for p in sent) > 1, "no partition travelled in several pieces"
        move = c.coordinator.recovery.last_move
        assert move is not None and move["stopped_s"] >= 0 and move["after_epoch"] >= 0
        assert c.coordinator.recovery.last is None and c.coordinator.recoveries == 0, "a move is no recovery"
        await check_against_serial(c)
        assert not c.sent.duplicate_replies()


async def test_a_worker_that_cannot_hand_off_ends_the_change_in_a_full_recovery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "MAX_HANDOFF_BYTES", 0)  # every handoff is too large: refused
    async with SimCluster(APP, workers=2, seed=12, snapshot_interval_epochs=2, epoch_size_max=20) as c:
        rng = random.Random(12)
        submit_random_mix(c, rng, 80, n_keys=30, hot=0.3)
        await c.wait()
        recoveries, generation = c.coordinator.recoveries, c.coordinator.cluster.gen
        reads = snapshot_reads(c)
        c.add_worker("w3")
        submit_random_mix(c, rng, 80, n_keys=30, hot=0.3)
        await c.wait(timeout_s=120)
        assert sorted(set(c.coordinator.cluster.placement)) == ["w1", "w2", "w3"]
        # The planned generation failed at once (refused), the next recovered from S3.
        assert c.coordinator.cluster.gen >= generation + 2 and c.coordinator.recoveries >= recoveries + 1
        moved = [p for p, w in enumerate(c.coordinator.cluster.placement) if w == "w3"]
        assert moved and any(f"p{p:05d}" in key for key in reads for p in moved), reads
        await check_against_serial(c)
        assert not c.sent.duplicate_replies()
