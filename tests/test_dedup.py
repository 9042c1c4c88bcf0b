"""ReplyTable: the replies already given, per partition, bounded and snapshotted.

Pins down: a table keeps at most ``cap`` replies per partition and forgets the oldest first in
record order (a re-recorded request id counts as new), independently per partition; the delta lists
replies in record order and only those recorded ``as_delta``; a failed snapshot's replies go back in
front of the newer ones.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from styx_py.core.wire import NIL, Reply
from styx_worker.dedup import ReplyTable


def reply(request_id: str, tid: int = 0) -> Reply:
    return Reply(request_id, tid, 0, 0, "committed", NIL, None, None)


def test_get_returns_the_recorded_reply_per_partition() -> None:
    table = ReplyTable(4)
    assert table.get(0, "r1") is None
    r = reply("r1", 7)
    table.record(0, r)
    assert table.get(0, "r1") == r
    assert table.get(1, "r1") is None, "partitions do not share replies"
    table.record(0, reply("r1", 9))
    assert table.get(0, "r1") == reply("r1", 9), "the newer reply replaces the older"
    assert len(table) == 1


def test_cap_evicts_the_oldest_in_record_order() -> None:
    table = ReplyTable(2)
    table.record(0, reply("a"))
    table.record(0, reply("b"))
    table.record(0, reply("a"))  # refreshed: "b" is now the oldest
    table.record(0, reply("c"))
    assert table.get(0, "b") is None
    assert list(table.replies[0]) == ["a", "c"]
    table.record(1, reply("x"))
    assert list(table.replies[0]) == ["a", "c"], "another partition's records evict nothing here"
    assert len(table) == 3


def test_delta_ordering_and_restore_after_a_failed_snapshot() -> None:
    table = ReplyTable(10)
    table.record(0, reply("a"))
    table.record(1, reply("b"))
    table.record(0, reply("c"))
    table.record(0, reply("loaded"), as_delta=False)
    failed = table.take_delta()
    assert failed == {0: [reply("a"), reply("c")], 1: [reply("b")]}
    assert table.get(0, "loaded") == reply("loaded"), "as_delta=False still answers"
    assert table.take_delta() == {}
    table.record(0, reply("d"))
    table.record(2, reply("e"))
    table.restore_delta(failed)
    assert table.take_delta() == {
        0: [reply("a"), reply("c"), reply("d")],
        1: [reply("b")],
        2: [reply("e")],
    }


ops = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from("abcdefg"), st.integers(0, 99), st.booleans()), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 5), records=ops)
def test_table_matches_a_bounded_lru_model(cap: int, records: list[tuple[int, str, int, bool]]) -> None:
    table = ReplyTable(cap)
    model: dict[int, OrderedDict[str, Reply]] = {}
    delta: dict[int, list[Reply]] = {}
    for p, rid, tid, as_delta in records:
        r = reply(rid, tid)
        table.record(p, r, as_delta=as_delta)
        m = model.setdefault(p, OrderedDict())
        m.pop(rid, None)
        m[rid] = r
        while len(m) > cap:
            m.popitem(last=False)
        if as_delta:
            delta.setdefault(p, []).append(r)
    assert {p: list(t.items()) for p, t in table.replies.items()} == {
        p: list(m.items()) for p, m in model.items()
    }
    assert all(len(t) <= cap for t in table.replies.values())
    assert len(table) == sum(len(m) for m in model.values())
    assert table.take_delta() == delta, (
        "the delta is not bounded by the cap: every reply since the last snapshot"
    )
