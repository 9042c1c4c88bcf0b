"""How the coordinator meets failures: a named operating error (S3 or the broker failing: an
``OSError``) is retried or refused, within a bound; anything else raised in its recovery, snapshots,
compaction or deploy (an assertion: a bug) ends it (``Coordinator.run`` raises, the process exits and
its supervisor restarts it) and is never retried.

Faults come through the ports, on the simulation's virtual time: the blob store fails the
coordinator's writes of some keys (:class:`FaultyBlobs`; the workers keep the plain in-memory store),
or the in-memory store's own injected upload failures (``MemoryBlobStore.fail``).
"""

from __future__ import annotations

import asyncio
import builtins
import random

import pytest

from styx_coordinator.server import Coordinator
from styx_py.core.config import load_config
from styx_py.core.errors import GraphError
from styx_py.core.wire import COORDINATOR, DeployRequest, Register
from styx_py.testing.cluster import SimCluster, check_against_serial, virtual_time
from styx_py.testing.memory import MemoryBlobStore, MemoryNetwork
from tests.test_oracle import APP, submit_random_mix

V1, V2 = "tests.apps.versioned:v1", "tests.apps.versioned:v2"


class FaultyBlobs:
    """The cluster's blob store as the coordinator writes it: once armed (:meth:`arm`), every write of a
    key under ``prefix`` raises ``exc``; reads, lists and deletes pass through."""

    def __init__(self, inner: MemoryBlobStore) -> None:
        self.inner = inner
        self.prefix = ""
        self.exc: BaseException | None = None
        self.raised = 0

    def arm(self, prefix: str, exc: BaseException) -> None:
        self.prefix, self.exc = prefix, exc

    async def put(self, key: str, data: bytes) -> None:
        if self.exc is not None and key.startswith(self.prefix):
            self.raised += 1
            raise self.exc
        await self.inner.put(key, data)

    async def get(self, key: str) -> bytes | None:
        return await self.inner.get(key)

    async def list(self, prefix: str) -> builtins.list[str]:
        return await self.inner.list(prefix)

    async def delete(self, keys: builtins.list[str]) -> None:
        await self.inner.delete(keys)


def faulty(c: SimCluster) -> FaultyBlobs:
    """Put a :class:`FaultyBlobs` between the coordinator and the cluster's blob store."""
    blobs = FaultyBlobs(c.blobs)
    c.coordinator.meta.blobs = c.coordinator.snapshots.blobs = blobs
    return blobs


async def until_ended(c: SimCluster, within_s: float = 120) -> None:
    """Until the coordinator's run() has ended (virtual time: the deadline costs no real time)."""
    done, _ = await asyncio.wait([c.coordinator_task], timeout=within_s)
    assert done, (
        f"the coordinator ran on for {within_s}s of simulated time: {c.coordinator.status()['state']}"
    )


async def until_state(c: SimCluster, state: str, within_s: float = 600) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while c.coordinator.status()["state"] != state:
        assert not c.coordinator_task.done(), "the coordinator ended"
        assert loop.time() < deadline, f"the cluster never became {state}"
        await asyncio.sleep(0.1)  # simulated time


async def some_work(c: SimCluster, seed: int, n: int = 60) -> None:
    submit_random_mix(c, random.Random(seed), n, n_keys=12, hot=0.3)
    await c.wait()


# ---- a bug ends the coordinator --------------------------------------------------------------------


async def test_a_bug_in_recovery_ends_the_coordinator_instead_of_being_retried() -> None:
    with pytest.raises(ExceptionGroup) as ended:
        async with SimCluster(APP, workers=3, seed=1, epoch_timeout_ms=300) as c:
            blobs = faulty(c)
            await some_work(c, 1)
            blobs.arm("cluster/", AssertionError("a bug while saving the cluster state"))
            c.crash("w2")  # its restart re-registers: a recovery, which saves the cluster state first
            await until_ended(c)
            attempts, state = c.coordinator.recovery.attempts, c.coordinator.state
    assert ended.group_contains(AssertionError, match="a bug while saving the cluster state")
    assert (attempts, blobs.raised, state) == (1, 1, "recovering"), "the bug was retried"


async def test_a_bug_in_taking_a_snapshot_ends_the_coordinator() -> None:
    with pytest.raises(ExceptionGroup) as ended:
        async with SimCluster(APP, workers=2, seed=2, snapshot_interval_epochs=1) as c:
            blobs = faulty(c)
            blobs.arm("manifests/", AssertionError("a bug while writing a manifest"))
            submit_random_mix(c, random.Random(2), 40, n_keys=12, hot=0.3)
            await until_ended(c)
    assert ended.group_contains(AssertionError, match="a bug while writing a manifest")
    assert blobs.raised == 1


async def test_a_bug_in_compaction_ends_the_coordinator() -> None:
    with pytest.raises(ExceptionGroup) as ended:
        async with SimCluster(
            APP, workers=2, seed=3, snapshot_interval_epochs=1, snapshot_compact_after=1, epoch_size_max=5
        ) as c:
            blobs = faulty(c)
            # The coordinator writes under snapshots/ only the bases compaction merges.
            blobs.arm("snapshots/", AssertionError("a bug while compacting"))
            submit_random_mix(c, random.Random(3), 80, n_keys=12, hot=0.3)
            await until_ended(c)
    assert ended.group_contains(AssertionError, match="a bug while compacting")
    assert blobs.raised == 1


async def test_a_bug_in_a_code_update_ends_the_coordinator() -> None:
    """A deploy request from an admin client runs in the coordinator's task group: an update whose
    commit hits a bug ends the coordinator, as any other of its tasks would."""
    with pytest.raises(ExceptionGroup) as ended:
        async with SimCluster(V1, workers=2, seed=4, epoch_size_max=10) as c:
            blobs = faulty(c)
            c.submit("acct", "deposit", "k1", 10)
            await c.wait()
            blobs.arm("cluster/", AssertionError("a bug while committing an update"))
            c.network.send("admin", COORDINATOR, DeployRequest(V2))
            await until_ended(c)
    assert ended.group_contains(AssertionError, match="a bug while committing an update")


# ---- named operating errors: retried or refused, within a bound --------------------------------------


async def test_a_recovery_failing_on_s3_is_retried_within_its_bound_then_the_cluster_is_degraded() -> None:
    """S3 refuses every write of the cluster state: each recovery attempt fails on it and is retried,
    up to recovery_max_attempts; then the cluster stops, degraded, saying why, and tries no more. The
    workers are not halted and nothing is saved: once S3 is back, a restarted coordinator resumes the
    cluster and recovers it."""
    async with SimCluster(APP, workers=3, seed=5, epoch_timeout_ms=300, recovery_max_attempts=6) as c:
        await some_work(c, 5)
        c.blobs.fail(10**9, "cluster/")
        c.crash("w2")
        await until_state(c, "degraded")
        status = c.coordinator.status()
        reason = status["degraded"]
        assert reason.startswith("recovery gave up after 6 attempts"), reason
        assert "recovery_max_attempts=6" in reason and "OSError: injected upload failure" in reason
        assert status["recovery_attempts"] == 6
        ready, why = c.coordinator.metrics.readiness()
        assert not ready and why == f"degraded: {reason}"
        recoveries, gen = c.coordinator.recoveries, c.coordinator.gen
        await asyncio.sleep(30)  # simulated time: what more attempts, 2 s apart at most, would fill
        assert (c.coordinator.recoveries, c.coordinator.gen) == (recoveries, gen), "it tried again"
        assert not c.coordinator_task.done(), "the coordinator must stay up to say why"
        # S3 is back: the operator restarts the coordinator, and only it (the workers were not halted:
        # a halted one would refuse the recovery that follows).
        c.blobs.fail(0)
        c.crash_coordinator()
        await some_work(c, 50)
        assert c.coordinator.status()["state"] == "running"
        await check_against_serial(c)


async def test_a_recovery_gives_up_after_recovery_max_s_however_few_its_attempts() -> None:
    async with SimCluster(APP, workers=3, seed=6, epoch_timeout_ms=300, recovery_max_s=5) as c:
        await some_work(c, 6)
        began = asyncio.get_running_loop().time()
        c.blobs.fail(10**9, "cluster/")
        c.crash("w3")
        await until_state(c, "degraded")
        took_s = asyncio.get_running_loop().time() - began
        attempts = c.coordinator.status()["recovery_attempts"]
        assert "recovery_max_s=5" in c.coordinator.status()["degraded"]
        assert 3 < attempts < 300 and took_s < 10, (attempts, took_s)


async def test_a_compaction_failing_on_s3_is_counted_and_the_cluster_runs_on() -> None:
    async with SimCluster(
        APP, workers=2, seed=7, snapshot_interval_epochs=1, snapshot_compact_after=1, epoch_size_max=5
    ) as c:
        blobs = faulty(c)
        blobs.arm("snapshots/", OSError("injected: S3 refuses the compacted base"))
        await some_work(c, 7, n=80)
        assert blobs.raised >= 1 and c.coordinator.status()["failed_compactions"] == blobs.raised
        m = c.coordinator.manifest
        assert m is not None and m.epoch >= 0, "snapshots complete all the same"
        c.crash("w1")  # and recover from their uncompacted chains
        await some_work(c, 70, n=40)
        await check_against_serial(c)


async def test_a_first_deploy_whose_state_cannot_be_saved_is_refused_and_a_second_deploys() -> None:
    """Nothing is deployed when S3 fails the first save of the cluster state, so deploying again
    deploys (a graph left set would make it a no-op)."""
    with virtual_time():
        net, blobs = MemoryNetwork(0), MemoryBlobStore()
        coord = Coordinator(load_config({}, env={}), net.endpoint(COORDINATOR), blobs=blobs)
        net.register(COORDINATOR, coord.on_message)
        task = asyncio.create_task(coord.run())
        coord.on_message("w1", Register("w1", "127.0.0.1", 1))
        blobs.fail(1, "cluster/")
        with pytest.raises(
            GraphError, match=r"saving the cluster state failed \(OSError: .*nothing deployed"
        ):
            await coord.deploy(APP, timeout_s=5.0)
        assert (coord.graph_path, coord.state, coord.manifest) == (None, "starting", None)
        await coord.deploy(APP, timeout_s=5.0)
        assert (coord.graph_path, coord.state) == (APP, "running") and "cluster/meta" in blobs.objects
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
