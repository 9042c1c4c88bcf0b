"""Deterministic fallback locks (worker.locks): granted strictly in tid order, never deadlocking."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from styx_worker.conflicts import EntityKey
from styx_worker.locks import LockTable

K: EntityKey = ("acct", "k")
J: EntityKey = ("acct", "j")


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_grants_in_tid_order() -> None:
    table = LockTable([5, 1, 3], {1: [K], 3: [K], 5: [K]})
    order: list[int] = []

    async def take(tid: int) -> None:
        await table.acquire(K, tid)
        order.append(tid)

    t5 = asyncio.create_task(take(5))
    t3 = asyncio.create_task(take(3))
    await settle()
    assert order == [], "3 and 5 must wait for 1"
    await take(1)
    assert order == [1]
    await settle()
    assert not t3.done() and not t5.done()

    table.release(1)
    await settle()
    assert t3.done(), "release of 1 wakes 3, the next head"
    assert not t5.done(), "5 still waits for 3"
    assert order == [1, 3]

    table.release(3)
    await asyncio.wait_for(t5, 1)
    assert order == [1, 3, 5]


async def test_release_wakes_exactly_the_next_head() -> None:
    table = LockTable([1, 2, 3, 4], {t: [K] for t in (1, 2, 3, 4)})
    tasks = {t: asyncio.create_task(table.acquire(K, t)) for t in (2, 3, 4)}
    await settle()
    table.release(1)
    await settle()
    assert [t for t, task in tasks.items() if task.done()] == [2]
    table.release(2)
    await settle()
    assert [t for t, task in tasks.items() if task.done()] == [2, 3]
    table.release(3)
    await settle()
    assert all(task.done() for task in tasks.values())


async def test_lower_tid_not_in_fallback_does_not_block() -> None:
    # Only fallback tids are queued; a key touched by 1 and 7 where just 7 re-runs is free for 7.
    table = LockTable([7], {1: [K], 7: [K]})
    await asyncio.wait_for(table.acquire(K, 7), 1)


async def test_owns_key_only_for_learned_keys() -> None:
    table = LockTable([1, 2], {1: [K], 2: [J]})
    assert table.owns_key(1, K)
    assert not table.owns_key(1, J)
    assert table.owns_key(2, J)
    assert not table.owns_key(2, K)
    assert not table.owns_key(3, K), "a tid outside the fallback set owns nothing"
    assert not table.owns_key(1, ("ledger", "k")), "same key name on another operator is another key"
    table.release(1)
    assert not table.owns_key(1, K), "a released tid owns nothing"


async def test_reentrant_while_head() -> None:
    table = LockTable([1, 2], {1: [K, J], 2: [K]})
    await asyncio.wait_for(table.acquire(K, 1), 1)
    await asyncio.wait_for(table.acquire(K, 1), 1)
    await asyncio.wait_for(table.acquire(J, 1), 1)
    waiter = asyncio.create_task(table.acquire(K, 2))
    second = asyncio.create_task(table.acquire(K, 2))  # two invocations of 2 on the same key
    await settle()
    assert not waiter.done() and not second.done()
    table.release(1)
    await asyncio.wait_for(asyncio.gather(waiter, second), 1)
    assert table.is_head(K, 2)


async def test_cancel_all_cancels_waiters() -> None:
    table = LockTable([1, 2], {1: [K], 2: [K]})
    waiter = asyncio.create_task(table.acquire(K, 2))
    await settle()
    table.cancel_all()
    await settle()
    assert waiter.cancelled()


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


async def _run_to_completion(keys_of: dict[int, list[EntityKey]], orders: dict[int, list[EntityKey]]) -> None:
    table = LockTable(list(keys_of), keys_of)
    released: set[int] = set()
    holding: set[int] = set()

    async def txn(tid: int) -> None:
        for key in orders[tid]:
            await table.acquire(key, tid)
        # Holding every lock: every lower tid sharing a key has already released.
        for lo, ks in keys_of.items():
            if lo < tid and set(ks) & set(keys_of[tid]):
                assert lo in released, (tid, lo)
        for other in holding:
            assert not set(keys_of[other]) & set(keys_of[tid]), (tid, other)
        holding.add(tid)

    tasks = {tid: asyncio.create_task(txn(tid)) for tid in sorted(keys_of, reverse=True)}
    for tid in sorted(keys_of):
        await asyncio.wait_for(tasks[tid], 1)
        holding.discard(tid)
        table.release(tid)
        released.add(tid)
    assert all(t.done() and t.exception() is None for t in tasks.values())
    assert not table.held and all(not q for q in table.queues.values())


@settings(max_examples=150, deadline=None)
@given(keys_of=lock_sets, data=st.data())
def test_no_deadlock_releasing_in_tid_order(keys_of: dict[int, list[EntityKey]], data: st.DataObject) -> None:
    # Each transaction takes its locks in an arbitrary order (its invocations run in any order).
    orders = {
        tid: list(data.draw(st.permutations(keys), label=f"order {tid}")) for tid, keys in keys_of.items()
    }
    asyncio.run(_run_to_completion(keys_of, orders))
