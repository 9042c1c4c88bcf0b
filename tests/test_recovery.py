"""Crashes in the in-process cluster: snapshots, recovery, replay, exactly-once replies.

Workers are killed at seeded points of the message flow (so at any point of an epoch: during
execution, between commit and reply, during a snapshot upload, during a recovery), restarted empty
with the same id, and the cluster recovers from the last complete snapshot plus the logs. Over many
seeds, every request is answered exactly once and the replies and final state equal the serial
execution in commit order.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from styx_coordinator.snapshots import empty_manifest
from styx_py.core.config import load_config
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import COORDINATOR, Message, Recover, Register, SnapshotDone
from styx_py.testing.cluster import SimCluster, check_against_serial
from styx_py.testing.memory import MemoryEgress, MemoryIngress, MemoryLog, MemoryNetwork, MemorySeqLog
from styx_worker.ports import WorkerPorts
from styx_worker.shell import Worker
from tests.test_oracle import APP, submit_random_mix


async def run_with_crashes(
    seed: int,
    *,
    crashes: int,
    coordinator_crashes: int = 0,
    snapshot_every: int,
    n: int = 300,
    upload_failures: int = 0,
    compact_after: int = 8,
    epoch_size: int | None = None,
    resends: int = 0,
    resends_first: bool = False,
    drops: int = 0,
    duplicates: int = 0,
    log_segment_s: float = 0.0,
    epoch_interval_ms: float = 0.0,
) -> SimCluster:
    rng = random.Random(seed)
    async with SimCluster(
        APP,
        workers=3,
        seed=seed,
        epoch_size_max=epoch_size or rng.choice([5, 20, 100]),
        snapshot_interval_epochs=snapshot_every,
        snapshot_compact_after=compact_after,
        epoch_timeout_ms=300,
        egress_ack_lag=rng.choice([0, 2, 8]),
        # Sequencer-log entries durable only after some hops (lost if the worker crashes first).
        seqlog_ack_lag=(seed % 3) * 20,
        log_segment_s=log_segment_s,
        epoch_interval_ms=epoch_interval_ms,
    ) as c:
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        base = c.network.delivered
        for _ in range(crashes):
            node = rng.choice(["w1", "w2", "w3"])
            c.network.faults.at(base + rng.randint(20, 1200), lambda node=node: c.crash(node))
        for _ in range(duplicates):
            c.network.faults.duplicates.add(base + rng.randint(20, 1200))
        for _ in range(drops):
            c.network.faults.drops.add(base + rng.randint(20, 1200))  # a lost message stalls an epoch
        for _ in range(coordinator_crashes):
            c.network.faults.at(base + rng.randint(20, 1200), c.crash_coordinator)
        for i in range(upload_failures):
            # The next few uploads fail: of snapshot objects first (snapshots taken then are torn and
            # must never be used), then of any object (manifests, the coordinator's own state).
            failures, prefix = rng.randint(3, 12), "snapshots/" if i % 2 == 0 else ""
            c.network.faults.at(base + rng.randint(20, 1000), lambda f=failures, p=prefix: c.blobs.fail(f, p))
        for _ in range(3):
            if resends_first:
                # Resends queued ahead of fresh requests of their partitions: an epoch's batch then
                # takes a resend before a fresh request, and logs it after (runs first).
                for rid in rng.sample(sorted(c.requests), min(resends, len(c.requests))):
                    c.resubmit(rid)
            submit_random_mix(c, rng, n // 3, n_keys=20, hot=rng.choice([0.2, 0.6]))
            # Clients resending request ids: some answered long ago, some still in flight.
            for rid in rng.sample(sorted(c.requests), min(resends, len(c.requests))):
                c.resubmit(rid)
            await c.wait(timeout_s=120)
        await check_against_serial(c)
        return c


@pytest.mark.parametrize("seed", range(30))
async def test_crashes_keep_exactly_once_and_serializability(seed: int) -> None:
    c = await run_with_crashes(seed, crashes=1 + seed % 3, snapshot_every=1 + seed % 4)
    assert c.crashes >= 1


async def test_recovery_uses_snapshots() -> None:
    c = await run_with_crashes(3, crashes=2, snapshot_every=2, n=600)
    assert c.coordinator.recoveries >= 1
    assert c.coordinator.manifest is not None and c.coordinator.manifest.epoch >= 0, "no snapshot completed"


async def test_recovery_without_any_snapshot_replays_from_the_start() -> None:
    c = await run_with_crashes(5, crashes=1, snapshot_every=0, n=150)
    assert c.coordinator.manifest is not None and c.coordinator.manifest.epoch == -1


@pytest.mark.parametrize("seed", range(12))
async def test_torn_snapshots_and_compaction(seed: int) -> None:
    c = await run_with_crashes(
        100 + seed,
        crashes=1 + seed % 2,
        snapshot_every=1,
        upload_failures=2,
        compact_after=2,
        n=450,
        epoch_size=5,
    )
    m = c.coordinator.manifest
    assert m is not None
    for keys in m.deltas.values():
        for key in keys:
            assert key in c.blobs.objects, f"manifest {m.epoch} lists {key}, which is gone"
    assert len(m.deltas.get(0, [])) <= 3, "compaction did not bound the delta chain"
    assert c.coordinator.compactions > 0
    assert c.coordinator.failed_snapshots > 0, "no torn snapshot was produced"


@pytest.mark.parametrize("seed", range(16))
async def test_coordinator_crashes(seed: int) -> None:
    c = await run_with_crashes(
        200 + seed, crashes=seed % 3, coordinator_crashes=1 + seed % 2, snapshot_every=seed % 3, n=300
    )
    assert c.crashes >= 1


@pytest.mark.parametrize("seed", range(12))
async def test_resent_request_ids_are_answered_not_executed(seed: int) -> None:
    c = await run_with_crashes(
        300 + seed, crashes=seed % 3, coordinator_crashes=seed % 2, snapshot_every=1 + seed % 3, resends=15
    )
    assert c.submissions.total() > len(c.requests), "nothing was resent"
    assert len(c.replies) == c.submissions.total()


@pytest.mark.parametrize("seed", range(8))
async def test_resends_ahead_of_fresh_requests_replay_in_log_order(seed: int) -> None:
    """Resends mixed into fresh traffic, with crashes: replay takes the ingress in log order."""
    c = await run_with_crashes(
        350 + seed, crashes=1 + seed % 3, snapshot_every=1 + seed % 3, resends=15, resends_first=True
    )
    assert c.crashes >= 1
    assert len(c.replies) == c.submissions.total()


@pytest.mark.parametrize("seed", range(8))
async def test_lost_messages_stall_an_epoch_and_recovery_repairs_it(seed: int) -> None:
    c = await run_with_crashes(400 + seed, crashes=seed % 2, snapshot_every=1 + seed % 3, drops=2)
    assert c.network.faults.dropped >= 1


@pytest.mark.parametrize("lost", ["EpochStart", "Vote", "Ack", "ExecDone", "Final", "Invoke"])
async def test_a_lost_protocol_message_is_repaired(lost: str) -> None:
    import styx_py.core.wire as wire

    async with SimCluster(APP, workers=3, seed=9, epoch_size_max=10, epoch_timeout_ms=300) as c:
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        c.network.faults.drop_types.add(getattr(wire, lost))
        submit_random_mix(c, random.Random(9), 200, n_keys=20, hot=0.6)
        await c.wait(timeout_s=60)
        await check_against_serial(c)
        assert c.network.faults.dropped == 1
        assert c.coordinator.stalls >= 1, "the lost message went unnoticed"


@pytest.mark.parametrize("seed", [41049, 41061])
async def test_workers_of_a_dead_generation_stop_deciding_before_recovery_reads_the_log(seed: int) -> None:
    """Workers decide epochs from each other's votes, without the coordinator. These seeds crash the
    coordinator while an epoch runs: were its workers to decide it after the new coordinator read the
    sequencer log, recovery would replay only the epochs before it and re-form it with different
    replies. Recovery reads the log only once every worker is fenced."""
    c = await run_with_crashes(
        seed,
        crashes=1 + seed % 2,
        snapshot_every=1,
        upload_failures=2,
        compact_after=2,
        n=450,
        epoch_size=5,
        coordinator_crashes=1 if seed % 3 == 0 else 0,
    )
    assert c.coordinator.recoveries >= 1


@pytest.mark.parametrize("seed", range(12))
async def test_duplicated_messages_change_nothing(seed: int) -> None:
    c = await run_with_crashes(
        500 + seed, crashes=seed % 2, snapshot_every=1 + seed % 3, duplicates=40, drops=seed % 2
    )
    assert c.network.faults.duplicated >= 10


async def test_a_request_resent_after_a_recovery_is_answered_again() -> None:
    """A recovered worker does not send again the replies its replay finds already on the egress log.
    Replies of epochs up to the restored snapshot can be there too (acknowledged after the snapshot
    recorded its egress position) without being replayed; a client resending such a request later
    must still get its reply, not have it taken for the replay's copy."""
    async with SimCluster(
        APP, workers=3, seed=4, epoch_size_max=5, snapshot_interval_epochs=1, egress_ack_lag=3
    ) as c:
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        c.crash("w2")
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 1)
        await c.wait()
        assert c.coordinator.recoveries >= 1
        for rid in sorted(c.requests):
            c.resubmit(rid)
        await c.wait(timeout_s=20)
        await check_against_serial(c)
    assert len(c.replies) == c.submissions.total() == 80


async def test_a_snapshot_is_confirmed_only_once_its_epochs_replies_are_acknowledged() -> None:
    """Recovery from a snapshot replays only later epochs, so a reply of an earlier epoch still in the
    producer's queue when the worker dies would never be sent. A worker reports its snapshot done
    only when no reply of the snapshot's epochs is unacknowledged. (End to end: seed 103 of the
    torn-snapshot test, with replies acknowledged 8 hops late, lost a reply this way.)"""
    unacked_at_done: list[int] = []  # per SnapshotDone, the unacknowledged replies of its epochs
    async with SimCluster(
        APP, workers=3, seed=11, epoch_size_max=5, snapshot_interval_epochs=1, egress_ack_lag=20
    ) as c:
        for w in c.workers:
            send = w.ports.transport.send

            def watching(dest: str, msg: Message, w: Worker = w, send: Callable[..., None] = send) -> None:
                if isinstance(msg, SnapshotDone) and msg.ok:
                    in_flight = w.ports.egress.in_flight  # type: ignore[attr-defined]
                    unacked_at_done.append(sum(n for e, n in in_flight.items() if e <= msg.epoch))
                send(dest, msg)

            w.ports.transport.send = watching  # type: ignore[method-assign]
        for wave in range(6):
            for i in range(10):
                c.submit("acct", "deposit", f"k{i + wave}", 1)
            await c.wait()
        await check_against_serial(c)
    assert len(unacked_at_done) >= 12
    assert set(unacked_at_done) == {0}


async def test_restores_slower_than_the_recovery_timeout_still_complete() -> None:
    """Restores that take longer than the recovery timeout: with a fixed wait every attempt would fail
    ("no answer") and cancel the restores of the last, for ever. The wait doubles after each attempt a
    worker did not answer in time, and then adapts to the restores it saw take."""
    async with SimCluster(
        APP, workers=3, seed=31, epoch_size_max=10, snapshot_interval_epochs=1, epoch_timeout_ms=300
    ) as c:
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        submit_random_mix(c, random.Random(31), 100, n_keys=20, hot=0.5)
        await c.wait()
        blobs, read = c.blobs, c.blobs.get

        async def slow_get(key: str) -> bytes | None:
            await asyncio.sleep(0.1)  # simulated time: S3 under load, a long log to read
            return await read(key)

        blobs.get = slow_get  # type: ignore[method-assign]
        c.crash("w2")
        submit_random_mix(c, random.Random(32), 100, n_keys=20, hot=0.5)
        await c.wait(timeout_s=120)
        recovery = c.coordinator.recovery
        assert recovery.failed_attempts == 0 and recovery.unanswered_attempts == 0
        assert recovery.last_restore_s > 0.3, "the restore was not slower than epoch_timeout_ms"
        assert recovery.timeout_s() == min(3 * recovery.last_restore_s, 16 * 0.3)
        await check_against_serial(c)


async def test_a_recover_for_a_generation_without_its_view_is_ignored() -> None:
    """The coordinator sends a generation's view, then its Recover. When the worker's process
    restarted in between, the new process gets the Recover without the view: it knows neither graph
    nor placement and must not run that generation (its own registration starts a newer one)."""
    log = MemoryLog()
    log.create("ingress", 2)
    log.create("egress", 2)
    log.create("seqlog", 1)
    network = MemoryNetwork()
    ports = WorkerPorts(
        network.endpoint("w1"),
        MemoryIngress(log, "ingress"),
        MemoryEgress(log, "egress"),
        MemorySeqLog(log, "seqlog"),
    )
    w = Worker("w1", load_config({}, env={}), ports)
    w.on_message(COORDINATOR, Recover(empty_manifest(2), -1, 3))
    assert w.recovering is None and w.generation == -1


async def test_a_register_lost_while_the_coordinator_resumes_is_sent_again() -> None:
    """A restarted coordinator waits for every worker of the cluster to register. A worker whose
    Register is lost hears no heartbeat echo and registers again after a failure timeout."""
    async with SimCluster(APP, workers=3, seed=22, epoch_size_max=10) as c:
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        c.network.faults.drop_types.add(Register)
        c.crash_coordinator()
        submit_random_mix(c, random.Random(22), 150, n_keys=20, hot=0.5)
        await c.wait(timeout_s=60)
        await check_against_serial(c)
        assert c.network.faults.dropped == 1


async def test_a_silent_worker_is_reported_failed_and_rejoins_once_heard_again() -> None:
    """Heartbeats and failure detection on simulated time: a worker cut off from the network is
    reported failed after the failure timeout, the stalled epoch's recovery cannot complete without
    it, and once the partition heals the worker registers again and the cluster recovers."""
    async with SimCluster(APP, workers=3, seed=23, epoch_size_max=10, epoch_timeout_ms=2000) as c:
        for i in range(20):
            c.submit("acct", "deposit", f"k{i}", 100)
        await c.wait()
        c.network.faults.isolated.add("w2")
        submit_random_mix(c, random.Random(23), 100, n_keys=20, hot=0.5)
        await until_failed_workers(c, ["w2"])
        c.network.faults.isolated.clear()
        await c.wait(timeout_s=60)
        await check_against_serial(c)
        await until_failed_workers(c, [])
        assert c.network.faults.cut > 0
        assert c.coordinator.recoveries >= 1


async def until_failed_workers(c: SimCluster, expected: list[str], within_s: float = 30) -> None:
    """Poll the coordinator's verdict every heartbeat interval of simulated time, with a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while c.coordinator.status()["failed_workers"] != expected:
        assert loop.time() < deadline, f"failed workers never became {expected}"
        await asyncio.sleep(c.config.heartbeat_interval_ms / 1000)


async def test_a_replay_that_diverges_stops_the_cluster_with_a_named_error_and_no_loop() -> None:
    """A function drawing from the global ``random``: after a crash, the replay answers differently
    than the run the client saw. The cluster stops for good, says which function and request and
    both results, reports it in status and readiness, and does not try to recover again."""
    app = "tests.apps.nondeterministic:app"
    async with SimCluster(app, workers=3, seed=31, snapshot_interval_epochs=0) as c:
        rids = [c.submit("counter", "bump", f"k{i}") for i in range(12)]
        await c.wait()
        c.crash("w2")  # recovery replays every epoch from the start of the logs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while c.coordinator.status()["state"] != "degraded":
            assert loop.time() < deadline, "the divergence was never reported"
            await asyncio.sleep(0.1)  # simulated time
        status = c.coordinator.status()
        reason = status["degraded"]
        assert "counter.bump" in reason and "diverged" in reason and "ctx.random()" in reason
        assert any(rid in reason for rid in rids)
        assert reason.count("committed") == 2, "both results are shown"
        assert not c.coordinator.metrics.readiness()[0]
        recoveries, gen = c.coordinator.recoveries, c.coordinator.gen
        c.crash("w1")  # a restarted process registers again: no recovery, no loop
        await asyncio.sleep(5)  # simulated time: what a loop of recoveries would fill
        assert (c.coordinator.recoveries, c.coordinator.gen) == (recoveries, gen)
        for w in c.workers:
            ready, why = w.readiness()
            assert not ready and "degraded" in why, (w.node_id, why)
        assert len(c.sent.duplicate_replies()) == 0, "no second, different answer left the cluster"


async def test_a_replay_that_changes_only_state_is_caught_at_the_write_and_named() -> None:
    """``stir`` draws from the global ``random`` but always answers "ok": on replay only the state it
    writes differs, and the next reads of that key answer differently. The digests of the writes its
    first run logged catch it at the write: the cluster stops, naming the epoch, the partition, the tid
    and ``counter.stir`` — not the read whose reply would have been the first to differ."""
    app = "tests.apps.quiet_nondeterministic:app"
    async with SimCluster(app, workers=3, seed=32, snapshot_interval_epochs=0) as c:
        for i in range(6):
            c.submit("counter", "read", f"k{i}")
        await c.wait()
        stirred = c.submit("counter", "stir", "k3")
        await c.wait()
        reads = [c.submit("counter", "read", "k3") for _ in range(3)]
        await c.wait()
        stir = next(r for r in c.replies if r.request_id == stirred)
        assert min(r.epoch for r in c.replies if r.request_id in reads) > stir.epoch, "read in later epochs"
        partition = partition_of("k3", 4)  # the counter operator's partitions
        owner = next(w.node_id for w in c.workers if partition in w.core.table.owned())
        c.crash(next(w.node_id for w in c.workers if w.node_id != owner))  # replay from the start
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while c.coordinator.status()["state"] != "degraded":
            assert loop.time() < deadline, "the divergence was never reported"
            await asyncio.sleep(0.1)  # simulated time
        reason = c.coordinator.status()["degraded"]
        assert reason.startswith(f"replay of epoch {stir.epoch} diverged on {owner}: "), reason
        named = f"the writes of tid {stir.tid} (counter.stir, request {stirred}) on partition {partition}"
        assert named in reason
        assert re.search(r"gave digest [0-9a-f]{16} before the failure and digest [0-9a-f]{16} on", reason)
        assert "ctx.random()" in reason
        assert "counter.read" not in reason
        assert len(c.sent.duplicate_replies()) == 0, "no second, different answer left the cluster"


async def test_a_request_id_reused_for_another_request_replays_without_divergence() -> None:
    """Two requests under one id, on two partitions of one worker, are two transactions with two
    replies. Replay pairs the replies it finds on the egress log with the replayed ones by tid; paired
    by id alone, one transaction's reply was compared with the other's and the cluster stopped."""
    async with SimCluster(APP, workers=3, seed=11, snapshot_interval_epochs=0) as c:
        c.submit("acct", "deposit", "k0", 1)
        await c.wait()
        owner = {p: w.node_id for w in c.workers for p in w.core.table.owned()}
        parts = 8  # the oracle app's acct operator
        by_part: dict[int, str] = {}
        for i in range(200):
            by_part.setdefault(partition_of(f"x{i}", parts), f"x{i}")
        a, b = next((a, b) for a in by_part for b in by_part if a < b and owner[a] == owner[b])
        c.submit("acct", "deposit", by_part[a], 1, request_id="same")
        await c.wait()
        del c.requests["same"]  # the client reuses the id for another request
        c.submit("acct", "deposit", by_part[b], 2, request_id="same")
        await c.wait()
        c.crash(next(w.node_id for w in c.workers if w.node_id != owner[a]))
        c.submit("acct", "deposit", "k1", 3)
        await c.wait(timeout_s=60)
        assert c.coordinator.status()["state"] != "degraded", c.coordinator.status()["degraded"]
        assert sorted(r.tid for r in c.replies if r.request_id == "same")[0] > 0


async def test_a_bug_in_a_recovery_ends_the_worker_instead_of_being_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An assertion raised while a worker recovers is a bug, not an operating error: the worker's task
    group ends with it (the process exits, and its supervisor restarts it) instead of reporting a failed
    recovery that the coordinator would retry forever. Restarted, the worker recovers and nothing is lost
    or answered twice."""
    from styx_worker import recovery

    real = recovery.restore
    planted: list[str] = []

    async def buggy(msg: Recover, owned: list[int], node_id: str, *args: Any) -> Any:
        if node_id == "w1" and not planted:
            planted.append(node_id)
            raise AssertionError("a planted bug in the restore")
        return await real(msg, owned, node_id, *args)

    async with SimCluster(APP, workers=3, seed=31, epoch_size_max=10) as c:
        submit_random_mix(c, random.Random(31), 60, n_keys=20, hot=0.3)
        await c.wait()
        monkeypatch.setattr(recovery, "restore", buggy)
        c.crash("w1")  # the new w1 process recovers: its restore raises
        task = c.worker_tasks["w1"]
        with pytest.raises(ExceptionGroup) as ended:
            await asyncio.wait_for(asyncio.shield(task), 30)
        assert ended.group_contains(AssertionError, match="planted bug")
        assert planted == ["w1"]
        assert c.coordinator.recovery.failed_attempts == 0, "a bug is not reported as a failed recovery"
        c.crash("w1")  # its supervisor starts it again: this time the recovery works
        submit_random_mix(c, random.Random(32), 60, n_keys=20, hot=0.3)
        await c.wait(timeout_s=120)
        await check_against_serial(c)
