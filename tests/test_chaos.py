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
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from benchmarks.bank import app as bank_app
from client import StyxClient
from styx_py.services import SeaweedS3, TansuBroker
from styx_py.stack import LocalStack, admin
from styx_py.testing.serial import reply_outcome, serial_replay
from styx_py.wire import Reply, Request, StatusRequest, encode_value
from tests.test_integration import read_topic

pytestmark = pytest.mark.services

ACCOUNTS = 200
INITIAL = 1000
KILLS = int(os.environ.get("STYX_CHAOS_KILLS", "5"))
RATE = float(os.environ.get("STYX_CHAOS_RATE", "200"))


@pytest.fixture
def stack(kafka: TansuBroker, s3: SeaweedS3, tmp_path: Path) -> Iterator[LocalStack]:
    suffix = uuid.uuid4().hex[:8]
    env = {
        "STYX_INGRESS_TOPIC": f"ingress-{suffix}",
        "STYX_EGRESS_TOPIC": f"egress-{suffix}",
        "STYX_SEQLOG_TOPIC": f"seqlog-{suffix}",
        "STYX_SNAPSHOT_BUCKET": f"snap-{suffix}",
        "STYX_SNAPSHOT_INTERVAL_S": "0.5",
        "STYX_LOG_LEVEL": "WARNING",
    }
    with LocalStack(tmp_path, workers=2, kafka=kafka.bootstrap, s3=s3.config, env=env) as s:
        s.topics = env  # type: ignore[attr-defined]
        s.deploy("benchmarks.bank:app")
        yield s


async def test_sigkill_workers_under_load(stack: LocalStack) -> None:
    rng = random.Random(7)
    requests: dict[str, Request] = {}
    replies: dict[str, Reply] = {}
    async with await StyxClient.connect(stack.coordinator, timeout_s=180) as client:

        async def submit(key: str, function: str, *args: object) -> None:
            rid = uuid.uuid4().hex
            requests[rid] = Request(rid, "account", function, key, msgspec.Raw(encode_value(list(args))))
            replies[rid] = await client.submit("account", key, function, *args, request_id=rid)

        await asyncio.gather(*(submit(f"a{i}", "deposit", INITIAL) for i in range(ACCOUNTS)))

        async def killer() -> None:
            for i in range(KILLS):
                # Chaos timing, not a wait for a condition. Every third kill follows the last
                # closely (two failures within one snapshot interval); kills 2, 12, 22, …
                # take the coordinator.
                await asyncio.sleep(rng.uniform(0.05, 0.2) if i % 3 == 1 else rng.uniform(0.4, 1.5))
                victim = "coordinator" if i % 10 == 2 else rng.choice(["w1", "w2"])
                stack.kill(victim)
                if victim == "coordinator":
                    stack.start_coordinator()
                else:
                    stack.start_worker(victim)

        async def load() -> None:
            tasks = []
            n = int(RATE * (KILLS * 1.0 + 2))
            start = asyncio.get_running_loop().time()
            for i in range(n):
                delay = start + i / RATE - asyncio.get_running_loop().time()
                if delay > 0:
                    await asyncio.sleep(delay)  # open-loop pacing
                a, b = rng.sample(range(ACCOUNTS), 2)
                tasks.append(asyncio.create_task(submit(f"a{a}", "transfer", f"a{b}", rng.randint(1, 300))))
            await asyncio.gather(*tasks)

        await asyncio.gather(killer(), load())
        balances = await asyncio.gather(
            *(client.call("account", f"a{i}", "balance") for i in range(ACCOUNTS))
        )

    status = await admin(stack.coordinator, StatusRequest())
    print(f"generation {status['generation']}, last recovery {status['last_recovery']}")
    # The generation counts every recovery over the cluster's life (it survives coordinator restarts).
    assert status["generation"] >= KILLS // 2 + 1, status
    assert sum(balances) == ACCOUNTS * INITIAL, "money not conserved"
    logged = await read_topic(stack.kafka, stack.topics["STYX_EGRESS_TOPIC"])  # type: ignore[attr-defined]
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
    topics = stack.topics  # type: ignore[attr-defined]
    argv = ["audit", "--kafka", stack.kafka, "--ingress-topic", topics["STYX_INGRESS_TOPIC"]]
    argv += ["--egress-topic", topics["STYX_EGRESS_TOPIC"], "--seqlog-topic", topics["STYX_SEQLOG_TOPIC"]]
    argv += ["--s3-endpoint", s3.endpoint, "--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key]
    argv += ["--bucket", topics["STYX_SNAPSHOT_BUCKET"], "--app", "benchmarks.bank:app"]
    argv += ["--out", str(stack.data_dir / "audit")]
    code = await asyncio.to_thread(styx_main, argv)
    report = (stack.data_dir / "audit" / "report.md").read_text()
    assert code == 0, report[:3000]
