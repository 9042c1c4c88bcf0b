"""A broker that loses its log under a running cluster (real processes).

In memory, Tansu loses every topic when it restarts: the cluster must stop in state ``log-lost``,
saying which log lost what, having given only replies equal to the serial execution, and none after.
On S3 storage (``--durable``) a restart loses nothing: the cluster rides it out, exactly once.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from styx_benchmarks.bank import app as bank_app
from styx_client import StyxClient
from styx_py.core.errors import RequestTimeout, StyxError, Unavailable
from styx_py.core.logmarks import LogMark, marker_topic
from styx_py.core.serial import reply_outcome, serial_replay
from styx_py.core.wire import Reply, Request, StatusRequest, encode_value
from styx_py.io.kafka_admin import create_topics
from styx_py.io.logguard import KafkaLogGuard
from styx_py.stack.errors import BrokerLost
from styx_py.stack.local import LocalStack, admin
from styx_py.stack.tansu import TansuBroker
from tests.test_metrics import samples, value
from tests.test_transport_security import until

pytestmark = pytest.mark.services

ACCOUNTS = 50
INITIAL = 1000
RATE = 200  # transfers per second, open loop


@dataclass
class Run:
    """What the clients sent and what they were answered."""

    requests: dict[str, Request] = field(default_factory=dict)
    replies: dict[str, Reply] = field(default_factory=dict)
    unanswered: int = 0

    async def submit(
        self, client: StyxClient, key: str, function: str, *args: object, timeout_s: float
    ) -> None:
        rid = uuid.uuid4().hex
        self.requests[rid] = Request(rid, "account", function, key, msgspec.Raw(encode_value(list(args))))
        try:
            self.replies[rid] = await client.submit(
                "account", key, function, *args, request_id=rid, timeout_s=timeout_s
            )
        except (RequestTimeout, Unavailable):  # no reply in time; not sent (the broker restarting)
            self.unanswered += 1

    async def load(self, client: StyxClient, stop: asyncio.Event, timeout_s: float) -> None:
        """Transfers at :data:`RATE` until ``stop``; returns once each was answered or timed out."""
        rng = random.Random(11)
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        start = loop.time()
        while not stop.is_set():
            delay = start + len(tasks) / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # open-loop pacing
            a, b = rng.sample(range(ACCOUNTS), 2)
            coro = self.submit(client, f"a{a}", "transfer", f"a{b}", rng.randint(1, 300), timeout_s=timeout_s)
            tasks.append(asyncio.create_task(coro))
        await asyncio.gather(*tasks)

    async def check_serial(self) -> dict[tuple[str, Any], Any]:
        """Every reply given equals the serial execution of the answered requests in tid order, no tid
        answers two requests; the serial state."""
        tids = Counter(r.tid for r in self.replies.values() if r.tid >= 0)
        assert [t for t, n in tids.items() if n > 1] == [], "a tid answered two requests"
        state, outcomes = await serial_replay(bank_app, self.requests, self.replies.values())
        wrong = [rid for rid, reply in self.replies.items() if reply_outcome(reply) != outcomes[rid]]
        assert wrong == [], f"{len(wrong)} replies differ from the serial execution"
        return state


async def test_the_guard_reads_the_marker_and_the_ends_and_names_what_a_restart_lost(tmp_path: Path) -> None:
    """The coordinator's check against a real broker: nothing lost, another cluster's marker, an end
    below a recorded offset, and after an in-memory restart the marker and the topic gone."""
    from aiokafka import AIOKafkaProducer

    broker = await asyncio.to_thread(TansuBroker("memory", log_path=tmp_path / "tansu.log").start)
    try:
        seqlog, marker = "t-seqlog", marker_topic("t-seqlog")
        await create_topics(broker.bootstrap, {seqlog: 1, marker: 1, "t-in": 4})
        guard = KafkaLogGuard(broker.bootstrap, seqlog)
        c1 = await guard.stamp()
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await producer.start()
        try:
            for _ in range(5):
                await producer.send_and_wait(seqlog, b"entry", partition=0)
                await producer.send_and_wait("t-in", b"request", partition=3)
        finally:
            await producer.stop()
        held = LogMark("sequencer log", seqlog, 0, 5)
        assert await guard.lost(c1, [held]) == []
        assert await guard.lost("c2", [held]) == [f"cluster marker {marker}: holds cluster {c1}, not c2"]
        beyond = held._replace(offset=6)
        assert await guard.lost(c1, [beyond]) == [
            f"sequencer log {seqlog} partition 0: recorded offset 6, broker ends at 5"
        ]
        ingress = LogMark("ingress", "t-in", 3, 5)
        assert await guard.lost(c1, [held, ingress]) == []
        await asyncio.to_thread(broker.restart, hard=True)
        assert await guard.lost(c1, [held]) == [
            f"cluster marker {marker}: the topic is gone (cluster {c1})",
            f"sequencer log {seqlog}: the topic is gone (recorded offset 5)",
        ]
        # A request names the topic again: Tansu creates it, empty, with partitions of its own choice.
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait("t-in", b"request", partition=0)
        finally:
            await producer.stop()
        marker_gone, again = await guard.lost(c1, [ingress])
        assert marker_gone.startswith(f"cluster marker {marker}")
        assert again.startswith("ingress t-in partition 3: ") and again.endswith(
            ("recorded offset 5, broker ends at 0", "the partition is gone (recorded offset 5)")
        ), again
    finally:
        await asyncio.to_thread(broker.stop)


async def status_of(stack: LocalStack) -> dict[str, Any] | None:
    try:
        return await admin(stack.coordinator, StatusRequest(), timeout_s=5)
    except StyxError:
        return None


async def state_becomes(stack: LocalStack, wanted: str, deadline_s: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:
        status = await status_of(stack)
        if status is not None and status["state"] == wanted:
            return status
        assert loop.time() < end, f"never {wanted}: {status and (status['state'], status['degraded'])}"
        await asyncio.sleep(0.05)  # polling the cluster's status, bounded by the deadline


async def snapshot_taken(stack: LocalStack) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while ((await status_of(stack)) or {}).get("last_snapshot") is None:
        assert loop.time() < end, "no snapshot in 60 s"
        await asyncio.sleep(0.05)  # polling the cluster's status, bounded by the deadline


async def test_a_restarted_in_memory_broker_stops_the_cluster_in_state_log_lost(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, workers=2, env={"STYX_SNAPSHOT_INTERVAL_S": "0.5"})
    await asyncio.to_thread(stack.start)
    run = Run()
    try:
        await asyncio.to_thread(stack.deploy, "styx_benchmarks.bank:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=60, max_pending=100_000) as client:
            await asyncio.gather(
                *(run.submit(client, f"a{i}", "deposit", INITIAL, timeout_s=60) for i in range(ACCOUNTS))
            )
            assert len(run.replies) == ACCOUNTS
            stop = asyncio.Event()
            load = asyncio.create_task(run.load(client, stop, timeout_s=5))
            await until(lambda: len(run.replies) >= ACCOUNTS + 300, "300 transfers answered", 60)
            await snapshot_taken(stack)
            assert stack.broker is not None
            # SIGKILL and start again with its own command line, the stack's supervisor not asked.
            await asyncio.to_thread(stack.broker.kill)
            answered_at_kill = len(run.replies)
            await asyncio.to_thread(stack.broker.start)
            status = await state_becomes(stack, "log-lost", 60)
            stop.set()
            await load
            unanswered = run.unanswered
            await run.submit(client, "a1", "deposit", 5, timeout_s=3)
        assert run.unanswered == unanswered + 1, "a request after the loss was answered"
        said = status["degraded"]
        assert "lost the cluster's log" in said and "docs/operations.md#log-lost" in said, said
        print(
            f"{answered_at_kill} answered at the kill, {len(run.replies)} in all, "
            f"{run.unanswered} unanswered; {said}"
        )
        async with httpx.AsyncClient(timeout=10) as http:
            ready = await http.get(stack.metrics_url("coordinator").replace("/metrics", "/readyz"))
            assert ready.status_code == 503 and "log-lost" in ready.text, ready.text
            scrape = samples((await http.get(stack.metrics_url("coordinator"))).text)
            assert value(scrape, "styx_coordinator_state", state="log-lost") == 1
        await run.check_serial()
        with pytest.raises(BrokerLost, match="a broker restart loses the cluster's data"):
            await asyncio.to_thread(stack.supervise)  # the broker it started died: `styx up` stops
    finally:
        await asyncio.to_thread(stack.stop)


async def test_a_restarted_durable_broker_loses_nothing_under_load(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, workers=2, durable=True, env={"STYX_SNAPSHOT_INTERVAL_S": "0.5"})
    await asyncio.to_thread(stack.start)
    run = Run()
    try:
        await asyncio.to_thread(stack.deploy, "styx_benchmarks.bank:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=120, max_pending=100_000) as client:
            await asyncio.gather(
                *(run.submit(client, f"a{i}", "deposit", INITIAL, timeout_s=120) for i in range(ACCOUNTS))
            )
            stop = asyncio.Event()
            load = asyncio.create_task(run.load(client, stop, timeout_s=120))
            await until(lambda: len(run.replies) >= ACCOUNTS + 300, "300 transfers answered", 120)
            await snapshot_taken(stack)
            assert stack.broker is not None
            await asyncio.to_thread(stack.broker.kill)
            # `styx up`'s supervisor starts a durable broker again (on its S3 storage).
            said = await asyncio.to_thread(stack.supervise)
            assert any(line.startswith("tansu was killed by SIGKILL: restarted") for line in said), said
            assert stack.broker.running
            answered_at_kill = len(run.replies)
            await until(
                lambda: len(run.replies) >= answered_at_kill + 300, "300 more transfers answered", 120
            )
            stop.set()
            await load
            balances = await asyncio.gather(
                *(client.call("account", f"a{i}", "balance") for i in range(ACCOUNTS))
            )
        status = await status_of(stack)
        assert status is not None and status["state"] == "running", status and status["degraded"]
        assert run.unanswered == 0 and len(run.replies) == len(run.requests), "requests lost"
        state = await run.check_serial()
        assert sum(balances) == ACCOUNTS * INITIAL, "money not conserved"
        assert balances == [state.get(("account", f"a{i}"), 0) for i in range(ACCOUNTS)]
        stack.check_alive()
    finally:
        await asyncio.to_thread(stack.stop)


async def test_a_coordinator_that_resumes_on_a_broker_that_lost_the_log_stops_it(tmp_path: Path) -> None:
    """The check at start: the coordinator dies, the in-memory broker restarts meanwhile, and the
    coordinator that resumes from S3 finds the cluster's marker gone before it recovers anything."""
    stack = LocalStack(tmp_path, workers=2, env={"STYX_SNAPSHOT_INTERVAL_S": "0.5"})
    await asyncio.to_thread(stack.start)
    run = Run()
    try:
        await asyncio.to_thread(stack.deploy, "styx_benchmarks.bank:app")
        async with await StyxClient.connect(stack.coordinator, timeout_s=60) as client:
            await asyncio.gather(
                *(run.submit(client, f"a{i}", "deposit", INITIAL, timeout_s=60) for i in range(ACCOUNTS))
            )
            await snapshot_taken(stack)
        assert len(run.replies) == ACCOUNTS
        stack.kill("coordinator")
        assert stack.broker is not None
        await asyncio.to_thread(stack.broker.restart, hard=True)
        stack.start_coordinator()
        status = await state_becomes(stack, "log-lost", 60)
        assert f"cluster marker {marker_topic('styx-seqlog')}: the topic is gone" in status["degraded"]
        assert status["recoveries"] == 0, "it recovered from a log it no longer had"
        await run.check_serial()
    finally:
        await asyncio.to_thread(stack.stop)
