"""Range reads (``ctx.scan``) in the whole-cluster simulation: scans of prefixes and ranges that the
epoch's inserts, deletes and transfers fall into, with crashes, lost and repeated messages, and reshapes;
every reply and the final state equal the serial execution (a phantom would change a report's sum)."""

from __future__ import annotations

import random

import pytest

from styx_py.core.wire import Phase, decode_value
from styx_py.testing.cluster import SimCluster, check_against_serial
from styx_py.testing.simulate import Events
from tests.test_reshape import joining, seeded_cluster

APP = "tests.apps.index:app"
PREFIXES = ["a", "a1", "b", "a:", ""]


def submit_scan_mix(c: SimCluster, rng: random.Random, n: int, hot: float) -> None:
    def key() -> str:
        pool = 4 if rng.random() < hot else 30
        return f"{rng.choice('ab')}{rng.randrange(pool)}"

    for _ in range(n):
        kind = rng.random()
        if kind < 0.18:
            c.submit("acct", "open_account", key(), rng.randint(1, 50))
        elif kind < 0.28:
            c.submit("acct", "close", key(), key())
        elif kind < 0.45:
            c.submit("acct", "transfer", key(), key(), rng.randint(1, 30))
        elif kind < 0.52:
            c.submit("acct", "deposit", key(), rng.randint(1, 10))
        elif kind < 0.68:
            c.submit("report", "total", f"r{rng.randrange(3)}", rng.choice(PREFIXES))
        elif kind < 0.76:
            lo, hi = sorted([key(), key()])
            c.submit("report", "window", f"r{rng.randrange(3)}", lo, hi + "~", rng.randint(1, 6))
        elif kind < 0.82:
            c.submit("report", "snapshot_total", f"r{rng.randrange(3)}", rng.choice(PREFIXES))
        elif kind < 0.88:
            c.submit("report", "top_up_smallest", f"r{rng.randrange(3)}", rng.choice(PREFIXES), 5)
        elif kind < 0.93:
            branches = rng.choice(["deposit_and_report", "report_and_deposit"])
            c.submit("acct", branches, key(), key(), rng.choice(PREFIXES))
        elif kind < 0.98:
            counter = rng.choice(["c0", "c1", key()])  # outside the range it counts, or inside
            c.submit("acct", "count_into_self", counter, rng.choice(["a", "b", "c"]))
        else:
            c.submit("report", "too_many", "r0")


async def seeded_accounts(c: SimCluster, n: int) -> None:
    for i in range(n):
        c.submit("acct", "open_account", f"a{i}", 100)
        c.submit("acct", "open_account", f"b{i}", 100)
    await c.wait()


async def run_scans(
    seed: int,
    *,
    crashes: int = 0,
    coordinator_crashes: int = 0,
    drops: int = 0,
    duplicates: int = 0,
    reshapes: int = 0,
    caching: bool = True,
    n: int = 240,
) -> SimCluster:
    rng = random.Random(seed)
    async with seeded_cluster(APP, seed, rng, call_graph_caching=caching) as c:
        await seeded_accounts(c, 10)
        base = c.network.delivered
        nodes = [w.node_id for w in c.workers]
        for _ in range(crashes):
            node = rng.choice(nodes)
            c.network.faults.at(base + rng.randint(20, 1200), lambda node=node: c.crash(node))
        for _ in range(coordinator_crashes):
            c.network.faults.at(base + rng.randint(20, 1200), c.crash_coordinator)
        for _ in range(drops):
            c.network.faults.drops.add(base + rng.randint(20, 1200))
        for _ in range(duplicates):
            c.network.faults.duplicates.add(base + rng.randint(20, 1200))
        changes = Events(c, rng, joining())
        waves = 3
        for wave in range(waves):
            if wave < reshapes:
                changes.at_random(rng.choice(["join", "drain", "lose"]), 400)
            submit_scan_mix(c, rng, n // waves, hot=rng.choice([0.2, 0.6]))
            await c.wait(timeout_s=600)
        await check_against_serial(c)
        return c


async def scan_seed(seed: int) -> None:
    """The sweep's scenario (tests/sweep.py ``scans``): the faults vary with the seed."""
    await run_scans(
        seed,
        crashes=seed % 3,
        coordinator_crashes=(seed // 3) % 2,
        drops=(seed // 2) % 2,
        duplicates=(seed // 5) % 2,
        reshapes=(seed // 4) % 3,
        caching=seed % 7 != 6,
    )


@pytest.mark.parametrize("seed", range(12))
async def test_scans_with_inserts_and_deletes_equal_the_serial_execution(seed: int) -> None:
    await run_scans(seed)


# 269, 356: a replay after a join decided a paged scan's conflicts otherwise than the first run (a range
# cut short by its limit on one partition held the keys of another partition of the same worker).
@pytest.mark.parametrize("seed", [*range(100, 108), 269, 356])
async def test_scans_under_crashes_and_reshapes_equal_the_serial_execution(seed: int) -> None:
    await scan_seed(seed)


async def test_scans_go_through_every_phase_and_fail_past_their_limit() -> None:
    c = await run_scans(7, n=600)
    phases = {r.phase for r in c.replies}
    assert phases == {Phase.OPTIMISTIC, Phase.FALLBACK, Phase.SERIAL}, phases
    too_many = [r for r in c.replies if c.requests[r.request_id].function == "too_many"]
    assert too_many and all(r.status == "failed" and "ScanLimitExceeded" in r.error for r in too_many)


async def test_a_scan_sees_its_own_writes_and_the_committed_state() -> None:
    async with SimCluster(APP, workers=3, seed=1) as c:
        await seeded_accounts(c, 3)
        rid = c.submit("acct", "count_into_self", "a9", "a")  # a0 a1 a2, and a9 is not open yet
        await c.wait()
        assert decode_value({r.request_id: r for r in c.replies}[rid].result) == 3
        later = c.submit("report", "window", "r0", "a", "b", 2)
        await c.wait()
        got = decode_value({r.request_id: r for r in c.replies}[later].result)
        # a9 now holds the count it wrote: in the range, after a0 a1 (the first page), a2 a9 next.
        assert got == [["a0", "a1"], 200, ["a2", "a9"]], got
        await check_against_serial(c)
