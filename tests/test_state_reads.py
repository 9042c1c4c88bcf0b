"""Consistent reads of committed state outside transactions (``client.scan``, ``styx state``,
``GET /v1/state/{operator}``): one epoch's cut across every partition, from the workers' memory.

The pure parts first (the window of versions, one worker's answer, the coordinator's merge), then the
whole path in the simulation: YCSB-T transfers run while scans page through the accounts, and every
scan must sum to the conserved total and equal the serial execution's state at its epoch.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import styx_worker.window
from styx_coordinator.reads import merge_page, share
from styx_py.core.errors import EpochOutOfWindow, StateReadRefused, Unavailable
from styx_py.core.partitioning import Key, partition_of
from styx_py.core.scan import ScanRange, order
from styx_py.core.serial import Writes
from styx_py.core.wire import AdminReply, PartRows, ReadAt, ReadState, Reply, decode_value, encode_value
from styx_py.io import stateread
from styx_py.testing.cluster import SimCluster, serial_replay
from styx_py.testing.reads import sim_reads
from styx_worker.state import StateStore
from styx_worker.window import VersionWindow, read_at

BANK = "styx_benchmarks.bank:app"
ACCOUNTS, INITIAL = 40, 1000


def _v(x: Any) -> bytes:
    return encode_value(x)


def _read(epoch: int, partitions: list[int], n: int = 2, rows: int = 100, **bounds: Any) -> ReadAt:
    rng = ScanRange("acct", bounds.get("low"), False, bounds.get("high"), True, bounds.get("prefix"), -1, n)
    return ReadAt(1, 0, epoch, rng, rows, partitions)


def _rows(answer: Any) -> dict[Key, Any]:
    parts = answer.parts
    return {k: decode_value(v) for p in parts for k, v in zip(p.keys, p.values_list(), strict=True)}


def test_a_read_as_of_an_epoch_sees_neither_later_epochs_nor_the_one_in_progress() -> None:
    window = VersionWindow(10)
    store = StateStore(window=window)
    store.apply({("acct", "a"): _v(1), ("acct", "b"): _v(2)}, 0)
    store.apply({("acct", "a"): _v(5), ("acct", "c"): _v(3)}, 1)
    store.apply({("acct", "b"): None}, 1)
    store.apply({("acct", "a"): _v(9)}, 2)  # epoch 2 in progress: one of its writes applied
    every = [0, 1]

    def at(epoch: int) -> dict[Key, Any]:
        return _rows(read_at(_read(epoch, every), "w1", store, window, 1, lambda p: True))

    assert at(1) == {"a": 5, "c": 3}
    assert at(0) == {"a": 1, "b": 2}
    assert at(-1) == {}
    behind = read_at(_read(2, every), "w1", store, window, 1, lambda p: True)
    assert behind.code == "unavailable", "an epoch not finished here is not answered"
    moved = read_at(_read(1, every), "w1", store, window, 1, lambda p: p == 0)
    assert moved.code == "unavailable", "a partition this worker does not own is not answered"


def test_the_window_keeps_only_its_epochs_and_restarts_after_a_restore() -> None:
    window = VersionWindow(3)
    store = StateStore(window=window)
    for e in range(10):
        store.apply({("acct", "a"): _v(e)}, e)
    assert sorted(window.before) == [7, 8, 9], "the versions of older epochs are dropped"
    old = read_at(_read(5, [0, 1]), "w1", store, window, 9, lambda p: True)
    assert old.code == "out-of-window" and old.oldest == 7
    assert _rows(read_at(_read(7, [0, 1]), "w1", store, window, 9, lambda p: True)) == {"a": 7}
    window.restart(9)
    assert not window.before
    assert read_at(_read(8, [0, 1]), "w1", store, window, 9, lambda p: True).code == "out-of-window"
    assert _rows(read_at(_read(9, [0, 1]), "w1", store, window, 9, lambda p: True)) == {"a": 9}


def test_inserts_and_deletes_after_the_key_order_was_built_are_seen_at_the_right_epochs() -> None:
    window = VersionWindow(10)
    store = StateStore(window=window)
    store.apply({("acct", k): _v(k) for k in ("a", "b", "c", 5)}, 0)

    def at(epoch: int, completed: int, **bounds: Any) -> list[Key]:
        answer = read_at(_read(epoch, [0, 1], **bounds), "w1", store, window, completed, lambda p: True)
        return sorted(_rows(answer), key=lambda k: (isinstance(k, str), k))

    assert at(0, 0) == [5, "a", "b", "c"]  # builds the key order
    store.apply({("acct", "b"): None}, 1)
    store.apply({("acct", "d"): _v("d")}, 1)
    store.apply({("acct", "b"): _v("b2")}, 1)  # deleted and inserted again in one epoch
    store.apply({("acct", "c"): None}, 1)
    assert at(0, 1) == [5, "a", "b", "c"], "the entities deleted since are read as they were"
    assert at(1, 1) == [5, "a", "b", "d"]
    assert at(0, 1, low="a", prefix="") == ["a", "b", "c"]
    assert at(1, 1, high="c") == [5, "a", "b"]
    store.apply({("acct", "a"): None, ("acct", "e"): _v("e")}, 2)
    assert at(1, 2) == [5, "a", "b", "d"] and at(2, 2) == [5, "b", "d", "e"]
    assert at(0, 2, prefix="c") == ["c"] and at(2, 2, prefix="c") == []


def test_one_partitions_answer_is_bounded_by_its_rows_and_ordered_by_key() -> None:
    window = VersionWindow(5)
    store = StateStore(window=window)
    store.apply({("acct", k): _v(i) for i, k in enumerate(["k3", "k1", 7, "k2", "j"])}, 0)
    store.apply({("other", "k0"): _v(0)}, 0)
    answer = read_at(_read(0, [0, 1], n=1, rows=2, prefix="k"), "w1", store, window, 0, lambda p: True)
    (part,) = [p for p in answer.parts if p.keys]
    assert part.keys == ["k1", "k2"] and part.more


@pytest.mark.parametrize("seed", range(40))
def test_answers_and_pages_equal_the_state_at_their_epoch_by_a_model(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random inserts, updates and deletes over epochs (int and str keys, two prefixes), then reads at
    random epochs with random bounds, row counts and byte budgets: each partition's answer is the
    first rows of the model's state at that epoch in the range, in key order, cut at the budget
    (always one row), ``more`` exactly when a row was left out; the merged pages of a whole scan hold
    the model's rows in order, each once."""
    rnd = random.Random(seed)
    n, epochs = rnd.choice([1, 2, 4]), 12
    window = VersionWindow(epochs)
    store = StateStore(window=window)
    keys: list[Key] = [*range(30), *(f"a{i}" for i in range(40)), *(f"b{i}" for i in range(40))]
    model: dict[Key, bytes] = {}
    states: list[dict[Key, bytes]] = []
    for e in range(epochs):
        writes: dict[tuple[str, Key], bytes | None] = {}
        for k in rnd.sample(keys, rnd.randint(0, 40)):
            writes[("acct", k)] = None if rnd.random() < 0.3 else _v("x" * rnd.randint(0, 30))
        if e == 3:
            store.index.keys("acct", 0, n, store.data)  # built from here on: kept in place by commits
        store.apply(writes, e)
        for (_, k), v in writes.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        states.append(dict(model))
    for _ in range(30):
        e = rnd.randrange(epochs)
        low = rnd.choice([None, rnd.choice(keys)])
        high = rnd.choice([None, rnd.choice(keys)])
        prefix = rnd.choice([None, None, "a", "b", "a1"])
        rng = ScanRange("acct", low, rnd.random() < 0.5, high, True, prefix, -1, n)
        rows, budget = rnd.choice([1, 3, 10, 200]), rnd.choice([10_000_000, 60, 5])
        want = sorted((k for k in states[e] if rng.holds(k)), key=order)
        msg = ReadAt(1, 0, e, rng, rows, list(range(n)))
        monkeypatch.setattr(styx_worker.window, "MAX_READ_BYTES", budget)
        answer = read_at(msg, "w1", store, window, epochs - 1, lambda p: True)
        left = budget
        for part in answer.parts:
            mine = [k for k in want if partition_of(k, n) == part.partition]
            got = [k for k in mine if k in part.keys]
            assert part.keys == mine[: len(part.keys)] == got, (seed, e, rng)
            sizes = [len(states[e][k]) for k in part.keys]
            assert [bytes(v) for v in part.values_list()] == [states[e][k] for k in part.keys]
            assert len(part.keys) <= rows and (len(part.keys) >= 1 or not mine)
            if len(part.keys) < min(rows, len(mine)):  # cut by the budget: the next row did not fit
                assert sum(sizes) + len(states[e][mine[len(part.keys)]]) > max(left, 0) or not part.keys
            assert part.more == (len(part.keys) < len(mine)), (seed, e, rng, rows)
            left -= sum(sizes)
        monkeypatch.setattr(styx_worker.window, "MAX_READ_BYTES", 10_000_000)
        scan_rng = ScanRange("acct", low, rng.low_open, high, True, prefix, -1, n)
        got_all: list[Key] = []
        after: Key | None = None
        for _ in range(len(want) + 2):
            r = scan_rng if after is None else ScanRange("acct", after, True, high, True, prefix, -1, n)
            ask = ReadAt(1, 0, e, r, share(rows, n), list(range(n)))
            page = read_at(ask, "w1", store, window, epochs - 1, lambda p: True)
            page_keys, values, after = merge_page(page.parts, rows)
            assert [bytes(v) for v in values] == [states[e][k] for k in page_keys]
            got_all += page_keys
            if after is None:
                break
        assert got_all == want, (seed, e, rng, rows)


def test_a_page_ends_where_every_partition_is_known() -> None:
    def part(p: int, keys: list[Key], more: bool) -> PartRows:
        return PartRows.of(p, keys, [_v(k) for k in keys], more)

    # Partition 1 was cut at "c": past it its rows are unknown, so the page stops at "c".
    keys, values, after = merge_page([part(0, ["a", "d", "e"], False), part(1, ["b", "c"], True)], 10)
    assert keys == ["a", "b", "c"] and after == "c"
    assert [decode_value(v) for v in values] == keys, "each value stays with its key"
    keys, _, after = merge_page([part(0, ["a", "d"], False), part(1, ["b"], False)], 2)
    assert keys == ["a", "b"] and after == "b"
    keys, _, after = merge_page([part(0, [1, "a"], False), part(1, [], False)], 5)
    assert keys == [1, "a"] and after is None, "int keys come before str keys"
    keys, values, after = merge_page([part(0, [2, "b"], False), part(1, [1, "a", "c"], True)], 5)
    assert keys == [1, 2, "a", "b", "c"] and after == "c"
    assert [decode_value(v) for v in values] == keys


@pytest.mark.parametrize(("n", "limit"), [(4, 1000), (4, 100), (3, 7), (8, 160), (2, 40), (1, 20)])
def test_pages_of_shares_hold_every_key_once_in_order_and_read_little_more_than_they_return(
    n: int, limit: int
) -> None:
    """Each partition is asked for its share of a page (a little over limit/n): the pages still hold
    every key once, in order, few more pages than full ones would take, and (for shares of 20 rows and
    more) the partitions read at most 1.5x the rows the pages return."""
    keys = sorted([f"user{i}" for i in range(2_000)] + list(range(300)), key=order)
    parts: dict[int, list[Key]] = {p: [] for p in range(n)}
    for k in keys:
        parts[partition_of(k, n)].append(k)
    quota = share(limit, n)
    got: list[Key] = []
    after: Key | None = None
    pages = read = 0
    while True:
        answers = []
        for p, ks in parts.items():
            left = [k for k in ks if after is None or order(k) > order(after)]
            answers.append(PartRows.of(p, left[:quota], [_v(0)] * len(left[:quota]), len(left) > quota))
            read += len(answers[-1].keys)
        page, _, after = merge_page(answers, limit)
        pages += 1
        got += page
        if after is None:
            break
    assert got == keys
    assert pages <= 1.3 * len(keys) / limit + 1, f"{pages} pages of {limit} for {len(keys)} keys"
    if limit / n >= 20:
        assert read <= 1.5 * len(keys) + n * quota, f"{read} rows read for {len(keys)}"


def test_a_cursor_carries_the_epoch_and_the_key() -> None:
    for epoch, key in ((0, "acct7"), (12345, -3), (7, "ü/ß")):
        assert stateread.from_cursor(stateread.to_cursor(epoch, key)) == (epoch, key)
    with pytest.raises(ValueError, match="not a state cursor"):
        stateread.from_cursor("%%%")


# ---- the whole path, in the simulation ---------------------------------------------------------------


def _states_by_epoch(commits: list[tuple[Reply, Writes]], epochs: set[int]) -> dict[int, dict[Key, Any]]:
    """The serial execution's ``account`` state as of each of ``epochs``."""
    state: dict[Key, Any] = {}
    out: dict[int, dict[Key, Any]] = {}
    pending = sorted(epochs)
    for reply, writes in commits:
        while pending and reply.epoch > pending[0]:
            out[pending.pop(0)] = dict(state)
        for (op, key), value in writes.items():
            if op == "account":
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = decode_value(value)
    for e in pending:
        out[e] = dict(state)
    return out


async def _scan(source: stateread.ReadSource, page_size: int, **kw: Any) -> tuple[int, dict[Key, Any], int]:
    """One scan by pages: its epoch, its rows and how many pages it took."""
    rows: dict[Key, Any] = {}
    epoch, pages = -2, 0
    async for page in stateread.scan(source, "account", page_size=page_size, **kw):
        assert epoch in (-2, page.epoch), "every page of one scan reads the same epoch"
        epoch, pages = page.epoch, pages + 1
        for k, v in page.rows:
            assert k not in rows, f"{k} on two pages"
            rows[k] = v
    return epoch, rows, pages


async def test_a_paced_scan_asks_each_page_only_once_its_rows_so_far_fit_the_rate() -> None:
    names = [f"acct{i}" for i in range(ACCOUNTS)]
    async with SimCluster(BANK, workers=2, seed=3) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        source, loop = sim_reads(c.network), asyncio.get_running_loop()
        fast = await _scan(source, page_size=7)
        times: list[tuple[float, int]] = []
        t0 = loop.time()
        async for page in stateread.scan(source, "account", page_size=7, rows_per_s=4.0):
            times.append((loop.time() - t0, len(page.rows)))
        # virtual time: the cluster answers at once, so every wait is the pacing's own
        read = 0
        for at, n in times:
            assert at >= read / 4.0, f"a page asked at {at:.2f} s after {read} rows (4 rows/s)"
            read += n
        assert read == ACCOUNTS and len(times) == fast[2] > 2
        with pytest.raises(ValueError, match="rows_per_s"):
            await _scan(source, page_size=7, rows_per_s=0)


@pytest.mark.parametrize("seed", [45, 46, 47])
async def test_scans_while_transfers_run_sum_to_the_total_and_equal_the_serial_state_at_their_epoch(
    seed: int,
) -> None:
    await scans_while_transfers_run(seed)


async def scans_while_transfers_run(seed: int) -> None:
    """50 scans by pages of 3-40 rows while transfers commit (also ``python -m tests.sweep reads``)."""
    rng = random.Random(seed)
    names = [f"acct{i}" for i in range(ACCOUNTS)]
    async with SimCluster(BANK, workers=3, seed=seed, epoch_size_max=20) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        source = sim_reads(c.network)
        scans: list[tuple[int, dict[Key, Any]]] = []
        moved_on = 0  # scans during whose pages the cluster committed more epochs
        for _ in range(50):
            for _ in range(15):
                src, dst = rng.sample(names, 2)
                c.submit("account", "transfer", src, dst, rng.randint(1, 50))
            async with asyncio.timeout(60):
                epoch, rows, pages = await _scan(source, page_size=rng.choice([3, 7, 40]))
            assert sum(rows.values()) == ACCOUNTS * INITIAL, f"scan at epoch {epoch}: money not conserved"
            assert sorted(rows) == sorted(names)
            moved_on += c.coordinator.epochs.epoch - 1 > epoch and pages > 1
            scans.append((epoch, rows))
        await c.wait()
        # Each scan again, by its epoch, now that many more epochs committed: the same rows.
        for epoch, rows in scans[-10:]:
            again = await _scan(source, page_size=11, as_of_epoch=epoch)
            assert again[:2] == (epoch, rows), f"an as-of read of epoch {epoch} changed"
        one = scans[-1]
        key = names[3]
        got = await stateread.read_value(source, "account", key, one[0])
        assert got == (one[0], True, one[1][key])
        assert (await stateread.read_value(source, "account", "nobody", one[0]))[1:] == (False, None)
        commits: list[tuple[Reply, Writes]] = []
        await serial_replay(c.graph_at, c.requests, c.sent.unique_replies(), commits)
    serial = _states_by_epoch(commits, {e for e, _ in scans})
    for epoch, rows in scans:
        assert rows == serial[epoch], f"the scan at epoch {epoch} differs from the serial state then"
    assert len({e for e, _ in scans}) > 10, "the scans should see many epochs"
    assert moved_on > 0, "no scan's pages spanned committed epochs: the cut was never tested"


async def test_an_epoch_past_the_window_or_before_a_recovery_is_refused_by_name() -> None:
    names = [f"acct{i}" for i in range(8)]
    async with SimCluster(BANK, workers=2, seed=3, state_window_epochs=4, snapshot_interval_epochs=2) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        source = sim_reads(c.network)
        first, _, _ = await _scan(source, page_size=100)
        for i in range(30):  # one epoch each: the window moves past ``first``
            c.submit("account", "transfer", names[i % 8], names[(i + 1) % 8], 1)
            await c.wait()
        with pytest.raises(EpochOutOfWindow, match="older than the oldest epoch kept") as caught:
            await _scan(source, page_size=100, as_of_epoch=first)
        assert caught.value.oldest > first
        latest = c.coordinator.epochs.epoch - 1
        with pytest.raises(StateReadRefused) as ahead:
            await stateread.read_value(source, "account", names[0], latest + 5)
        assert ahead.value.code == "not-committed"
        with pytest.raises(StateReadRefused) as unknown:
            await stateread.read_page(source, ReadState("nope"))
        assert unknown.value.code == "unknown-operator"


async def test_after_a_recovery_the_window_restarts_at_the_restored_snapshot() -> None:
    names = [f"acct{i}" for i in range(8)]
    async with SimCluster(BANK, workers=2, seed=5, snapshot_interval_epochs=2) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        source = sim_reads(c.network)
        before, rows_before, _ = await _scan(source, page_size=100)
        for i in range(10):  # one epoch each, with snapshots after ``before``
            c.submit("account", "transfer", names[i % 8], names[(i + 3) % 8], 1)
            await c.wait()
        assert (await _scan(source, page_size=5, as_of_epoch=before))[1] == rows_before
        c.crash("w1")
        for i in range(10):
            c.submit("account", "transfer", names[i % 8], names[(i + 5) % 8], 2)
        await c.wait()
        assert c.coordinator.recoveries >= 1
        # Every worker restored the snapshot: the versions before it are gone, and an older epoch is
        # refused by name, never answered with a newer state.
        oldest = min(w.core.epochs.window.floor for w in c.workers)
        assert before < oldest
        with pytest.raises(EpochOutOfWindow):
            await _scan(source, page_size=100, as_of_epoch=before)
        at, rows_at, _ = await _scan(source, page_size=3, as_of_epoch=oldest)
        assert at == oldest and sum(rows_at.values()) == 8 * INITIAL
        now, rows_now, _ = await _scan(source, page_size=3)
        assert now > oldest and sum(rows_now.values()) == 8 * INITIAL


async def test_scans_across_a_partition_move_stay_whole_and_the_window_restarts() -> None:
    rng = random.Random(7)
    names = [f"acct{i}" for i in range(16)]
    async with SimCluster(BANK, workers=2, seed=7, epoch_size_max=10) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        source = sim_reads(c.network)
        before, _, _ = await _scan(source, page_size=100)
        for i in range(3):  # epochs after ``before``, ahead of the move
            c.submit("account", "transfer", names[i], names[i + 1], 1)
            await c.wait()
        c.add_worker("w3")
        for _ in range(12):  # transfers and scans while the partitions move
            for _ in range(5):
                src, dst = rng.sample(names, 2)
                c.submit("account", "transfer", src, dst, rng.randint(1, 9))
            _, rows, _ = await _scan(source, page_size=5)
            assert sum(rows.values()) == 16 * INITIAL and len(rows) == 16
        await c.wait()
        assert "w3" in c.coordinator.cluster.placement and c.coordinator.recoveries == 0
        floors = [w.core.epochs.window.floor for w in c.workers]
        assert min(floors) > before, "the move restarts every worker's window"
        with pytest.raises(EpochOutOfWindow):
            await _scan(source, page_size=100, as_of_epoch=before)


@pytest.mark.parametrize("seed", range(61, 69))
async def test_scans_under_worker_crashes_are_right_or_refused_never_wrong(seed: int) -> None:
    """Workers crash (and restore from snapshots) while scans page: a scan either sums to the total
    and equals the serial state at its epoch, or is refused by name (its epoch fell out of a restarted
    window, or the cluster was recovering past the retries); it never returns another state."""
    await scans_under_worker_crashes(seed)


async def scans_under_worker_crashes(seed: int) -> None:
    """The scenario of the test above, one seed (also ``python -m tests.sweep read-crashes``)."""
    rng = random.Random(seed)
    names = [f"acct{i}" for i in range(24)]
    async with SimCluster(
        BANK, workers=3, seed=seed, epoch_size_max=10, snapshot_interval_epochs=3, epoch_timeout_ms=300
    ) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        source = sim_reads(c.network)
        base = c.network.delivered
        for _ in range(3):
            node = rng.choice(["w1", "w2", "w3"])
            c.network.faults.at(base + rng.randint(50, 3000), lambda node=node: c.crash(node))
        scans: list[tuple[int, dict[Key, Any]]] = []
        refused = 0
        for _ in range(30):
            for _ in range(8):
                src, dst = rng.sample(names, 2)
                c.submit("account", "transfer", src, dst, rng.randint(1, 30))
            try:
                async with asyncio.timeout(120):
                    epoch, rows, _ = await _scan(source, page_size=rng.choice([4, 9]))
            except (EpochOutOfWindow, Unavailable):
                refused += 1
                continue
            assert sum(rows.values()) == len(names) * INITIAL, f"seed {seed}: scan at epoch {epoch}"
            scans.append((epoch, rows))
        await c.wait(timeout_s=120)
        assert c.coordinator.recoveries >= 1, "no crash hit the run"
        commits: list[tuple[Reply, Writes]] = []
        await serial_replay(c.graph_at, c.requests, c.sent.unique_replies(), commits)
    serial = _states_by_epoch(commits, {e for e, _ in scans})
    for epoch, rows in scans:
        assert rows == serial[epoch], f"seed {seed}: the scan at epoch {epoch} differs from the serial state"
    assert len(scans) > 20, f"seed {seed}: only {len(scans)} scans answered ({refused} refused)"


async def test_a_read_naming_a_replys_epoch_sees_that_transactions_writes() -> None:
    """Replies leave before their epoch is over: a read of the newest finished epoch right after one
    can miss its writes. Naming the reply's epoch as ``min_epoch`` makes the coordinator wait for it."""
    names = [f"acct{i}" for i in range(4)]
    async with SimCluster(BANK, workers=2, seed=11) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        source = sim_reads(c.network)
        balances = dict.fromkeys(names, INITIAL)
        ahead = 0  # replies that arrived before every worker had finished their epoch
        for i in range(40):
            src, dst = names[i % 4], names[(i + 1) % 4]
            rid = c.submit("account", "transfer", src, dst, 7)
            await c.wait_for_replies(len(c.replies) + 1)
            reply = next(r for r in c.replies if r.request_id == rid)
            assert reply.committed, reply
            balances[src] -= 7
            balances[dst] += 7
            ahead += reply.epoch > c.coordinator.epochs.epoch - 1
            for key in (src, dst):
                got = await stateread.read_value(source, "account", key, min_epoch=reply.epoch)
                epoch, found, value = got
                assert found and epoch >= reply.epoch
                assert value == balances[key], f"a read at epoch {epoch} missed transfer {i} ({reply.epoch})"
        assert ahead > 0, "no reply came before its epoch finished: the wait was never needed"
        assert not c.coordinator.reads.parked


async def test_sdk_reads_name_the_newest_reply_epoch_and_an_epoch_that_never_finishes_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from styx_client.sdk import StyxClient

    asked: list[ReadState] = []

    async def source(msg: ReadState) -> Any:
        asked.append(msg)
        return AdminReply(
            True, "", {"epoch": max(msg.epoch, msg.min_epoch, 0), "keys": [], "values": [], "next": None}
        )

    monkeypatch.setattr(stateread, "admin_reads", lambda *a, **kw: source)
    client = StyxClient("127.0.0.1:1", {"account": 4}, coordinator="127.0.0.1:2")
    client._core.table.newest_epoch = 42
    assert client.newest_epoch == 42
    await client.scan("account", prefix="acct")
    await client.read("account", "acct1")
    await client.scan("account", as_of_epoch=3)
    assert [(m.epoch, m.min_epoch) for m in asked] == [(-1, 42), (-1, 42), (3, 42)]

    names = [f"acct{i}" for i in range(4)]
    async with SimCluster(BANK, workers=2, seed=12) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        latest = c.coordinator.epochs.epoch - 1
        with pytest.raises(Unavailable, match=f"epoch {latest + 1000} has not finished"):
            await stateread.read_value(sim_reads(c.network), "account", names[0], min_epoch=latest + 1000)
        assert not c.coordinator.reads.parked


async def test_reads_that_time_out_share_one_timer_task() -> None:
    """Every open or parked read times out after LOOKUP_TIMEOUT_S, each refused by name, and all of
    them through one sweeping task: not a sleeping task per read (a busy scanner opens hundreds a
    second)."""
    names = [f"acct{i}" for i in range(4)]
    async with SimCluster(BANK, workers=2, seed=13) as c:
        c.submit("account", "open_accounts", "loader", names, INITIAL)
        await c.wait()
        reads = c.coordinator.reads
        far = c.coordinator.epochs.epoch - 1 + 1000
        waiting = [  # each its own admin client: one of them asks one read at a time
            asyncio.ensure_future(
                stateread.read_value(sim_reads(c.network, f"reader-{i}"), "account", name, min_epoch=far)
            )
            for i, name in enumerate(names * 5)
        ]
        for _ in range(10_000):  # virtual time: until every read is parked
            if len(reads.parked) == len(waiting):
                break
            await asyncio.sleep(0.001)
        assert len(reads.parked) == len(waiting) == len(reads.deadlines)
        timers = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.startswith("StateReads.")]
        assert [t.get_coro().__qualname__ for t in timers] == ["StateReads._sweep"]
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(o, Unavailable) and f"epoch {far} has not finished" in str(o) for o in outcomes)
        assert not reads.parked and not reads.deadlines and not reads.sweeping
