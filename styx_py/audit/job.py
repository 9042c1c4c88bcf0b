"""The audit job: read the logs (and a snapshot), distribute the rules of :mod:`.rules`, write a report.

Run it as ``styx audit …`` or ``spark-submit styx_py/audit/job.py …`` (same arguments; see
``--help``). The exit code is 0 when every check passes, 1 when any fails, 2 on a usage error.

The plan, with the Spark step that distributes each rule::

    ingress ─┐ union, group by request id ─► check_request ─► facts (one row per request id)
    egress  ─┘                                                 ├─► latency, throughput, aborts
    seqlog ─► generation that ran each epoch ─► check_entry ─► check_epochs (driver: one row per
          │                                                    worker and epoch), epoch analytics
          └─► explode entries ─┐ union, group by tid ─► check_tid
    egress ────────────────────┘
    snapshot (S3) ─► latest value per entity ─► Workload.check_state (driver: the state is small)
    facts ─► one partition, sorted by (epoch, phase, tid) ─► SerialCheck (one task: replay is serial)

Every offset range is planned once, in the driver (the fetch high watermark at the start of the
audit), so all steps read exactly the same records even while the cluster keeps appending.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pandas as pd
import pyarrow as pa
from pyspark import SparkConf, StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from styx_py.audit.arrow import spark_schema
from styx_py.audit.kafka_source import (
    OffsetRange,
    StyxKafkaSource,
    plan_ranges,
    ranges_option,
)
from styx_py.audit.options import AuditConfig, S3Options, add_arguments, config_from
from styx_py.audit.report import write_report
from styx_py.audit.rows import key_value
from styx_py.audit.rules import (
    CHECKS,
    ERROR,
    WARNING,
    EntrySummary,
    Finding,
    SerialCheck,
    check_entry,
    check_epochs,
    check_invariants,
    check_request,
    check_tid,
)
from styx_py.audit.snapshot_source import StyxSnapshotSource, load_manifest, load_meta
from styx_py.graph import load_graph
from styx_py.wire import Reply, Request, decode_value

FINDING = pa.struct(
    [("check", pa.string()), ("subject", pa.string()), ("message", pa.string()), ("severity", pa.string())]
)
FINDINGS_SCHEMA = pa.schema(list(FINDING))
FACTS_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("submissions", pa.int32()),
        ("replies", pa.int32()),
        ("operator", pa.string()),
        ("function", pa.string()),
        ("key", pa.string()),
        ("key_is_int", pa.bool_()),
        ("args", pa.binary()),
        ("sent_ms", pa.int64()),  # the client's send time (Request.ts_ms), else the ingress record's time
        ("request_ts_ms", pa.int64()),  # Request.ts_ms as sent (0: unknown)
        ("tid", pa.int64()),
        ("epoch", pa.int64()),
        ("phase", pa.int32()),
        ("status", pa.string()),
        ("result", pa.binary()),
        ("error", pa.string()),
        ("error_type", pa.string()),
        ("reply_ms", pa.int64()),  # the first reply's egress record time
        ("latency_ms", pa.int64()),
        ("findings", pa.list_(pa.field("element", FINDING))),
    ]
)
ENTRY_SCHEMA = pa.schema(
    [
        ("epoch", pa.int64()),
        ("gen", pa.int64()),
        ("node_id", pa.string()),
        ("sid", pa.int64()),
        ("lc_start", pa.int64()),
        ("lc_end", pa.int64()),
        ("fresh", pa.int64()),
        ("rescheduled", pa.int64()),
        ("resent", pa.int64()),
        ("logged_ms", pa.int64()),
        ("findings", pa.list_(pa.field("element", FINDING))),
    ]
)
SAMPLE_PER_CHECK = 10  # findings per check spelled out in the report (all of them go to Parquet)


@dataclass
class AuditResult:
    ok: bool
    counts: dict[str, dict[str, int]]  # check -> severity -> findings
    samples: list[Finding]
    stats: dict[str, Any]
    timings_s: dict[str, float]
    report: Path

    def messages(self, check_prefix: str = "") -> list[str]:
        return [f.message for f in self.samples if f.check.startswith(check_prefix)]


# ---- Spark session ------------------------------------------------------------------------------------


def spark_session(app_name: str = "styx-audit", driver_memory: str = "2g") -> SparkSession:
    """``local[2]`` (unless spark-submit chose a master), UI off, two shuffle partitions, UTC; the
    settings measured best on this 2-core machine (shared/PYSPARK.md)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    java_opts = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    builder = SparkSession.builder.appName(app_name)
    if not SparkConf().contains("spark.master"):
        builder = builder.master("local[2]")
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": driver_memory,
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark


def register_sources(spark: SparkSession) -> None:
    spark.dataSource.register(StyxKafkaSource)
    spark.dataSource.register(StyxSnapshotSource)


# ---- the rules, as Arrow batch functions (what Spark ships to its Python workers) --------------------


def _finding_dicts(findings: Sequence[Finding]) -> list[dict[str, str]]:
    return [
        {"check": f.check, "subject": f.subject, "message": f.message, "severity": f.severity}
        for f in findings
    ]


def _by_offset(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def request_facts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Groups (request_id, requests[], replies[]) → one fact row each, with check_request's findings."""
    names = FACTS_SCHEMA.names
    for batch in batches:
        cols: dict[str, list[Any]] = {n: [] for n in names}
        for row in batch.to_pylist():
            rid = row["request_id"]
            reqs = _by_offset(row["requests"])
            reps = _by_offset(row["replies"])
            q = reqs[0] if reqs else None
            r = reps[0] if reps else None
            sent = None
            if q is not None:
                sent = q["ts_ms"] or q["record_ms"]
            cols["request_id"].append(rid)
            cols["submissions"].append(len(reqs))
            cols["replies"].append(len(reps))
            for name in ("operator", "function", "key", "key_is_int", "args"):
                cols[name].append(None if q is None else q[name])
            cols["sent_ms"].append(sent)
            cols["request_ts_ms"].append(None if q is None else q["ts_ms"])
            for name in ("tid", "epoch", "phase", "status", "result", "error", "error_type"):
                cols[name].append(None if r is None else r[name])
            cols["reply_ms"].append(None if r is None else r["record_ms"])
            cols["latency_ms"].append(None if r is None or sent is None else r["record_ms"] - sent)
            cols["findings"].append(_finding_dicts(check_request(rid, reqs, reps)))
        yield pa.RecordBatch.from_pydict(cols, schema=FACTS_SCHEMA)


def tid_findings(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Groups (tid, logged[], replies[]) → check_tid's findings."""
    for batch in batches:
        found: list[Finding] = []
        for row in batch.to_pylist():
            found += check_tid(row["tid"], row["logged"], row["replies"])
        yield pa.RecordBatch.from_pylist(_finding_dicts(found), schema=FINDINGS_SCHEMA)


def entry_checks(n_by_gen: dict[int, int], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Sequencer-log entries → one summary row each, with check_entry's findings."""
    for batch in batches:
        rows: list[dict[str, Any]] = []
        for entry in batch.to_pylist():
            found, s = check_entry(entry, n_by_gen[entry["gen"]])
            rows.append(
                {
                    "epoch": s.epoch,
                    "gen": s.gen,
                    "node_id": s.node_id,
                    "sid": s.sid,
                    "lc_start": s.lc_start,
                    "lc_end": s.lc_end,
                    "fresh": s.fresh,
                    "rescheduled": s.rescheduled,
                    "resent": s.resent,
                    "logged_ms": entry["logged_ms"],
                    "findings": _finding_dicts(found),
                }
            )
        yield pa.RecordBatch.from_pylist(rows, schema=ENTRY_SCHEMA)


def serial_findings(
    app: str,
    snapshot_epoch: int | None,
    snapshot_state: dict[tuple[str, Any], Any] | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """All answered requests, in commit order, in one task → SerialCheck's findings."""
    check = SerialCheck(load_graph(app), snapshot_epoch, snapshot_state)
    for batch in batches:
        for row in batch.to_pylist():
            request = Request(
                row["request_id"],
                row["operator"],
                row["function"],
                key_value(row["key"], row["key_is_int"]),
                _raw(row["args"]),
                row["request_ts_ms"] or 0,
            )
            reply = Reply(
                row["request_id"],
                row["tid"],
                row["epoch"],
                row["phase"],
                row["status"],
                _raw(row["result"]),
                row["error"],
                row["error_type"],
                row["request_ts_ms"] or 0,
            )
            check.feed(request, reply)
    yield pa.RecordBatch.from_pylist(_finding_dicts(check.finish()), schema=FINDINGS_SCHEMA)


def _raw(data: bytes | None) -> Any:
    import msgspec

    return msgspec.Raw(data if data is not None else b"\xc0")


# ---- the pipeline ----------------------------------------------------------------------------------


class Timer:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.t0 = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.times[name] = round(now - self.t0, 2)
        self.t0 = now


def _kafka_df(spark: SparkSession, cfg: AuditConfig, kind: str, ranges: list[OffsetRange]) -> DataFrame:
    return (
        spark.read.format("styx_kafka")
        .option("bootstrap", cfg.kafka)
        .option("kind", kind)
        .option("ranges", ranges_option(ranges))
        .option("split_records", str(cfg.split_records))
        .option("timeout_s", str(cfg.timeout_s))
        .load()
    )


def _generation_of(epoch: Column, epoch_generations: Sequence[tuple[int, int]]) -> Column:
    """Manifest.generation_of as a column expression (the last pair that applies wins)."""
    expr: Column = F.lit(0)
    for first, gen in epoch_generations:
        expr = F.when(epoch >= first, F.lit(gen)).otherwise(expr)
    return expr


def _findings_rows(df: DataFrame) -> DataFrame:
    return df.select(F.explode("findings").alias("f")).select("f.*")


def run_audit(spark: SparkSession, cfg: AuditConfig) -> AuditResult:
    timer = Timer()
    out = cfg.out
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    topics = {"ingress": cfg.ingress_topic, "egress": cfg.egress_topic, "seqlog": cfg.seqlog_topic}
    planned = asyncio.run(plan_ranges(cfg.kafka, list(topics.values()), cfg.timeout_s))
    ranges = {kind: [r for r in planned if r.topic == topic] for kind, topic in topics.items()}
    stats: dict[str, Any] = {
        "kafka": cfg.kafka,
        "topics": topics,
        "records": {kind: sum(r.end - r.start for r in rs) for kind, rs in ranges.items()},
        "ranges": {kind: [str(r) for r in rs] for kind, rs in ranges.items()},
    }
    timer.lap("plan")
    extra: list[Finding] = []

    ingress = _kafka_df(spark, cfg, "ingress", ranges["ingress"])
    egress = _kafka_df(spark, cfg, "egress", ranges["egress"])
    seqlog = _kafka_df(spark, cfg, "seqlog", ranges["seqlog"])

    # Requests and replies, flattened, read from Kafka once.
    ing = ingress.select(
        "partition", "offset", F.unix_millis("timestamp").alias("record_ms"), "value.*", "decode_error"
    ).persist(StorageLevel.MEMORY_AND_DISK)
    egr = egress.select(
        "partition", "offset", F.unix_millis("timestamp").alias("record_ms"), "value.*", "decode_error"
    ).persist(StorageLevel.MEMORY_AND_DISK)
    undecodable = {
        "ingress": ing.where(F.col("decode_error").isNotNull()).count(),
        "egress": egr.where(F.col("decode_error").isNotNull()).count(),
    }
    timer.lap("read ingress+egress")

    # ---- exactly once: one group per request id
    req_side = ing.where(F.col("decode_error").isNull()).select(
        "request_id",
        F.struct(
            "partition", "offset", "record_ms", "operator", "function", "key", "key_is_int", "args", "ts_ms"
        ).alias("q"),
    )
    rep_side = egr.where(F.col("decode_error").isNull()).select(
        "request_id",
        F.struct(
            "partition",
            "offset",
            "record_ms",
            "tid",
            "epoch",
            "phase",
            "status",
            "result",
            "error",
            "error_type",
            "request_ts_ms",
        ).alias("r"),
    )
    groups = (
        req_side.withColumn("r", F.lit(None).cast(rep_side.schema["r"].dataType))
        .unionByName(rep_side.withColumn("q", F.lit(None).cast(req_side.schema["q"].dataType)))
        .groupBy("request_id")
        .agg(F.collect_list("q").alias("requests"), F.collect_list("r").alias("replies"))
    )
    facts = groups.mapInArrow(request_facts, spark_schema(FACTS_SCHEMA)).persist(StorageLevel.MEMORY_AND_DISK)
    n_requests = facts.count()
    stats["request_ids"] = n_requests
    timer.lap("exactly-once (group by request id)")

    # ---- the sequencer log: which generation ran each epoch
    seq = seqlog.where(F.col("decode_error").isNull()).select(
        F.unix_millis("timestamp").alias("logged_ms"), "value.*"
    )
    undecodable["seqlog"] = seqlog.where(F.col("decode_error").isNotNull()).count()
    meta_gens: list[tuple[int, int]] | None = None
    manifest = None
    if cfg.s3 is not None:
        client = cfg.s3.client()
        meta = load_meta(client, cfg.s3.bucket)
        manifest = load_manifest(client, cfg.s3.bucket, cfg.snapshot)
        if meta is not None:
            meta_gens = [tuple(p) for p in meta.epoch_generations]  # type: ignore[misc]
        elif manifest is not None:
            meta_gens = [tuple(p) for p in manifest.epoch_generations]  # type: ignore[misc]
    if meta_gens is not None:
        seq = seq.withColumn("run_gen", _generation_of(F.col("epoch"), meta_gens))
        stats["generations"] = f"from the cluster's epoch_generations {meta_gens}"
    else:
        seq = seq.withColumn("run_gen", F.max("gen").over(_window_by("epoch")))
        stats["generations"] = "inferred: the newest generation that logged each epoch"
    effective = (
        seq.where(F.col("gen") == F.col("run_gen")).drop("run_gen").persist(StorageLevel.MEMORY_AND_DISK)
    )
    n_by_gen = {
        int(r["gen"]): int(r["n"])
        for r in effective.groupBy("gen", "epoch")
        .agg(F.count_distinct("node_id").alias("n"))
        .groupBy("gen")
        .agg(F.max("n").alias("n"))
        .collect()
    }
    stats["workers_by_generation"] = n_by_gen
    entries = effective.mapInArrow(
        functools.partial(entry_checks, n_by_gen), spark_schema(ENTRY_SCHEMA)
    ).persist(StorageLevel.MEMORY_AND_DISK)
    summaries = [
        EntrySummary(
            r["epoch"],
            r["gen"],
            r["node_id"],
            r["sid"],
            r["lc_start"],
            r["lc_end"],
            r["fresh"],
            r["rescheduled"],
            r["resent"],
        )
        for r in entries.drop("findings").collect()
    ]
    extra += check_epochs(summaries, n_by_gen)
    timer.lap("sequencer log (entries, epochs)")

    # ---- ordering: one group per tid
    logged = (
        effective.select(
            "epoch",
            "gen",
            "node_id",
            "lc_start",
            "lc_end",
            F.size(F.filter("entries", lambda e: e["tid"] > 0)).alias("roots"),
            F.posexplode("entries").alias("pos", "e"),
        )
        .where(F.col("e.tid") > 0)
        .select(
            F.col("e.tid").alias("tid"),
            F.struct(
                "epoch",
                "gen",
                "node_id",
                F.col("e.request_id").alias("request_id"),
                (F.col("pos") >= F.col("roots") - (F.col("lc_end") - F.col("lc_start"))).alias("fresh"),
            ).alias("l"),
        )
    )
    by_tid = egr.where(F.col("decode_error").isNull()).select(
        "tid", F.struct("request_id", "epoch", "partition", "offset").alias("r")
    )
    tid_groups = (
        logged.withColumn("r", F.lit(None).cast(by_tid.schema["r"].dataType))
        .unionByName(by_tid.withColumn("l", F.lit(None).cast(logged.schema["l"].dataType)))
        .groupBy("tid")
        .agg(F.collect_list("l").alias("logged"), F.collect_list("r").alias("replies"))
    )
    tid_found = tid_groups.mapInArrow(tid_findings, spark_schema(FINDINGS_SCHEMA))
    timer.lap("ordering (plan)")

    # ---- state: the snapshot, the workload's invariants, the serial replay
    snapshot_state: dict[tuple[str, Any], Any] | None = None
    snapshot_epoch: int | None = None
    workload = None
    if cfg.workload is not None:
        # Imported by name: the workloads live in the benchmarks package, outside the typed packages.
        workloads = importlib.import_module("benchmarks.workload")
        workload = workloads.make_workload(cfg.workload, workloads.Options(**cfg.workload_options))
    if cfg.s3 is not None:
        if manifest is None:
            extra.append(
                Finding(
                    "invariant",
                    f"bucket {cfg.s3.bucket}",
                    f"no snapshot in bucket {cfg.s3.bucket!r}: the state checks were skipped",
                    WARNING,
                )
            )
        else:
            snapshot_epoch = manifest.epoch
            snapshot_state = read_state(spark, cfg.s3, cfg.snapshot)
            stats["snapshot"] = {"epoch": manifest.epoch, "entities": len(snapshot_state)}
            if workload is not None:
                extra += check_invariants(workload.name, workload.check_state(snapshot_state), manifest.epoch)
    timer.lap("snapshot + invariants")
    app = cfg.app or (workload.app if workload is not None else None)
    serial_found: DataFrame | None = None
    if cfg.serial and app is not None:
        answered = facts.where((F.col("submissions") > 0) & (F.col("replies") > 0)).select(
            "request_id",
            "operator",
            "function",
            "key",
            "key_is_int",
            "args",
            "request_ts_ms",
            "tid",
            "epoch",
            "phase",
            "status",
            "result",
            "error",
            "error_type",
        )
        serial_found = (
            answered.repartition(1)
            .sortWithinPartitions("epoch", "phase", "tid")
            .mapInArrow(
                functools.partial(serial_findings, app, snapshot_epoch, snapshot_state),
                spark_schema(FINDINGS_SCHEMA),
            )
        )
    elif cfg.serial:
        extra.append(
            Finding(
                "serial.outcome",
                "audit",
                "no workload or --app given: the serial replay was skipped",
                WARNING,
            )
        )

    # ---- all findings: written in full, counted and sampled for the report
    for kind, n in undecodable.items():
        if n:
            severity = WARNING if kind == "ingress" else ERROR
            why = " (the cluster skips them: no reply possible)" if kind == "ingress" else ""
            extra.append(
                Finding("input.undecodable", kind, f"{n} {kind} records do not decode{why}", severity)
            )
    parts = [_findings_rows(facts), _findings_rows(entries), tid_found]
    if serial_found is not None:
        parts.append(serial_found)
    extra_df = spark.createDataFrame(
        [(f.check, f.subject, f.message, f.severity) for f in extra], spark_schema(FINDINGS_SCHEMA)
    )
    findings = functools.reduce(DataFrame.unionByName, parts, extra_df)
    findings.write.mode("overwrite").parquet(str(out / "tables" / "findings.parquet"))
    findings = spark.read.parquet(str(out / "tables" / "findings.parquet"))
    timer.lap("ordering + serial replay + findings written")
    counts: dict[str, dict[str, int]] = {}
    for r in findings.groupBy("check", "severity").count().collect():
        counts.setdefault(r["check"], {})[r["severity"]] = int(r["count"])
    ranked = findings.withColumn(
        "n", F.row_number().over(_window_by("check", order=["severity", "subject", "message"]))
    )
    samples = [
        Finding(r["check"], r["subject"], r["message"], r["severity"])
        for r in ranked.where(F.col("n") <= SAMPLE_PER_CHECK).orderBy("check", "n").collect()
    ]

    # ---- analytics
    tables = analytics(facts, entries)
    if cfg.write_facts:
        facts.drop("findings").write.mode("overwrite").parquet(str(out / "tables" / "requests.parquet"))
    for name, table in tables.items():
        table.to_parquet(out / "tables" / f"{name}.parquet", index=False)
    stats["replies"] = int(tables["status"]["replies"].sum()) if len(tables["status"]) else 0
    timer.lap("analytics")

    ok = not any(c.get(ERROR, 0) for c in counts.values())
    report = write_report(out, ok, counts, samples, stats, tables, timer.times, CHECKS)
    timer.lap("report")
    for df in (ing, egr, facts, effective, entries):
        df.unpersist()
    return AuditResult(ok, counts, samples, stats, timer.times, report)


def _pandas(df: DataFrame) -> pd.DataFrame:
    return cast(pd.DataFrame, df.toPandas())


def _window_by(*cols: str, order: Sequence[str] = ()) -> Any:
    from pyspark.sql import Window

    w = Window.partitionBy(*cols)
    return w.orderBy(*order) if order else w


def read_state(spark: SparkSession, s3: S3Options, which: str) -> dict[tuple[str, Any], Any]:
    """The snapshot's state: each entity's value from its newest object (null: deleted), decoded."""
    snap = spark.read.format("styx_snapshots").options(**s3.as_options(), snapshot=which).load()
    latest = snap.groupBy("operator", "key", "key_is_int").agg(
        F.max_by("value", "object_epoch").alias("value")
    )
    state: dict[tuple[str, Any], Any] = {}
    for r in latest.where(F.col("value").isNotNull()).toLocalIterator():
        state[(r["operator"], key_value(r["key"], r["key_is_int"]))] = decode_value(r["value"])
    return state


def analytics(facts: DataFrame, entries: DataFrame) -> dict[str, Any]:
    """Small result tables (pandas): latency, throughput, aborts, epochs."""
    answered = facts.where(F.col("replies") > 0)
    pct = [0.5, 0.95, 0.99]

    def percentiles(prefix: str = "") -> list[Column]:
        p = F.percentile_approx("latency_ms", pct, 10_000)
        return [
            p[0].alias(f"{prefix}p50_ms"),
            p[1].alias(f"{prefix}p95_ms"),
            p[2].alias(f"{prefix}p99_ms"),
            F.max("latency_ms").alias(f"{prefix}max_ms"),
            F.round(F.avg("latency_ms"), 2).alias(f"{prefix}mean_ms"),
        ]

    def count_status(name: str) -> Column:
        return F.sum(F.when(F.col("status") == name, 1).otherwise(0)).alias(name)

    latency_by_function = _pandas(
        answered.groupBy("operator", "function")
        .agg(
            F.count("*").alias("replies"),
            count_status("committed"),
            count_status("aborted"),
            count_status("failed"),
            *percentiles(),
        )
        .orderBy("operator", "function")
    )
    per_second = _pandas(
        answered.withColumn("second", F.floor(F.col("reply_ms") / 1000).cast("long"))
        .groupBy("second")
        .agg(
            F.count("*").alias("replies"),
            count_status("committed"),
            count_status("aborted"),
            count_status("failed"),
            F.sum(F.when(F.col("phase") == 1, 1).otherwise(0)).alias("fallback"),
            *percentiles(),
        )
        .orderBy("second")
    )
    latency_per_second_by_function = _pandas(
        answered.withColumn("second", F.floor(F.col("reply_ms") / 1000).cast("long"))
        .groupBy("second", "operator", "function")
        .agg(F.count("*").alias("replies"), *percentiles())
        .orderBy("second", "operator", "function")
    )
    total = max(1, answered.count())
    cause = F.regexp_replace(F.coalesce(F.col("error"), F.lit("")), r"[0-9]+", "N")
    abort_causes = _pandas(
        answered.where(F.col("status") != "committed")
        .groupBy("status", "error_type", cause.alias("cause"))
        .agg(F.count("*").alias("replies"))
        .withColumn("share_of_all_replies", F.round(F.col("replies") / total, 6))
        .orderBy(F.desc("replies"))
    )
    status = _pandas(answered.groupBy("status").agg(F.count("*").alias("replies")).orderBy("status"))
    epochs = _pandas(
        entries.groupBy("epoch", "gen")
        .agg(
            F.count("*").alias("workers"),
            (F.sum("fresh") + F.sum("rescheduled")).alias("transactions"),
            F.sum("fresh").alias("fresh"),
            F.sum("rescheduled").alias("rescheduled"),
            F.sum("resent").alias("resent"),
            F.min("logged_ms").alias("logged_ms"),
        )
        .orderBy("epoch")
    )
    # An epoch lasts from its sequencer-log entries to the next epoch's (the log is written at its start).
    epochs["duration_ms"] = epochs["logged_ms"].shift(-1) - epochs["logged_ms"]
    return {
        "latency_by_function": latency_by_function,
        "per_second": per_second,
        "latency_per_second_by_function": latency_per_second_by_function,
        "abort_causes": abort_causes,
        "status": status,
        "epochs": epochs,
    }


# ---- command line ----------------------------------------------------------------------------------


def summary_lines(result: AuditResult) -> list[str]:
    lines = [f"audit {'PASSED' if result.ok else 'FAILED'}: {result.stats.get('request_ids', 0)} request ids"]
    for check, by in sorted(result.counts.items()):
        lines.append(f"  {check}: {by.get(ERROR, 0)} errors, {by.get(WARNING, 0)} warnings")
    for f in result.samples:
        if f.severity == ERROR:
            lines.append(f"  [{f.check}] {f.message}")
    lines.append(f"report: {result.report}  (stages: {json.dumps(result.timings_s)})")
    return lines


def run_from_args(args: argparse.Namespace, echo: Callable[[str], None] = print) -> int:
    cfg = config_from(args)
    started = time.monotonic()
    spark = spark_session(driver_memory=cfg.driver_memory)
    try:
        result = run_audit(spark, cfg)
    finally:
        spark.stop()
    for line in summary_lines(result):
        echo(line)
    echo(f"audit took {time.monotonic() - started:.1f}s")
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="styx-audit", description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
