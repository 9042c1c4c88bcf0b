"""The audit's changelog rules (styx_py/audit/changelog_rules.py), without Spark: the order and once
scan of a partition, the digest sums the serial replay compares, and the snapshot comparison."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow")

from styx_benchmarks.bank import app
from styx_py.audit.changelog_rules import (
    ChangelogExpectation,
    digest_sums,
    partition_findings,
    snapshot_findings,
)
from styx_py.audit.rows import KafkaRecord, change_digest, decode_records
from styx_py.core.changelog import encode_change, entity_key, records_of
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import Phase, encode_value


def _rows(records: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int, int]]:
    """(epoch, phase, tid, index) -> (offset, ...)"""
    return [(i, *r) for i, r in enumerate(records)]


def test_a_partition_in_commit_order_has_no_findings() -> None:
    rows = _rows([(0, 0, 3, 0), (0, 0, 5, 1), (0, 1, 2, 2), (2, 0, 1, 0), (2, 2, 9, 1)])
    assert partition_findings(0, rows) == []


@pytest.mark.parametrize(
    ("records", "check", "text"),
    [
        ([(0, 0, 3, 0), (0, 0, 3, 0)], "changelog.once", "written twice"),
        ([(0, 0, 3, 0), (0, 0, 5, 2)], "changelog.once", "records 1..1 missing"),
        ([(0, 0, 3, 0), (1, 0, 5, 1)], "changelog.once", "epoch 1 records 0..0 missing"),
        ([(0, 0, 3, 1)], "changelog.once", "first record is index 1"),
        ([(1, 0, 3, 0), (0, 0, 5, 0)], "changelog.order", "after epoch 1"),
        ([(0, 1, 3, 0), (0, 0, 5, 1)], "changelog.order", "phase 0 tid 5"),
    ],
)
def test_a_record_twice_missing_or_out_of_order_is_named(
    records: list[tuple[int, int, int, int]], check: str, text: str
) -> None:
    found = partition_findings(3, _rows(records))
    assert [f.check for f in found] == [check]
    assert text in found[0].message and "p3@" in found[0].subject


def test_many_findings_are_capped_and_counted() -> None:
    found = partition_findings(0, _rows([(0, 0, 1, 0)] * 50))
    assert len(found) == 21 and "49 such findings" in found[-1].message


def test_the_serial_replays_writes_sum_like_the_topics_records() -> None:
    v = encode_value
    epochs = {
        1: [(Phase.OPTIMISTIC, 4, {("account", "a1"): v(5), ("account", "a2"): v(6)})],
        2: [(Phase.FALLBACK, 9, {("account", "a1"): None})],
        3: [(Phase.OPTIMISTIC, 12, {("account", "a3"): v(1)})],  # beyond the bound
    }
    expect = ChangelogExpectation(bound=2)
    on_topic = []
    for epoch, commits in epochs.items():
        for phase, tid, writes in commits:
            expect.feed(app, epoch, phase, tid, writes)
        for p, records in records_of(epoch, commits, {"account": 4}).items():
            on_topic += [(p, r) for r in records]
    # The topic as the audit reads it: the Kafka source's digest of each record's bytes.
    rows = [
        KafkaRecord("cl", p, i, 0, entity_key(r.operator, r.key), [], encode_change(r))
        for i, (p, r) in enumerate(on_topic)
    ]
    batch = decode_records("changelog", rows)
    values = batch.column("value").to_pylist()
    assert [x["digest"] for x in values] == [change_digest(encode_change(r)) for _, r in on_topic]
    actual = digest_sums(
        (p, x["digest"]) for (p, _), x in zip(on_topic, values, strict=True) if x["epoch"] <= 2
    )
    assert expect.findings(actual) == []
    # A record missing, or one written twice, shows in its partition.
    p = partition_of("a1", 4)
    first = next(x["digest"] for (q, _), x in zip(on_topic, values, strict=True) if q == p)
    n, total = actual[p]
    for wrong in ((n - 1, total - first), (n + 1, total + first)):
        found = expect.findings({**actual, p: wrong})
        assert [f.subject for f in found] == [f"changelog p{p}"]
        assert "the serial replay writes" in found[0].message


def test_the_snapshot_comparison_names_each_entity_that_differs() -> None:
    assert snapshot_findings(7, {("account", "a"): 1}, {("account", "a"): 1}) == []
    found = snapshot_findings(7, {("account", "a"): 1, ("account", "b"): 2}, {("account", "a"): 3})
    assert [f.subject for f in found] == ["account/a", "account/b"]
    assert "snapshot 7 holds 3, the changelog up to epoch 7 gives 1" in found[0].message
