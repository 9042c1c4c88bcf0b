"""Snapshot capture (a delta split into per-partition parts) and the coordinator's verdict on it.

Pins down: every write of the delta lands in exactly one part, the one ``partition_of`` names, and
every owned partition gets a part (in partition order) even when it has nothing; rescheduled
transactions are sorted by tid and waiting requests by offset; a failed snapshot's delta is merged
back with newer writes winning and its replies restored older-first, so the successful snapshots
alone (the verdict reaching the worker before its next capture, as the coordinator guarantees)
rebuild the live state and reply table. Done in steps (so the event loop runs between them), the
capture reads all but the delta and the replies at once, and a part encoded a slice at a time is the
same bytes as the part encoded at once.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_py.core.config import load_config
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import NIL, IngressRecord, PartitionSnapshot, Reply, Request, SnapshotResult
from styx_worker.dedup import ReplyTable
from styx_worker.snapshot import (
    Unconfirmed,
    capture_steps,
    encode_steps,
    on_result,
    run_steps,
    snapshot_decoder,
)
from styx_worker.state import StateStore, Writes

T = TypeVar("T")
PARTITIONS = {"acct": 4, "item": 2}  # operator -> partition count
OWNED = [0, 1, 2, 3]
ROWS = load_config(env={}).snapshot_step_rows  # rows per step, as a worker takes them by default


def request(rid: str, key: str | int = 0) -> Request:
    return Request(rid, "acct", "f", key, msgspec.Raw(b"\x90"))


def reply(rid: str) -> Reply:
    return Reply(rid, 0, 0, 0, "committed", NIL, None, None)


keys = st.tuples(st.sampled_from(sorted(PARTITIONS)), st.one_of(st.integers(-50, 50), st.text(max_size=3)))
deltas = st.dictionaries(keys, st.one_of(st.none(), st.binary(max_size=3)), max_size=20)


@settings(max_examples=150, deadline=None)
@given(
    delta=deltas,
    rescheduled=st.lists(
        st.tuples(st.sampled_from(OWNED), st.integers(0, 10**6)), max_size=10, unique_by=lambda r: r[1]
    ),
    waiting=st.lists(st.tuples(st.sampled_from(OWNED), st.integers(0, 10**6)), max_size=10),
)
def test_capture_splits_by_partition(
    delta: Writes, rescheduled: list[tuple[int, int]], waiting: list[tuple[int, int]]
) -> None:
    resched = [(p, tid, tid + 1, 5, request(f"t{tid}")) for p, tid in rescheduled]
    held = [IngressRecord(p, off, request(f"w{off}"), 9) for p, off in waiting]
    positions, replies = {1: {0: 11, 2: 4}}, {0: [reply("r")]}
    steps = capture_steps(
        7, delta, PARTITIONS, [3, 1, 0, 2], positions, resched, {2: 22}, 33, replies, held, ROWS
    )
    parts = run_steps(steps)
    assert [part.partition for part in parts] == OWNED
    assert all(part.epoch == 7 and part.seqlog_offset == 33 for part in parts)
    assert [(part.position, part.egress_offset) for part in parts] == [(0, 0), (11, 0), (0, 22), (0, 0)]
    assert [part.cursor for part in parts] == [{}, {0: 11, 2: 4}, {}, {}]
    assert [part.replies for part in parts] == [[reply("r")], [], [], []]
    for part in parts:
        for op, key, _ in part.writes:
            assert partition_of(key, PARTITIONS[op]) == part.partition
        assert part.writes == [
            (op, k, v) for (op, k), v in delta.items() if partition_of(k, PARTITIONS[op]) == part.partition
        ], "a part keeps the delta's write order (apply order, which is tid order)"
        tids = [tid for tid, _, _, _ in part.rescheduled]
        assert tids == sorted(tid for p, tid in rescheduled if p == part.partition)
        assert all(off == tid + 1 and req.request_id == f"t{tid}" for tid, off, _, req in part.rescheduled)
        offsets = [off for off, _, _ in part.waiting]
        assert offsets == sorted(off for p, off in waiting if p == part.partition)
    assert sum(len(part.writes) for part in parts) == len(delta)


def test_capture_of_nothing_still_gives_every_owned_partition_a_part() -> None:
    parts = run_steps(capture_steps(0, {}, PARTITIONS, [2, 0], {}, [], {}, 5, {}, [], ROWS))
    assert parts == [PartitionSnapshot(0, p, [], 0, [], 0, 5, [], []) for p in (0, 2)]


def test_a_confirmed_snapshot_is_forgotten_a_failed_one_merged_back() -> None:
    store, answered = StateStore(), ReplyTable(10)
    store.apply({("acct", 1): b"old", ("acct", 2): b"gone"})
    answered.record(0, reply("r1"))
    unconfirmed: Unconfirmed = {4: (store.take_delta(), answered.take_delta())}
    store.apply({("acct", 1): b"new", ("acct", 3): None})
    answered.record(0, reply("r2"))
    on_result(unconfirmed, SnapshotResult(9, False, 0), store, answered)  # unknown epoch: nothing changes
    assert 4 in unconfirmed and store.delta == {("acct", 1): b"new", ("acct", 3): None}
    on_result(unconfirmed, SnapshotResult(4, False, 0), store, answered)
    assert unconfirmed == {}
    assert store.delta == {("acct", 1): b"new", ("acct", 2): b"gone", ("acct", 3): None}
    assert answered.take_delta() == {0: [reply("r1"), reply("r2")]}
    unconfirmed[5] = (store.take_delta(), {})
    on_result(unconfirmed, SnapshotResult(5, True, 0), store, answered)
    assert unconfirmed == {} and store.delta == {}, "a durable snapshot's delta is not carried again"


# One epoch of the run: writes (key index -> value or delete), then maybe a snapshot whose verdict
# arrives after ``late`` more write sets, with that verdict.
epochs = st.lists(
    st.tuples(
        st.lists(
            st.dictionaries(st.integers(0, 7), st.one_of(st.none(), st.binary(max_size=2)), max_size=4),
            max_size=3,
        ),
        st.booleans(),  # snapshot at the end of this epoch
        st.booleans(),  # its verdict
        st.lists(
            st.dictionaries(st.integers(0, 7), st.one_of(st.none(), st.binary(max_size=2)), max_size=4),
            max_size=2,
        ),
    ),
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(run=epochs)
def test_successful_snapshots_rebuild_state_and_replies(
    run: list[tuple[list[dict[int, bytes | None]], bool, bool, list[dict[int, bytes | None]]]],
) -> None:
    store, answered = StateStore(), ReplyTable(1000)
    unconfirmed: Unconfirmed = {}
    durable: list[list[PartitionSnapshot]] = []
    n = 0

    def commit(writes: dict[int, bytes | None]) -> None:
        nonlocal n
        store.apply({("acct", k): v for k, v in writes.items()})
        n += 1
        answered.record(partition_of(n, 4), reply(f"r{n}"))

    def snapshot(epoch: int, ok: bool, late: list[dict[int, bytes | None]]) -> None:
        delta, replies = store.take_delta(), answered.take_delta()
        parts = run_steps(capture_steps(epoch, delta, PARTITIONS, OWNED, {}, [], {}, 0, replies, [], ROWS))
        unconfirmed[epoch] = (delta, replies)
        for writes in late:  # epochs that run while the upload is in flight
            commit(writes)
        if ok:
            durable.append(parts)
        on_result(unconfirmed, SnapshotResult(epoch, ok, 0), store, answered)

    for epoch, (writes_list, snap, ok, late) in enumerate(run):
        for writes in writes_list:
            commit(writes)
        if snap:
            snapshot(epoch, ok, late)
    snapshot(len(run), True, [])
    assert unconfirmed == {}
    restored, restored_replies = StateStore(), ReplyTable(1000)
    for parts in durable:
        for part in parts:
            restored.load_writes(part.writes)
            for r in part.replies:
                restored_replies.record(part.partition, r, as_delta=False)
    assert restored.data == store.data
    assert {p: dict(t) for p, t in restored_replies.replies.items() if t} == {
        p: dict(t) for p, t in answered.replies.items() if t
    }


def steps_taken(steps: Generator[None, None, T]) -> tuple[int, T]:
    """How many times ``steps`` let other work run, and its result."""
    n = 0
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return n, stop.value
        n += 1


@settings(max_examples=40, deadline=None)
@given(
    n_writes=st.integers(0, 3 * ROWS + 1),
    n_replies=st.sampled_from([0, 1, 15, 16, ROWS, ROWS + 1, 2**16 + 5]),
)
def test_a_part_encoded_in_steps_is_the_part_encoded_at_once(n_writes: int, n_replies: int) -> None:
    writes = [
        ("acct", i if i % 3 else str(i), None if i % 7 == 0 else b"v" * (i % 5)) for i in range(n_writes)
    ]
    part = PartitionSnapshot(3, 1, writes, 9, [], 4, 5, [reply(f"r{i}") for i in range(n_replies)], [])
    steps, data = steps_taken(encode_steps(part, ROWS))
    assert data == msgspec.msgpack.encode(part)
    assert snapshot_decoder.decode(data) == part
    slices = -(-n_writes // ROWS) if n_writes > ROWS else 0
    slices += -(-n_replies // ROWS) if n_replies > ROWS else 0
    assert steps == slices, "a long list is encoded a slice per step, a short one at once"


def test_capture_takes_a_step_per_slice_of_writes_and_reads_the_rest_at_once() -> None:
    delta: Writes = {("acct", i): b"x" for i in range(2 * ROWS + 10)}
    positions = {0: {0: 7}}
    steps = capture_steps(1, delta, PARTITIONS, OWNED, positions, [], {}, 0, {}, [], ROWS)
    positions[0][0] = 99  # read at the call: later changes are not in the snapshot
    taken, parts = steps_taken(steps)
    assert taken == 2
    assert parts[0].position == 7 and parts[0].cursor == {0: 7}
    assert sum(len(part.writes) for part in parts) == len(delta)
