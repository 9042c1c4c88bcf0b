"""The changelog's part of the audit on Spark: the rules of :mod:`.changelog_rules` over the topic.

    changelog ─► by partition, in offset order ─► changelog_scan: partition_findings (order, once)
              ├► up to the epoch bound ─► digest_sums per partition (small: to the driver, then into the
              │   serial replay, which compares them with its own writes: changelog.once)
              ├► up to the bound, anti-joined with the committed replies by (tid, epoch, phase) ─► once
              └► up to the snapshot's epoch, the latest record per entity ─► snapshot_findings (driver)

The epoch bound is the newest epoch of any reply minus one: an audit of a running cluster reads each
topic to its end as of the plan, and the last epoch may be in one and not yet in the other.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from styx_py.audit.arrow import spark_schema
from styx_py.audit.changelog_rules import digest_sums, partition_findings, snapshot_findings
from styx_py.audit.rows import key_value
from styx_py.audit.rules import Finding
from styx_py.audit.tasks import FINDINGS_SCHEMA, finding_dicts
from styx_py.core.wire import decode_value

__all__ = ["ChangelogResult", "changelog_checks"]

SUMS_SCHEMA = pa.schema([("partition", pa.int32()), ("records", pa.int64()), ("digest_sum", pa.int64())])
_MAX_ORPHANS = 10


def changelog_scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Rows sorted by (partition, offset) within the Spark partition → their findings."""

    def rows() -> Iterator[tuple[int, int, int, int, int, int]]:
        for batch in batches:
            cols = [
                batch.column(n).to_pylist() for n in ("partition", "offset", "epoch", "phase", "tid", "index")
            ]
            yield from zip(*cols, strict=True)

    found: list[Finding] = []
    for p, group in itertools.groupby(rows(), key=lambda r: r[0]):
        found += partition_findings(p, (r[1:] for r in group))
    yield pa.RecordBatch.from_pylist(finding_dicts(found), schema=FINDINGS_SCHEMA)


def changelog_sums(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """(partition, digest) rows → per partition, the records and their digest sum (this task's part)."""

    def pairs() -> Iterator[tuple[int, int]]:
        for batch in batches:
            yield from zip(
                batch.column("partition").to_pylist(), batch.column("digest").to_pylist(), strict=True
            )

    sums = digest_sums(pairs())
    rows = [{"partition": p, "records": n, "digest_sum": s} for p, (n, s) in sorted(sums.items())]
    yield pa.RecordBatch.from_pylist(rows, schema=SUMS_SCHEMA)


class ChangelogResult:
    def __init__(
        self, findings: list[Finding], bound: int, sums: dict[int, tuple[int, int]], records: int
    ) -> None:
        self.findings = findings
        self.bound = bound  # the epoch up to which the records are compared with the replies
        self.sums = sums  # per partition: records and digest sum up to the bound
        self.records = records


def changelog_checks(
    changelog: DataFrame,
    facts: DataFrame,
    snapshot_epoch: int | None,
    snapshot_state: dict[tuple[str, Any], Any] | None,
) -> ChangelogResult:
    """Every changelog finding but the serial replay's comparison (which needs the result's ``sums``)."""
    cl = changelog.where(F.col("decode_error").isNull()).select("partition", "offset", "value.*")
    bad = changelog.where(F.col("decode_error").isNotNull()).count()
    found: list[Finding] = []
    if bad:
        found.append(Finding("changelog.once", "changelog", f"{bad} changelog records do not decode"))
    scanned = (
        cl.select("partition", "offset", "epoch", "phase", "tid", "index")
        .repartition("partition")
        .sortWithinPartitions("partition", "offset")
        .mapInArrow(changelog_scan, spark_schema(FINDINGS_SCHEMA))
    )
    found += [Finding(r["check"], r["subject"], r["message"], r["severity"]) for r in scanned.collect()]

    committed = facts.where((F.col("replies") > 0) & (F.col("status") == "committed")).select(
        "tid", "epoch", "phase"
    )
    newest = facts.where(F.col("replies") > 0).agg(F.max("epoch").alias("e")).first()
    bound = -1 if newest is None or newest["e"] is None else int(newest["e"]) - 1
    upto = cl.where(F.col("epoch") <= bound)
    orphans = upto.join(committed, ["tid", "epoch", "phase"], "left_anti")
    n_orphans = orphans.count()
    for r in orphans.orderBy("partition", "offset").limit(_MAX_ORPHANS).collect():
        found.append(
            Finding(
                "changelog.once",
                f"changelog p{r['partition']}@{r['offset']}",
                f"changelog p{r['partition']}@{r['offset']}: a write of tid {r['tid']} (epoch {r['epoch']}, "
                f"phase {r['phase']}) to {r['operator']} {r['key']!r}, which no committed reply names",
            )
        )
    if n_orphans > _MAX_ORPHANS:
        found.append(Finding("changelog.once", "changelog", f"{n_orphans} such records in all"))

    sums: dict[int, tuple[int, int]] = {}
    for r in (
        upto.select("partition", "digest").mapInArrow(changelog_sums, spark_schema(SUMS_SCHEMA)).collect()
    ):
        p, n, s = int(r["partition"]), int(r["records"]), int(r["digest_sum"])
        have_n, have_s = sums.get(p, (0, 0))
        sums[p] = (have_n + n, digest_sums([(p, have_s), (p, s)])[p][1])  # wrapping sum of the parts

    if snapshot_epoch is not None and snapshot_state is not None:
        latest = (
            cl.where(F.col("epoch") <= snapshot_epoch)
            .groupBy("operator", "key", "key_is_int")
            .agg(F.max_by(F.struct("value"), F.struct("epoch", "index")).alias("last"))
            .where(F.col("last.value").isNotNull())
        )
        rebuilt = {
            (r["operator"], key_value(r["key"], r["key_is_int"])): decode_value(r["last"]["value"])
            for r in latest.toLocalIterator()
        }
        found += snapshot_findings(snapshot_epoch, rebuilt, snapshot_state)
    return ChangelogResult(found, bound, sums, cl.count())
