"""The log-loss verdict (pure): offsets the cluster recorded against what the broker has, the
incarnation marker, and a worker's watch on the broker's word."""

from __future__ import annotations

import pytest

from styx_py.core.logmarks import LogMark, describe, losses, marker_loss, marker_topic
from styx_worker.logwatch import LogWatch

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
