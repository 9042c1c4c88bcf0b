"""Digests of the writes every epoch commits (styx_worker.digests): stable, per partition and tid, in
the sequencer log (records of older versions still decode), and compared on replay."""

from __future__ import annotations

import msgspec

from styx_py.core.partitioning import partition_of
from styx_py.core.wire import (
    DIGEST_BYTES,
    Manifest,
    Run,
    SeqLogEntry,
    Written,
    encode_value,
    seqlog_decoder,
)
from styx_worker.digests import Divergence, EpochWrites, digests_of, logged_digests

PARTS = {"acct": 2}
ON_0 = [k for k in ("a", "b", "c", 7) if partition_of(k, 2) == 0]
ON_1 = [k for k in ("d", 8) if partition_of(k, 2) == 1]


def test_a_digest_is_the_same_in_every_process_and_for_any_order_of_the_writes() -> None:
    # A fixed value: no salted hash() inside (a replay runs in another process).
    assert digests_of({("acct", "a"): encode_value(5)}, PARTS) == {0: bytes.fromhex("c1332084aa9f939e")}
    a, b = ON_0[0], ON_0[1]
    one = {("acct", a): encode_value(1), ("acct", b): None}
    other = {("acct", b): None, ("acct", a): encode_value(1)}
    assert digests_of(one, PARTS) == digests_of(other, PARTS)
    assert len(digests_of(one, PARTS)[0]) == DIGEST_BYTES


def test_a_delete_a_stored_none_a_value_and_a_key_type_all_digest_differently() -> None:
    k = ON_0[0]
    seen = {
        digests_of({("acct", k): None}, PARTS)[0],  # a delete (a tombstone)
        digests_of({("acct", k): encode_value(None)}, PARTS)[0],  # put(None)
        digests_of({("acct", k): encode_value(0)}, PARTS)[0],
        digests_of({("acct", 7): encode_value(0)}, PARTS)[0],
        digests_of({("acct", "7"): encode_value(0)}, {"acct": 1})[0],
    }
    assert len(seen) == 5


def test_writes_on_two_partitions_get_one_digest_each() -> None:
    w0 = {("acct", ON_0[0]): encode_value(3)}
    w1 = {("acct", ON_1[0]): encode_value(4)}
    both = digests_of({**w0, **w1}, PARTS)
    assert both == {0: digests_of(w0, PARTS)[0], 1: digests_of(w1, PARTS)[1]}


def test_an_epoch_logs_every_partition_it_owned_empty_ones_too() -> None:
    ew = EpochWrites(PARTS, None)
    ew.add(5, {("acct", ON_0[0]): encode_value(1)})
    ew.add(2, {("acct", ON_0[1]): encode_value(2)})
    assert ew.finished() is None
    [p0, p1] = ew.logged([1, 0])
    assert (p0.partition, p0.tids, p1.partition, p1.tids, p1.digests) == (0, [2, 5], 1, [], b"")
    assert p0.digests == ew.by_partition[0][2] + ew.by_partition[0][5]


def test_a_replay_finds_a_different_write_an_extra_one_and_a_missing_one() -> None:
    k0, k1 = ON_0[0], ON_1[0]
    first = EpochWrites(PARTS, None)
    first.add(1, {("acct", k0): encode_value(1)})
    first.add(4, {("acct", k1): encode_value(1)})
    logged = {0: dict(first.by_partition[0]), 1: dict(first.by_partition[1])}

    same = EpochWrites(PARTS, logged)
    same.add(1, {("acct", k0): encode_value(1)})
    same.add(4, {("acct", k1): encode_value(1)})
    assert same.finished() is None

    other = EpochWrites(PARTS, logged)
    other.add(1, {("acct", k0): encode_value(2)})
    assert other.diverged == Divergence(0, 1, logged[0][1], other.by_partition[0][1])

    extra = EpochWrites(PARTS, logged)
    extra.add(3, {("acct", k1): encode_value(9)})  # tid 3 wrote nothing on partition 1 the first time
    assert extra.diverged is not None and extra.diverged[:3] == (1, 3, None)

    missing = EpochWrites(PARTS, logged)
    missing.add(1, {("acct", k0): encode_value(1)})
    assert missing.diverged is None, "tid 4 may still commit (in the fallback)"
    assert missing.finished() == Divergence(1, 4, logged[1][4], None)

    unknown = EpochWrites(PARTS, {0: logged[0]})  # nothing logged of partition 1: not checked
    unknown.add(1, {("acct", k0): encode_value(1)})
    unknown.add(7, {("acct", k1): encode_value(7)})
    assert unknown.finished() is None


def entry(epoch: int, node: str, gen: int, written_epoch: int, written: list[Written]) -> SeqLogEntry:
    return SeqLogEntry(epoch, node, 0, [], gen, 0, 2, 2, 1, written_epoch, written)


def test_recovery_takes_the_first_digests_logged_of_each_replayed_epoch_and_owned_partition() -> None:
    d = [bytes([i]) * DIGEST_BYTES for i in range(4)]
    m = Manifest(3, 10, 2, {}, [(0, 0), (6, 1)])
    entries = [
        entry(4, "w1", 0, 3, [Written(0, [1], d[0])]),  # epoch 3: the snapshot's, not replayed
        entry(5, "w1", 0, 4, [Written(0, [3, 5], d[1] + d[2]), Written(1, [], b"")]),
        entry(6, "w2", 0, 5, [Written(1, [8], d[3])]),
        entry(6, "w1", 1, 4, [Written(0, [3], d[3])]),  # a later copy of epoch 4, partition 0
        entry(7, "w2", 1, 6, [Written(1, [8], d[3])]),  # epoch 6: after replay_until
    ]
    got = logged_digests(entries, m, 5, {0, 1})
    assert got == {4: {0: {3: d[1], 5: d[2]}, 1: {}}, 5: {1: {8: d[3]}}}
    assert logged_digests(entries, m, 5, {1}) == {4: {1: {}}, 5: {1: {8: d[3]}}}


def test_a_sequencer_log_entry_carries_the_digests_and_older_records_still_decode() -> None:
    new = entry(5, "w1", 2, 4, [Written(0, [3], b"\x01" * DIGEST_BYTES), Written(1, [], b"")])
    assert seqlog_decoder.decode(msgspec.msgpack.encode(new)) == new
    # A record of a version before the digests: the array ends after ``version``.
    older = [5, "w1", 0, [["run", 3, 0, 9, "r1"]], 2, 1, 2, 2, 1]
    out = seqlog_decoder.decode(msgspec.msgpack.encode(older))
    assert out.entries == [Run(3, 0, 9, "r1")] and (out.written_epoch, out.written) == (-1, [])
