"""Code updates: ``styx deploy`` of a new version takes effect at an epoch barrier on every worker.

Transactions of epochs before the barrier ran the old version, those of the barrier epoch and after
run the new one: over seeds, with workers and the coordinator crashing around the update, every reply
and the final state equal the serial execution in commit order where each transaction runs the
version of its epoch. A version that cannot be loaded or would move keys is refused and changes
nothing.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from styx_py.cli import format_status
from styx_py.core.errors import GraphError
from styx_py.core.graph import GraphVersion, version_at
from styx_py.core.wire import ClusterMeta, ClusterView, EpochStart, Reply, SeqLogEntry, seqlog_decoder
from styx_py.testing.cluster import SimCluster, check_against_serial

V1 = "tests.apps.versioned:v1"
V2 = "tests.apps.versioned:v2"
RETRY_S = 0.25  # virtual time between deploy attempts (an operator retrying a refused update)
MAX_ATTEMPTS = 200


def submit_mix(c: SimCluster, rng: random.Random, n: int, *, new_functions: bool) -> None:
    """Transfers on hot keys (conflicts, fallback, rescheduling), chains of synchronous calls across
    workers, deposits; ``acct.bonus`` exists only from v2 on (before: an unknown function)."""

    def key() -> str:
        return f"k{rng.randrange(3)}" if rng.random() < 0.5 else f"k{rng.randrange(12)}"

    for _ in range(n):
        kind = rng.random()
        a, b = key(), key()
        if kind < 0.45 and a != b:
            c.submit("acct", "transfer", a, b, rng.randint(1, 40))
        elif kind < 0.6:
            c.submit("acct", "chain", a, [f"k{rng.randrange(12)}" for _ in range(rng.randint(0, 3))], 2)
        elif kind < 0.7 or not new_functions:
            c.submit("acct", "deposit", a, rng.randint(1, 9))
        elif kind < 0.85:
            c.submit("acct", "bonus", a)
        else:
            c.submit("fees", "collect", "total", 1)  # a new operator: only once v2 is committed


async def deploy_until_committed(c: SimCluster, import_path: str) -> dict[str, Any]:
    """Deploy, retrying what a crash refused (a recovery in between, a coordinator that died)."""
    for _ in range(MAX_ATTEMPTS):
        try:
            return await c.deploy(import_path, timeout_s=5.0)
        except GraphError as exc:
            assert "did not" in str(exc) or "recover" in str(exc) or "in progress" in str(exc), exc
            await asyncio.sleep(RETRY_S)
    raise AssertionError(f"{import_path} was never committed")


def version_of(reply: Reply) -> str | None:
    value = reply.value if reply.committed else None
    return value[0] if isinstance(value, list) and value and isinstance(value[0], str) else None


async def run_update(
    seed: int, *, crashes: int, coordinator_crashes: int, drops: int = 0, duplicates: int = 0
) -> SimCluster:
    rng = random.Random(seed)
    async with SimCluster(
        V1,
        workers=3,
        seed=seed,
        epoch_size_max=rng.choice([5, 20]),
        snapshot_interval_epochs=1 + seed % 3,
        epoch_timeout_ms=300,
        egress_ack_lag=rng.choice([0, 4]),
        seqlog_ack_lag=(seed % 3) * 10,
    ) as c:
        for i in range(12):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        base = c.network.delivered
        for _ in range(crashes):
            node = rng.choice(["w1", "w2", "w3"])
            c.network.faults.at(base + rng.randint(10, 600), lambda node=node: c.crash(node))
        for _ in range(coordinator_crashes):
            c.network.faults.at(base + rng.randint(10, 600), c.crash_coordinator)
        for _ in range(drops):
            c.network.faults.drops.add(base + rng.randint(10, 600))  # e.g. a PrepareGraph, a view, a vote
        for _ in range(duplicates):
            c.network.faults.duplicates.add(base + rng.randint(10, 600))
        c.submit("acct", "bonus", "k1")  # before the barrier: v1 has no such function
        submit_mix(c, rng, 120, new_functions=False)
        await c.wait_for_replies(len(c.replies) + 30)
        await deploy_until_committed(c, V2)  # under load: most requests above are still to run
        submit_mix(c, rng, 80, new_functions=True)
        await c.wait(timeout_s=120)
        await check_against_serial(c)
        return c


def barrier_of(c: SimCluster) -> int:
    versions = c.coordinator.cluster.versions
    assert [(v.number, v.import_path) for v in versions] == [(1, V1), (2, V2)], versions
    return versions[1].first_epoch


def assert_versions_by_epoch(c: SimCluster) -> tuple[int, int]:
    """Every committed reply names the version of its epoch; returns (v1 replies, v2 replies)."""
    barrier = barrier_of(c)
    counts = {"v1": 0, "v2": 0}
    for reply in c.sent.unique_replies():
        tag = version_of(reply)
        if tag is None:
            continue
        assert tag == ("v1" if reply.epoch < barrier else "v2"), (c.seed, barrier, reply)
        counts[tag] += 1
    # Every worker's sequencer-log entry records the version its epoch ran.
    for entry in seqlog_entries(c):
        if entry.gen == c.coordinator.manifest.generation_of(entry.epoch):  # type: ignore[union-attr]
            assert (entry.version or 1) == (1 if entry.epoch < barrier else 2), entry
    return counts["v1"], counts["v2"]


def seqlog_entries(c: SimCluster) -> list[SeqLogEntry]:
    entries = c.log.topics[c.config.seqlog_topic][0]
    assert entries and all(isinstance(e, SeqLogEntry) for e in entries)
    return list(entries)


async def test_an_update_under_load_answers_v1_before_the_barrier_and_v2_after() -> None:
    c = await run_update(1, crashes=0, coordinator_crashes=0)
    v1, v2 = assert_versions_by_epoch(c)
    assert v1 > 0 and v2 > 0, (v1, v2)
    bonus = [r for r in c.sent.unique_replies() if c.requests[r.request_id].function == "bonus"]
    before = [r for r in bonus if r.epoch < barrier_of(c)]
    assert before and all(r.status == "failed" and "unknown function" in (r.error or "") for r in before)
    assert any(r.committed for r in bonus), "no bonus ran on v2"
    status = c.coordinator.status()
    assert status["version"] == 2 and status["graph"] == V2
    assert [v["version"] for v in status["versions"]] == [1, 2]
    assert c.coordinator.metrics.registry.get_sample_value("styx_coordinator_graph_version") == 2
    shown = format_status(status)
    assert f"{V2}, version 2 from epoch {barrier_of(c)} (before: 1 {V1} from 0)" in shown, shown


@pytest.mark.parametrize("seed", range(8))
async def test_updates_with_crashes_run_every_epoch_with_its_version(seed: int) -> None:
    c = await run_update(100 + seed, crashes=1 + seed % 2, coordinator_crashes=1 if seed % 3 == 0 else 0)
    assert c.crashes >= 1
    assert_versions_by_epoch(c)


# 4069 (found by a sweep): the view listing v2's new operator was lost; the worker ran epoch E with v2
# (prepared) and could not route its call to that operator. Workers now route to the epoch's graph.
@pytest.mark.parametrize("seed", [200, 201, 202, 203, 4069])
async def test_updates_with_lost_and_duplicated_messages(seed: int) -> None:
    """A lost PrepareGraph, GraphPrepared, view or vote stalls the update or an epoch (the deploy is
    retried, recovery repairs the epoch); duplicates change nothing."""
    c = await run_update(
        seed, crashes=seed % 3, coordinator_crashes=seed % 2, drops=1 + seed % 2, duplicates=20
    )
    assert c.network.faults.dropped >= 1
    assert_versions_by_epoch(c)


@pytest.mark.parametrize(
    ("import_path", "error"),
    [
        ("tests.apps.no_such_module:app", "cannot import"),
        ("tests.apps.versioned:nothing", "has no attribute"),
        ("tests.apps.versioned:repartitioned", "moves its keys between partitions"),
        ("tests.apps.versioned:too_wide", "cannot add partitions"),
        ("tests.apps.versioned:dropped", "removes operator 'ledger'"),
    ],
)
async def test_a_refused_update_leaves_the_old_version_running(import_path: str, error: str) -> None:
    async with SimCluster(V1, workers=2, seed=3, epoch_size_max=10) as c:
        for i in range(8):
            c.submit("acct", "deposit", f"k{i}", 10)
        with pytest.raises(GraphError, match=error):
            await c.coordinator.deploy(import_path, timeout_s=5.0)
        c.submit("acct", "bonus", "k1")
        for i in range(8):
            c.submit("acct", "deposit", f"k{i}", 1)
        await c.wait()
        await check_against_serial(c)
        assert c.coordinator.cluster.versions == [GraphVersion(1, V1, 0)]
        assert {version_of(r) for r in c.sent.unique_replies() if r.committed} == {"v1"}
        assert c.coordinator.status()["refused_updates"] == 1


async def test_an_update_whose_state_cannot_be_saved_is_refused() -> None:
    """The version of an epoch must be durable before the epoch runs: when saving the cluster's state
    fails at the barrier, the update is refused and v1 runs on (and a later deploy succeeds)."""
    async with SimCluster(V1, workers=2, seed=4, epoch_size_max=10) as c:
        c.submit("acct", "deposit", "k1", 10)
        await c.wait()
        c.blobs.fail(1, "cluster/")
        with pytest.raises(GraphError, match="saving the cluster state failed"):
            await c.deploy(V2, timeout_s=5.0)
        c.submit("acct", "deposit", "k1", 1)
        await c.wait()
        assert version_of(c.replies[-1]) == "v1"
        assert c.coordinator.cluster.versions == [GraphVersion(1, V1, 0)]
        await c.deploy(V2, timeout_s=5.0)
        c.submit("acct", "bonus", "k1")
        await c.wait()
        assert version_of(c.replies[-1]) == "v2"
        await check_against_serial(c)


async def test_a_worker_that_cannot_load_the_new_version_refuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's Python path may differ from the coordinator's: its failure refuses the update."""
    import styx_worker.versions as service

    real = service.load_graph

    def workers_lack_v2(path: str) -> Any:  # the workers' Python path, without v2 on it
        if path == V2:
            raise GraphError("cannot import 'tests.apps.versioned': not on this worker's path")
        return real(path)

    async with SimCluster(V1, workers=3, seed=5, epoch_size_max=10) as c:
        monkeypatch.setattr(service, "load_graph", workers_lack_v2)
        with pytest.raises(GraphError, match=r"worker w1 cannot load .*not on this worker's path"):
            await c.coordinator.deploy(V2, timeout_s=5.0)
        monkeypatch.undo()
        c.submit("acct", "deposit", "k1", 1)
        await c.wait()
        await check_against_serial(c)
        assert version_of(c.replies[-1]) == "v1"
        assert c.coordinator.graph_path == V1


async def test_two_updates_in_a_row_and_a_replay_across_both() -> None:
    """v1 -> v2 -> v3, then a worker crash: the replay runs each epoch with the version it ran with."""
    async with SimCluster(V1, workers=3, seed=8, epoch_size_max=5, snapshot_interval_epochs=0) as c:
        rng = random.Random(8)
        submit_mix(c, rng, 30, new_functions=False)
        await c.deploy(V2)
        submit_mix(c, rng, 30, new_functions=True)
        await c.deploy("tests.apps.versioned:v3")
        submit_mix(c, rng, 30, new_functions=True)
        await c.wait()
        c.crash("w2")  # no snapshot: recovery replays every epoch, across all three versions
        submit_mix(c, rng, 30, new_functions=True)
        await c.wait(timeout_s=60)
        await check_against_serial(c)
        assert c.coordinator.recoveries >= 1
        assert [v.number for v in c.coordinator.cluster.versions] == [1, 2, 3]
        tags = {version_of(r) for r in c.sent.unique_replies()} - {None}
        assert tags == {"v1", "v2", "v3"}


def test_records_written_before_code_updates_still_decode() -> None:
    """The version fields are last, with defaults: a sequencer-log entry, a saved cluster state, a view
    or an EpochStart written before them decode (as the first version)."""
    old_entry = msgspec.msgpack.encode([3, "w1", 40, [], 2, 42])
    assert seqlog_decoder.decode(old_entry).version == 0
    old_meta = msgspec.msgpack.encode(["m:app", ["w1"], ["w1"], 2, [[0, 0]], ""])
    meta = msgspec.msgpack.decode(old_meta, type=ClusterMeta)
    assert meta.versions == [] and meta.graph_path == "m:app"
    view = ClusterView(1, [], [], "m:app", [], None, "in", "out", "seq", 0)
    encoded = msgspec.msgpack.encode(view)
    assert msgspec.msgpack.decode(encoded, type=ClusterView).versions == []
    start = msgspec.msgpack.decode(msgspec.msgpack.encode(["es", 5, 0, False, False, 1]), type=EpochStart)
    assert start.version == 0
    assert version_at([GraphVersion(1, "a", 0), GraphVersion(2, "b", 7)], 6).number == 1
    assert version_at([GraphVersion(1, "a", 0), GraphVersion(2, "b", 7)], 7).number == 2


async def test_the_audit_replays_each_epoch_with_its_version() -> None:
    """``styx audit`` reads the versions from the cluster's saved state: a log that ran v1 then v2
    checks clean against them, and not against v2 alone."""
    from styx_py.audit.rules import SerialCheck
    from styx_py.audit.tasks import graphs_of

    async with SimCluster(V1, workers=2, seed=2, epoch_size_max=10) as c:
        rng = random.Random(2)
        submit_mix(c, rng, 30, new_functions=False)
        await c.wait()
        await c.deploy(V2)
        submit_mix(c, rng, 30, new_functions=True)
        await c.wait()
    versions = [(v.number, v.first_epoch, v.import_path) for v in c.coordinator.cluster.versions]
    ordered = sorted(c.sent.unique_replies(), key=lambda r: (r.epoch, r.phase, r.tid))

    async def findings(app: Any) -> int:
        check = SerialCheck(graphs_of(app), None, None)
        for reply in ordered:
            await check.feed(c.requests[reply.request_id], reply)
        return len(check.finish())

    assert await findings(versions) == 0
    assert await findings(V2) > 0


async def test_the_gateway_client_learns_the_new_functions_of_an_update() -> None:
    """The SDK checks calls against the deployed graph: after a code update the gateway's client must
    accept the new operators and functions (it learns them from the coordinator's status)."""
    from styx_client.gateway.cluster import Backend, ClusterLink
    from styx_client.gateway.config import GatewayConfig
    from styx_client.sdk import StyxClient
    from styx_py.core.errors import BadRequest
    from styx_py.core.graph import load_graph

    def status(path: str) -> dict[str, Any]:
        ops = load_graph(path).specs()
        return {"graph": path, "state": "running", "operators": [msgspec.structs.asdict(o) for o in ops]}

    statuses = [status(V1), status(V2)]
    client = StyxClient("127.0.0.1:1", {"acct": 4, "ledger": 2}, functions={"acct": ["deposit"]})

    async def source() -> dict[str, Any]:
        return statuses[0]

    async def factory(body: Any, cfg: GatewayConfig) -> Backend:
        return client

    link = ClusterLink(GatewayConfig("127.0.0.1:1"), source, factory)
    await link._poll(0)
    with pytest.raises(BadRequest, match="bonus"):
        client.prepare("acct", "bonus")
    statuses.pop(0)
    await link._poll(0)
    client.prepare("acct", "bonus")
    client.prepare("fees", "collect")


@pytest.mark.services
async def test_a_code_update_under_load_on_real_processes(kafka: Any, s3: Any, tmp_path: Path) -> None:
    """The same on a real cluster (coordinator and 2 worker processes, Tansu, SeaweedFS): transfers
    run while v2 is deployed; a refused update changes nothing; a worker killed after the update
    recovers (replaying epochs of both versions when its snapshot is older than the barrier). Every
    reply is v1 before the barrier and v2 from it, each request answered once, money conserved."""
    from styx_client import StyxClient
    from styx_py.core.errors import StyxError
    from styx_py.core.wire import StatusRequest
    from styx_py.stack.local import LocalStack, admin
    from tests.service_fixtures import cluster_env
    from tests.test_integration import read_replies, read_topic

    env = cluster_env(snapshot_interval_s="0.5")
    stack = LocalStack(tmp_path, workers=2, kafka=kafka.bootstrap, s3=s3.config, env=env)
    await asyncio.to_thread(stack.start)
    replies: list[Reply] = []
    rng = random.Random(7)
    accounts = [f"a{i}" for i in range(20)]

    async def transfers(client: StyxClient, n: int) -> None:
        window = asyncio.Semaphore(50)

        async def one() -> None:
            a, b = rng.sample(accounts, 2)
            async with window:
                replies.append(await client.submit("acct", a, "transfer", b, rng.randint(1, 30)))

        await asyncio.gather(*(one() for _ in range(n)))

    try:
        await asyncio.to_thread(stack.deploy, V1)
        async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
            replies += await asyncio.gather(*(client.submit("acct", a, "deposit", 100) for a in accounts))
            load = asyncio.ensure_future(transfers(client, 600))
            body = await asyncio.to_thread(stack.deploy, V2)  # under load
            with pytest.raises(StyxError, match="moves its keys"):
                await asyncio.to_thread(stack.deploy, "tests.apps.versioned:repartitioned")
            await load
            client.set_deployment(
                {o["name"]: o["partitions"] for o in body["operators"]},
                {o["name"]: o["functions"] for o in body["operators"]},
            )
            bonus = await asyncio.gather(*(client.submit("acct", a, "bonus") for a in accounts[:5]))
            replies += bonus
            stack.kill("w1")
            stack.start_worker("w1")
            await transfers(client, 300)
            balances = [await client.call("acct", a, "peek") for a in accounts]
            fees = await client.call("fees", "total", "collect", 0)
        status = await admin(stack.coordinator, StatusRequest())
        egress, ids = env["STYX_EGRESS_TOPIC"], [r.request_id for r in replies]
        logged = await read_replies(lambda: read_topic(kafka.bootstrap, egress), ids)
    finally:
        await asyncio.to_thread(stack.stop)
    assert [v["version"] for v in status["versions"]] == [1, 2] and status["refused_updates"] == 1
    assert status["recoveries"] >= 1
    barrier = status["versions"][1]["first_epoch"]
    tags = {"v1": 0, "v2": 0}
    for reply in replies:
        tag = version_of(reply)
        if tag is not None:
            assert tag == ("v1" if reply.epoch < barrier else "v2"), (barrier, reply)
            tags[tag] += 1
    assert tags["v1"] > 0 and tags["v2"] > 0, tags
    counts = Counter(r.request_id for r in logged)
    assert all(counts[r.request_id] == 1 for r in replies), "a request was answered twice or not at all"
    assert all(r.committed for r in bonus), bonus
    assert sum(b[1] for b in balances) + fees[1] == 100 * len(accounts) + 5 * len(bonus)


async def test_a_replay_that_needs_a_version_it_cannot_import_fails_by_name(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """All versions stay importable (docs/operations.md#code-updates): a restarted worker that must
    replay v1 epochs but cannot import v1 fails its recovery with an error naming the epoch, the
    version and the path; the recovery is retried and succeeds once v1 is importable again."""
    import styx_worker.versions as service

    real = service.load_graph

    def v1_gone(path: str) -> Any:
        if path == V1:
            raise GraphError("cannot import 'tests.apps.versioned': v1 was uninstalled")
        return real(path)

    async with SimCluster(V1, workers=2, seed=6, epoch_size_max=5, snapshot_interval_epochs=0) as c:
        rng = random.Random(6)
        submit_mix(c, rng, 20, new_functions=False)
        await c.wait()
        await c.deploy(V2)
        monkeypatch.setattr(service, "load_graph", v1_gone)
        c.crash("w2")  # no snapshot: its replay starts with v1's epochs
        for _ in range(MAX_ATTEMPTS):  # poll (virtual time) until an attempt failed
            if c.coordinator.recovery.failed_attempts:
                break
            await asyncio.sleep(RETRY_S)
        assert c.coordinator.recovery.failed_attempts >= 1
        monkeypatch.undo()
        submit_mix(c, rng, 20, new_functions=True)
        await c.wait(timeout_s=60)
        await check_against_serial(c)
    failures = [r.getMessage() for r in caplog.records if "recovery to generation" in r.getMessage()]
    assert any(
        "replaying epoch 0 needs graph version 1 (tests.apps.versioned:v1)" in m and "uninstalled" in m
        for m in failures
    ), failures
