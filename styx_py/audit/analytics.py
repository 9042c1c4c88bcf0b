"""The analytics tables of an audit (small pandas frames for the report and Parquet): latency per
function and per second, throughput, aborts and failures by cause, epoch sizes and durations."""

from __future__ import annotations

from typing import cast

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

PERCENTILES = [0.5, 0.95, 0.99]


def _pandas(df: DataFrame) -> pd.DataFrame:
    return cast(pd.DataFrame, df.toPandas())


def analytics(facts: DataFrame, entries: DataFrame) -> dict[str, pd.DataFrame]:
    """Small result tables (pandas): latency, throughput, aborts, epochs."""
    answered = facts.where(F.col("request_id").isNotNull() & (F.col("replies") > 0))
    pct = PERCENTILES

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
    per_second.insert(1, "time", pd.to_datetime(per_second["second"], unit="s", utc=True))
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
