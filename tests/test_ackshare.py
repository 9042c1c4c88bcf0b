"""Ack-share completion (worker.ackshare) over arbitrary call trees, with exact integer pairs.

``fractions.Fraction`` is the reference model: every share must equal the Fraction that exact rational
arithmetic gives, in lowest terms, and the collector must agree with a Fraction sum on every prefix."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_worker.ackshare import ONE, Share, ShareCollector, scaled, split_async, split_sync


def frac(share: Share) -> Fraction:
    return Fraction(*share)


def lowest(share: Share) -> bool:
    return frac(share).as_integer_ratio() == share


# A call tree node is the list of its outgoing calls, in program order: (is_sync, callee node).
Node = list[tuple[bool, Any]]

trees: st.SearchStrategy[Node] = st.recursive(
    st.just([]),
    lambda children: st.lists(st.tuples(st.booleans(), children), max_size=4),
    max_leaves=25,
)


def simulate(node: Node, share: Share, acks: list[Share]) -> None:
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
            assert lowest(keep) and lowest(give)
            assert frac(keep) == frac(give) == frac(current) / 2
            current = keep
            simulate(child, give, acks)
        else:
            async_children.append(child)
    own = split_async(current, len(async_children))
    assert lowest(own)
    assert frac(own) * (len(async_children) + 1) == frac(current)
    for child in async_children:
        simulate(child, own, acks)
    acks.append(own)


def count_nodes(node: Node) -> int:
    return 1 + sum(count_nodes(child) for _, child in node)


def test_split_rules_hand_worked() -> None:
    assert split_sync(ONE) == ((1, 2), (1, 2))
    assert split_sync((1, 3)) == ((1, 6), (1, 6))
    assert split_sync((2, 3)) == ((1, 3), (1, 3))
    assert split_async(ONE, 0) == ONE
    assert split_async(ONE, 2) == (1, 3)
    assert split_async((1, 2), 4) == (1, 10)
    assert split_async((3, 4), 2) == (1, 4)  # 3/4 in three parts, reduced
    assert split_async((3, 4), 1) == (3, 8)
    assert scaled((1, 6), 3) == (1, 2)
    assert scaled((1, 6), 4) == (2, 3)
    assert scaled((1, 6), 1) == (1, 6)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 10**30), d=st.integers(1, 10**30), k=st.integers(0, 1024), m=st.integers(1, 1024))
def test_splits_equal_fraction_arithmetic_in_lowest_terms(n: int, d: int, k: int, m: int) -> None:
    share = Fraction(n, d).as_integer_ratio()
    assert frac(split_async(share, k)) == Fraction(*share) / (k + 1) and lowest(split_async(share, k))
    keep, give = split_sync(share)
    assert frac(keep) == frac(give) == Fraction(*share) / 2 and lowest(keep)
    assert frac(scaled(share, m)) == Fraction(*share) * m and lowest(scaled(share, m))


def test_hand_worked_tree() -> None:
    # root: sync call A, then async calls B and C; A makes one async call D.
    tree: Node = [(True, [(False, [])]), (False, []), (False, [])]
    acks: list[Share] = []
    simulate(tree, ONE, acks)
    # A gets 1/2 and keeps 1/4 (D gets 1/4); root keeps 1/2 then splits three ways: 1/6 each.
    assert sorted(acks) == sorted([(1, 4), (1, 4), (1, 6), (1, 6), (1, 6)])
    c = ShareCollector()
    assert [c.add(a) for a in acks] == [False, False, False, False, True]


def test_collector_rejects_overshoot() -> None:
    c = ShareCollector()
    assert not c.add((2, 3))
    with pytest.raises(AssertionError):
        c.add((2, 3))
    c = ShareCollector()
    assert not c.add((1, 2))
    with pytest.raises(AssertionError):
        c.add((4, 7))  # 1/2 + 4/7 > 1 across different denominators


def test_collector_float_thirds_would_not_sum_to_one() -> None:
    # Why exact rationals: ten float tenths do not add up to 1.
    assert sum([0.1] * 10) != 1.0
    c = ShareCollector()
    results = [c.add((1, 10)) for _ in range(10)]
    assert results == [False] * 9 + [True]
    assert c.total == ONE


def test_collector_mixed_denominators() -> None:
    c = ShareCollector()
    assert [c.add(s) for s in [(1, 3), (1, 4), (1, 6), (1, 4)]] == [False, False, False, True]
    c = ShareCollector()
    assert [c.add(s) for s in [(1, 6), (2, 3), (1, 12), (1, 12)]] == [False, False, False, True]
    assert c.total == ONE


@settings(max_examples=300, deadline=None)
@given(tree=trees, data=st.data())
def test_acked_shares_sum_to_one_and_complete_on_last_ack(tree: Node, data: st.DataObject) -> None:
    acks: list[Share] = []
    simulate(tree, ONE, acks)
    assert len(acks) == count_nodes(tree), "every invocation acks exactly once"
    assert all(frac(a) > 0 for a in acks)
    assert sum(map(frac, acks), Fraction(0)) == 1

    order = data.draw(st.permutations(acks), label="ack order")
    collector = ShareCollector()
    seen: list[bool] = []
    running = Fraction(0)
    for a in order:
        seen.append(collector.add(a))
        running += frac(a)
        assert frac(collector.total) == running, "the collector's sum is the exact sum"
    assert seen[-1] is True
    assert not any(seen[:-1]), "declared complete before the last ack"
    assert collector.total == ONE


@settings(max_examples=100, deadline=None)
@given(tree=trees, data=st.data())
def test_missing_ack_never_completes(tree: Node, data: st.DataObject) -> None:
    acks: list[Share] = []
    simulate(tree, ONE, acks)
    drop = data.draw(st.integers(0, len(acks) - 1), label="lost ack")
    rest = acks[:drop] + acks[drop + 1 :]
    collector = ShareCollector()
    assert not any(collector.add(a) for a in rest)
    assert frac(collector.total) < 1


@settings(max_examples=200, deadline=None)
@given(shares=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), min_size=1, max_size=30))
def test_collector_agrees_with_fraction_sum_on_any_values(shares: list[tuple[int, int]]) -> None:
    """Exactness does not depend on the split rules: any positive rationals, reduced or not."""
    collector = ShareCollector()
    running = Fraction(0)
    for n, d in shares:
        running += Fraction(n, d)
        if running > 1:
            with pytest.raises(AssertionError):
                collector.add((n, d))
            return
        assert collector.add((n, d)) is (running == 1)
        assert frac(collector.total) == running


def test_shares_beyond_64_bits_cross_the_wire_exactly() -> None:
    """A chain of 100 synchronous calls halves the share 100 times: the denominator outgrows msgpack's
    64-bit integers, which once stalled such a transaction forever. Shares then travel as strings."""
    from styx_py.core.wire import HEADER_BYTES, Ack, Batch, decode_batch, encode_frame
    from styx_worker.ackshare import from_wire, to_wire

    share = ONE
    for _ in range(100):
        share, _given = split_sync(share)
    assert share[1] > 2**64
    ack = Ack(1, 7, 0, *to_wire(share), 0, "", [0] * 100, 0)
    frame = encode_frame(Batch("w1", [ack]))
    [decoded] = decode_batch(frame[HEADER_BYTES:], "worker").msgs
    assert isinstance(decoded, Ack)
    assert from_wire(decoded.share_n, decoded.share_d) == share
    assert to_wire((1, 3)) == (1, 3)  # small shares stay plain integers
