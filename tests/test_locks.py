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


def reference_front(queue: list[int], writes: dict[int, set[EntityKey]], key: EntityKey) -> list[int]:
    """The tids that may use ``key``, by the rule itself: its head, or the readers ahead of its first
    writer (the queue walked every time)."""
    front: list[int] = []
    for t in queue:
        if key in writes[t]:
            return front or [t]
        front.append(t)
    return front


@settings(max_examples=200, deadline=None)
@given(keys_of=lock_sets, data=st.data())
def test_the_table_answers_as_the_rule_walked_over_the_queue_whatever_is_released(
    keys_of: dict[int, list[EntityKey]], data: st.DataObject
) -> None:
    """``may_use`` and ``release`` answer in constant and logarithmic time without walking a queue;
    against the rule applied to the queue as it stands, for every key and tid, after releases in any
    order (a tid may be final without having used its keys: aborted by a call elsewhere)."""
    writes = {
        t: set(data.draw(st.lists(st.sampled_from(ks), unique=True), label="writes"))
        for t, ks in keys_of.items()
    }
    table = LockTable(list(keys_of), keys_of, writes_of=writes)
    queues = {k: sorted(t for t, ks in keys_of.items() if k in ks) for ks in keys_of.values() for k in ks}
    live = sorted(keys_of)
    while live:
        for key, queue in queues.items():
            front = reference_front(queue, writes, key)
            assert [t for t in queue if table.may_use(key, t)] == front, (key, queue)
            assert not any(table.may_use(key, t) for t in keys_of if t not in queue)
        tid = data.draw(st.sampled_from(live), label="released")
        before = {k: reference_front(q, writes, k) for k, q in queues.items()}
        for q in queues.values():
            if tid in q:
                q.remove(tid)
        expected = sorted(
            (k, t) for k, q in queues.items() for t in reference_front(q, writes, k) if t not in before[k]
        )
        assert sorted(table.release(tid)) == expected, tid
        live.remove(tid)


def test_a_thousand_readers_of_one_key_cost_no_walk_of_its_queue() -> None:
    """TPC-C with one warehouse: every fallback transaction reads the warehouse's part. The table asks
    each tid's place in O(1) and hands a key on in O(log n) plus what it grants, so a thousand readers
    released one by one make a few comparisons each (counted, not timed), not a walk of the queue each."""
    n = 1000
    hot: EntityKey = ("warehouse", 1)
    keys_of = {t: [hot, ("district", t % 10)] for t in range(1, n + 1)}
    writes = {t: {("district", t % 10)} for t in keys_of}
    table = LockTable(list(keys_of), keys_of, writes_of=writes)
    compared = 0

    class Counted(int):
        def __lt__(self, other: object) -> bool:
            nonlocal compared
            compared += 1
            return int(self) < int(other)  # type: ignore[call-overload]

        def __eq__(self, other: object) -> bool:
            nonlocal compared
            compared += 1
            return int(self) == other

        __hash__ = int.__hash__

    table.queues[hot] = [Counted(t) for t in table.queues[hot]]
    assert all(table.may_use(hot, t) for t in keys_of), "readers only: every one may read at once"
    for t in range(n, 0, -1):  # the highest first: the worst order for a walk from the head
        table.release(t)
    assert compared <= 20 * n, compared  # a walk of the queue per release: ~n * n / 2
