"""Worker crashes on real services: SIGKILL while bank transfers flow at a steady rate.

Tansu (Kafka protocol) + SeaweedFS (snapshots) + coordinator and worker processes. A worker is
killed with SIGKILL at random times and restarted (as a supervisor would); the cluster rolls back to
the last complete snapshot and replays the logged epochs. At the end: no request lost, none executed
twice (on the egress log itself), money conserved, balances equal the serial replay in commit order.
Admission control is on as deployed: a request it refuses (a hot account's queue past the bound)
is answered `refused`, runs nothing, and the serial replay takes it so.

Two clusters: the default one (Tansu in memory), and durable mode (Tansu keeping its log in S3, as
``styx up --durable``) with clients that resend a request id when its reply is late, Zipfian keys and
a kill that lands while the cluster recovers from the previous one.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka import TopicPartition

from styx_benchmarks.bank import account
from styx_benchmarks.bank import app as bank_app
from styx_benchmarks.keys import KeyChooser
from styx_client import StyxClient
from styx_py.core.errors import Overloaded, RequestTimeout, StyxError
from styx_py.core.serial import reply_outcome, serial_replay
from styx_py.core.wire import Reply, Request, StatusRequest, encode_value, reply_decoder
from styx_py.io.kafka_logs import read_to_end
from styx_py.stack.local import LocalStack, admin
from styx_py.stack.services import SeaweedS3
from tests.service_fixtures import ClusterFactory, DurableKafkaFactory, start_cluster
from tests.test_integration import ingress_ids, read_replies, read_topic

pytestmark = pytest.mark.services

ACCOUNTS = 200
INITIAL = 1000
KILLS = int(os.environ.get("STYX_CHAOS_KILLS", "5"))
RATE = float(os.environ.get("STYX_CHAOS_RATE", "200"))
DURABLE_RATE = float(os.environ.get("STYX_CHAOS_DURABLE_RATE", "300"))
RESEND_AFTER_S = 1.5  # a durable-mode client resends a request id whose reply is this late


@dataclass
class Chaos:
    """How one chaos run loads and kills the cluster."""

    rate: float
    kills: int = KILLS
    resend_after_s: float | None = None  # None: one submission per request, waiting as long as it takes
    zipf: float = 0.0  # key skew of the transfers
    wait_for_recovering: bool = False  # a close-following kill waits until the cluster is recovering
    worker_with_coordinator: bool = False  # the coordinator's kill takes a worker down with it
    requests: dict[str, Request] = field(default_factory=dict)  # filled by run_chaos: what it sent


@pytest.fixture
def stack(local_cluster: ClusterFactory, s3: SeaweedS3) -> LocalStack:
    return local_cluster(app="styx_benchmarks.bank:app", s3=s3, settings={"snapshot_interval_s": "0.5"})


async def test_sigkill_workers_under_load(stack: LocalStack) -> None:
    egress = stack.env["STYX_EGRESS_TOPIC"]
    logged = await run_chaos(stack, Chaos(RATE), lambda: read_topic(stack.kafka, egress))
    assert not [rid for rid, c in Counter(r.request_id for r in logged).items() if c > 1], (
        "a request was answered twice"
    )
    await audit(stack)


@pytest.fixture
def durable_stack(durable_kafka: DurableKafkaFactory, s3: SeaweedS3, tmp_path: Path) -> Iterator[LocalStack]:
    """A cluster on a Tansu that keeps its log in S3 (what ``styx up --durable`` runs, reply routing
    off included: with every reply of the one client on one partition, Tansu on S3 starves its reader
    and this test resends 6x as often and does not finish; docs/operations.md "Durable mode")."""
    # Admission on, as deployed: its clients resend every unanswered request each 1.5 s, and those
    # copies do not count against the bound (docs/operations.md#overload).
    settings = {"snapshot_interval_s": "0.5", "reply_routing": "false"}
    app = "styx_benchmarks.bank:app"
    with start_cluster(tmp_path, durable_kafka(), s3=s3, app=app, settings=settings) as stack:
        yield stack


async def test_sigkill_in_durable_mode_with_resending_clients(durable_stack: LocalStack) -> None:
    """Durable mode, a kill during recovery, clients resending timed-out ids (same id, 1.5 s timeout,
    Zipfian keys, 300/s), and the coordinator killed together with a worker: the cluster recovers each
    time, and no request runs twice."""
    stack = durable_stack
    chaos = Chaos(
        DURABLE_RATE,
        resend_after_s=RESEND_AFTER_S,
        zipf=0.9,
        wait_for_recovering=True,
        worker_with_coordinator=True,
    )
    logged = await run_chaos(stack, chaos, lambda: read_egress(stack))
    # A resent id is answered again (from the reply table, or by its running copy): the same reply,
    # never a second execution.
    first: dict[str, Reply] = {}
    for reply in logged:
        assert first.setdefault(reply.request_id, reply) == reply, f"{reply.request_id} executed twice"


async def run_chaos(stack: LocalStack, chaos: Chaos, read_egress_log: Callable[[], Any]) -> list[Reply]:
    """Transfers at ``chaos.rate`` while ``chaos.kills`` processes are SIGKILLed and restarted, then the
    checks against the serial execution; the egress log as read by ``read_egress_log``."""
    rng, killing = random.Random(7), random.Random(8)  # load, kills: each its own seeded stream
    keys = KeyChooser(ACCOUNTS, chaos.zipf, seed=9)
    requests = chaos.requests
    replies: dict[str, Reply] = {}
    resent = refused = 0
    # Room for every request sent while a recovery (or several) holds replies back; every request is
    # sent (none shed by the client's window), and one the cluster refuses is answered `refused`.
    connecting = StyxClient.connect(
        stack.coordinator, timeout_s=180, max_pending=100_000, shed_when_refused=False
    )
    async with await connecting as client:

        async def submit(key: str, function: str, *args: object) -> None:
            nonlocal refused
            rid = uuid.uuid4().hex
            requests[rid] = Request(rid, "account", function, key, msgspec.Raw(encode_value(list(args))))
            try:
                replies[rid] = await submit_once(rid, key, function, *args)
            except Overloaded as exc:
                # Admission control refused it (a hot account's queue, a backlog past the bound):
                # nothing ran, and the serial replay below takes it as such.
                assert isinstance(exc.reply, Reply), f"{rid} shed by the client"
                replies[rid] = exc.reply
                refused += 1

        async def submit_once(rid: str, key: str, function: str, *args: object) -> Reply:
            nonlocal resent
            if chaos.resend_after_s is None:
                return await client.submit("account", key, function, *args, request_id=rid)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 300
            while True:
                try:
                    return await client.submit(
                        "account", key, function, *args, request_id=rid, timeout_s=chaos.resend_after_s
                    )
                except RequestTimeout:
                    assert loop.time() < deadline, f"no reply to {rid} in 300 s of resending"
                    resent += 1  # the same id again, as a client whose request timed out would

        await asyncio.gather(*(submit(f"a{i}", "deposit", INITIAL) for i in range(ACCOUNTS)))

        async def cluster_status() -> dict[str, Any] | None:
            try:
                return await admin(stack.coordinator, StatusRequest(), timeout_s=5)
            except StyxError:
                return None  # the coordinator is down or restarting

        async def recovered_from(generation: int) -> int:
            """Wait (polling, with a deadline) until a generation after ``generation`` is running with
            every worker registered; its generation."""
            deadline = asyncio.get_running_loop().time() + 300
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

        async def recovering() -> bool:
            """Wait (polling, with a deadline) until the coordinator reports a recovery in progress;
            False if the cluster was running again before that could be seen."""
            deadline = asyncio.get_running_loop().time() + 60
            while asyncio.get_running_loop().time() < deadline:
                status = await cluster_status()
                if status is not None and status["state"] == "recovering":
                    return True
                await asyncio.sleep(0.02)
            return False

        first = await cluster_status()
        assert first is not None and first["state"] == "running"
        generations = [int(first["generation"])]  # at the start, then the generation each kill hit
        spaced = during_recovery = 0
        killing_done = asyncio.Event()

        async def killer() -> None:
            nonlocal spaced, during_recovery
            try:
                for i in range(chaos.kills):
                    if i % 3 == 1:
                        # Every third kill follows the last closely, while the cluster may still be
                        # recovering from it: chaos timing, not a wait (or, in durable mode, a wait
                        # for the recovery to be under way, so that this kill surely lands in it).
                        if chaos.wait_for_recovering:
                            during_recovery += await recovering()
                        else:
                            await asyncio.sleep(killing.uniform(0.05, 0.2))
                    else:
                        # The others hit a cluster that is running again after the previous kill (so each
                        # must cause a recovery of its own), after some load on it (chaos timing).
                        if i > 0:
                            await recovered_from(generations[-1])
                        await asyncio.sleep(killing.uniform(0.1, 0.6))
                        spaced += 1
                    status = await cluster_status()
                    generations.append(generations[-1] if status is None else int(status["generation"]))
                    if i % 10 == 2:  # kills 2, 12, 22, …
                        stack.kill("coordinator")
                        if chaos.worker_with_coordinator:
                            worker = killing.choice(["w1", "w2"])
                            stack.kill(worker)
                            stack.start_worker(worker)
                        stack.start_coordinator()
                    else:
                        worker = killing.choice(["w1", "w2"])
                        stack.kill(worker)
                        stack.start_worker(worker)
            finally:
                killing_done.set()

        async def load() -> None:
            """Open-loop transfers at the rate from the start until a second after the last kill."""
            tasks = []
            loop = asyncio.get_running_loop()
            start, i, end = loop.time(), 0, float("inf")
            while (now := loop.time()) < end:
                if killing_done.is_set() and end == float("inf"):
                    end = now + 1.0
                delay = start + i / chaos.rate - now
                if delay > 0:
                    await asyncio.sleep(delay)  # open-loop pacing
                a, b = keys.distinct(2, rng)
                tasks.append(asyncio.create_task(submit(f"a{a}", "transfer", f"a{b}", rng.randint(1, 300))))
                i += 1
            await asyncio.gather(*tasks)

        await asyncio.gather(killer(), load())
        final_generation = await recovered_from(generations[-1] - (chaos.kills == 0))
        balances = await asyncio.gather(
            *(client.call("account", f"a{i}", "balance") for i in range(ACCOUNTS))
        )

    print(
        f"{len(requests)} requests ({resent} resends, {refused} refused), generations {generations} -> "
        f"{final_generation}, {spaced} spaced kills, {during_recovery} during a recovery"
    )
    # The generation counts every recovery over the cluster's life (it survives coordinator restarts):
    # every kill of a running cluster started at least one recovery of its own.
    assert final_generation - generations[0] >= spaced, (generations, final_generation)
    if chaos.wait_for_recovering:
        assert during_recovery >= 1, "no kill landed during a recovery"
    assert sum(balances) == ACCOUNTS * INITIAL, "money not conserved"
    logged: list[Reply] = await read_replies(read_egress_log, requests)
    assert set(requests) <= {r.request_id for r in logged}, "requests lost"
    by_id = {r.request_id: r for r in logged if r.request_id in requests}
    for rid, reply in replies.items():
        assert by_id[rid] == reply
    serial_state, outcomes = await serial_replay(bank_app, requests, by_id.values())
    for rid, reply in by_id.items():
        assert reply_outcome(reply) == outcomes[rid], rid
    assert balances == [serial_state.get(("account", f"a{i}"), 0) for i in range(ACCOUNTS)]
    return logged


async def read_egress(stack: LocalStack) -> list[Reply]:
    """The whole egress log, read with the recovery's reader (its fetch wait adapts to Tansu on S3)."""
    topic = stack.env["STYX_EGRESS_TOPIC"]
    records = await read_to_end(stack.kafka, {TopicPartition(topic, p): 0 for p in range(account.partitions)})
    return [reply_decoder.decode(r.value) for r in records]


async def audit(stack: LocalStack, app: str = "styx_benchmarks.bank:app") -> str:
    """The offline audit over exactly the topics and snapshots the run produced: exactly-once, Mencius
    ordering, epochs against the sequencer log, serial replay of the snapshot; its report.md."""
    pytest.importorskip("pyspark")
    from styx_py.cli import main as styx_main

    s3 = stack.external_s3
    assert s3 is not None
    topics = stack.env
    # The audit reads the logs up to their ends as it starts; the copies of the last replies the test's
    # client was pushed may still be on their way to the egress log (read_until).
    await read_replies(
        lambda: read_topic(stack.kafka, topics["STYX_EGRESS_TOPIC"]),
        await ingress_ids(stack.kafka, topics["STYX_INGRESS_TOPIC"]),
    )
    argv = ["audit", "--kafka", stack.kafka, "--ingress-topic", topics["STYX_INGRESS_TOPIC"]]
    argv += ["--egress-topic", topics["STYX_EGRESS_TOPIC"], "--seqlog-topic", topics["STYX_SEQLOG_TOPIC"]]
    argv += ["--changelog-topic", topics["STYX_CHANGELOG_TOPIC"]]
    argv += ["--s3-endpoint", s3.endpoint, "--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key]
    argv += ["--bucket", topics["STYX_SNAPSHOT_BUCKET"], "--app", app]
    argv += ["--out", str(stack.data_dir / "audit")]
    code = await asyncio.to_thread(styx_main, argv)
    report = (stack.data_dir / "audit" / "report.md").read_text()
    assert code == 0, report[:3000]
    return report
