"""Worker crashes on real services: SIGKILL while bank transfers flow at a steady rate.

Tansu (Kafka protocol) + SeaweedFS (snapshots) + coordinator and worker processes. A worker is
killed with SIGKILL at random times and restarted (as a supervisor would); the cluster rolls back to
the last complete snapshot and replays the logged epochs. At the end: no request lost, none answered
twice (on the egress log itself), money conserved, balances equal the serial replay in commit order.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import Counter
from typing import Any

import msgspec
import pytest

from styx_py.benchmarks.bank import app as bank_app
from styx_py.client import StyxClient
from styx_py.core.errors import StyxError
from styx_py.core.serial import reply_outcome, serial_replay
from styx_py.core.wire import Reply, Request, StatusRequest, encode_value
from styx_py.stack.local import LocalStack, admin
from styx_py.stack.services import SeaweedS3
from tests.service_fixtures import ClusterFactory
from tests.test_integration import read_topic

pytestmark = pytest.mark.services

ACCOUNTS = 200
INITIAL = 1000
KILLS = int(os.environ.get("STYX_CHAOS_KILLS", "5"))
RATE = float(os.environ.get("STYX_CHAOS_RATE", "200"))


@pytest.fixture
def stack(local_cluster: ClusterFactory, s3: SeaweedS3) -> LocalStack:
    return local_cluster(app="styx_py.benchmarks.bank:app", s3=s3, settings={"snapshot_interval_s": "0.5"})


async def test_sigkill_workers_under_load(stack: LocalStack) -> None:
    rng, chaos = random.Random(7), random.Random(8)  # load, kills: each its own seeded stream
    requests: dict[str, Request] = {}
    replies: dict[str, Reply] = {}
    async with await StyxClient.connect(stack.coordinator, timeout_s=180) as client:

        async def submit(key: str, function: str, *args: object) -> None:
            rid = uuid.uuid4().hex
            requests[rid] = Request(rid, "account", function, key, msgspec.Raw(encode_value(list(args))))
            replies[rid] = await client.submit("account", key, function, *args, request_id=rid)

        await asyncio.gather(*(submit(f"a{i}", "deposit", INITIAL) for i in range(ACCOUNTS)))

        async def cluster_status() -> dict[str, Any] | None:
            try:
                return await admin(stack.coordinator, StatusRequest(), timeout_s=5)
            except StyxError:
                return None  # the coordinator is down or restarting

        async def recovered_from(generation: int) -> int:
            """Wait (polling, with a deadline) until a generation after ``generation`` is running with
            every worker registered; its generation."""
            deadline = asyncio.get_running_loop().time() + 120
            while True:
                status = await cluster_status()
                if (
                    status is not None
                    and status["state"] == "running"
                    and status["generation"] > generation
                    and len(status["workers"]) == 2
                    and not status["failed_workers"]
                ):
                    return int(status["generation"])
                assert asyncio.get_running_loop().time() < deadline, (
                    f"no recovery after {generation}: {status}"
                )
                await asyncio.sleep(0.05)

        first = await cluster_status()
        assert first is not None and first["state"] == "running"
        generations = [int(first["generation"])]  # at the start, then the generation each kill hit
        spaced = 0
        killing_done = asyncio.Event()

        async def killer() -> None:
            nonlocal spaced
            try:
                for i in range(KILLS):
                    if i % 3 == 1:
                        # Every third kill follows the last closely, within one snapshot interval, while
                        # the cluster may still be recovering from it: chaos timing, not a wait.
                        await asyncio.sleep(chaos.uniform(0.05, 0.2))
                    else:
                        # The others hit a cluster that is running again after the previous kill (so each
                        # must cause a recovery of its own), after some load on it (chaos timing).
                        if i > 0:
                            await recovered_from(generations[-1])
                        await asyncio.sleep(chaos.uniform(0.1, 0.6))
                        spaced += 1
                    status = await cluster_status()
                    generations.append(generations[-1] if status is None else int(status["generation"]))
                    victim = (
                        "coordinator" if i % 10 == 2 else chaos.choice(["w1", "w2"])
                    )  # kills 2, 12, 22, …
                    stack.kill(victim)
                    if victim == "coordinator":
                        stack.start_coordinator()
                    else:
                        stack.start_worker(victim)
            finally:
                killing_done.set()

        async def load() -> None:
            """Open-loop transfers at RATE from the start until a second after the last kill."""
            tasks = []
            loop = asyncio.get_running_loop()
            start, i, end = loop.time(), 0, float("inf")
            while (now := loop.time()) < end:
                if killing_done.is_set() and end == float("inf"):
                    end = now + 1.0
                delay = start + i / RATE - now
                if delay > 0:
                    await asyncio.sleep(delay)  # open-loop pacing
                a, b = rng.sample(range(ACCOUNTS), 2)
                tasks.append(asyncio.create_task(submit(f"a{a}", "transfer", f"a{b}", rng.randint(1, 300))))
                i += 1
            await asyncio.gather(*tasks)

        await asyncio.gather(killer(), load())
        final_generation = await recovered_from(generations[-1] - (KILLS == 0))
        balances = await asyncio.gather(
            *(client.call("account", f"a{i}", "balance") for i in range(ACCOUNTS))
        )

    print(f"{len(requests)} requests, generations {generations} -> {final_generation}, {spaced} spaced kills")
    # The generation counts every recovery over the cluster's life (it survives coordinator restarts):
    # every kill of a running cluster started at least one recovery of its own.
    assert final_generation - generations[0] >= spaced, (generations, final_generation)
    assert sum(balances) == ACCOUNTS * INITIAL, "money not conserved"
    logged = await read_topic(stack.kafka, stack.env["STYX_EGRESS_TOPIC"])
    counts = Counter(r.request_id for r in logged)
    assert set(requests) <= set(counts), f"{len(set(requests) - set(counts))} requests lost"
    assert not [rid for rid, c in counts.items() if c > 1], "a request was answered twice"
    by_id = {r.request_id: r for r in logged if r.request_id in requests}
    for rid, reply in replies.items():
        assert by_id[rid] == reply
    serial_state, outcomes = await serial_replay(bank_app, requests, by_id.values())
    for rid, reply in by_id.items():
        assert reply_outcome(reply) == outcomes[rid], rid
    assert balances == [serial_state.get(("account", f"a{i}"), 0) for i in range(ACCOUNTS)]

    # The chaos run ends with the offline audit over exactly the topics and snapshots it produced:
    # exactly-once, Mencius ordering, epochs against the sequencer log, serial replay of the snapshot.
    pytest.importorskip("pyspark")
    from styx_py.cli import main as styx_main

    s3 = stack.external_s3
    assert s3 is not None
    topics = stack.env
    argv = ["audit", "--kafka", stack.kafka, "--ingress-topic", topics["STYX_INGRESS_TOPIC"]]
    argv += ["--egress-topic", topics["STYX_EGRESS_TOPIC"], "--seqlog-topic", topics["STYX_SEQLOG_TOPIC"]]
    argv += ["--s3-endpoint", s3.endpoint, "--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key]
    argv += ["--bucket", topics["STYX_SNAPSHOT_BUCKET"], "--app", "styx_py.benchmarks.bank:app"]
    argv += ["--out", str(stack.data_dir / "audit")]
    code = await asyncio.to_thread(styx_main, argv)
    report = (stack.data_dir / "audit" / "report.md").read_text()
    assert code == 0, report[:3000]
