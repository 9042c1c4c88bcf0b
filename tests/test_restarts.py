"""Restarts of the services under a running cluster: the durable broker and the S3 server."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from styx_client import StyxClient
from styx_py.core.changelog import change_decoder
from styx_py.core.wire import Reply, StatusRequest, request_decoder
from styx_py.io.kafka_logs import read_to_end
from styx_py.stack.local import LocalStack, admin
from styx_py.stack.services import SeaweedS3, TansuBroker
from tests.service_fixtures import cluster_env
from tests.test_integration import read_topic, read_values

pytestmark = pytest.mark.services

ACCOUNTS = 100
INITIAL = 1000


async def open_accounts(client: StyxClient) -> None:
    await asyncio.gather(*(client.submit("account", f"a{i}", "deposit", INITIAL) for i in range(ACCOUNTS)))


@contextlib.asynccontextmanager
async def bank_cluster(
    tmp_path: Path, s3: SeaweedS3, kafka: TansuBroker, env: dict[str, str]
) -> AsyncIterator[tuple[LocalStack, StyxClient]]:
    """Two workers on the session's broker and S3 running the bank app, its accounts open, and a
    client; stopped on the way out."""
    stack = LocalStack(tmp_path, workers=2, kafka=kafka.bootstrap, s3=s3.config, env=env)
    await asyncio.to_thread(stack.start)
    try:
        await asyncio.to_thread(stack.deploy, "styx_benchmarks.bank:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
            await open_accounts(client)
            yield stack, client
    finally:
        await asyncio.to_thread(stack.stop)


async def transfers(client: StyxClient, n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    ids = [uuid.uuid4().hex for _ in range(n)]
    window = asyncio.Semaphore(200)

    async def one(rid: str) -> None:
        a, b = rng.sample(range(ACCOUNTS), 2)
        async with window:
            await client.submit("account", f"a{a}", "transfer", f"a{b}", rng.randint(1, 50), request_id=rid)

    await asyncio.gather(*(one(rid) for rid in ids))
    return ids


async def balances(client: StyxClient) -> list[int]:
    return list(await asyncio.gather(*(client.call("account", f"a{i}", "balance") for i in range(ACCOUNTS))))


@pytest.mark.parametrize("changelog", ["", "styx-changelog"], ids=["no-changelog", "changelog"])
async def test_durable_broker_restart_loses_nothing(tmp_path: Path, changelog: str) -> None:
    """SIGKILL of the durable broker right after a burst: a worker's produce request (replies, changelog
    records, a sequencer-log entry) is then often in flight, stored in part or whole and not answered.
    Each worker reads such a partition back and sends only what is missing (styx_py.io.indoubt), so
    every submission gets one reply and every committed write one changelog record."""
    # Admission on, as deployed: the backlog of the restart on Tansu-on-S3 is a stall's, worked
    # through (docs/operations.md#overload).
    env = {
        "STYX_SNAPSHOT_INTERVAL_S": "0.5",
        "STYX_LOG_LEVEL": "WARNING",
        "STYX_CHANGELOG_TOPIC": changelog,
    }
    stack = LocalStack(tmp_path, workers=2, durable=True, env=env)
    await asyncio.to_thread(stack.start)  # LocalStack's set-up is synchronous
    try:
        await asyncio.to_thread(stack.deploy, "styx_benchmarks.bank:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
            await open_accounts(client)
            before = await transfers(client, 500, 1)
            assert stack.broker is not None
            # SIGKILL: only what was acknowledged may survive, and all of that must.
            await asyncio.to_thread(stack.broker.restart, hard=True)
            after = await transfers(client, 500, 2)
            total = sum(await balances(client))
        assert total == ACCOUNTS * INITIAL
        # One reply per submission: a request the client wrote again to a newer ingress segment (a
        # slow run) is answered once per copy, with the same reply (docs/architecture.md).
        submitted = Counter(
            request_decoder.decode(v).request_id for v in await read_values(stack.kafka, "styx-ingress")
        )
        replies: dict[str, list[Reply]] = {}
        for reply in await read_topic(stack.kafka, "styx-egress"):
            replies.setdefault(reply.request_id, []).append(reply)
        for when, rids in (("before", before), ("after", after)):
            for rid in rids:
                got = replies.get(rid, [])
                assert len(got) == submitted[rid] and all(r == got[0] for r in got), (
                    f"{rid} (sent {when} the restart): {len(got)} replies, {submitted[rid]} submitted: {got}"
                )
        if changelog:
            positions = Counter(await changelog_positions(stack.kafka, changelog))
            twice = [p for p, n in positions.items() if n > 1]
            assert positions and not twice, f"changelog records stored twice: {twice[:5]}"
        stack.check_alive()  # workers and coordinator rode out the broker restart
    finally:
        await asyncio.to_thread(stack.stop)


async def changelog_positions(bootstrap: str, topic: str) -> list[tuple[int, int, int]]:
    """(partition, epoch, index) of every record of the changelog ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.topics()
        parts = sorted(consumer.partitions_for_topic(topic) or ())
    finally:
        await consumer.stop()
    records = await read_to_end(bootstrap, {TopicPartition(topic, p): 0 for p in parts})
    return [(r.partition, *change_decoder.decode(r.value).position) for r in records]


async def test_snapshots_survive_an_s3_restart(s3: SeaweedS3, kafka: TansuBroker, tmp_path: Path) -> None:
    async with bank_cluster(tmp_path, s3, kafka, cluster_env(snapshot_interval_s="0.2")) as (stack, client):
        await transfers(client, 300, 3)
        status = await admin(stack.coordinator, StatusRequest())
        while status["last_snapshot"] is None:  # poll until a snapshot is complete
            await transfers(client, 20, 4)
            status = await admin(stack.coordinator, StatusRequest())
        await asyncio.to_thread(s3.restart, hard=True)
        stack.kill("w1")
        stack.start_worker("w1")
        await transfers(client, 300, 5)
        total = sum(await balances(client))
        status = await admin(stack.coordinator, StatusRequest())
    assert total == ACCOUNTS * INITIAL
    assert status["recoveries"] >= 1
    assert status["last_recovery"]["snapshot_epoch"] >= 0, "recovery did not use the snapshot"


async def test_hung_worker_is_detected_replaced_and_recovered(kafka: TansuBroker, tmp_path: Path) -> None:
    """SIGSTOP freezes a worker's event loop: no heartbeat for failure_timeout_ms => failed; the
    supervisor kills and restarts it and the cluster recovers (the frozen one is fenced by SIGKILL)."""
    import os
    import signal
    import time

    stack = LocalStack(tmp_path, workers=2, kafka=kafka.bootstrap, env=cluster_env())
    await asyncio.to_thread(stack.start)
    try:
        await asyncio.to_thread(stack.deploy, "styx_benchmarks.bank:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
            await open_accounts(client)
            os.kill(stack.procs["w1"].pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            pending = asyncio.ensure_future(transfers(client, 300, 6))  # waits on the frozen worker
            said: list[str] = []
            while not any(line.startswith("w1 hung") for line in said):  # poll with a deadline
                assert time.monotonic() - frozen_at < 30, f"the hung worker was never replaced: {said}"
                said += await asyncio.to_thread(stack.supervise)
            detected_s = time.monotonic() - frozen_at
            await pending
            total = sum(await balances(client))
            status = await admin(stack.coordinator, StatusRequest())
    finally:
        await asyncio.to_thread(stack.stop)
    assert total == ACCOUNTS * INITIAL
    assert status["recoveries"] >= 1
    print(f"hung worker replaced after {detected_s:.2f}s; recovery {status['last_recovery']}")


async def test_sigterm_stops_workers_and_the_coordinator_cleanly(
    s3: SeaweedS3, kafka: TansuBroker, tmp_path: Path
) -> None:
    """SIGTERM (a supervisor's stop) runs a process's closers: producers flushed and closed, the
    coordinator's compaction child shut down. Each exits 0 and says so; the coordinator, which has
    compacted, leaves no multiprocessing resources behind (a process that died at once would leave
    semaphores the resource tracker reports as leaked)."""
    import os
    import signal

    env = cluster_env(snapshot_interval_s="0.2", snapshot_compact_after="1", log_level="INFO")
    async with bank_cluster(tmp_path, s3, kafka, env) as (stack, client):
        seed = 10
        while (await admin(stack.coordinator, StatusRequest()))["compactions"] < 1:
            await transfers(client, 50, seed)  # the next snapshots compact (bounded by the test timeout)
            seed += 1
        for name in ("w1", "w2", "coordinator"):
            proc = stack.procs[name]
            os.killpg(proc.pid, signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 60)
            said = (stack.log_dir / f"{name}.log").read_text(errors="replace")
            assert code == 0, f"{name} exited {code} after SIGTERM:\n{said[-3000:]}"
            assert "SIGTERM: stopping" in said, said[-3000:]
            assert "leaked" not in said, said[-3000:]


async def test_a_bug_in_a_worker_recovery_ends_its_process_and_the_supervisor_restarts_it(
    s3: SeaweedS3, kafka: TansuBroker, tmp_path: Path
) -> None:
    """An assertion raised in a worker's recovery (planted in w1's restore by the app it imports) is a
    bug: the worker process exits with its traceback (code 70) instead of reporting a failed recovery
    that would be retried for ever; ``styx up``'s supervisor starts it again, the next recovery works,
    and no money is lost or made."""
    import time

    marker = tmp_path / "planted-bug"
    env = {**cluster_env(snapshot_interval_s="0.5"), "STYX_TEST_PLANTED_BUG": str(marker)}
    stack = LocalStack(tmp_path, workers=2, kafka=kafka.bootstrap, s3=s3.config, env=env)
    await asyncio.to_thread(stack.start)
    try:
        await asyncio.to_thread(stack.deploy, "tests.apps.recovery_bug:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
            await open_accounts(client)
            await transfers(client, 200, 7)
            marker.touch()
            stack.kill("w1")  # its next process recovers, and the planted bug fires in the restore
            said: list[str] = []
            deadline = time.monotonic() + 120
            while not any("w1 exited with code 70" in line for line in said):  # poll with a deadline
                assert time.monotonic() < deadline, f"w1 never ended with the bug: {said}"
                said += await asyncio.to_thread(stack.supervise)
                await asyncio.sleep(0.1)
            assert not marker.exists(), "the planted bug did not fire"
            log = (stack.log_dir / "w1.log").read_text(errors="replace")
            assert "AssertionError: a planted bug in the restore" in log
            await transfers(client, 200, 8)  # w1's third process recovers and runs
            total = sum(await balances(client))
            status = await admin(stack.coordinator, StatusRequest())
    finally:
        await asyncio.to_thread(stack.stop)
    assert total == ACCOUNTS * INITIAL
    assert status["state"] == "running"
    assert any(line.startswith("w1 was killed") for line in said), said
