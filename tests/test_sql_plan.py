"""``styx sql`` without Spark: which snapshot and changelog records make the state as of an epoch
(:mod:`styx_py.audit.asof`), the table names, and the output formats."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest

from styx_py.audit.asof import (
    AsOfUnavailable,
    ChangelogDisabled,
    StatePlan,
    chain_epochs,
    plan_state,
)
from styx_py.core.blobs import base_key, delta_key
from styx_py.sql_cli import format_table, rows_json

# Two partitions: a compacted base at epoch 20, then deltas at 30 and 40 (every snapshot writes one
# delta per partition); partition 1's base came from an older merge at 10 plus its delta at 20.
CHAIN = {
    0: [base_key(0, 20), delta_key(0, 30), delta_key(0, 40)],
    1: [base_key(1, 10), delta_key(1, 20), delta_key(1, 30), delta_key(1, 40)],
}


def test_the_chain_rebuilds_the_epochs_every_partition_holds() -> None:
    assert chain_epochs(CHAIN) == [20, 30, 40]
    assert chain_epochs({}) == []


@pytest.mark.parametrize(
    ("as_of", "plan"),
    [
        (None, StatePlan(40, 40, None)),  # the newest snapshot
        (30, StatePlan(30, 30, None)),  # a snapshot epoch: the chain up to it
        (35, StatePlan(35, 30, 30)),  # between: snapshot 30, then the changelog's epochs 31..35
        (47, StatePlan(47, 40, 40)),  # after the newest snapshot
        (15, StatePlan(15, None, -1)),  # before the chain: the changelog from its start
    ],
)
def test_the_plan_of_an_epoch(as_of: int | None, plan: StatePlan) -> None:
    assert plan_state(40, [20, 30, 40], as_of, None) == plan


def test_the_plan_says_which_path_it_takes() -> None:
    assert plan_state(40, [20, 30, 40], 35, None).describe() == (
        "the state as of epoch 35: snapshot 30, then the changelog's records of epochs 31..35"
    )
    assert plan_state(40, [20, 30, 40], 15, None).describe() == (
        "the state as of epoch 15: the changelog's records of epochs 0..15"
    )
    assert plan_state(40, [20, 30, 40], None, None).describe() == "the state as of epoch 40: snapshot 40"


def test_without_a_changelog_only_snapshot_epochs_can_be_read() -> None:
    off = "no changelog topic given: --changelog-topic or STYX_CHANGELOG_TOPIC"
    assert plan_state(40, [20, 30, 40], 30, off) == StatePlan(30, 30, None)
    with pytest.raises(
        ChangelogDisabled, match=r"epoch 35 is no snapshot epoch .*20, 30, 40.*STYX_CHANGELOG_TOPIC"
    ):
        plan_state(40, [20, 30, 40], 35, off)
    with pytest.raises(
        AsOfUnavailable, match=r"epoch 15 is before the snapshots \(the oldest .* is epoch 20"
    ):
        plan_state(40, [20, 30, 40], 15, off, "b")
    with pytest.raises(AsOfUnavailable, match="no snapshot in bucket 'b' yet"):
        plan_state(None, [], None, None, "b")
    with pytest.raises(AsOfUnavailable, match="0 or more"):
        plan_state(40, [20, 30, 40], -1, None)
    # No snapshot yet, but a changelog: read from its start.
    assert plan_state(None, [], 5, None) == StatePlan(5, None, -1)


def test_the_table_output() -> None:
    rows = [
        {"key": "a1", "value": 7, "at": datetime.datetime(2026, 1, 2, 3, 4, 5)},
        {"key": "a10", "value": None, "at": None},
    ]
    assert format_table(["key", "value", "at"], rows).splitlines() == [
        "key | value | at",
        "----+-------+--------------------",
        "a1  |     7 | 2026-01-02T03:04:05",
        "a10 |  NULL | NULL",
    ]


def test_the_json_output() -> None:
    rows = [{"n": decimal.Decimal("4000"), "x": decimal.Decimal("0.5"), "b": b"\x01", "s": {"k": [1]}}]
    assert json.dumps(rows_json(rows)) == '[{"n": 4000, "x": 0.5, "b": "01", "s": {"k": [1]}}]'


def test_the_snapshot_source_groups_objects_into_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    from styx_py.audit import snapshot_source
    from styx_py.audit.options import S3Options

    objs = [snapshot_source.SnapshotObject(40, delta_key(p, e), e) for p in (0, 1) for e in (10, 20, 30)]
    monkeypatch.setattr(snapshot_source, "plan_objects", lambda *_: objs)
    s3 = S3Options("localhost:1", "k", "s", "b", "us-east-1")

    def tasks(**kw: int) -> list[list[str]]:
        reader = snapshot_source.SnapshotReader(s3, "latest", **kw)
        return [[o.name for o in p.objs] for p in reader.partitions()]  # type: ignore[attr-defined]

    assert tasks() == [[o.name for o in objs]]  # six small objects: one task
    assert tasks(objects_per_task=4) == [[o.name for o in objs[:4]], [o.name for o in objs[4:]]]
    assert tasks(max_object_epoch=20, objects_per_task=2) == [  # an older snapshot's chain
        [delta_key(0, 10), delta_key(0, 20)],
        [delta_key(1, 10), delta_key(1, 20)],
    ]
    with pytest.raises(ValueError, match="objects_per_task"):
        snapshot_source.SnapshotReader(s3, "latest", objects_per_task=0)
