"""Serializability oracle: the in-process cluster against a serial execution in commit order."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from styx_py.core.wire import Phase, PushedReply, decode_value
from styx_py.testing.cluster import SimCluster, check_against_serial, run_simulated
from styx_py.testing.latency import LatencyModel, TimedNetwork
from styx_worker.snapshot import snapshot_decoder

APP = "tests.apps.oracle:app"


def submit_random_mix(c: SimCluster, rng: random.Random, n: int, n_keys: int, hot: float) -> None:
    def key() -> str:
        # A share of accesses goes to 3 hot keys: conflicts, fallback and rescheduling get exercised.
        return f"k{rng.randrange(3)}" if rng.random() < hot else f"k{rng.randrange(n_keys)}"

    def distinct(m: int) -> list[str]:
        out: list[str] = []
        while len(out) < m:
            k = key()
            if k not in out:
                out.append(k)
        return out

    for _ in range(n):
        kind = rng.random()
        if kind < 0.24:
            a, b = distinct(2)
            c.submit("acct", "transfer", a, b, rng.randint(1, 60))
        elif kind < 0.27:
            c.submit("acct", "tip", key(), rng.randint(1, 9))
        elif kind < 0.28:
            c.submit("acct", "tip_and_look", key(), rng.randint(1, 9))
        elif kind < 0.3:
            # Adds to accounts and to a stats entry (now and then to a counter, which holds an int: the
            # field add fails there).
            stats = f"s{rng.randrange(2)}" if rng.random() < 0.9 else f"c{rng.randrange(2)}"
            c.submit("acct", "spread", key(), distinct(rng.randint(1, 3)), rng.randint(1, 9), stats)
        elif kind < 0.33:
            # A delete; now and then of an account nobody opens (a missing key). Later operations on a
            # closed account read nothing and insert it again.
            a, b = distinct(2)
            c.submit("acct", "close", a if rng.random() < 0.8 else f"n{rng.randrange(3)}", b)
        elif kind < 0.35:
            c.submit("acct", "reopen", key(), rng.randint(0, 100))
        elif kind < 0.5:
            ks = distinct(rng.randint(2, 4))
            c.submit("acct", "fan_out", ks[0], ks[1:], rng.randint(1, 20))
        elif kind < 0.65:
            ks = distinct(rng.randint(1, 5))
            c.submit("acct", "chain", ks[0], ks[1:], rng.randint(1, 5))
        elif kind < 0.75:
            ks = distinct(rng.randint(1, 4))
            c.submit("acct", "sum_read", ks[0], ks[1:])
        elif kind < 0.85:
            a, b = distinct(2)
            c.submit("acct", "move_if_rich", a, b, rng.randint(5, 30))
        elif kind < 0.9:
            c.submit("acct", "boom", key(), rng.randrange(7))
        elif kind < 0.93:
            c.submit("acct", "converge", key(), distinct(rng.randint(2, 3)), f"t{rng.randrange(3)}")
        elif kind < 0.96:
            c.submit("acct", "lucky", key())
        else:
            c.submit("counter", "open_order", f"c{rng.randrange(2)}", rng.randint(1, 9))


async def run_seed(
    seed: int, *, workers: int = 3, n: int = 300, caching: bool = True, waves: int = 3
) -> SimCluster:
    rng = random.Random(seed)
    async with SimCluster(
        APP, workers=workers, seed=seed, epoch_size_max=rng.choice([5, 20, 100]), call_graph_caching=caching
    ) as c:
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        for _ in range(waves):
            submit_random_mix(c, rng, n // waves, n_keys=20, hot=rng.choice([0.2, 0.6]))
            await c.wait()
        await check_against_serial(c)
        return c


@pytest.mark.parametrize("seed", range(40))
async def test_serial_equivalence(seed: int) -> None:
    await run_seed(seed)


@pytest.mark.parametrize("seed", range(10))
async def test_serial_equivalence_without_caching(seed: int) -> None:
    await run_seed(1000 + seed, caching=False)


async def test_fallback_and_rescheduling_are_exercised() -> None:
    c = await run_seed(7, n=600)
    assert c.coordinator.totals["fallback"] > 0
    assert sum(w.totals.fallback for w in c.workers) > 0, "no worker re-ran a transaction under locks"
    assert sum(w.totals.rescheduled for w in c.workers) > 0, "no transaction was rescheduled"
    assert c.coordinator.totals["rescheduled"] == sum(w.totals.rescheduled for w in c.workers)
    phases = {r.phase for r in c.replies}
    assert phases == {Phase.OPTIMISTIC, Phase.FALLBACK, Phase.SERIAL}, phases


async def test_blind_adds_to_one_entity_commit_together_without_locks() -> None:
    """Adds of one epoch to one account commute: none of them falls back. A read of the account
    behind them conflicts (it must see them all), as does a put; an add behind a put falls back too.
    Every reply and the final state equal the serial execution."""
    async with SimCluster(APP, workers=3, seed=2, epoch_size_max=100) as c:
        c.submit("acct", "deposit", "k0", 100)
        await c.wait()
        first = len(c.replies)
        for i in range(30):
            c.submit("acct", "tip", "k0", i + 1)
        await c.wait()
        tips = c.replies[first:]
        assert {r.phase for r in tips} == {Phase.OPTIMISTIC}, "an add fell back"
        assert len({r.epoch for r in tips}) < len(tips), "the adds did not share an epoch"
        before = len(c.replies)
        for _ in range(10):
            c.submit("acct", "tip", "k1", 1)
        c.submit("acct", "peek", "k1")  # behind the adds of its epoch: falls back
        c.submit("acct", "deposit", "k1", 5)  # a read and a put
        c.submit("acct", "tip", "k1", 1)  # behind that put: falls back
        await c.wait()
        assert any(r.phase == Phase.FALLBACK for r in c.replies[before:])
        await check_against_serial(c)
        assert c.state()[("acct", "k0")] == 100 + sum(range(1, 31))


async def test_rescheduled_transactions_of_one_entity_run_one_per_epoch() -> None:
    """Transactions that keep changing each other's call graph (one counter, each order keyed by the
    number it took) are rescheduled; only the oldest of each root entity runs in the next epoch, the
    others wait. Re-running all of them would reschedule all but one again, every epoch: about n²/2
    reschedules for n such transactions (~1 800 here) instead of at most one each."""
    n = 60
    async with SimCluster(APP, workers=3, seed=5, epoch_size_max=100) as c:
        for i in range(n):
            c.submit("counter", "open_order", "c0", i + 1)
            c.submit("counter", "open_order", "c1", i + 1)
        await c.wait()
        await check_against_serial(c)
        rescheduled = sum(w.totals.rescheduled for w in c.workers)
        numbers = sorted(decode_value(r.result) for r in c.sent.unique_replies())
    assert numbers == sorted([*range(1, n + 1)] * 2), "every order got its own number"
    assert 0 < rescheduled <= 2 * n, f"{rescheduled} reschedules for {2 * n} transactions"


@pytest.mark.parametrize("seed", range(5))
async def test_a_fallback_reader_that_writes_after_all_is_rescheduled(seed: int) -> None:
    """Fallback transactions that only read a key in their optimistic run hold it beside each other.
    One that writes it after all (``skim`` finds money to take once a lower tid's deposit is in) would
    race the other readers, which may read the key before that write although they come after it in
    tid order: it is rescheduled instead, and every reply equals the serial execution."""
    groups = [f"g{i}" for i in range(12)]
    async with SimCluster(APP, workers=3, seed=seed, epoch_size_max=200) as c:
        for g in groups:
            c.submit("acct", "deposit", g, 10)
        await c.wait()
        for g in groups:
            c.submit("acct", "deposit", g, 200)  # the readers below conflict with it if it is lower
            c.submit("acct", "skim", g, 50)  # reads 10, or writes if the deposit is in
            c.submit("acct", "sum_read", f"{g}-a", [g])
            c.submit("acct", "sum_read", f"{g}-b", [g])
        await c.wait()
        await check_against_serial(c)
        rescheduled = sum(w.totals.rescheduled for w in c.workers)
    assert rescheduled >= 1


async def test_fallback_readers_of_one_entity_run_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """400 conflicting writers of 50 accounts, every one reading one ``cfg`` entity, on a network with
    100-500 µs hops and a CPU cost per message (virtual time, so exact): with the readers of ``cfg``
    holding it shared, the fallback takes a fraction of the virtual time it takes with every lock
    exclusive (each writer then waits for every lower one's final, whatever account it writes)."""
    from styx_worker import fallback, locks

    async def run() -> float:
        model = LatencyModel(hop_us=(100, 500), recv_cpu_us=20, send_cpu_us=10, txn_cpu_us=20)
        async with SimCluster(
            APP, workers=4, seed=1, epoch_size_max=1000, network=TimedNetwork(1, model)
        ) as c:
            c.submit("acct", "deposit", "cfg", 1)
            await c.wait()
            loop = asyncio.get_running_loop()
            start = loop.time()
            for i in range(400):
                c.submit("acct", "bump", f"k{i % 50}", "cfg")
            await c.wait()
            took = loop.time() - start
            await check_against_serial(c)
        return took

    shared = await run()

    class Exclusive(locks.LockTable):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args[:3])

    monkeypatch.setattr(fallback, "LockTable", Exclusive)
    exclusive = await run()
    assert shared * 3 < exclusive, (shared, exclusive)


async def test_deletes_across_epochs_snapshots_and_a_recovery_equal_the_serial_execution() -> None:
    """Deletes end to end: a read after a delete in the same transaction and in the next epochs, an
    insert after a delete (in the same transaction, and in a later epoch), a delete of a key never
    written, and snapshots holding the tombstones, from which a recovery rebuilds every partition; the
    replies and the final state equal the serial execution."""
    async with SimCluster(APP, workers=3, seed=8, snapshot_interval_epochs=1) as c:
        for i in range(6):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        closed = c.submit("acct", "close", "k0", "k1")
        reopened = c.submit("acct", "reopen", "k2", 7)
        missing = c.submit("acct", "close", "nobody", "k3")
        await c.wait()
        c.submit("acct", "peek", "k0")
        c.submit("acct", "sum_read", "k1", ["k0", "k2"])
        c.submit("acct", "close", "k4", "k5")
        await c.wait()
        c.submit("acct", "deposit", "k0", 5)
        await c.wait()
        parts = [snapshot_decoder.decode(v) for k, v in c.blobs.objects.items() if k.endswith(".delta")]
        tombstones = {(op, key) for part in parts for op, key, value in part.writes if value is None}
        assert {("acct", "k4"), ("acct", "nobody")} <= tombstones, tombstones
        c.crash("w2")  # every worker rolls back to the last snapshot and replays the log after it
        c.submit("acct", "peek", "k4")
        c.submit("acct", "close", "k0", "k4")
        await c.wait(timeout_s=60)
        await check_against_serial(c)
        assert c.coordinator.recoveries >= 1
        outcome = {r.request_id: decode_value(r.result) for r in c.sent.unique_replies()}
        assert (outcome[closed], outcome[reopened], outcome[missing]) == ([100, -1], [100, 7], [0, -1])
        state = c.state()
        assert ("acct", "nobody") not in state and ("acct", "k0") not in state
        assert state[("acct", "k4")] == 5, "closed, then given k0's balance once k0 was open again"


async def test_same_seed_same_run() -> None:
    a = await run_seed(11)
    b = await run_seed(11)
    assert a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize("seed", range(12))
async def test_parallel_branches_reach_one_entity_in_the_serial_order(seed: int) -> None:
    """Branches through different workers that end on one entity (``converge``): the entity sees
    them in the serial model's order, not in the order their messages happened to arrive, so the
    run equals the serial execution and a replay reproduces it. (Every seed failed before such
    transactions ran alone in Phase.SERIAL.)"""
    rng = random.Random(seed)
    async with SimCluster(APP, workers=3, seed=seed, epoch_size_max=rng.choice([5, 20, 100])) as c:
        for _ in range(40):
            hops = [f"k{rng.randrange(20)}" for _ in range(rng.randint(2, 4))]
            c.submit("acct", "converge", f"k{rng.randrange(20)}", hops, f"t{rng.randrange(3)}")
        await c.wait()
        await check_against_serial(c)
        assert any(r.phase == Phase.SERIAL for r in c.replies)


async def run_resting(seed: int) -> SimCluster:
    """The mix of :func:`run_seed` through clients whose egress readers rest (those with pushed replies),
    with epochs on a timer so that virtual time moves and the workers send their egress marks; some
    pushed replies are lost and a worker restarts, so some replies reach their client by the log only."""
    rng = random.Random(seed)
    size = rng.choice([5, 20, 100])
    async with SimCluster(
        APP, workers=3, seed=seed, epoch_size_max=size, epoch_interval_ms=5, resting_clients=True
    ) as c:
        faults = c.network.faults
        for _ in range(4):
            faults.at(rng.randint(50, 1500), lambda: faults.drop_types.add(PushedReply))
        node = f"w{rng.randint(1, 3)}"
        faults.at(rng.randint(1500, 2500), lambda: c.crash(node))
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        for _ in range(3):
            submit_random_mix(c, rng, 100, n_keys=20, hot=rng.choice([0.2, 0.6]))
            await c.wait()
        await check_against_serial(c)
        return c


@pytest.mark.parametrize("seed", range(6))
def test_resting_clients_miss_no_reply(seed: int) -> None:
    """A resting reader moves over the egress records the workers' marks say hold only replies taken
    already (styx_client.sdk.resting), and reads again for a reply that was not pushed: every reply
    still reaches its caller once, the run equals the serial execution, and the same seed runs the
    same (each run on a fresh loop: virtual time moves here, and a second run on the same loop would
    start later)."""
    c = run_simulated(run_resting(seed))
    assert any(client.rest_egress for client in c.clients.clients), f"seed {seed}: no resting client"
    assert all(client.stats.egress_skipped == 0 for client in c.clients.clients if not client.rest_egress)
    assert c.network.faults.dropped > 0 and c.crashes == 1
    assert run_simulated(run_resting(seed)).fingerprint() == c.fingerprint()


def test_resting_clients_skip_what_came_pushed() -> None:
    c = run_simulated(run_resting(3))
    resting = [client for client in c.clients.clients if client.rest_egress]
    assert len(resting) == 2 and all(client.stats.egress_skipped > 0 for client in resting), resting
