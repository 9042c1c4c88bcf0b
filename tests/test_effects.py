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

import pytest

from styx_benchmarks import reservations_sim
from styx_py.testing.cluster import SimCluster, check_against_serial
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
