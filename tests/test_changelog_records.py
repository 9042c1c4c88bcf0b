"""The changelog's records (styx_py/core/changelog.py): encoding, commit order, positions, skipping
what a partition holds already, and the table a read from the start rebuilds (pure, no services)."""

from __future__ import annotations

import msgspec
import pytest

from styx_py.core.changelog import (
    ChangeRecord,
    change_decoder,
    encode_change,
    entity_key,
    records_of,
    table_of,
)
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import NIL, Phase, decode_value, encode_value

PARTITIONS = {"acct": 1, "other": 1}  # one partition: every record lands on partition 0


def test_a_record_round_trips_and_keeps_put_none_apart_from_a_delete() -> None:
    put = ChangeRecord(
        "acct", "k1", msgspec.Raw(encode_value({"a": [1, 2]})), False, 7, Phase.FALLBACK, 41, 3
    )
    none = ChangeRecord("acct", 5, msgspec.Raw(encode_value(None)), False, 7, Phase.OPTIMISTIC, 9, 0)
    gone = ChangeRecord("acct", 5, NIL, True, 8, Phase.SERIAL, 12, 0)
    for r in (put, none, gone):
        back = change_decoder.decode(encode_change(r))
        assert back == r
        assert back.position == (r.epoch, r.index)
    assert put.decoded() == {"a": [1, 2]}
    assert none.decoded() is None and not none.deleted
    assert gone.decoded() is None and gone.deleted
    # The value is embedded as the state's msgpack: a plain msgpack reader sees it as a nested value.
    plain = msgspec.msgpack.decode(encode_change(put))
    assert plain == ["acct", "k1", {"a": [1, 2]}, False, 7, 1, 41, 3]
    # Kafka key: the entity, the same bytes for the same entity whatever the record.
    assert entity_key("acct", "k1") == msgspec.msgpack.encode(["acct", "k1"])
    assert entity_key("acct", 5) != entity_key("acct", "5")


def test_records_follow_phase_then_tid_and_one_transactions_writes_are_sorted() -> None:
    v = encode_value
    commits = [
        (Phase.SERIAL, 2, {("acct", "z"): v(1)}),
        (Phase.FALLBACK, 30, {("acct", "b"): v(2)}),
        (Phase.OPTIMISTIC, 50, {("acct", "y"): None, ("acct", "a"): v(3), ("other", 1): v(4)}),
        (Phase.OPTIMISTIC, 10, {("acct", "c"): v(5)}),
    ]
    records = records_of(4, commits, PARTITIONS)
    assert list(records) == [0]
    got = [(r.phase, r.tid, r.operator, r.key, r.deleted, r.index, r.epoch) for r in records[0]]
    one_txn = sorted([("acct", "y"), ("acct", "a"), ("other", 1)], key=lambda k: entity_key(*k))
    assert got == [
        (Phase.OPTIMISTIC, 10, "acct", "c", False, 0, 4),
        *[(Phase.OPTIMISTIC, 50, op, k, k == "y", i + 1, 4) for i, (op, k) in enumerate(one_txn)],
        (Phase.FALLBACK, 30, "acct", "b", False, 4, 4),
        (Phase.SERIAL, 2, "acct", "z", False, 5, 4),
    ]
    # The input's order does not matter (a fallback commits in lock order, not tid order).
    assert records_of(4, list(reversed(commits)), PARTITIONS) == records


def test_records_go_to_their_entitys_partition_with_an_index_per_partition() -> None:
    parts = {"acct": 4}
    keys = [f"k{i}" for i in range(12)]
    commits = [(Phase.OPTIMISTIC, tid, {("acct", k): encode_value(tid)}) for tid, k in enumerate(keys)]
    records = records_of(0, commits, parts)
    assert sorted(records) == sorted({partition_of(k, 4) for k in keys})
    for p, part in records.items():
        assert [r.index for r in part] == list(range(len(part)))
        assert all(partition_of(r.key, 4) == p for r in part)
        assert [r.tid for r in part] == sorted(r.tid for r in part)


def test_records_at_or_below_a_partitions_tail_are_skipped() -> None:
    commits = [(Phase.OPTIMISTIC, t, {("acct", f"k{t}"): encode_value(t)}) for t in range(5)]
    whole = records_of(9, commits, PARTITIONS)[0]
    # The changelog ends at the third record of epoch 9: only the last two go out, unchanged.
    assert records_of(9, commits, PARTITIONS, {0: (9, 2)}) == {0: whole[3:]}
    assert records_of(9, commits, PARTITIONS, {0: (9, 4)}) == {}  # all there already
    assert records_of(9, commits, PARTITIONS, {0: (8, 100)}) == {0: whole}  # an older epoch's tail
    assert records_of(9, commits, PARTITIONS, {1: (10, 0)}) == {0: whole}  # another partition's


def test_the_table_is_the_latest_record_per_entity() -> None:
    v = encode_value
    epochs = [
        [(Phase.OPTIMISTIC, 1, {("acct", "a"): v(1), ("acct", "b"): v(2)})],
        [(Phase.OPTIMISTIC, 4, {("acct", "a"): None}), (Phase.FALLBACK, 7, {("acct", "b"): v(None)})],
        [(Phase.OPTIMISTIC, 9, {("acct", "c"): v([1])}), (Phase.OPTIMISTIC, 11, {("acct", "c"): v([2])})],
    ]
    log = [r for e, commits in enumerate(epochs) for r in records_of(e, commits, PARTITIONS)[0]]
    assert table_of(log) == {("acct", "b"): None, ("acct", "c"): [2]}
    assert table_of(log[:2]) == {("acct", "a"): 1, ("acct", "b"): 2}
    assert decode_value(log[-1].value) == [2]


@pytest.mark.parametrize("bad", ["duplicate", "gap", "swap"])
def test_the_simulations_check_names_a_duplicate_a_gap_and_a_reordering(bad: str) -> None:
    from styx_benchmarks.bank import app
    from styx_py.core.wire import Reply, ReplyStatus
    from styx_py.testing.changelog import check_changelog, expected_changelog

    commits = []
    for tid in range(1, 9):
        reply = Reply(f"r{tid}", tid, tid // 3, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, NIL, None, None)
        commits.append((reply, {("account", f"a{tid % 3}"): encode_value(tid)}))
    expected = expected_changelog(commits, lambda _: app)
    topic = [list(expected.get(p, [])) for p in range(4)]
    state = table_of(r for part in topic for r in part)
    check_changelog(0, topic, commits, lambda _: app, state)  # the right log passes
    p = next(p for p, part in enumerate(topic) if len(part) >= 2)
    if bad == "duplicate":
        topic[p].insert(1, topic[p][1])
    elif bad == "gap":
        del topic[p][0]
    else:
        topic[p][0], topic[p][1] = topic[p][1], topic[p][0]
    with pytest.raises(AssertionError, match=f"changelog partition {p} differs"):
        check_changelog(0, topic, commits, lambda _: app, state)


def test_the_example_view_applies_each_position_once_and_filters_by_operator() -> None:
    from styx_benchmarks.changelog_view import ChangelogView

    v = encode_value
    part = records_of(
        3,
        [
            (Phase.OPTIMISTIC, 1, {("acct", "a"): v(5), ("other", "x"): v(1)}),
            (Phase.OPTIMISTIC, 2, {("acct", "b"): v(7)}),
            (Phase.FALLBACK, 3, {("acct", "a"): None}),
        ],
        PARTITIONS,
    )[0]
    view = ChangelogView("acct")
    view.apply(0, part[:3])
    assert view.table == {("acct", "a"): 5, ("acct", "b"): 7} and view.total() == 12
    view.apply(0, part[1:])  # a record seen already changes nothing; the delete does
    assert view.table == {("acct", "b"): 7}
    assert view.positions == {0: part[-1].position} and view.newest_epoch == 3
    everything = ChangelogView()
    everything.apply(0, part)
    assert everything.table == table_of(part) == {("acct", "b"): 7, ("other", "x"): 1}
