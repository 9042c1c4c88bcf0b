"""Range reads (``ctx.scan``): the range predicate and its bounds (styx_py.core.scan), the conflict rule
for scanned ranges (styx_worker.conflicts), the fallback's scan locks (styx_worker.locks) and the race
rule (styx_worker.scan), and a phantom caught end to end."""

from __future__ import annotations

import pytest

from styx_py import Context, Graph, GraphError, Operator
from styx_py.core.errors import ScanLimitExceeded
from styx_py.core.limits import MAX_SCAN_LIMIT
from styx_py.core.partitioning import partition_of
from styx_py.core.scan import SCAN_OP, ScanRange, merge, order, scan_key, scan_partition, scan_range, select
from styx_py.core.wire import Invoke, Phase, Reply, decode_value
from styx_py.testing.cluster import SimCluster, check_against_serial
from styx_worker.conflicts import EntityKey, find_conflicts
from styx_worker.locks import LockTable
from styx_worker.scan import guard_of, scan_races
from styx_worker.txn import CachedInvocation

APP = "tests.apps.index:app"
PARTS = {"acct": 4}


def k(name: str) -> EntityKey:
    return ("acct", name)


def prefix(p: str) -> ScanRange:
    return scan_range("acct", prefix=p)[0]


# ---- the range -----------------------------------------------------------------------------------------
def test_bounds_prefix_and_key_order() -> None:
    rng, rows = scan_range("acct", start="b", end="d")
    assert rows == MAX_SCAN_LIMIT
    assert [x for x in ["a", "b", "bz", "c", "d", "e"] if rng.holds(x)] == ["b", "bz", "c"]
    after = scan_range("acct", after="b", end="d")[0]
    assert not after.holds("b") and after.holds("b0")
    assert prefix("a1").holds("a1") and prefix("a1").holds("a10") and not prefix("a1").holds("a2")
    assert not prefix("1").holds(1), "a prefix selects str keys only"
    assert sorted([3, "a", 1, "B"], key=order) == [1, 3, "B", "a"], "ints first, then strs by code point"


@pytest.mark.parametrize("limit", [0, -1, MAX_SCAN_LIMIT + 1, 2.5, True])
def test_a_limit_out_of_bounds_is_named(limit: object) -> None:
    with pytest.raises(ScanLimitExceeded):
        scan_range("acct", limit=limit)  # type: ignore[arg-type]


def test_bad_bounds_are_type_errors() -> None:
    with pytest.raises(TypeError):
        scan_range("acct", start="a", after="b")
    with pytest.raises(TypeError):
        scan_range("acct", start=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        scan_range("acct", prefix=3)  # type: ignore[arg-type]


def test_select_skips_deletes_and_narrows_the_range_a_limit_cut() -> None:
    rng, _ = scan_range("acct", prefix="a")
    entries = [("a3", b"3"), ("a1", b"1"), ("a2", None), ("b1", b"9"), ("a4", b"4")]
    live, read = select(rng, 10, entries)
    assert live == [("a1", b"1"), ("a3", b"3"), ("a4", b"4")] and read == rng
    live, read = select(rng, 2, entries)
    assert live == [("a1", b"1"), ("a3", b"3")]
    assert read.holds("a3") and read.holds("a2") and not read.holds("a35"), "read up to a3, inclusive"
    assert merge([[("b", 2)], [(1, 0), ("a", 1)]], 2) == [(1, 0), ("a", 1)]


def test_the_scan_operator_name_is_reserved() -> None:
    op = Operator(SCAN_OP, partitions=1)

    @op.function
    async def f(ctx: Context) -> None:
        return None

    with pytest.raises(GraphError, match="reserved"):
        Graph("g", [op])


# ---- the conflict rule -----------------------------------------------------------------------------------
def test_a_lower_tid_insert_into_a_scanned_range_conflicts() -> None:
    assert find_conflicts({}, {1: [k("a7")]}, ranges={2: [prefix("a")]}) == [2]


def test_a_write_outside_the_range_does_not() -> None:
    assert find_conflicts({}, {1: [k("b7")]}, ranges={2: [prefix("a")]}) == []
    assert find_conflicts({}, {1: [("report", "a7")]}, ranges={2: [prefix("a")]}) == [], "another operator"


def test_a_higher_tid_insert_does_not() -> None:
    assert find_conflicts({}, {3: [k("a7")]}, ranges={2: [prefix("a")]}) == []


def test_a_delete_or_update_in_the_range_conflicts_like_an_insert() -> None:
    # Write reservations carry no value: a delete (None) and an update reserve the key alike.
    assert find_conflicts({}, {1: [k("a1")], 2: [k("zz")]}, ranges={2: [prefix("a")]}) == [2]


def test_an_aborted_writer_is_left_out() -> None:
    assert find_conflicts({}, {1: [k("a7")]}, frozenset({1}), ranges={2: [prefix("a")]}) == []


def test_an_insert_past_what_a_limit_read_does_not_conflict() -> None:
    _, read = select(prefix("a"), 1, [("a1", b"1"), ("a5", b"5")])
    assert find_conflicts({}, {1: [k("a7")]}, ranges={2: [read]}) == []
    assert find_conflicts({}, {1: [k("a0")]}, ranges={2: [read]}) == [2]


def test_a_partitions_range_holds_only_that_partitions_keys() -> None:
    """Cut short by its limit, one partition's range differs from another's: a range holding another
    partition's keys would make the conflicts depend on which partitions share a worker."""
    mine = next(n for n in (f"a{i}" for i in range(40)) if partition_of(n, 4) == 0)
    theirs = next(n for n in (f"a{i}" for i in range(40)) if partition_of(n, 4) == 1)
    rng = ScanRange("acct", None, False, None, True, "a", 0, 4)
    assert rng.holds(mine) and not rng.holds(theirs)
    assert find_conflicts({}, {1: [k(theirs)]}, ranges={2: [rng]}) == []
    assert find_conflicts({}, {1: [k(mine)]}, ranges={2: [rng]}) == [2]


# ---- the fallback's scan locks ---------------------------------------------------------------------------
def test_a_scan_waits_for_lower_writers_of_its_partition_and_higher_ones_wait_for_it() -> None:
    guard = guard_of(PARTS)
    same = [n for n in (f"a{i}" for i in range(40)) if partition_of(n, 4) == 0][:3]
    other = next(n for n in (f"a{i}" for i in range(40)) if partition_of(n, 4) == 1)
    lock: EntityKey = (SCAN_OP, scan_key("acct", 0))
    table = LockTable(
        [1, 2, 3, 4],
        {1: [k(same[0])], 2: [lock, ("report", "r")], 3: [k(same[1])], 4: [k(other)]},
        guard,
    )
    assert table.blocked(lock, 2) == lock, "the scanner waits for tid 1, which writes in partition 0"
    assert table.blocked(k(same[0]), 1) is None
    assert table.blocked(k(same[1]), 3) == lock, "tid 3 writes in the scanned partition: after the scan"
    assert table.blocked(k(other), 4) is None, "another partition is not locked"
    assert table.release(1) == [(lock, 2)]
    assert table.blocked(lock, 2) is None and table.blocked(("report", "r"), 2) is None
    assert table.release(2) == [(lock, 3)]
    assert table.blocked(k(same[1]), 3) is None


def test_without_a_scan_no_partition_lock_is_taken() -> None:
    table = LockTable([1, 2], {1: [k("a1")], 2: [k("a2")]}, guard_of(PARTS))
    assert table.blocked(k("a1"), 1) is None and table.blocked(k("a2"), 2) is None


# ---- the race rule ---------------------------------------------------------------------------------------
def cached(op: str, key: str | int, path: list[int]) -> CachedInvocation:
    inv = Invoke(0, 5, Phase.OPTIMISTIC, path, "w1", "w1", op, "f", key, b"\x90", 1, 1, False, 0, 0, "r")
    return CachedInvocation(inv, [], (1, 1))


def test_a_scan_and_an_invocation_of_an_entity_of_its_partition_race() -> None:
    key = next(n for n in (f"a{i}" for i in range(40)) if partition_of(n, 4) == 2)
    scan = cached(SCAN_OP, scan_key("acct", 2), [1, 0])  # made by the invocation at path [1]
    assert scan_races({5: [scan, cached("acct", key, [0])]}, PARTS) == {5}, "a sibling branch wrote there"
    # The scanning entity itself too: re-invoked from the cache, it and its scan run in parallel.
    assert scan_races({5: [scan, cached("acct", key, [1])]}, PARTS) == {5}
    far = next(n for n in (f"a{i}" for i in range(40)) if partition_of(n, 4) == 3)
    assert scan_races({5: [scan, cached("acct", far, [1])]}, PARTS) == set(), "another partition"
    assert scan_races({5: [scan, cached("report", key, [1])]}, PARTS) == set(), "another operator"
    assert scan_partition(scan_key("acct", 2)) == 2


# ---- a phantom, end to end -------------------------------------------------------------------------------
async def one_epoch(first: tuple[object, ...], second: tuple[object, ...]) -> tuple[Reply, Reply]:
    """``first`` then ``second`` in one epoch of a one-worker cluster (its batch takes the ingress
    partitions in order: the keys below are chosen for it, and the tids are checked)."""
    async with SimCluster(APP, workers=1, seed=3, epoch_size_max=100) as c:
        for i in (0, 1, 2, 4):
            c.submit("acct", "open_account", f"a{i}", 10)
        await c.wait()
        a, b = c.submit(*first), c.submit(*second)  # type: ignore[arg-type]
        await c.wait()
        await check_against_serial(c)
        by_id = {r.request_id: r for r in c.replies}
        ra, rb = by_id[a], by_id[b]
        assert ra.epoch == rb.epoch and ra.tid < rb.tid, "the test needs both in one epoch, in this order"
        return ra, rb


async def test_a_phantom_is_caught_the_scanner_re_runs_and_sees_the_insert() -> None:
    _, scan = await one_epoch(("acct", "open_account", "a6", 5), ("report", "total", "r0", "a"))
    assert scan.phase != Phase.OPTIMISTIC, "a lower tid inserted into the range: the scan conflicts"
    assert decode_value(scan.result) == [5, 45], "and its re-run sees the insert"


async def test_a_delete_in_the_range_is_caught_too() -> None:
    _, scan = await one_epoch(("acct", "close", "a4", "zz"), ("report", "total", "r0", "a"))
    assert scan.phase != Phase.OPTIMISTIC
    assert decode_value(scan.result) == [3, 30]


async def test_an_insert_outside_the_range_leaves_the_scan_lock_free() -> None:
    _, scan = await one_epoch(("acct", "open_account", "b1", 5), ("report", "total", "r0", "a"))
    assert scan.phase == Phase.OPTIMISTIC and decode_value(scan.result) == [4, 40]


async def test_a_higher_tid_insert_leaves_the_scan_lock_free_and_unseen() -> None:
    scan, _ = await one_epoch(("report", "total", "r4", "a"), ("acct", "open_account", "a7", 5))
    assert scan.phase == Phase.OPTIMISTIC and decode_value(scan.result) == [4, 40]
