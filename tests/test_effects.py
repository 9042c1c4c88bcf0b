"""External calls and durable timers in the simulation (virtual time, seeded faults).

The reservation app (tests/apps/effects_app.py) charges through an in-memory payment service that is
slow, fails before taking effect and loses answers after it; holds expire on timers. Workers and the
coordinator crash at seeded points, messages are dropped and duplicated. The workers' own requests
(the calls' outcomes, the timers' firings) go through the clients like any other, so
``check_against_serial`` holds them to the serial execution as ordinary inputs; the app's ``check``
holds the ledger to what committed: every charge under one key and one effect, none from a
transaction that did not commit, each either kept by a sold seat or refunded, every timer fired at
most once, every hold ended.
"""

from __future__ import annotations

import random

import pytest

from styx_py.testing.cluster import SimCluster, check_against_serial
from tests.apps import effects_app

APP = "tests.apps.effects_app:app"


async def run_effects(
    seed: int,
    *,
    n: int = 60,
    crashes: int = 0,
    coordinator_crashes: int = 0,
    drops: int = 0,
    duplicates: int = 0,
    snapshot_every: int = 2,
) -> SimCluster:
    rng = random.Random(seed)
    effects_app.PAYMENTS = payments = effects_app.Payments(
        seed, fail=rng.choice([0.0, 0.2]), lose=rng.choice([0.0, 0.2]), delay_s=rng.choice([0.001, 0.05])
    )
    async with SimCluster(
        APP,
        workers=3,
        seed=seed,
        epoch_size_max=rng.choice([5, 20, 100]),
        snapshot_interval_epochs=snapshot_every,
        epoch_timeout_ms=300,
        egress_ack_lag=rng.choice([0, 2, 8]),
        seqlog_ack_lag=(seed % 3) * 20,
    ) as c:
        base = c.network.delivered
        for _ in range(crashes):
            node = rng.choice(["w1", "w2", "w3"])
            c.network.faults.at(base + rng.randint(20, 1500), lambda node=node: c.crash(node))
        for _ in range(duplicates):
            c.network.faults.duplicates.add(base + rng.randint(20, 1500))
        for _ in range(drops):
            c.network.faults.drops.add(base + rng.randint(20, 1500))
        for _ in range(coordinator_crashes):
            c.network.faults.at(base + rng.randint(20, 1500), c.crash_coordinator)
        for i in range(n):
            # Short holds (sequenced time, real seconds) race the payments; long ones wait for them.
            ttl = rng.choice([0.0, 0.02, 30.0])
            c.submit("seat", "hold", f"s{rng.randrange(12)}", f"u{i % 5}", rng.randint(1, 100), ttl)
        await c.settle()
        await check_against_serial(c)
        effects_app.check(c.state(), payments.ledger)
        assert all(n == 1 for n in payments.effects.values()), "a key took effect twice"
        return c


@pytest.mark.parametrize("seed", range(6))
async def test_external_calls_and_timers_without_faults(seed: int) -> None:
    c = await run_effects(seed)
    completions = [r for r in c.requests.values() if r.operator == "styx.outbox"]
    assert completions, "no external call completed"


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
