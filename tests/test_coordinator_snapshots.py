"""The coordinator's snapshot bookkeeping: manifests, compaction, retention, the last decided epoch.

Pins down: ``extend`` and ``with_generation`` build new manifests and leave the old one intact;
``generation_of`` names the latest generation started at or before an epoch; a compacted chain
restores exactly the state, reply table and positions the delta chain restores (deletes dropped
from the base, replies kept up to the cap); ``retain`` removes only objects and manifests no
current manifest needs; an epoch counts as possibly decided only when every worker logged it in
the generation that ran it, and only if every epoch before it (after the snapshot) does too.
"""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_coordinator.snapshots import (
    compact,
    empty_manifest,
    extend,
    last_complete_epoch,
    retain,
    with_generation,
)
from styx_py.core.blobs import base_key, delta_key, epoch_of, manifest_key
from styx_py.core.wire import NIL, Manifest, PartitionSnapshot, Reply, Request, SeqLogEntry
from styx_py.testing.memory import MemoryBlobStore
from styx_worker.dedup import ReplyTable
from styx_worker.state import StateStore

encode = msgspec.msgpack.Encoder().encode
decode = msgspec.msgpack.Decoder(PartitionSnapshot).decode
N_PARTITIONS = 2


def reply(rid: str, epoch: int) -> Reply:
    return Reply(rid, epoch, epoch, 0, "committed", NIL, None, None)


def part(
    p: int, epoch: int, writes: list[tuple[str, str | int, bytes | None]], rids: list[str]
) -> PartitionSnapshot:
    req = Request(f"q{epoch}", "op", "f", p, msgspec.Raw(b"\x90"))
    return PartitionSnapshot(
        epoch, p, writes, 10 * epoch, [(epoch, 1, 2, req)], 20 * epoch, 30 * epoch,
        [reply(r, epoch) for r in rids], [(epoch, 3, req)],
    )  # fmt: skip


def restore(blobs: MemoryBlobStore, m: Manifest, p: int, cap: int) -> tuple[object, ...]:
    """What a recovering worker rebuilds for partition ``p`` (as styx_worker.recovery does): state,
    reply table, and the positions of the newest object."""
    store, table = StateStore(), ReplyTable(cap)
    last: PartitionSnapshot | None = None
    for key in sorted(m.deltas.get(p, []), key=epoch_of):
        last = decode(blobs.objects[key])
        store.load_writes(last.writes)
        for r in last.replies:
            table.record(p, r, as_delta=False)
    assert last is not None
    replies = list(table.replies.get(p, {}).values())
    positions = (last.position, last.rescheduled, last.egress_offset, last.seqlog_offset, last.waiting)
    return store.data, replies, positions


# ---- manifests ----------------------------------------------------------------------------------


def test_empty_manifest_restores_nothing_in_generation_zero() -> None:
    m = empty_manifest(3)
    assert (m.epoch, m.n_partitions, m.deltas, m.seqlog_offset) == (-1, 3, {}, 0)
    assert [m.generation_of(e) for e in (-1, 0, 10**9)] == [0, 0, 0]


def test_extend_and_with_generation_leave_the_previous_manifest_intact() -> None:
    m0 = empty_manifest(2)
    m1 = extend(m0, 4, 17, 99)
    assert (m1.epoch, m1.lc, m1.seqlog_offset) == (4, 17, 99)
    assert m1.deltas == {0: [delta_key(0, 4)], 1: [delta_key(1, 4)]}
    m2 = with_generation(m1, 6, 1)
    m3 = extend(m2, 8, 30, 120)
    assert m3.deltas == {p: [delta_key(p, 4), delta_key(p, 8)] for p in (0, 1)}
    assert m3.epoch_generations == [(0, 0), (6, 1)]
    assert m0 == empty_manifest(2) and m1.epoch_generations == [(0, 0)], "older manifests unchanged"
    m3.epoch_generations.append((9, 2))
    assert m2.epoch_generations == [(0, 0), (6, 1)], "manifests share no lists"


@given(starts=st.lists(st.integers(0, 40), max_size=6), epoch=st.integers(-1, 50))
def test_generation_of_names_the_latest_generation_started_by_then(starts: list[int], epoch: int) -> None:
    m = empty_manifest(1)
    firsts = [0]
    for gen, first in enumerate(sorted(starts), start=1):
        m = with_generation(m, first, gen)
        firsts.append(first)
    expected = max((g for g, first in enumerate(firsts) if first <= epoch), default=0)
    assert m.generation_of(epoch) == expected


# ---- compaction and retention -------------------------------------------------------------------

op_writes = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 6), st.one_of(st.none(), st.binary(max_size=2))),
    max_size=6,
)
snapshots = st.lists(
    st.tuples(
        st.lists(op_writes, min_size=N_PARTITIONS, max_size=N_PARTITIONS),
        st.lists(st.sampled_from([f"r{i}" for i in range(8)]), max_size=4),
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=60, deadline=None)
@given(chain=snapshots, keep_deltas=st.integers(0, 3), cap=st.integers(1, 5))
def test_compaction_restores_what_the_delta_chain_restores(
    chain: list[tuple[list[list[tuple[str, int, bytes | None]]], list[str]]], keep_deltas: int, cap: int
) -> None:
    async def scenario() -> None:
        plain, blobs = MemoryBlobStore(), MemoryBlobStore()  # plain: never compacted (the reference)
        ref = m = empty_manifest(N_PARTITIONS)
        for i, (per_partition, rids) in enumerate(chain):
            epoch = 3 * i + 1  # epochs are not contiguous
            for p, writes in enumerate(per_partition):
                data = encode(part(p, epoch, list(writes), rids))
                await plain.put(delta_key(p, epoch), data)
                await blobs.put(delta_key(p, epoch), data)
            ref = extend(ref, epoch, i, i)
            m = await compact(blobs, extend(m, epoch, i, i), keep_deltas, cap)
            await blobs.put(manifest_key(epoch), encode(m))
            await retain(blobs, m)
            for p in range(N_PARTITIONS):
                keys = m.deltas[p]
                assert len(keys) <= keep_deltas or keys == [base_key(p, epoch)]
                assert restore(blobs, m, p, cap) == restore(plain, ref, p, cap)
                if keys[0].endswith(".base"):
                    base = decode(blobs.objects[keys[0]])
                    assert all(v is not None for _, _, v in base.writes), "deletes are dropped from a base"
                    assert len(base.replies) <= cap
            needed = {k for keys in m.deltas.values() for k in keys}
            assert set(await blobs.list("snapshots/")) == needed, "retain keeps exactly what is needed"
            assert await blobs.list("manifests/") == [manifest_key(epoch)]

    asyncio.run(scenario())


def test_compaction_keeps_the_newest_replies_and_none_with_cap_zero() -> None:
    async def scenario() -> None:
        blobs, m = MemoryBlobStore(), empty_manifest(1)
        for epoch, rids in [(2, ["x", "y"]), (11, ["z", "x"])]:
            await blobs.put(delta_key(0, epoch), encode(part(0, epoch, [("a", 1, b"v")], rids)))
            m = extend(m, epoch, 0, 0)
        kept = await compact(blobs, m, 1, 2)
        assert [r.request_id for r in decode(blobs.objects[base_key(0, 11)]).replies] == ["z", "x"]
        assert decode(blobs.objects[base_key(0, 11)]).replies[1].epoch == 11, "the newer reply of x"
        assert kept.deltas == {0: [base_key(0, 11)]}
        await compact(blobs, m, 1, 0)
        assert decode(blobs.objects[base_key(0, 11)]).replies == []
        unchanged = await compact(blobs, m, 2, 2)
        assert unchanged == m, "a chain within keep_deltas is left alone"

    asyncio.run(scenario())


def test_compaction_merges_in_a_child_process_as_it_does_in_process() -> None:
    """The coordinator process merges snapshot chains in a child (off its event loop): the same base."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from styx_coordinator.snapshots import merge_chain

    async def scenario() -> None:
        here, there, m = MemoryBlobStore(), MemoryBlobStore(), empty_manifest(2)
        for epoch, rids in [(2, ["x", "y"]), (5, ["z"]), (11, ["z", "x"])]:
            for p in range(2):
                data = encode(part(p, epoch, [("a", p, b"v"), ("b", epoch, None)], rids))
                await here.put(delta_key(p, epoch), data)
                await there.put(delta_key(p, epoch), data)
            m = extend(m, epoch, 0, 0)
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:

            async def in_child(chain: list[bytes], keep: int) -> tuple[int, bytes]:
                return await asyncio.get_running_loop().run_in_executor(pool, merge_chain, chain, keep)

            assert await compact(there, m, 1, 2, in_child) == await compact(here, m, 1, 2)
        assert there.objects == here.objects and base_key(1, 11) in here.objects

    asyncio.run(scenario())


def test_compaction_of_a_missing_object_fails_loudly() -> None:
    m = extend(extend(empty_manifest(1), 1, 0, 0), 2, 0, 0)
    blobs = MemoryBlobStore()
    blobs.objects[delta_key(0, 1)] = encode(part(0, 1, [], []))
    with pytest.raises(FileNotFoundError, match=delta_key(0, 2)):
        asyncio.run(compact(blobs, m, 1, 5))
    assert base_key(0, 2) not in blobs.objects


def test_retain_removes_only_what_no_manifest_needs() -> None:
    blobs = MemoryBlobStore()
    m = Manifest(5, 0, 2, {0: [base_key(0, 3), delta_key(0, 5)], 1: [delta_key(1, 5)]}, [(0, 0)])
    keep = [
        base_key(0, 3),
        delta_key(0, 5),
        delta_key(1, 5),
        delta_key(0, 6),
        manifest_key(5),
        manifest_key(6),
    ]
    stale = [
        delta_key(0, 3),
        delta_key(1, 3),
        base_key(0, 1),
        delta_key(0, 4),
        manifest_key(3),
        manifest_key(4),
    ]
    for key in keep + stale:
        blobs.objects[key] = b"x"
    assert asyncio.run(retain(blobs, m)) == len(stale)
    assert sorted(blobs.objects) == sorted(keep), "newer objects may belong to a snapshot in progress"
    assert asyncio.run(retain(blobs, m)) == 0


# ---- the last epoch that may have been decided --------------------------------------------------


def entry(epoch: int, node: str, gen: int = 0) -> SeqLogEntry:
    return SeqLogEntry(epoch, node, 0, [], gen, 0)


def test_last_complete_epoch_needs_every_worker_of_the_right_generation() -> None:
    m = Manifest(4, 0, 1, {}, [(0, 0)])
    full = [entry(e, n) for e in (3, 4, 5, 6, 7) for n in ("w1", "w2")]
    assert last_complete_epoch(full, m, 2) == 7
    assert last_complete_epoch([x for x in full if (x.epoch, x.node_id) != (6, "w2")], m, 2) == 5
    assert last_complete_epoch([x for x in full if x.epoch != 5], m, 2) == 4, "a gap stops it"
    assert last_complete_epoch([entry(5, "w1"), entry(5, "w1")], m, 2) == 4, "a repeat counts once"
    assert last_complete_epoch([x for x in full if x.epoch <= 4], m, 2) == 4
    # Generation 0 died having logged epoch 6 on both workers; generation 1 reran it from epoch 6.
    m1 = with_generation(m, 6, 1)
    dead = [entry(5, "w1"), entry(5, "w2"), entry(6, "w1"), entry(6, "w2")]
    assert last_complete_epoch(dead, m1, 2) == 5
    assert last_complete_epoch([*dead, entry(6, "w1", 1), entry(6, "w2", 1)], m1, 2) == 6
    assert last_complete_epoch([entry(5, "w1", 1), entry(5, "w2", 1)], m1, 2) == 4


WORKERS = ["w1", "w2", "w3"]
# Per epoch 0..9: the workers whose entry of the right generation is missing (often none), and
# stray entries of the wrong generation (a generation that died mid-epoch).
epoch_logs = st.lists(
    st.tuples(
        st.one_of(st.just(set[str]()), st.sets(st.sampled_from(WORKERS))),
        st.lists(st.sampled_from(WORKERS), max_size=3),
    ),
    min_size=10,
    max_size=10,
)


@settings(max_examples=100, deadline=None)
@given(logs=epoch_logs, snapshot=st.integers(-1, 4), restart=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_last_complete_epoch_is_the_end_of_the_complete_run(
    logs: list[tuple[set[str], list[str]]], snapshot: int, restart: int, seed: int
) -> None:
    m = with_generation(Manifest(snapshot, 0, 1, {}, [(0, 0)]), restart, 1)
    entries = []
    for e, (missing, stray) in enumerate(logs):
        gen = m.generation_of(e)
        entries += [entry(e, n, gen) for n in WORKERS if n not in missing]
        entries += [entry(e, n, 1 - gen) for n in stray]  # never the generation that ran ``e``
    last = last_complete_epoch(entries, m, len(WORKERS))
    assert last >= snapshot
    assert all(not logs[e][0] for e in range(snapshot + 1, last + 1)), "an incomplete epoch counted"
    assert last == len(logs) - 1 or logs[last + 1][0], "a complete epoch after the run was missed"
    random.Random(seed).shuffle(entries)
    assert last_complete_epoch(entries, m, len(WORKERS)) == last, "the order of the log does not matter"
