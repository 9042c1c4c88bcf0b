"""The audit job: read the logs (and a snapshot), distribute the rules of :mod:`.rules`, write a report.

Run it as ``styx audit …`` or ``spark-submit styx_py/audit/job.py …`` (same arguments; see
``--help``). The exit code is 0 when every check passes (skipped checks are listed; they fail the
audit only with ``--strict``), 1 when any fails, 2 when the audit could not run
(:mod:`.failures`). A line per stage goes to stderr while Spark runs; Spark's own output (the JVM's
warnings, its log) goes to ``OUT/spark.log`` unless ``--verbose``.

The plan, with the Spark step that distributes each rule (the functions of :mod:`.tasks`)::

    ingress ─┐ shuffle by request id, sort ─► request_facts: check_request ─► facts (one row per id)
    egress  ─┘                                                                ├─► analytics
    seqlog ─► generation that ran each epoch ─► entry_checks: check_entry ─► check_epochs (driver)
          └─► explode_entries ─┐ full outer join by tid; irregular tids ─► tid_findings: check_tid
    facts (each id's reply) ───┘
    snapshot (S3) ─► newest value per entity ─► Workload.check_state (driver: the state is small)
    changelog ─► changelog_job.changelog_checks (order, once, the snapshot; its digest sums go to ─┐
    facts ─► one partition, sorted by (epoch, phase, tid) ─► serial_findings: SerialCheck (one task,  ◄┘
             run beside the steps above: a serial replay is serial; it also compares its writes
             with the changelog's records)

Every offset range is planned once, in the driver (the fetch high watermark at the start of the
audit), so all steps read exactly the same records even while the cluster keeps appending.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import urllib3.exceptions
from aiokafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]
from minio.error import MinioException
from py4j.protocol import Py4JError
from pyspark import SparkConf, StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from styx_benchmarks.workload import Options as WorkloadOptions
from styx_benchmarks.workloads import make_workload
from styx_py.audit.analytics import CHECK, analytics
from styx_py.audit.arrow import spark_schema
from styx_py.audit.changelog_job import changelog_checks
from styx_py.audit.changelog_rules import changelog_skipped
from styx_py.audit.failures import (
    EXIT_COULD_NOT_RUN,
    EXIT_FAILED,
    EXIT_PASSED,
    MissingData,
    check_s3,
    could_not_run,
    kafka_failure,
)
from styx_py.audit.kafka_source import OffsetRange, StyxKafkaSource, plan_ranges, read_ranges
from styx_py.audit.options import AuditConfig, S3Options, add_arguments, config_from
from styx_py.audit.report import headline, write_report
from styx_py.audit.rows import key_value
from styx_py.audit.rules import (
    ERROR,
    INFO,
    SKIPPED,
    EntrySummary,
    Finding,
    Verdict,
    check_epochs,
    check_invariants,
    check_undecodable,
    checks_for,
    skipped_checks,
    verdicts,
)
from styx_py.audit.snapshot_source import StyxSnapshotSource, load_manifest, load_meta
from styx_py.audit.tasks import (
    EGRESS,
    ENTRY_SCHEMA,
    FACTS_SCHEMA,
    FINDINGS_SCHEMA,
    INGRESS,
    LOGGED_SCHEMA,
    REQUEST_ROW,
    AppVersions,
    entry_checks,
    explode_entries,
    request_facts,
    serial_findings,
    tid_findings,
)
from styx_py.core.errors import StyxError
from styx_py.core.segments import segments_in
from styx_py.core.wire import decode_value

# What stops an audit that could not run (exit code 2, one line): Kafka, S3 or Spark failing (a Python
# error inside a Spark task comes back as a PySparkException), data that is missing or does not
# decode. Anything else raised on the driver is a bug in the audit, shown with its traceback.
RUN_FAILURES = (
    OSError,
    KafkaError,
    MinioException,
    urllib3.exceptions.HTTPError,
    Py4JError,
    PySparkException,
    MissingData,
    msgspec.DecodeError,
)

SAMPLE_PER_CHECK = 10  # findings per check spelled out in the report (all of them go to Parquet)


@dataclass
class AuditResult:
    ok: bool
    counts: dict[str, dict[str, int]]  # check -> severity -> findings
    samples: list[Finding]
    stats: dict[str, Any]
    timings_s: dict[str, float]
    report: Path  # report.md
    html: Path  # report.html, self-contained
    verdicts: list[Verdict]

    def messages(self, check_prefix: str = "") -> list[str]:
        return [f.message for f in self.samples if f.check.startswith(check_prefix) and f.severity != SKIPPED]

    def verdict(self, check: str) -> Verdict:
        return next(v for v in self.verdicts if v.check == check)


# ---- Spark session ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 points at ``path`` inside the block: a JVM started here writes its stderr
    (its warnings, its log, its Python workers' output) there for its whole life."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def command_session(*args: Any, **kwargs: Any) -> Iterator[SparkSession]:
    """:func:`spark_session` for a command run in this process, stopped at the end only if the command
    started it: a caller's running SparkContext is used and left running. Whether one runs is asked of
    the process (``SparkContext._active_spark_context``), not of ``SparkSession.getActiveSession()``:
    that is per thread, so a session made in another thread would look absent and be stopped under
    its owner."""
    from pyspark import SparkContext

    ours = SparkContext._active_spark_context is None
    spark = spark_session(*args, **kwargs)
    try:
        yield spark
    finally:
        if ours:
            spark.stop()


def spark_session(
    app_name: str = "styx-audit",
    driver_memory: str = "2g",
    log: Path | None = None,
    verbose: bool = False,
    *,
    master: str | None = None,
    executor_memory: str | None = None,
) -> SparkSession:
    """On ``master``, else the one spark-submit chose, else ``local[2]``; UI off, two shuffle
    partitions, UTC; the settings measured best on this 2-core machine (shared/PYSPARK.md).

    On a cluster master the executors run this package's code (the data sources and the rules): they
    need the same Python with styx-py installed (``PYSPARK_PYTHON``, default: this interpreter) and
    must reach Kafka and S3 at the addresses the audit was given.

    Quiet unless ``verbose``: log level ERROR, no console progress bars, and a JVM started here writes
    its output to ``log`` (when given) instead of the terminal. ``verbose``: level WARN, progress bars."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    java_opts = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):
        builder = builder.master("local[2]")
    if executor_memory is not None:
        builder = builder.config("spark.executor.memory", executor_memory)
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": str(verbose).lower(),
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
    with _stderr_to(log) if log is not None and not verbose else contextlib.nullcontext():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    register_sources(spark)
    return spark


def register_sources(spark: SparkSession) -> None:
    spark.dataSource.register(StyxKafkaSource)
    spark.dataSource.register(StyxSnapshotSource)


# ---- the steps ----------------------------------------------------------------------------------------


HEARTBEAT_S = 10.0  # a stage that runs longer than this gets a line with Spark's task count


class Progress:
    """Stage timings, and a line per stage for a person waiting (``echo``: stderr in ``styx audit``).

    While a stage runs longer than :data:`HEARTBEAT_S`, a background thread adds a line with how many
    of the running Spark stages' tasks are done, so a long shuffle does not look like a hang."""

    def __init__(self, echo: Callable[[str], None] | None = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.echo = echo
        self.times: dict[str, float] = {}
        self.started = self.t0 = time.monotonic()
        self.stage_started = self.started
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._spark: SparkSession | None = None

    def say(self, text: str) -> None:
        if self.echo is not None:
            self.echo(f"audit [{time.monotonic() - self.started:6.1f}s] {text}")

    def stage(self, text: str) -> None:
        """Stage ``text`` begins (the previous one, if any, ends)."""
        self.stage_started = time.monotonic()
        self.say(text)

    def lap(self, name: str) -> None:
        """Stage ``name`` has ended: record how long since the previous lap."""
        now = time.monotonic()
        self.times[name] = round(now - self.t0, 2)
        self.t0 = now

    def watch(self, spark: SparkSession) -> None:
        """Start the heartbeat over ``spark``'s running stages (only with an echo)."""
        if self.echo is None or self._thread is not None:
            return
        self._spark = spark
        self._thread = threading.Thread(target=self._beat, name="audit-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        assert self._spark is not None
        tracker = self._spark.sparkContext.statusTracker()
        while not self._stop.wait(self.heartbeat_s):
            stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
            done = sum(s.numCompletedTasks for s in stages if s is not None)
            total = sum(s.numTasks for s in stages if s is not None)
            spark = f"Spark: {done} of {total} tasks done" if total else "Spark: planning or starting tasks"
            self.say(f"  … {time.monotonic() - self.stage_started:.0f}s into this stage ({spark})")


def kafka_df(spark: SparkSession, cfg: AuditConfig, kind: str, ranges: list[OffsetRange]) -> DataFrame:
    return read_ranges(spark, cfg.kafka, kind, ranges, cfg.split_records, cfg.timeout_s, cfg.kafka_security)


def _flat(df: DataFrame) -> DataFrame:
    return df.select(
        "partition", "offset", F.unix_millis("timestamp").alias("record_ms"), "value.*", "decode_error"
    )


def exactly_once(ingress: DataFrame, egress: DataFrame) -> DataFrame:
    """One fact row per request id, with check_request's findings: request and reply records in one
    shape, shuffled by request id and sorted, then streamed through :func:`.tasks.request_facts`.

    (Measured at 1 M requests: grouping with collect_list took ~2.5x as long, an object aggregate
    falling back to sorting beyond 128 keys per task; joining requests to replies ~2x.)
    """
    shape = spark_schema(REQUEST_ROW)

    def rows(df: DataFrame, side: int) -> DataFrame:
        present = set(df.columns)
        return df.select(
            *[
                (F.lit(side) if f.name == "side" else F.col(f.name) if f.name in present else F.lit(None))
                .cast(f.dataType)
                .alias(f.name)
                for f in shape.fields
            ]
        )

    both = rows(_flat(ingress), INGRESS).unionByName(rows(_flat(egress), EGRESS))
    return (
        both.repartition("request_id")
        .sortWithinPartitions("request_id", "side", "partition", "offset")
        .mapInArrow(request_facts, spark_schema(FACTS_SCHEMA))
    )


def effective_entries(seqlog: DataFrame, epoch_generations: Sequence[tuple[int, int]] | None) -> DataFrame:
    """Sequencer-log entries of the generation that ran each epoch (from the cluster's record of
    generations when there is one, else the newest generation that logged the epoch)."""
    seq = seqlog.where(F.col("decode_error").isNull()).select(
        F.unix_millis("timestamp").alias("logged_ms"), "value.*"
    )
    run_gen: Column
    if epoch_generations is not None:
        run_gen = F.lit(0)
        for first, gen in epoch_generations:  # Manifest.generation_of: the last pair that applies wins
            run_gen = F.when(F.col("epoch") >= first, F.lit(gen)).otherwise(run_gen)
    else:
        run_gen = F.max("gen").over(Window.partitionBy("epoch"))
    return seq.withColumn("run_gen", run_gen).where(F.col("gen") == F.col("run_gen")).drop("run_gen")


def ordering(effective: DataFrame, facts: DataFrame) -> DataFrame:
    """check_tid's findings for every tid of the (effective) sequencer log and of the replies.

    Each request id's reply is taken from the facts (its first reply): further replies to the same id
    are identical or already an ``exactly_once.changed_result`` error. A tid assigned once and answered
    at most once, for that request in that epoch, breaks no ordering rule (tested: check_tid finds
    nothing there); a full outer join by tid marks those in SQL, and only the other tids' rows are
    grouped and judged in Python.
    """
    logged = effective.mapInArrow(explode_entries, spark_schema(LOGGED_SCHEMA))
    # A refused request (not admitted) has no tid: its reply carries 0 and takes no place in the order.
    answered = F.col("request_id").isNotNull() & (F.col("replies") > 0) & (F.col("status") != "refused")
    replies = facts.where(answered).select(
        "tid", F.struct("request_id", "epoch", "reply_partition", "reply_offset").alias("r")
    )
    log, rep = F.col("l"), F.col("r")
    clean_row = (
        log.isNotNull()
        & log["fresh"]
        & (rep.isNull() | ((rep["request_id"] == log["request_id"]) & (rep["epoch"] == log["epoch"])))
    )
    by_tid = Window.partitionBy("tid")
    irregular = (
        logged.join(replies, "tid", "full_outer")
        .withColumn("rows", F.count(F.lit(1)).over(by_tid))
        .withColumn("clean", F.min(F.coalesce(clean_row, F.lit(False)).cast("int")).over(by_tid))
        .where((F.col("rows") != 1) | (F.col("clean") == 0))
    )
    groups = irregular.groupBy("tid").agg(
        F.collect_set("l").alias("logged"),
        F.collect_set(
            F.struct(
                rep["request_id"].alias("request_id"),
                rep["epoch"].alias("epoch"),
                rep["reply_partition"].alias("partition"),
                rep["reply_offset"].alias("offset"),
            )
        ).alias("replies"),
    )
    return groups.mapInArrow(tid_findings, spark_schema(FINDINGS_SCHEMA))


def serial_replay(
    facts: DataFrame,
    app: AppVersions,
    snapshot_epoch: int | None,
    state: dict[tuple[str, Any], Any] | None,
    changelog: tuple[int, dict[int, tuple[int, int]]] | None = None,
) -> DataFrame:
    """SerialCheck's findings: every answered request, in commit order, in one task (and whether the
    changelog's records up to an epoch are the replay's writes: ``changelog``, from changelog_checks)."""
    answered = facts.where(
        F.col("request_id").isNotNull()
        & (F.col("submissions") > 0)
        & (F.col("replies") > 0)
        & (F.col("status") != "refused")  # nothing ran: not part of the serial execution
    ).select(
        *("request_id", "operator", "function", "key", "key_is_int", "args", "request_ts_ms", "ingress_ms"),
        *("tid", "epoch", "phase", "status", "result", "error", "error_type"),
    )
    return (
        answered.repartition(1)
        .sortWithinPartitions("epoch", "phase", "tid")
        .mapInArrow(
            functools.partial(serial_findings, app, snapshot_epoch, state, changelog),
            spark_schema(FINDINGS_SCHEMA),
        )
    )


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


def _entry_summaries(entries: DataFrame) -> list[EntrySummary]:
    fields = ("epoch", "gen", "node_id", "sid", "lc_start", "lc_end", "fresh", "rescheduled", "resent")
    return [EntrySummary(*(r[f] for f in fields)) for r in entries.select(*fields).collect()]


def _findings(df: DataFrame) -> list[Finding]:
    return [Finding(r["check"], r["subject"], r["message"], r["severity"]) for r in df.collect()]


def _exploded(df: DataFrame) -> DataFrame:
    return df.select(F.explode("findings").alias("f")).select("f.*")


# ---- the audit ----------------------------------------------------------------------------------------


def plan(cfg: AuditConfig) -> list[OffsetRange]:
    """Every offset range the audit reads (to the fetch high watermarks now); :class:`AuditError` when
    Kafka or a topic is not there."""
    topics = [cfg.ingress_topic, cfg.egress_topic, cfg.seqlog_topic]
    try:
        segmented = [cfg.ingress_topic, cfg.egress_topic]
        planned = asyncio.run(
            plan_ranges(cfg.kafka, topics, cfg.timeout_s, segmented=segmented, security=cfg.kafka_security)
        )
    except (OSError, KafkaError, MissingData) as exc:  # TimeoutError is an OSError
        raise kafka_failure(cfg.kafka, exc) from exc
    if cfg.changelog_topic:  # planned after the replies: it holds no epoch the replies do not
        try:
            planned += asyncio.run(
                plan_ranges(cfg.kafka, [cfg.changelog_topic], cfg.timeout_s, security=cfg.kafka_security)
            )
        except MissingData:
            pass  # a cluster without a changelog: its checks are skipped (run_audit says so)
        except (OSError, KafkaError) as exc:
            raise kafka_failure(cfg.kafka, exc) from exc
    return planned


def run_audit(
    spark: SparkSession,
    cfg: AuditConfig,
    progress: Progress | None = None,
    planned: list[OffsetRange] | None = None,
) -> AuditResult:
    """The whole audit on ``spark``: read, check, analyse, write the reports. ``planned``: the offset
    ranges, when :func:`plan` already ran (else planned here)."""
    timer = progress if progress is not None else Progress()
    out = cfg.out
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    topics = {"ingress": cfg.ingress_topic, "egress": cfg.egress_topic, "seqlog": cfg.seqlog_topic}
    if planned is None:
        timer.stage(f"planning: the high watermarks of {', '.join(topics.values())} on {cfg.kafka}")
        planned = plan(cfg)
    # The segments of the ingress and egress topics (core.segments) are read as one log each: request
    # ids, not offsets, tie requests to replies.
    ranges = {kind: [r for r in planned if segments_in([r.topic], topic)] for kind, topic in topics.items()}
    ranges["changelog"] = [r for r in planned if cfg.changelog_topic and r.topic == cfg.changelog_topic]
    stats: dict[str, Any] = {
        "kafka": cfg.kafka,
        "topics": topics,
        "records": {kind: sum(r.end - r.start for r in rs) for kind, rs in ranges.items()},
    }
    extra: list[Finding] = []

    # ---- the snapshot, the workload's invariants, the cluster's record of generations (S3)
    epoch_generations: list[tuple[int, int]] | None = None
    manifest = None
    versions: list[tuple[int, int, str]] = []  # the cluster's code updates: each epoch replays its version
    snapshot_state: dict[tuple[str, Any], Any] | None = None
    no_snapshot: str | None = "no S3 endpoint given (--s3-endpoint or STYX_S3_ENDPOINT)"
    if cfg.s3 is not None:
        timer.stage(f"snapshots: the manifest and the cluster's generations in s3://{cfg.s3.bucket}")
        client = cfg.s3.client()
        meta = load_meta(client, cfg.s3.bucket)
        if meta is not None and len(meta.versions) > 1:
            versions = [(v.number, v.first_epoch, v.import_path) for v in meta.versions]
            stats["versions"] = versions
        manifest = load_manifest(client, cfg.s3.bucket, cfg.snapshot)
        source = meta if meta is not None else manifest
        if source is not None:
            epoch_generations = [(int(first), int(gen)) for first, gen in source.epoch_generations]
        if manifest is None:
            which = "no snapshot" if cfg.snapshot == "latest" else f"no snapshot {cfg.snapshot}"
            no_snapshot = f"{which} in bucket {cfg.s3.bucket!r}"
            timer.say(f"  {no_snapshot}: the state checks are skipped")
        else:
            timer.stage(f"snapshots: reading snapshot {manifest.epoch} (the state at epoch {manifest.epoch})")
            snapshot_state = read_state(spark, cfg.s3, cfg.snapshot)
            stats["snapshot"] = {"epoch": manifest.epoch, "entities": len(snapshot_state)}
            no_snapshot = None
    stats["generations"] = (
        f"from the cluster's epoch_generations {epoch_generations}"
        if epoch_generations is not None
        else "inferred: the newest generation that logged each epoch"
    )
    workload = None
    if cfg.workload is not None:
        workload = make_workload(cfg.workload, WorkloadOptions(**cfg.workload_options))
        if manifest is not None and snapshot_state is not None:
            timer.stage(f"checking invariant.{workload.name} on snapshot {manifest.epoch}")
            extra += check_invariants(workload.name, workload.check_state(snapshot_state), manifest.epoch)
    app = cfg.app or (workload.app if workload is not None else None)
    extra += skipped_checks(cfg.workload, app, cfg.serial, no_snapshot)
    timer.lap("plan, snapshot, invariants")

    # ---- exactly once: the facts table (ingress and egress read once here)
    records = stats["records"]
    timer.stage(
        f"reading ingress ({records['ingress']} records) and egress ({records['egress']} records), "
        "checking exactly_once.*"
    )
    ingress = kafka_df(spark, cfg, "ingress", ranges["ingress"])
    egress = kafka_df(spark, cfg, "egress", ranges["egress"])
    facts = exactly_once(ingress, egress).persist(StorageLevel.MEMORY_AND_DISK)
    stats["request_ids"] = facts.where(F.col("request_id").isNotNull()).count()
    timer.lap("read ingress+egress, exactly-once")

    # ---- the changelog: order, once, the snapshot (the serial replay compares it with its writes)
    changelog: tuple[int, dict[int, tuple[int, int]]] | None = None
    if not cfg.changelog_topic:
        extra += changelog_skipped("no changelog topic given (--changelog-topic): not checked")
    elif not ranges["changelog"]:
        extra += changelog_skipped(f"topic {cfg.changelog_topic!r} does not exist: the cluster writes none")
    else:
        timer.stage(f"reading the changelog ({cfg.changelog_topic}), checking changelog.*")
        cl_df = kafka_df(spark, cfg, "changelog", ranges["changelog"]).persist(StorageLevel.MEMORY_AND_DISK)
        snap_epoch = manifest.epoch if manifest is not None and snapshot_state is not None else None
        cl = changelog_checks(cl_df, facts, snap_epoch, snapshot_state)
        extra += cl.findings
        stats["changelog"] = {"records": cl.records, "compared_up_to_epoch": cl.bound}
        if snap_epoch is None:
            extra += changelog_skipped(f"{no_snapshot}: no state to compare", ["changelog.snapshot"])
        changelog = (cl.bound, cl.sums)
        cl_df.unpersist()
        timer.lap("changelog")

    # ---- the serial replay runs in one task: start it now, beside the rest (2 cores)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="serial-replay")
    serial_future: Future[tuple[list[Finding], float]] | None = None
    if cfg.serial and app is not None:
        snapshot_epoch = manifest.epoch if manifest is not None else None
        serial_df = serial_replay(facts, versions or app, snapshot_epoch, snapshot_state, changelog)

        def replay() -> tuple[list[Finding], float]:
            started = time.monotonic()
            return _findings(serial_df), time.monotonic() - started

        serial_future = pool.submit(replay)
        timer.say("  serial replay started (one Spark task, beside the next stages)")

    # ---- the sequencer log and the tid order
    timer.stage(f"reading the sequencer log ({records['seqlog']} records), checking ordering.*")
    seqlog = kafka_df(spark, cfg, "seqlog", ranges["seqlog"]).persist(StorageLevel.MEMORY_AND_DISK)
    bad = seqlog.where(F.col("decode_error").isNotNull())
    n_bad = bad.count()
    if n_bad:
        first = bad.orderBy("offset").first()
        assert first is not None
        extra += check_undecodable(
            "seqlog", n_bad, f"p{first['partition']}@{first['offset']}: {first['decode_error']}"
        )
    effective = effective_entries(seqlog, epoch_generations).persist(StorageLevel.MEMORY_AND_DISK)
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
    extra += check_epochs(_entry_summaries(entries), n_by_gen)
    rule_findings = functools.reduce(
        DataFrame.unionByName, [_exploded(facts), _exploded(entries), ordering(effective, facts)]
    )
    staged = out / "tables" / "rule_findings.parquet"
    rule_findings.write.mode("overwrite").parquet(str(staged))
    timer.lap("sequencer log, ordering")
    timer.stage("analytics: latency, throughput, aborts, epochs")
    tables = analytics(facts, entries)
    timer.lap("analytics")

    # ---- all findings: written in full, counted and sampled for the report
    if serial_future is not None:
        timer.stage("waiting for the serial replay: serial.*, effects.*, timers.fired")
        serial, serial_s = serial_future.result()
        for tally in [f for f in serial if f.severity == INFO]:  # what was counted, not a finding
            stats.setdefault("checked", {})[tally.check] = json.loads(tally.message)
        extra += [f for f in serial if f.severity != INFO]
        timer.times["serial replay (beside the above)"] = round(serial_s, 2)
    pool.shutdown()
    timer.stage("counting the findings, writing the report")
    extra_df = spark.createDataFrame(
        [(f.check, f.subject, f.message, f.severity) for f in extra], spark_schema(FINDINGS_SCHEMA)
    )
    findings = spark.read.parquet(str(staged)).unionByName(extra_df)
    findings.coalesce(1).write.mode("overwrite").parquet(str(out / "tables" / "findings.parquet"))
    shutil.rmtree(staged, ignore_errors=True)
    findings = spark.read.parquet(str(out / "tables" / "findings.parquet"))
    counts: dict[str, dict[str, int]] = {}
    for r in findings.groupBy("check", "severity").count().collect():
        counts.setdefault(r["check"], {})[r["severity"]] = int(r["count"])
    by_check = Window.partitionBy("check").orderBy("severity", "subject", "message")
    samples = _findings(
        findings.withColumn("n", F.row_number().over(by_check))
        .where(F.col("n") <= SAMPLE_PER_CHECK)
        .orderBy("check", "n")
    )
    if cfg.write_facts:
        facts.drop("findings").write.mode("overwrite").parquet(str(out / "tables" / "requests.parquet"))
    for name, table in tables.items():
        table.to_parquet(out / "tables" / f"{name}.parquet", index=False)
    status = tables["status"]
    stats["replies"] = int(status["replies"].sum()) if len(status) else 0
    stats["check_replies"] = int(status[status["traffic"] == CHECK]["replies"].sum()) if len(status) else 0
    starts = tables["per_second"]
    if len(starts):
        stats["run_start"] = str(starts["time"].iloc[0])
    timer.lap("findings")

    checks = checks_for(cfg.workload)
    judged = verdicts(checks, counts, samples)
    ok = not any(v.verdict == "FAIL" or (cfg.strict and v.verdict == "skipped") for v in judged)
    report, page = write_report(out, ok, counts, samples, stats, tables, timer.times, checks)
    for df in (facts, seqlog, effective, entries):
        df.unpersist()
    return AuditResult(ok, counts, samples, stats, timer.times, report, page, judged)


# ---- command line ----------------------------------------------------------------------------------


def summary_lines(result: AuditResult) -> list[str]:
    ids = result.stats.get("request_ids", 0)
    lines = [f"audit {headline(result.ok, result.verdicts)} ({ids} request ids)"]
    for v in result.verdicts:
        if v.verdict == "skipped":
            detail = f": {v.reason}"
        elif v.errors or v.warnings:
            detail = f" ({v.errors} errors, {v.warnings} warnings)"
        else:
            detail = ""
        lines.append(f"  {v.check}: {v.verdict}{detail}")
    for f in result.samples:
        if f.severity == ERROR:
            lines.append(f"  [{f.check}] {f.message}")
    lines.append(f"report: {result.html} (and {result.report.name}, plots/, tables/)")
    return lines


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_from_args(
    args: argparse.Namespace,
    echo: Callable[[str], None] = print,
    err: Callable[[str], None] = _stderr,
    on_result: Callable[[AuditResult], None] | None = None,
) -> int:
    """``styx audit``: the exit code (0 passed, 1 a check failed); :class:`AuditError` (exit code 2)
    when the audit could not run. ``echo`` gets the summary, ``err`` the progress lines, ``on_result``
    the result."""
    cfg = config_from(args)
    progress = Progress(err)
    if not cfg.verbose:  # aiokafka logs each failed connection; the error line below says it once
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        cfg.out.mkdir(parents=True, exist_ok=True)
        progress.stage(f"planning: the high watermarks of the topics on Kafka {cfg.kafka}")
        planned = plan(cfg)
        if cfg.s3 is not None:
            progress.stage(f"checking S3 at {cfg.s3.endpoint} (bucket {cfg.s3.bucket!r})")
            check_s3(cfg.s3)
        log = cfg.out / "spark.log"
        where = cfg.master or SparkConf().get("spark.master", "local[2]")
        progress.stage(f"starting Spark ({where})" + ("" if cfg.verbose else f"; its own log: {log}"))
        with command_session(
            driver_memory=cfg.driver_memory,
            log=log,
            verbose=cfg.verbose,
            master=cfg.master,
            executor_memory=cfg.executor_memory,
        ) as spark:
            try:
                progress.watch(spark)
                result = run_audit(spark, cfg, progress, planned)
            finally:
                progress.close()
    except StyxError:
        raise
    except RUN_FAILURES as exc:  # one line (exit code 2); anything else is a bug: its traceback
        if cfg.verbose:
            traceback.print_exc()
        raise could_not_run(exc, cfg.verbose) from exc
    if on_result is not None:
        on_result(result)
    for line in summary_lines(result):
        echo(line)
    echo(f"audit took {time.monotonic() - progress.started:.1f}s")
    return EXIT_PASSED if result.ok else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="styx-audit", description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    try:
        return run_from_args(p.parse_args(argv))
    except StyxError as exc:
        print(f"styx-audit: error: {exc}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN


if __name__ == "__main__":
    sys.exit(main())
