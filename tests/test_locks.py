"""Deterministic fallback locks (styx_worker.locks): granted strictly in tid order, never deadlocking.

The table is pure: a tid may use a key while it heads the key's queue, or reads it behind readers only
(``may_use``), and ``release`` says which tids may use each key it held now.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from styx_worker.conflicts import EntityKey
from styx_worker.locks import LockTable

K: EntityKey = ("acct", "k")
J: EntityKey = ("acct", "j")


def test_grants_in_tid_order() -> None:
    table = LockTable([5, 1, 3], {1: [K], 3: [K], 5: [K]})
    assert table.may_use(K, 1) and not table.may_use(K, 3) and not table.may_use(K, 5)
    assert table.release(1) == [(K, 3)], "release of 1 hands the key to 3, the next head"
    assert table.may_use(K, 3) and not table.may_use(K, 5), "5 still waits for 3"
    assert table.release(3) == [(K, 5)]
    assert table.release(5) == []


def test_release_names_exactly_the_new_heads() -> None:
    table = LockTable([1, 2, 3], {1: [K, J], 2: [K], 3: [J]})
    assert sorted(table.release(1)) == sorted([(K, 2), (J, 3)])
    # A tid released before its turn (final without having run here) hands nothing on.
    table = LockTable([1, 2, 3], {t: [K] for t in (1, 2, 3)})
    assert table.release(2) == []
    assert table.release(1) == [(K, 3)]


def test_readers_share_a_key_and_a_writer_takes_it_alone() -> None:
    """Keys a tid only read in the optimistic run are shared with the readers around it; a writer waits
    for every lower reader, and a reader behind a writer waits for it."""
    table = LockTable([1, 2, 3, 4, 5], {t: [K] for t in (1, 2, 3, 4, 5)}, writes_of={3: {K}})
    assert [t for t in (1, 2, 3, 4, 5) if table.may_use(K, t)] == [1, 2]
    assert table.shares(1, K) and not table.shares(3, K)
    assert table.release(2) == [], "1 still reads: the writer waits"
    assert table.release(1) == [(K, 3)]
    assert sorted(table.release(3)) == [(K, 4), (K, 5)], "both readers behind the writer go at once"


def test_without_writes_every_lock_is_exclusive_and_scans_never_share() -> None:
    scan: EntityKey = ("styx.scan", "0/acct")
    table = LockTable([1, 2], {1: [K, scan], 2: [K, scan]})
    assert table.may_use(K, 1) and not table.may_use(K, 2)
    table = LockTable([1, 2], {1: [K, scan], 2: [K, scan]}, writes_of={})
    assert table.may_use(K, 2) and not table.may_use(scan, 2)


def test_lower_tid_not_in_fallback_does_not_block() -> None:
    # Only fallback tids are queued; a key touched by 1 and 7 where just 7 re-runs is free for 7.
    table = LockTable([7], {1: [K], 7: [K]})
    assert table.may_use(K, 7)


def test_owns_key_only_for_learned_keys() -> None:
    table = LockTable([1, 2], {1: [K], 2: [J]})
    assert table.owns_key(1, K)
    assert not table.owns_key(1, J)
    assert table.owns_key(2, J)
    assert not table.owns_key(2, K)
    assert not table.owns_key(3, K), "a tid outside the fallback set owns nothing"
    assert not table.owns_key(1, ("ledger", "k")), "same key name on another operator is another key"
    table.release(1)
    assert not table.owns_key(1, K), "a released tid owns nothing"


lock_sets = st.dictionaries(
    st.integers(1, 30),
    st.lists(
        st.sampled_from([("acct", c) for c in "abcde"] + [("ledger", "a")]),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=150, deadline=None)
@given(keys_of=lock_sets, data=st.data())
def test_no_deadlock_and_no_overlap_whatever_the_order_of_finals(
    keys_of: dict[int, list[EntityKey]], data: st.DataObject
) -> None:
    """Any tid that may use all its keys may finish (the epoch machine starts its invocations then);
    finishing in any such order, every tid runs, and two tids holding a key at once, one of them to
    write it, never happens: a lower tid that touched a key a higher one uses is final first unless
    both only read it."""
    writes = {
        t: set(data.draw(st.lists(st.sampled_from(ks), unique=True), label="writes"))
        for t, ks in keys_of.items()
    }
    table = LockTable(list(keys_of), keys_of, writes_of=writes)
    waiting = set(keys_of)
    released: set[int] = set()
    while waiting:
        runnable = sorted(t for t in waiting if all(table.may_use(k, t) for k in keys_of[t]))
        assert runnable, f"deadlock: {sorted(waiting)} all wait"
        tid = data.draw(st.sampled_from(runnable), label="finishes")
        for lo, ks in keys_of.items():
            written = {k for k in set(ks) & set(keys_of[tid]) if k in writes[lo] or k in writes[tid]}
            if lo < tid and written:
                assert lo in released, (tid, lo)
        table.release(tid)
        waiting.discard(tid)
        released.add(tid)
    assert not table.held and all(not q for q in table.queues.values())
