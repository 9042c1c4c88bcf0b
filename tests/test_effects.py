"""External calls and durable timers in the simulation (virtual time, seeded faults).

The reservation app (tests/apps/effects_app.py) charges through the payment service's double of the
simulation kit (styx_benchmarks.reservations_sim), slow, failing before taking effect and losing answers
after it; holds expire on timers; the calls are the kit's reservation workload. Workers and the
coordinator crash at seeded points, messages are dropped and duplicated. The workers' own requests
(the calls' outcomes, the timers' firings) go through the clients like any other, so
``check_against_serial`` holds them to the serial execution as ordinary inputs; the app's ``check``
holds the ledger to what committed: every charge under one key and one effect, none from a
transaction that did not commit, each either kept by a sold seat or refunded, every timer fired at
most once, every hold ended.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from styx_benchmarks import reservations_sim
from styx_py.core.wire import decode_value
from styx_py.testing.cluster import SimCluster, check_against_serial, run_simulated
from styx_py.testing.simulate import Events
from tests.apps import effects_app
from tests.test_updates import deploy_until_committed

APP = "tests.apps.effects_app:app"
APP_V2 = "tests.apps.effects_app_v2:app"


async def run_effects(
    seed: int,
    *,
    n: int = 60,
    crashes: int = 0,
    coordinator_crashes: int = 0,
    drops: int = 0,
    duplicates: int = 0,
    snapshot_every: int = 2,
    reshapes: int = 0,
    update: bool = False,
) -> SimCluster:
    rng = random.Random(seed)
    doubles = reservations_sim.services(random.Random(seed))
    effects_app.PAYMENTS = doubles["payments"]
    async with SimCluster(
        APP,
        workers=3,
        seed=seed,
        epoch_size_max=rng.choice([5, 20, 100]),
        snapshot_interval_epochs=snapshot_every,
        epoch_timeout_ms=300,
        takeover_after_ms=3000,
        egress_ack_lag=rng.choice([0, 2, 8]),
        seqlog_ack_lag=(seed % 3) * 20,
    ) as c:
        base = c.network.delivered
        for _ in range(crashes):
            node = rng.choice(["w1", "w2", "w3"])
            c.network.faults.at(base + rng.randint(20, 700), lambda node=node: c.crash(node))
        for _ in range(duplicates):
            c.network.faults.duplicates.add(base + rng.randint(20, 700))
        for _ in range(drops):
            c.network.faults.drops.add(base + rng.randint(20, 700))
        for _ in range(coordinator_crashes):
            c.network.faults.at(base + rng.randint(20, 700), c.crash_coordinator)
        changes = Events(c, rng, (f"w{i}" for i in range(4, 100)))  # joins never reuse an id that left
        for _ in range(reshapes):
            changes.at_random(rng.choice(["join", "drain", "lose"]), 700)
        calls = reservations_sim.workload(random.Random(seed))
        for i, (operator, key, function, args) in enumerate(itertools.islice(calls, n)):
            c.submit(operator, function, key, *args)
            if update and i == n // 2:
                await c.wait_for_replies(len(c.replies) + 5)
                await deploy_until_committed(c, APP_V2)
        await c.settle()
        await check_against_serial(c)
        problems = list(reservations_sim.no_double_charge(c.state(), doubles))
        assert not problems, problems
        return c


@pytest.mark.parametrize("seed", range(6))
async def test_external_calls_and_timers_without_faults(seed: int) -> None:
    c = await run_effects(seed)
    completions = [r for r in c.requests.values() if r.operator == "styx.outbox"]
    assert completions, "no external call completed"
    payments = effects_app.PAYMENTS
    if not payments.fail and not payments.lose:
        # Nothing failed and nothing crashed: each intent was called once (no replay, rescan or
        # duplicate made another attempt).
        assert set(payments.attempts.values()) == {1}, payments.attempts


@pytest.mark.parametrize("seed", range(4))
async def test_external_calls_and_timers_under_reshapes_and_a_code_update(seed: int) -> None:
    c = await run_effects(300 + seed, reshapes=2, update=True, crashes=seed % 2)
    assert len(c.coordinator.cluster.versions) == 2
    assert c.coordinator.status()["shape_changes"], "no shape change happened"


@pytest.mark.parametrize("seed", range(8))
async def test_external_calls_and_timers_under_crashes(seed: int) -> None:
    c = await run_effects(
        100 + seed,
        crashes=1 + seed % 2,
        coordinator_crashes=seed % 3 == 0,
        drops=seed % 2,
        duplicates=(seed // 2) % 2,
    )
    assert c.crashes >= 1


async def run_bounded(seed: int) -> tuple[list[tuple[str, str, str]], int]:
    """Holds on distinct seats against a slow payment service and a bound of 3 pending per partition:
    (request id, status, error) of each hold, and how many intents were pending at most in one
    partition at an epoch's start."""
    effects_app.PAYMENTS = reservations_sim.payments(random.Random(seed), delay_s=2.0)
    async with SimCluster("tests.apps.effects_app:bounded", workers=2, seed=seed, epoch_size_max=4) as c:
        holds = [c.submit("seat", "hold", f"s{i}", f"u{i % 5}", 10, 30.0) for i in range(24)]
        await c.settle()
        await check_against_serial(c)  # the serial model applies the same bound and agrees
        effects_app.check(c.state(), effects_app.PAYMENTS.ledger)
        replies = {r.request_id: r for r in c.replies}
        return [(rid, replies[rid].status, replies[rid].error) for rid in holds], c.crashes


@pytest.mark.parametrize("seed", range(3))
async def test_a_partition_holds_at_most_its_bound_of_pending_calls(seed: int) -> None:
    outcomes, _ = await run_bounded(seed)
    refused = [e for _, status, e in outcomes if status == "aborted"]
    assert refused, "no hold reached the per-partition bound"
    assert all(e.startswith("PendingLimit: the partition of") for e in refused), refused
    assert all(f"max_pending_per_partition {effects_app.BOUND}" in e for e in refused), refused
    assert sum(status == "committed" for _, status, _ in outcomes) >= effects_app.BOUND
    # The bound depends on state only: the same seed, the same holds refused.
    again, _ = await run_bounded(seed)
    assert again == outcomes


@pytest.mark.parametrize(("seed", "how"), [(0, "boom"), (1, "refuse"), (2, "boom")])
async def test_a_failed_continuation_records_the_outcome_and_clears_the_intent(seed: int, how: str) -> None:
    """The continuation raises (or aborts): its completion fails with that error, and the worker
    records the outcome again without the continuation, so the intent is cleared at once (not left
    pending until a recovery, never called again)."""
    effects_app.PAYMENTS = payments = reservations_sim.payments(random.Random(seed), delay_s=0.01)
    async with SimCluster("tests.apps.effects_app:failing", workers=2, seed=seed) as c:
        asked = [c.submit("flaky", "go", f"k{i}", how) for i in range(6)]
        await c.settle()
        assert not c.effects_pending(), "an intent was left pending"
        await check_against_serial(c)  # the settling completions are ordinary inputs of the serial run
        replies = {r.request_id: r for r in c.replies}
        keys = {replies[rid].request_id: decode_value(replies[rid].result) for rid in asked}
        completions = [r for r in c.requests.values() if r.operator == "styx.outbox"]
        failed = [replies[r.request_id] for r in completions if len(decode_value(r.args)) == 4]
        settled = [replies[r.request_id] for r in completions if len(decode_value(r.args)) == 5]
        want = "aborted" if how == "refuse" else "failed"
        assert [r.status for r in failed] == [want] * 6, failed
        assert all(r.status == "committed" for r in settled) and len(settled) == 6, settled
        assert all(decode_value(r.result).startswith("continuation failed: ") for r in settled)
        assert sorted(payments.attempts) == sorted(keys.values())
        assert set(payments.attempts.values()) == {1}, "an intent was called again"
        assert not any(op == "styx.outbox" for op, _ in c.state()), "an intent is still in the state"


@pytest.mark.parametrize("seed", [3, 104])
def test_one_seed_run_twice_gives_the_same_run(seed: int) -> None:
    """Timers race the payments (short holds) and crashes: on virtual time, with every request and every
    firing stamped by it, the same seed gives the same replies, state, ledger and service attempts (each
    run on a fresh event loop, whose virtual time starts at 0)."""

    def once() -> tuple[str, dict[str, Any], dict[str, int]]:
        c = run_simulated(run_effects(seed, crashes=seed % 2, drops=seed % 2))
        return c.fingerprint(), effects_app.PAYMENTS.ledger, dict(effects_app.PAYMENTS.attempts)

    first = once()
    assert once() == first
