"""The changelog under seeded crashes in the simulation: replays skip what the topic holds already.

``check_against_serial`` compares every changelog partition with the serial execution's writes in
commit order (each once, no gap) and the state it rebuilds with the final state; these runs make sure
the interesting path is taken: restores that find records of the epochs they replay on the topic.
"""

from __future__ import annotations

import pytest

from tests.test_recovery import run_with_crashes


@pytest.mark.parametrize("seed", range(6))
async def test_replays_after_crashes_skip_the_records_on_the_changelog(seed: int) -> None:
    c = await run_with_crashes(seed, crashes=3, coordinator_crashes=seed % 2, snapshot_every=3, n=300)
    assert c.coordinator.recoveries >= 1
    topic = c.log.topics[c.config.changelog_topic]
    assert sum(map(len, topic)) > 0
    restored = [w for w in c.workers if w.core.epochs.changelog.tail]
    assert restored, f"seed {seed}: no restore found records on the changelog"


async def test_across_seeds_some_replay_skipped_records() -> None:
    skipped = 0
    for seed in range(6, 12):
        c = await run_with_crashes(seed, crashes=3, snapshot_every=4, n=300)
        skipped += sum(w.core.epochs.changelog.skipped for w in c.workers)
    assert skipped > 0, "no replay ever met its own records on the changelog"


async def test_a_cluster_without_a_changelog_writes_none() -> None:
    from styx_py.testing.cluster import SimCluster, check_against_serial
    from tests.test_oracle import APP

    async with SimCluster(APP, workers=2, seed=1, changelog_topic="") as c:
        for i in range(10):
            c.submit("acct", "deposit", f"k{i}", 5)
        await check_against_serial(c)
        assert not any(t.startswith("styx-changelog") for t in c.log.topics)
        assert not any(w.core.epochs.changelog.enabled for w in c.workers)
