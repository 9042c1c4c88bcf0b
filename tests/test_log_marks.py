"""The log-loss verdict (pure): offsets the cluster recorded against what the broker has, the
incarnation marker, and a worker's watch on the broker's word."""

from __future__ import annotations

import asyncio

import pytest

from styx_py.core.logmarks import (
    LogMark,
    describe,
    highest,
    losses,
    marker_loss,
    marker_topic,
    recorded_by_snapshot,
)
from styx_py.core.segments import pack
from styx_py.core.wire import LogLost
from styx_py.testing.cluster import SimCluster, check_against_serial
from styx_worker.effects import Halt, Send
from styx_worker.logwatch import LogWatch
from tests.test_epoch_core import core_of, start

SEQ = LogMark("sequencer log", "styx-seqlog", 0, 5230)
INGRESS = LogMark("ingress", "styx-ingress", 2, 1830)


def test_a_broker_that_holds_every_recorded_offset_lost_nothing() -> None:
    topics = {"styx-seqlog", "styx-ingress"}
    ends = {("styx-seqlog", 0): 5230, ("styx-ingress", 2): 1900}
    assert losses([SEQ, INGRESS], topics, ends) == []


def test_a_partition_that_ends_below_a_recorded_offset_is_named_with_both_offsets() -> None:
    topics = {"styx-seqlog", "styx-ingress"}
    ends = {("styx-seqlog", 0): 5230, ("styx-ingress", 2): 0}
    assert losses([SEQ, INGRESS], topics, ends) == [
        "ingress styx-ingress partition 2: recorded offset 1830, broker ends at 0"
    ]


def test_a_vanished_topic_is_a_loss_and_needs_no_end() -> None:
    got = losses([SEQ, INGRESS], {"styx-ingress"}, {("styx-ingress", 2): 1830})
    assert got == ["sequencer log styx-seqlog: the topic is gone (recorded offset 5230)"]


def test_a_partition_the_broker_no_longer_has_is_a_loss() -> None:
    got = losses([INGRESS], {"styx-ingress"}, {("styx-ingress", 0): 5})
    assert got == ["ingress styx-ingress partition 2: the partition is gone (recorded offset 1830)"]


def test_an_offset_of_zero_records_nothing() -> None:
    assert losses([LogMark("egress", "styx-egress", 0, 0)], set(), {}) == []


def test_every_loss_is_listed_in_a_stable_order() -> None:
    ends = {("styx-seqlog", 0): 3, ("styx-ingress", 2): 7}
    got = losses([SEQ, INGRESS], {"styx-seqlog", "styx-ingress"}, ends)
    assert got == sorted(got) and len(got) == 2


def test_the_marker_must_hold_the_cluster_id() -> None:
    topic = marker_topic("styx-seqlog")
    assert topic == "styx-seqlog-cluster"
    assert marker_loss(topic, "c1", [b"c0", b"c1"]) is None
    assert marker_loss(topic, "c1", None) == f"cluster marker {topic}: the topic is gone (cluster c1)"
    assert marker_loss(topic, "c1", []) == f"cluster marker {topic}: empty, the record of cluster c1 is gone"
    assert marker_loss(topic, "c1", [b"c9"]) == f"cluster marker {topic}: holds cluster c9, not c1"
    assert marker_loss(topic, "", None) is None  # state saved before markers: nothing to compare


def test_the_reason_names_every_loss_and_what_to_do() -> None:
    reason = describe(["a", "b"])
    assert "lost the cluster's log (a; b)" in reason
    assert "docs/operations.md#log-lost" in reason
    assert "\n" not in reason
    many = describe([f"loss {i}" for i in range(10)])
    assert "(loss 0; loss 1; loss 2; and 7 more)" in many


def test_a_snapshot_records_every_ingress_segment_position_and_egress_offset() -> None:
    positions = {0: {0: 12, 3: 4}, 1: {3: 0}}  # partition -> segment -> next offset
    egress = {0: pack(3, 7), 1: 0}
    assert sorted(recorded_by_snapshot("in", "out", positions, egress)) == [
        LogMark("egress", "out.3", 0, 7),
        LogMark("ingress", "in", 0, 12),
        LogMark("ingress", "in.3", 0, 4),
    ]


def test_the_highest_offset_of_each_partition_is_kept() -> None:
    a, b = LogMark("ingress", "in", 0, 12), LogMark("ingress", "in", 0, 30)
    c = LogMark("egress", "out", 0, 5)
    assert highest([a, c, b, a]) == [c, b]


def test_a_worker_notices_an_end_below_one_the_broker_gave_once() -> None:
    said: list[str] = []
    watch = LogWatch("ingress")
    watch.on_lost = said.append
    assert not watch.end("styx-ingress", 2, 1830)
    assert not watch.end("styx-ingress", 2, 1830)  # the same end again is no loss
    assert not watch.end("styx-ingress", 1, 0)  # another partition has its own
    assert watch.end("styx-ingress", 2, 12)
    assert watch.end("styx-ingress", 2, 0)  # still lost, said once
    assert said == ["ingress styx-ingress partition 2: recorded offset 1830, broker ends at 12"]
    assert watch.lost == said[0]


def test_a_restored_position_past_the_broker_end_is_a_loss() -> None:
    said: list[str] = []
    watch = LogWatch("ingress")
    watch.on_lost = said.append
    watch.vouched("styx-ingress", 0, 40)
    watch.vouched("styx-ingress", 0, 10)  # a lower position later vouches for nothing new
    assert watch.end("styx-ingress", 0, 39)
    assert said == ["ingress styx-ingress partition 0: recorded offset 40, broker ends at 39"]


def test_a_new_record_stored_below_an_acknowledged_one_is_a_loss() -> None:
    said: list[str] = []
    watch = LogWatch("sequencer log")
    watch.on_lost = said.append
    for offset in (0, 1, 5):  # other workers' entries in between
        assert not watch.stored("styx-seqlog", 0, offset)
    assert watch.stored("styx-seqlog", 0, 0)
    assert said == [
        "sequencer log styx-seqlog partition 0: acknowledged up to offset 5, the broker stored a new "
        "record at 0"
    ]


def test_an_unwired_watch_is_a_bug() -> None:
    watch = LogWatch("egress")
    watch.vouched("styx-egress", 0, 3)
    with pytest.raises(AssertionError, match="nobody listens"):
        watch.stored("styx-egress", 0, 1)


async def test_a_recovery_on_a_log_that_was_emptied_stops_the_cluster_in_state_log_lost() -> None:
    """The coordinator's check in the simulation: every topic comes back empty (a restarted in-memory
    broker), a worker crashes, and the recovery finds the cluster's marker and the snapshot's offsets
    gone before it restores or replays anything; a restarted process does not start another."""
    async with SimCluster("styx_benchmarks.bank:app", workers=2, seed=4, snapshot_interval_epochs=2) as c:
        for i in range(20):
            c.submit("account", f"a{i}", "deposit", 10)
        await c.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while c.coordinator.manifest is None or c.coordinator.manifest.epoch < 0:
            c.submit("account", "a0", "deposit", 1)
            await c.wait()
            assert loop.time() < deadline, "no snapshot"
        assert c.coordinator.recoveries == 0
        for partitions in c.log.topics.values():
            for records in partitions:
                records.clear()
        c.crash("w1")
        while c.coordinator.status()["state"] != "log-lost":
            assert loop.time() < deadline, f"never log-lost: {c.coordinator.status()['state']}"
            await asyncio.sleep(0.1)  # simulated time
        reason = c.coordinator.status()["degraded"]
        assert f"cluster marker {marker_topic(c.config.seqlog_topic)}: empty" in reason, reason
        assert "broker ends at 0" in reason, reason
        assert c.coordinator.last_recovery is None, "it restored from a log it no longer had"
        ready, why = c.coordinator.metrics.readiness()
        assert not ready and why.startswith("log-lost: the Kafka broker lost the cluster's log"), why
        gen = c.coordinator.gen
        c.crash("w2")
        await asyncio.sleep(5)  # simulated time: what a loop of recoveries would fill
        assert c.coordinator.gen == gen and c.coordinator.state == "log-lost"
        assert all(w.halted for w in c.workers)


async def test_no_recovery_of_a_seeded_run_with_crashes_finds_a_loss() -> None:
    """The in-memory log loses nothing: the check, asked at every recovery, never raises a false alarm."""
    async with SimCluster("styx_benchmarks.bank:app", workers=3, seed=9, snapshot_interval_epochs=2) as c:
        for round_ in range(4):
            for i in range(30):
                c.submit("account", f"a{i}", "deposit", round_ + 1)
            c.crash(f"w{1 + round_ % 3}")
            await c.wait()
        assert c.coordinator.recoveries >= 4 and c.coordinator.state == "running"
        assert c.coordinator.manifest is not None and c.coordinator.manifest.marks, "no offsets recorded"
        await check_against_serial(c)


def test_a_worker_core_that_finds_a_loss_tells_the_coordinator_once_and_runs_nothing_more() -> None:
    core = core_of("w1", ["w1", "w1"])
    core.log_lost("ingress in partition 0: recorded offset 40, broker ends at 0")
    effects = core.flush()
    sent = [e.msg for e in effects if isinstance(e, Send)]
    assert sent == [LogLost("w1", "ingress in partition 0: recorded offset 40, broker ends at 0")]
    assert [type(e) for e in effects if not isinstance(e, Send)] == [Halt]
    assert core.halted.startswith("log lost: ingress in partition 0")
    core.log_lost("egress out partition 1: acknowledged up to offset 3, the broker stored a new record at 0")
    assert core.flush() == [], "said once"
    assert core.step(start(0)) == [], "no epoch runs after the loss"
