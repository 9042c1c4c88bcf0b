"""A Spark data source over Kafka topics, through PySpark's Python Data Source API and aiokafka.

The spark-sql-kafka connector is a JVM jar that cannot be installed here, so ``styx_kafka`` reads
topics in Python: one Spark input partition per (topic, partition, offset range), each read by its own
aiokafka consumer with manual assignment (no consumer group, nothing committed)::

    spark.dataSource.register(StyxKafkaSource)
    df = (spark.read.format("styx_kafka").option("bootstrap", "127.0.0.1:9092")
          .option("topics", "styx-egress").option("kind", "egress").load())

Options: ``bootstrap`` (required); ``topics`` (comma-separated; ``topic`` is an alias); ``kind``
(``ingress`` | ``egress`` | ``seqlog`` | ``raw``, see :mod:`styx_py.audit.rows`); ``ranges`` (JSON
from :func:`ranges_option`: read exactly these offset ranges); ``split_records`` (largest range one
task reads, default 250 000); ``timeout_s`` (a range that makes no progress for this long fails,
default 120); ``kafka.security_protocol``, ``kafka.ssl_ca_file``, ``kafka.ssl_cert_file``,
``kafka.ssl_key_file``, ``kafka.sasl_mechanism``, ``kafka.sasl_username``, ``kafka.sasl_password``
(:meth:`~styx_py.core.security.KafkaSecurity.as_options`; default PLAINTEXT).

**Where a partition ends.** The end of each partition is its *fetch high watermark*, captured once
at planning time, so a DataFrame is a fixed cut of the log (later appends are not read). Neither
``end_offsets()`` nor ``seek_to_end()`` is used: on the local Tansu broker they are wrong (the last
batch's base offset + 1), while the high watermark in a fetch response is right on Tansu and on
Apache Kafka alike. The start is the log start offset (``beginning_offsets()``; 0 on Tansu).
A job that runs several actions over one topic passes ``ranges`` planned once in the driver, so every
action sees the same records.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from styx_py.audit.arrow import spark_schema
from styx_py.audit.failures import MissingData
from styx_py.audit.options import DEFAULT_SPLIT_RECORDS, DEFAULT_TIMEOUT_S
from styx_py.audit.rows import KINDS, KafkaRecord, Kind, decode_records, kafka_schema
from styx_py.core.security import PLAINTEXT, KafkaSecurity
from styx_py.core.segments import segment_topic, segments_in
from styx_py.io.tls import kafka_options

FETCH_WAIT_MS = (
    10  # Tansu never answers a fetch with max wait 0, and answers a waiting one only at its deadline
)
MAX_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
BATCH_RECORDS = 20_000  # records per Arrow batch handed to Spark


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}[{self.start}, {self.end})"


def _consumer(bootstrap: str, security: KafkaSecurity) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=FETCH_WAIT_MS,
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        **kafka_options(security),
    )


TOPIC_WAIT_S = 10.0  # a topic whose metadata shows no partitions for this long does not exist


async def plan_ranges(
    bootstrap: str,
    topics: Sequence[str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    segmented: Sequence[str] = (),
    security: KafkaSecurity = PLAINTEXT,
) -> list[OffsetRange]:
    """Every partition of ``topics`` from its log start to its current fetch high watermark; of each
    topic in ``segmented`` (one of ``topics``), every segment's (:mod:`styx_py.core.segments`)."""
    consumer = _consumer(bootstrap, security)
    try:
        await consumer.start()  # inside: a consumer that failed to bootstrap is stopped too
        if segmented:
            existing = await consumer.topics()
            topics = [
                *topics,
                *(segment_topic(t, s) for t in segmented for s in segments_in(existing, t) if s > 0),
            ]
        deadline = time.monotonic() + timeout_s
        topic_deadline = time.monotonic() + min(timeout_s, TOPIC_WAIT_S)
        tps: list[TopicPartition] = []
        for topic in topics:
            parts = consumer.partitions_for_topic(topic)
            while not parts:
                if time.monotonic() > topic_deadline:
                    raise MissingData(f"topic {topic!r} does not exist on {bootstrap} (no partitions)")
                # AIOKafkaConsumer has no force_metadata_update(); topics() fetches the cluster's metadata.
                if topic not in await consumer.topics():
                    await asyncio.sleep(0.2)  # a topic just created shows up within a few metadata rounds
                parts = consumer.partitions_for_topic(topic)
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        starts: dict[TopicPartition, int] = await consumer.beginning_offsets(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        ends: dict[TopicPartition, int] = {}
        while len(ends) < len(tps):  # any fetch response carries the high watermark
            if time.monotonic() > deadline:
                missing = sorted(f"{tp.topic}/{tp.partition}" for tp in tps if tp not in ends)
                raise TimeoutError(f"no fetch response with a high watermark for {missing} in {timeout_s}s")
            await consumer.getmany(*[tp for tp in tps if tp not in ends], timeout_ms=100, max_records=1)
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is not None and tp not in ends:
                    ends[tp] = hw
        return [OffsetRange(tp.topic, tp.partition, starts[tp], max(starts[tp], ends[tp])) for tp in tps]
    finally:
        await consumer.stop()


def split(ranges: Sequence[OffsetRange], max_records: int) -> list[OffsetRange]:
    """Cut ranges longer than ``max_records`` into consecutive pieces (one Spark task each)."""
    assert max_records > 0, max_records
    out: list[OffsetRange] = []
    for r in ranges:
        for s in range(r.start, r.end, max_records):
            out.append(OffsetRange(r.topic, r.partition, s, min(r.end, s + max_records)))
    return out


def ranges_option(ranges: Sequence[OffsetRange]) -> str:
    return json.dumps([[r.topic, r.partition, r.start, r.end] for r in ranges])


def parse_ranges(text: str) -> list[OffsetRange]:
    try:
        return [OffsetRange(str(t), int(p), int(s), int(e)) for t, p, s, e in json.loads(text)]
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"option 'ranges' is not a JSON list of [topic, partition, start, end]: {exc}"
        ) from exc


async def iter_range(
    bootstrap: str,
    r: OffsetRange,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_records: int = BATCH_RECORDS,
    security: KafkaSecurity = PLAINTEXT,
) -> AsyncGenerator[list[KafkaRecord], None]:
    """The records of ``r`` in offset order, in lists of at most ``batch_records``."""
    if r.end <= r.start:
        return
    tp = TopicPartition(r.topic, r.partition)
    consumer = _consumer(bootstrap, security)
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, r.start)
        position = r.start
        last_progress = time.monotonic()
        while position < r.end:
            fetched = await consumer.getmany(tp, timeout_ms=200, max_records=batch_records)
            records = [
                KafkaRecord(
                    rec.topic,
                    rec.partition,
                    rec.offset,
                    rec.timestamp,
                    rec.key,
                    [(k, bytes(v)) for k, v in rec.headers],
                    rec.value,
                )
                for rec in fetched.get(tp, ())
                if r.start <= rec.offset < r.end
            ]
            # Gaps (transaction markers, compaction) move the position past offsets that hold no record.
            position = await consumer.position(tp)
            if fetched:
                last_progress = time.monotonic()
                if records:
                    yield records
            elif time.monotonic() - last_progress > timeout_s:
                raise TimeoutError(
                    f"reading {r} from {bootstrap}: stuck at offset {position} for {timeout_s}s"
                )
    finally:
        await consumer.stop()


def read_range(
    bootstrap: str,
    r: OffsetRange,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_records: int = BATCH_RECORDS,
    security: KafkaSecurity = PLAINTEXT,
) -> Iterator[list[KafkaRecord]]:
    """:func:`iter_range` for synchronous callers (a Spark task): a generator driving a private event
    loop, so Spark consumes the range batch by batch with bounded memory."""
    loop = asyncio.new_event_loop()
    batches = iter_range(bootstrap, r, timeout_s, batch_records, security)
    try:
        while True:
            try:
                yield loop.run_until_complete(anext(batches))
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(batches.aclose())
        loop.close()


class RangePartition(InputPartition):
    def __init__(self, r: OffsetRange) -> None:
        super().__init__(r)
        self.range = r


class StyxKafkaSource(DataSource):
    """``spark.read.format("styx_kafka")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "styx_kafka"

    def _kind(self) -> Kind:
        kind = self.options.get("kind", "raw")
        if kind not in KINDS:
            raise ValueError(f"option 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
        return kind

    def schema(self) -> StructType:
        return spark_schema(kafka_schema(self._kind()))

    def reader(self, schema: StructType) -> DataSourceReader:
        bootstrap = self.options.get("bootstrap")
        if not bootstrap:
            raise ValueError("option 'bootstrap' (Kafka HOST:PORT) is required")
        topics = [t for t in (self.options.get("topics") or self.options.get("topic") or "").split(",") if t]
        ranges_text = self.options.get("ranges")
        if not topics and not ranges_text:
            raise ValueError("option 'topics' (or 'ranges') is required")
        return KafkaRangeReader(
            bootstrap,
            topics,
            self._kind(),
            parse_ranges(ranges_text) if ranges_text else None,
            int(self.options.get("split_records", DEFAULT_SPLIT_RECORDS)),
            float(self.options.get("timeout_s", DEFAULT_TIMEOUT_S)),
            KafkaSecurity.from_options(self.options),
        )


class KafkaRangeReader(DataSourceReader):
    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        kind: Kind,
        ranges: list[OffsetRange] | None,
        split_records: int,
        timeout_s: float,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.topics = topics
        self.kind = kind
        self.ranges = ranges
        self.split_records = split_records
        self.timeout_s = timeout_s

    def partitions(self) -> Sequence[InputPartition]:
        ranges = self.ranges
        if ranges is None:
            ranges = asyncio.run(
                plan_ranges(self.bootstrap, self.topics, self.timeout_s, security=self.security)
            )
        return [RangePartition(r) for r in split([r for r in ranges if r.end > r.start], self.split_records)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, RangePartition):
            # No records to read (every range empty): PySpark then calls read() once with a plain
            # InputPartition of its own instead of none at all.
            return
        for records in read_range(self.bootstrap, partition.range, self.timeout_s, security=self.security):
            yield decode_records(self.kind, records)


def read_ranges(
    spark: SparkSession,
    bootstrap: str,
    kind: str,
    ranges: Sequence[OffsetRange],
    split_records: int = DEFAULT_SPLIT_RECORDS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    security: KafkaSecurity = PLAINTEXT,
) -> DataFrame:
    """A DataFrame of exactly the records of ``ranges`` (planned once, by :func:`plan_ranges`), decoded
    as ``kind``; ``styx_kafka`` must be registered on ``spark``."""
    return (
        spark.read.format("styx_kafka")
        .option("bootstrap", bootstrap)
        .option("kind", kind)
        .option("ranges", ranges_option(ranges))
        .option("split_records", str(split_records))
        .option("timeout_s", str(timeout_s))
        .options(**security.as_options())
        .load()
    )
