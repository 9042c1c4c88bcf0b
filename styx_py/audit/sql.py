"""Spark SQL over a run: each operator's state as of an epoch, and the logs the audit reads.

``styx sql "SELECT …"`` (:mod:`styx_py.sql_cli`) and :func:`query` from Python. The tables:

* **one per operator** (its name, characters other than letters, digits and ``_`` as ``_``; an
  operator named like a log table is ``op_<name>``): ``key``, then the value's fields when every
  value of the operator is a map (a struct), else one ``value`` column; types as Spark infers them
  from the values (a field of mixed types is JSON text). One row per entity that exists as of the
  epoch (deleted ones are gone); an operator of the deployed graph with no entity is an empty
  table. The state is the newest snapshot's, or as of ``as_of_epoch`` (:mod:`.asof` says which
  snapshot and which changelog records make it);
* **requests** (the ingress topic), **replies** (the egress topic), **epochs** (the sequencer log,
  one row per epoch of the generation that ran it) and **aborts** (the replies that did not commit,
  with their request's operator, function and key): see :data:`LOG_COLUMNS`. The logs are read to
  their end as of the query (the fetch high watermark), whatever ``as_of_epoch`` says.

Only the tables a query names are read (Spark's parser lists them before anything is read).

    snapshot chain (S3, styx_snapshots) ─ objects of epochs <= S ─┐
    changelog (Kafka, styx_kafka) ─ records of epochs (S, E] ─────┴─► latest per entity ─► per operator:
        msgpack → JSON (Python tasks) ─► spark.read.json (schema inferred) ─► a temp view
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from styx_py.audit.asof import (
    AsOfUnavailable,
    ChangelogDisabled,
    SqlError,
    SqlSyntaxError,
    StatePlan,
    UnknownTable,
    chain_epochs,
    plan_state,
)
from styx_py.audit.failures import MissingData
from styx_py.audit.job import effective_entries, register_sources, spark_session
from styx_py.audit.kafka_source import OffsetRange, iter_range, plan_ranges, read_ranges
from styx_py.audit.options import DEFAULT_SPLIT_RECORDS, DEFAULT_TIMEOUT_S, S3Options
from styx_py.audit.snapshot_source import load_manifest, load_meta
from styx_py.core.errors import GraphError
from styx_py.core.graph import load_graph
from styx_py.core.security import PLAINTEXT, KafkaSecurity
from styx_py.core.wire import SeqLogEntry, decode_value

__all__ = [
    "LOG_COLUMNS",
    "LOG_TABLES",
    "AsOfUnavailable",
    "ChangelogDisabled",
    "SqlError",
    "SqlResult",
    "SqlSources",
    "SqlSyntaxError",
    "UnknownTable",
    "query",
    "table_name",
]

LOG_TABLES = ("requests", "replies", "epochs", "aborts")
LOG_COLUMNS: dict[str, tuple[str, ...]] = {
    "requests": (
        *("request_id", "operator", "function", "key", "key_is_int", "args", "sent_at", "logged_at"),
        *("partition", "offset"),
    ),
    "replies": (
        *("request_id", "tid", "epoch", "phase", "status", "result", "error", "error_type"),
        *("latency_ms", "replied_at", "partition", "offset"),
    ),
    "epochs": ("epoch", "gen", "workers", "transactions", "resent", "refused", "logged_at"),
    "aborts": (
        *("request_id", "operator", "function", "key", "tid", "epoch", "phase", "status"),
        *("error_type", "error", "cause"),
    ),
}
DEFAULT_MAX_ROWS = 10_000  # rows a query brings to the driver (a result beyond it is cut, and says so)
_seqlog_decoder = msgspec.msgpack.Decoder(SeqLogEntry)


@dataclass(frozen=True)
class SqlSources:
    """Where the run is: Kafka and its topics (for the log tables and the changelog), S3 (the
    operator tables). ``kafka`` empty: no log tables; ``s3`` None: no operator tables."""

    kafka: str = ""
    s3: S3Options | None = None
    ingress_topic: str = "styx-ingress"
    egress_topic: str = "styx-egress"
    seqlog_topic: str = "styx-seqlog"
    changelog_topic: str = ""  # "": the changelog is off
    kafka_security: KafkaSecurity = PLAINTEXT
    split_records: int = DEFAULT_SPLIT_RECORDS
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class SqlResult:
    columns: list[str]
    rows: list[dict[str, Any]]  # Spark's values (datetime, Decimal, nested dicts and lists…)
    truncated: bool  # more rows than max_rows: ``rows`` holds the first max_rows
    tables: list[str]  # the tables the query read
    state: StatePlan | None = None  # where the operator tables came from (None: no operator table read)
    notes: list[str] = field(default_factory=list)


def table_name(operator: str) -> str:
    """The SQL table of ``operator``'s state."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", operator)
    return f"op_{name}" if name.lower() in LOG_TABLES else name


def query(
    sql: str,
    sources: SqlSources,
    *,
    as_of_epoch: int | None = None,
    spark: SparkSession | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
    echo: Callable[[str], None] | None = None,
) -> SqlResult:
    """Run ``sql`` over the run at ``sources``: the operator tables as of ``as_of_epoch`` (None: the
    newest snapshot) and the log tables. On ``spark`` (default: the active session, else a new one
    from :func:`styx_py.audit.job.spark_session`, left running for the next query). ``echo`` gets a
    line per slow step. Raises :class:`~styx_py.audit.asof.SqlError` (its subclasses name the
    case)."""
    assert max_rows > 0, max_rows
    say = echo or (lambda _: None)
    if spark is None:
        spark = SparkSession.getActiveSession() or spark_session("styx-sql", driver_memory="1g")
    register_sources(spark)  # a session of the caller's own may not have them yet
    names = referenced_tables(spark, sql)
    catalog = _Catalog(spark, sources, as_of_epoch, say)
    try:
        for name in names:
            catalog.register(name)
        try:
            df = spark.sql(sql)
        except AnalysisException as exc:
            raise catalog.analysis_error(exc) from exc
        say("running the query")
        rows = df.limit(max_rows + 1).collect()
        return SqlResult(
            list(df.columns),
            [r.asDict(recursive=True) for r in rows[:max_rows]],
            len(rows) > max_rows,
            sorted(catalog.registered),
            catalog.plan if catalog.state_read else None,
            catalog.notes,
        )
    finally:
        catalog.close()


_RELATION = re.compile(r"'UnresolvedRelation \[([^\]]*)\]")


def referenced_tables(spark: SparkSession, sql: str) -> list[str]:
    """The one-part table names ``sql`` reads (CTE names among them), lower case, from Spark's parser;
    :class:`SqlSyntaxError` with Spark's message when it does not parse."""
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(sql)
    except ParseException as exc:
        raise SqlSyntaxError(_short(exc)) from exc
    names = {m.group(1).strip("`").lower() for m in _RELATION.finditer(plan.toString())}
    return sorted(n for n in names if n and "," not in n)


def _short(exc: BaseException) -> str:
    """Spark's message without its SQL listing and stack."""
    text = str(exc).split("== SQL", 1)[0].split("\n\nJVM stacktrace", 1)[0].strip()
    return " ".join(text.split())[:400]


class _Catalog:
    """The temp views of one query, each built on first use."""

    def __init__(
        self, spark: SparkSession, sources: SqlSources, as_of: int | None, say: Callable[[str], None]
    ) -> None:
        self.spark = spark
        self.src = sources
        self.as_of = as_of
        self.say = say
        self.registered: set[str] = set()
        self.notes: list[str] = []
        self.state_read = False
        self._state: DataFrame | None = None
        self._operators: dict[str, str] | None = None  # table name (lower case) -> operator
        self._plan: StatePlan | None = None
        self._ranges: dict[str, list[OffsetRange]] = {}
        self._persisted: list[DataFrame] = []

    def close(self) -> None:
        for name in self.registered:
            self.spark.catalog.dropTempView(name)
        for df in self._persisted:
            df.unpersist()

    @property
    def plan(self) -> StatePlan | None:
        return self._plan

    # ---- which table is what

    def register(self, name: str) -> None:
        if name in self.registered:
            return
        df = self._log_table(name) if name in LOG_TABLES else self._operator_table(name)
        if df is not None:  # None: not a table of ours (a CTE's name; Spark resolves or rejects it)
            if name in ("requests", "replies", "epochs"):  # read once however often the query names them
                df = df.persist(StorageLevel.MEMORY_AND_DISK)
                self._persisted.append(df)
            df.createOrReplaceTempView(name)
            self.registered.add(name)

    def tables(self) -> list[str]:
        have = [t for t in LOG_TABLES if self.src.kafka]
        if self.src.s3 is not None:
            have += sorted(self.operators())
        return have

    def analysis_error(self, exc: AnalysisException) -> SqlError:
        if exc.getCondition() == "TABLE_OR_VIEW_NOT_FOUND":
            name = (exc.getMessageParameters() or {}).get("relationName", "?").strip("`")
            return UnknownTable(
                f"no table {name}: the tables are {', '.join(self.tables())}{self._why_not()}"
            )
        return SqlError(_short(exc))

    def _why_not(self) -> str:
        missing = []
        if not self.src.kafka:
            missing.append("no Kafka given (--kafka or STYX_KAFKA_BOOTSTRAP): no log tables")
        if self.src.s3 is None:
            missing.append("no S3 given (--s3-endpoint or STYX_S3_ENDPOINT): no operator tables")
        elif self._plan is not None:
            missing.append(
                f"operator tables: the deployed graph's operators and those with state as of epoch "
                f"{self._plan.epoch}"
            )
        return f" ({'; '.join(missing)})" if missing else ""

    # ---- the operators' state

    def operators(self) -> dict[str, str]:
        if self._operators is None:
            if self.src.s3 is None:
                self._operators = {}
            else:
                ops = {r["operator"] for r in self.state().select("operator").distinct().collect()}
                self._operators = {table_name(op).lower(): op for op in sorted(ops | self._graph_operators())}
        return self._operators

    def _graph_operators(self) -> set[str]:
        """The deployed graph's operators (a table each, empty when no entity exists at the epoch), when
        the graph named in the cluster's saved state imports here; else none."""
        assert self.src.s3 is not None
        meta = load_meta(self.src.s3.client(), self.src.s3.bucket)
        if meta is None or not meta.graph_path:
            return set()
        try:
            return set(load_graph(meta.graph_path).operators)
        except GraphError:
            return set()

    def _operator_table(self, name: str) -> DataFrame | None:
        if self.src.s3 is None:
            return None
        op = self.operators().get(name)
        if op is None:
            return None
        self.say(f"inferring the columns of {name} (operator {op!r}) from its values")
        lines = self.state().where(F.col("operator") == op).mapInArrow(entity_json, "line string")
        typed = self._read_json(lines)
        if "key" not in typed.columns:  # no entity of the operator at the epoch
            return self.spark.createDataFrame([], "key string, value string")
        value = typed.schema["value"].dataType if "value" in typed.columns else None
        if value is not None and value.typeName() == "struct":
            fields = [f.name for f in value.fields]  # type: ignore[attr-defined]
            cols = [F.col("key")] + [
                F.col("value").getField(f).alias("value_key" if f == "key" else f) for f in fields
            ]
            return typed.select(*cols)
        return typed.select("key", "value") if value is not None else typed.select("key")

    def _read_json(self, lines: DataFrame) -> DataFrame:
        """``spark.read.json`` of a one-string-column DataFrame (Scala's ``json(Dataset[String])``, which
        PySpark does not expose), ``lines`` cached: its Python tasks run once, not for the inference and
        again for the read, and no rows go through a Python RDD."""
        lines = lines.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(lines)
        jvm = self.spark._jvm
        assert jvm is not None
        strings = getattr(lines._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING())
        return DataFrame(self.spark._jsparkSession.read().json(strings), self.spark)

    def state(self) -> DataFrame:
        """(operator, key, key_is_int, value): each entity as of the plan's epoch (msgpack values)."""
        if self._state is not None:
            return self._state
        s3 = self.src.s3
        assert s3 is not None
        self.say(f"reading the snapshot manifest in s3://{s3.bucket}")
        manifest = load_manifest(s3.client(), s3.bucket)
        chain = chain_epochs(manifest.deltas) if manifest is not None else []
        cl_ranges: list[OffsetRange] | None = None
        off: str | None = None
        if self.as_of is not None and self.as_of not in chain:
            off = self._changelog_off()
            if off is None:
                # The newest epoch first, then the changelog's ends: an epoch's records go out with the
                # next epoch's sequencer-log entry, so every epoch before the newest is there by then.
                self._check_ran(self.as_of)
                try:
                    cl_ranges = self._plan_topic(self.src.changelog_topic)
                except MissingData:
                    off = f"topic {self.src.changelog_topic!r} does not exist on {self.src.kafka}"
        plan = plan_state(manifest.epoch if manifest is not None else None, chain, self.as_of, off, s3.bucket)
        self._plan = plan
        self.say(plan.describe())
        parts: list[DataFrame] = []
        if plan.snapshot is not None:
            assert manifest is not None
            snap = (
                self.spark.read.format("styx_snapshots")
                .options(**s3.as_options(), snapshot=str(manifest.epoch), max_object_epoch=str(plan.snapshot))
                .load()
            )
            parts.append(
                snap.select(
                    "operator", "key", "key_is_int", "value",
                    F.struct(F.lit(0).alias("source"), F.col("object_epoch").alias("epoch"),
                             F.lit(0).cast("long").alias("index")).alias("at"),
                )
            )  # fmt: skip
        if plan.changelog_after is not None:
            assert cl_ranges is not None
            cl = self._kafka("changelog", cl_ranges).where(F.col("decode_error").isNull()).select("value.*")
            cl = cl.where((F.col("epoch") > plan.changelog_after) & (F.col("epoch") <= plan.epoch))
            parts.append(
                cl.select(
                    "operator", "key", "key_is_int", "value",
                    F.struct(F.lit(1).alias("source"), F.col("epoch"), F.col("index")).alias("at"),
                )
            )  # fmt: skip
        both = parts[0]
        for p in parts[1:]:
            both = both.unionByName(p)
        latest = (
            both.groupBy("operator", "key", "key_is_int")
            .agg(F.max_by(F.struct("value"), F.col("at")).alias("last"))
            .where(F.col("last.value").isNotNull())
            .select("operator", "key", "key_is_int", F.col("last.value").alias("value"))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        self._persisted.append(latest)
        self._state = latest
        self.state_read = True
        return latest

    def _changelog_off(self) -> str | None:
        """Why no changelog can be read (None: a topic and Kafka are given)."""
        if not self.src.changelog_topic:
            return "no changelog topic given: --changelog-topic or STYX_CHANGELOG_TOPIC"
        if not self.src.kafka:
            return "no Kafka given: --kafka or STYX_KAFKA_BOOTSTRAP"
        return None

    def _check_ran(self, epoch: int) -> None:
        newest = newest_logged_epoch(
            self.src.kafka, self.src.seqlog_topic, self.src.timeout_s, self.src.kafka_security
        )
        if newest is None or epoch > newest:
            have = "no epoch" if newest is None else f"the newest is {newest}"
            raise AsOfUnavailable(
                f"epoch {epoch} has not run yet ({have} on the sequencer log {self.src.seqlog_topic!r})"
            )
        if epoch == newest:
            self.notes.append(
                f"epoch {epoch} is the newest on the sequencer log: on a running cluster it may not be "
                "over, and its last changelog records may still be on their way"
            )

    # ---- the logs

    def _plan_topic(self, topic: str, segmented: bool = False) -> list[OffsetRange]:
        if topic not in self._ranges:
            self.say(f"planning: the high watermarks of {topic} on {self.src.kafka}")
            self._ranges[topic] = asyncio.run(
                plan_ranges(
                    self.src.kafka,
                    [topic],
                    self.src.timeout_s,
                    segmented=[topic] if segmented else [],
                    security=self.src.kafka_security,
                )
            )
        return self._ranges[topic]

    def _kafka(self, kind: str, ranges: Sequence[OffsetRange]) -> DataFrame:
        return read_ranges(
            self.spark,
            self.src.kafka,
            kind,
            ranges,
            self.src.split_records,
            self.src.timeout_s,
            self.src.kafka_security,
        )

    def _log(self, kind: str, topic: str) -> DataFrame:
        try:
            ranges = self._plan_topic(topic, segmented=kind in ("ingress", "egress"))
        except MissingData as exc:
            raise SqlError(f"{exc}: pass --{kind}-topic or set STYX_{kind.upper()}_TOPIC") from exc
        df = self._kafka(kind, ranges).where(F.col("decode_error").isNull())
        return df.select("partition", "offset", "timestamp", "value.*")

    def _log_table(self, name: str) -> DataFrame | None:
        if not self.src.kafka:
            return None
        src = self.src
        if name == "requests":
            ingress = self._log("ingress", src.ingress_topic)
            ingress = ingress.mapInArrow(functools.partial(json_columns, ["args"]), _json_schema(ingress))
            return ingress.select(
                *("request_id", "operator", "function", "key", "key_is_int", "args"),
                F.timestamp_millis("ts_ms").alias("sent_at"),
                F.col("timestamp").alias("logged_at"),
                *("partition", "offset"),
            )
        if name == "replies":
            egress = self._log("egress", src.egress_topic)
            egress = egress.mapInArrow(functools.partial(json_columns, ["result"]), _json_schema(egress))
            return egress.select(
                *("request_id", "tid", "epoch", "phase", "status", "result", "error", "error_type"),
                (F.unix_millis("timestamp") - F.col("request_ts_ms")).alias("latency_ms"),
                F.col("timestamp").alias("replied_at"),
                *("partition", "offset"),
            )
        if name == "epochs":
            return self._epochs()
        assert name == "aborts", name
        self.register("requests")
        self.register("replies")
        return self.spark.sql(
            "SELECT r.request_id, q.operator, q.function, q.key, r.tid, r.epoch, r.phase, r.status, "
            "r.error_type, r.error, regexp_replace(coalesce(r.error, ''), '[0-9]+', 'N') AS cause "
            "FROM replies r LEFT JOIN (SELECT request_id, first(operator) AS operator, "
            "first(function) AS function, first(key) AS key FROM requests GROUP BY request_id) q "
            "ON r.request_id = q.request_id WHERE r.status <> 'committed'"
        )

    def _epochs(self) -> DataFrame:
        generations = None
        if self.src.s3 is not None:
            meta = load_meta(self.src.s3.client(), self.src.s3.bucket)
            if meta is not None:
                generations = [(int(first), int(gen)) for first, gen in meta.epoch_generations]
        try:
            seqlog = self._kafka("seqlog", self._plan_topic(self.src.seqlog_topic))
        except MissingData as exc:
            raise SqlError(f"{exc}: pass --seqlog-topic or set STYX_SEQLOG_TOPIC") from exc

        def count(kinds: tuple[str, ...]) -> Any:
            return F.size(F.filter("entries", lambda e: e["kind"].isin(*kinds)))

        entries = effective_entries(seqlog, generations).select(
            "epoch",
            "gen",
            "logged_ms",
            count(("run",)).alias("transactions"),
            count(("answered", "waiting")).alias("resent"),
            count(("refused",)).alias("refused"),
        )
        return (
            entries.groupBy("epoch", "gen")
            .agg(
                F.count("*").alias("workers"),
                F.sum("transactions").alias("transactions"),
                F.sum("resent").alias("resent"),
                F.sum("refused").alias("refused"),
                F.timestamp_millis(F.min("logged_ms")).alias("logged_at"),
            )
            .select(*LOG_COLUMNS["epochs"])
        )


def newest_logged_epoch(
    bootstrap: str, topic: str, timeout_s: float = DEFAULT_TIMEOUT_S, security: KafkaSecurity = PLAINTEXT
) -> int | None:
    """The newest epoch on the sequencer log (its last record per partition); None when it is empty."""

    async def newest() -> int | None:
        best: int | None = None
        for r in await plan_ranges(bootstrap, [topic], timeout_s, security=security):
            if r.end <= r.start:
                continue
            last = OffsetRange(r.topic, r.partition, r.end - 1, r.end)
            async for batch in iter_range(bootstrap, last, timeout_s, security=security):
                for rec in batch:
                    if rec.value is not None:
                        epoch = _seqlog_decoder.decode(rec.value).epoch
                        best = epoch if best is None else max(best, epoch)
        return best

    try:
        return asyncio.run(newest())
    except MissingData as exc:
        raise SqlError(f"{exc}: pass --seqlog-topic or set STYX_SEQLOG_TOPIC") from exc


# ---- what runs in Spark's Python workers ------------------------------------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")


def json_text(raw: bytes | None) -> str | None:
    """A msgpack value as JSON text (bytes as base64); None for None."""
    if raw is None:
        return None
    return json.dumps(decode_value(raw), default=_json_default, ensure_ascii=False)


def entity_json(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """(key, key_is_int, value) rows → one JSON line each, ``{"key": …, "value": …}`` (int keys as
    numbers), for Spark's schema inference."""
    for batch in batches:
        keys = batch.column("key").to_pylist()
        is_int = batch.column("key_is_int").to_pylist()
        values = batch.column("value").to_pylist()
        lines = [
            f'{{"key": {k if i else json.dumps(k, ensure_ascii=False)}, "value": {json_text(v) or "null"}}}'
            for k, i, v in zip(keys, is_int, values, strict=True)
        ]
        yield pa.RecordBatch.from_pydict({"line": pa.array(lines, pa.string())})


def json_columns(names: list[str], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches with the msgpack columns ``names`` turned into JSON text."""
    for batch in batches:
        cols = [
            pa.array([json_text(v) for v in col.to_pylist()], pa.string()) if name in names else col
            for name, col in zip(batch.schema.names, batch.columns, strict=True)
        ]
        yield pa.RecordBatch.from_arrays(cols, names=batch.schema.names)


def _json_schema(df: DataFrame) -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType(
        [StructField(f.name, StringType()) if f.name in ("args", "result") else f for f in df.schema.fields]
    )
