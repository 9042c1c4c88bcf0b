"""The changelog on real processes: Tansu, SeaweedFS, a coordinator and two workers, bank transfers at a
steady rate while workers and the coordinator are SIGKILLed and restarted (tests/test_chaos.py's
schedule). Read from its start, the changelog topic must hold every committed write once, in commit
order (the serial execution's writes, record for record), and rebuild exactly the state of the newest
snapshot (its records up to the snapshot's epoch) and of the live cluster once it is quiet.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from aiokafka import TopicPartition

from styx_benchmarks.bank import account
from styx_benchmarks.bank import app as bank_app
from styx_benchmarks.changelog_view import ChangelogView, follow
from styx_client import StyxClient
from styx_py.core.changelog import ChangeRecord, change_decoder, table_of
from styx_py.core.partitioning import Key
from styx_py.core.serial import Writes, serial_replay
from styx_py.core.wire import Reply, decode_value
from styx_py.io.kafka_logs import read_to_end
from styx_py.io.s3 import s3_client
from styx_py.stack.local import LocalStack
from styx_py.stack.services import SeaweedS3
from styx_py.testing.changelog import expected_changelog
from styx_worker.snapshot import snapshot_decoder
from tests.service_fixtures import ClusterFactory
from tests.test_chaos import ACCOUNTS, INITIAL, Chaos, run_chaos
from tests.test_integration import read_topic

pytestmark = pytest.mark.services

# Workers (every third kill right after the one before) and the coordinator (kills 2, 12, 22, …);
# STYX_CHANGELOG_KILLS=30 for a long run.
KILLS = int(os.environ.get("STYX_CHANGELOG_KILLS", "5"))


@pytest.fixture
def stack(local_cluster: ClusterFactory, s3: SeaweedS3) -> LocalStack:
    return local_cluster(app="styx_benchmarks.bank:app", s3=s3, settings={"snapshot_interval_s": "0.5"})


async def read_changelog(stack: LocalStack) -> dict[int, list[ChangeRecord]]:
    topic = stack.env["STYX_CHANGELOG_TOPIC"]
    starts = {TopicPartition(topic, p): 0 for p in range(account.partitions)}
    out: dict[int, list[ChangeRecord]] = {p: [] for p in range(account.partitions)}
    for r in await read_to_end(stack.kafka, starts):
        out[r.partition].append(change_decoder.decode(r.value))
    return out


def newest_snapshot(stack: LocalStack) -> tuple[int, dict[tuple[str, Key], Any]]:
    """The epoch of the newest complete snapshot and the state it holds (its objects in epoch order)."""
    from styx_py.audit.snapshot_source import get_object, load_manifest

    s3 = stack.external_s3
    assert s3 is not None
    client = s3_client(s3.endpoint, s3.access_key, s3.secret_key, s3.region, secure=s3.secure)
    bucket = stack.env["STYX_SNAPSHOT_BUCKET"]
    manifest = load_manifest(client, bucket)
    assert manifest is not None and manifest.epoch >= 0, "no snapshot completed"
    state: dict[tuple[str, Key], Any] = {}
    for _, names in sorted(manifest.deltas.items()):
        for name in names:  # a compacted base first, then deltas, in epoch order
            data = get_object(client, bucket, name)
            assert data is not None, f"{name} of snapshot {manifest.epoch} is gone"
            for op, key, value in snapshot_decoder.decode(data).writes:
                if value is None:
                    state.pop((op, key), None)
                else:
                    state[(op, key)] = decode_value(value)
    return manifest.epoch, state


async def test_the_changelog_rebuilds_the_snapshot_and_the_live_state_after_kills(stack: LocalStack) -> None:
    chaos = Chaos(200, kills=KILLS)
    logged = await run_chaos(stack, chaos, lambda: read_topic(stack.kafka, stack.env["STYX_EGRESS_TOPIC"]))
    by_id = {r.request_id: r for r in logged if r.request_id in chaos.requests}
    commits: list[tuple[Reply, Writes]] = []
    serial_state, _ = await serial_replay(bank_app, chaos.requests, by_id.values(), commits)
    expected = expected_changelog(commits, lambda _: bank_app)

    # The live cluster, quiet (run_chaos waited for every reply): its state, read through transactions.
    async with await StyxClient.connect(stack.coordinator, timeout_s=60) as client:
        balances = await asyncio.gather(
            *(client.call("account", f"a{i}", "balance") for i in range(ACCOUNTS))
        )
    live = {("account", f"a{i}"): b for i, b in enumerate(balances) if ("account", f"a{i}") in serial_state}
    assert live == serial_state

    # The last epochs' records ride with the next sequencer-log entry (or go after at most
    # REPLY_WAIT_FOR_LOG_ENTRY_S): poll, with a deadline, until the topic holds them all.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        changelog = await read_changelog(stack)
        if sum(map(len, changelog.values())) >= sum(map(len, expected.values())) or loop.time() > deadline:
            break
        await asyncio.sleep(0.2)
    total = sum(map(len, changelog.values()))
    print(
        f"changelog: {total} records, {len(commits)} committed transactions, {len(chaos.requests)} requests"
    )
    for p, part in changelog.items():
        positions = [r.position for r in part]
        assert positions == sorted(set(positions)), f"partition {p}: a record twice or out of order"
        want = expected.get(p, [])
        assert len(part) == len(want), (
            f"partition {p}: {len(part)} records, the serial execution wrote {len(want)}"
        )
        assert part == want, f"partition {p} differs from the serial execution's writes in commit order"
    everything = [r for part in changelog.values() for r in part]
    assert table_of(everything) == live == serial_state

    # The consumer example (benchmarks/styx_benchmarks/changelog_view.py) builds the same live view.
    view, caught_up = ChangelogView("account"), asyncio.Event()
    following = asyncio.create_task(
        follow(stack.kafka, stack.env["STYX_CHANGELOG_TOPIC"], view, caught_up=caught_up)
    )
    try:
        await asyncio.wait_for(caught_up.wait(), 60)
    finally:
        following.cancel()
    assert view.table == live and view.total() == ACCOUNTS * INITIAL

    epoch, snapshot_state = newest_snapshot(stack)
    assert snapshot_state, f"snapshot {epoch} holds nothing"
    assert table_of(r for r in everything if r.epoch <= epoch) == snapshot_state, (
        f"the changelog up to epoch {epoch} is not the state of the snapshot of that epoch"
    )
