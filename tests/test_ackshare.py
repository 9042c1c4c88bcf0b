"""Ack-share completion (worker.ackshare) over arbitrary call trees, with exact fractions."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_py.worker.ackshare import ONE, ShareCollector, split_async, split_sync

# A call tree node is the list of its outgoing calls, in program order: (is_sync, callee node).
Node = list[tuple[bool, Any]]

trees: st.SearchStrategy[Node] = st.recursive(
    st.just([]),
    lambda children: st.lists(st.tuples(st.booleans(), children), max_size=4),
    max_leaves=25,
)


def simulate(node: Node, share: Fraction, acks: list[Fraction]) -> None:
    """Exactly what worker.executor does for one invocation holding ``share``.

    Synchronous calls happen during the run, each halving the caller's current share (the callee
    gets the other half). When the invocation ends, its k asynchronous callees and the invocation
    itself each get (current share)/(k+1); the invocation acks the part it kept.
    """
    current = share
    async_children: list[Node] = []
    for is_sync, child in node:
        if is_sync:
            keep, give = split_sync(current)
            assert isinstance(keep, Fraction) and isinstance(give, Fraction)
            assert keep + give == current
            current = keep
            simulate(child, give, acks)
        else:
            async_children.append(child)
    own = split_async(current, len(async_children))
    assert isinstance(own, Fraction)
    assert own * (len(async_children) + 1) == current
    for child in async_children:
        simulate(child, own, acks)
    acks.append(own)


def count_nodes(node: Node) -> int:
    return 1 + sum(count_nodes(child) for _, child in node)


def test_split_rules_hand_worked() -> None:
    assert split_sync(Fraction(1)) == (Fraction(1, 2), Fraction(1, 2))
    assert split_sync(Fraction(1, 3)) == (Fraction(1, 6), Fraction(1, 6))
    assert split_async(Fraction(1), 0) == Fraction(1)
    assert split_async(Fraction(1), 2) == Fraction(1, 3)
    assert split_async(Fraction(1, 2), 4) == Fraction(1, 10)
    for value in (*split_sync(Fraction(1, 7)), split_async(Fraction(1, 7), 3)):
        assert type(value) is Fraction


def test_hand_worked_tree() -> None:
    # root: sync call A, then async calls B and C; A makes one async call D.
    tree: Node = [(True, [(False, [])]), (False, []), (False, [])]
    acks: list[Fraction] = []
    simulate(tree, ONE, acks)
    # A gets 1/2 and keeps 1/4 (D gets 1/4); root keeps 1/2 then splits three ways: 1/6 each.
    assert sorted(acks) == sorted(
        [Fraction(1, 4), Fraction(1, 4), Fraction(1, 6), Fraction(1, 6), Fraction(1, 6)]
    )
    c = ShareCollector()
    assert [c.add(a) for a in acks] == [False, False, False, False, True]


def test_collector_rejects_overshoot() -> None:
    c = ShareCollector()
    assert not c.add(Fraction(2, 3))
    with pytest.raises(AssertionError):
        c.add(Fraction(2, 3))


def test_collector_float_thirds_would_not_sum_to_one() -> None:
    # Why fractions: three float thirds of a third-split do not add up exactly.
    assert sum([0.1] * 10) != 1.0
    c = ShareCollector()
    results = [c.add(Fraction(1, 10)) for _ in range(10)]
    assert results == [False] * 9 + [True]
    assert type(c.total) is Fraction


@settings(max_examples=300, deadline=None)
@given(tree=trees, data=st.data())
def test_acked_shares_sum_to_one_and_complete_on_last_ack(tree: Node, data: st.DataObject) -> None:
    acks: list[Fraction] = []
    simulate(tree, ONE, acks)
    assert len(acks) == count_nodes(tree), "every invocation acks exactly once"
    assert all(type(a) is Fraction and a > 0 for a in acks)
    assert sum(acks, Fraction(0)) == ONE

    order = data.draw(st.permutations(acks), label="ack order")
    collector = ShareCollector()
    seen: list[bool] = [collector.add(a) for a in order]
    assert seen[-1] is True
    assert not any(seen[:-1]), "declared complete before the last ack"
    assert type(collector.total) is Fraction
    assert collector.total == ONE


@settings(max_examples=100, deadline=None)
@given(tree=trees, data=st.data())
def test_missing_ack_never_completes(tree: Node, data: st.DataObject) -> None:
    acks: list[Fraction] = []
    simulate(tree, ONE, acks)
    drop = data.draw(st.integers(0, len(acks) - 1), label="lost ack")
    rest = acks[:drop] + acks[drop + 1 :]
    collector = ShareCollector()
    assert not any(collector.add(a) for a in rest)
    assert collector.total < ONE


def test_shares_beyond_64_bits_cross_the_wire_exactly() -> None:
    """A chain of 100 synchronous calls halves the share 100 times: the denominator outgrows msgpack's
    64-bit integers, which once stalled such a transaction forever. Shares then travel as strings."""
    from styx_py.core.wire import HEADER_BYTES, Ack, Batch, decode_batch, encode_frame
    from styx_py.worker.ackshare import from_wire, to_wire

    share = ONE
    for _ in range(100):
        share, _given = split_sync(share)
    assert share.denominator > 2**64
    ack = Ack(1, 7, 0, *to_wire(share), 0, "", [0] * 100, 0)
    frame = encode_frame(Batch("w1", [ack]))
    [decoded] = decode_batch(frame[HEADER_BYTES:], "worker").msgs
    assert isinstance(decoded, Ack)
    assert from_wire(decoded.share_n, decoded.share_d) == share
    assert to_wire(Fraction(1, 3)) == (1, 3)  # small shares stay plain integers
