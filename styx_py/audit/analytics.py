"""The analytics tables of an audit (small pandas frames for the report and Parquet): latency per
function and per second, throughput, aborts and failures by cause, epoch sizes and durations.

Requests whose id starts with :data:`~styx_benchmarks.workload.CHECK_ID_PREFIX` are a workload check's own
reads (after a benchmark run, every balance read once): they are counted apart (``traffic`` =
``check``) and left out of the per-second throughput and latency, which they would otherwise dwarf.
Time is shown as seconds since the run's start (its first ingress record) and as ISO UTC time."""

from __future__ import annotations

from typing import cast

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from styx_benchmarks.workload import CHECK_ID_PREFIX

PERCENTILES = [0.5, 0.95, 0.99]
WORKLOAD, CHECK = "workload", "check"


def _pandas(df: DataFrame) -> pd.DataFrame:
    return cast(pd.DataFrame, df.toPandas())


_LATENCY_COLUMNS = ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms")
_COUNT_COLUMNS = ("replies", "committed", "aborted", "failed", "fallback", "check_replies")


def with_run_time(table: pd.DataFrame, start_ms: int | None) -> pd.DataFrame:
    """``second`` (Unix seconds) replaced by ``t_s``, seconds since the run's start (``start_ms``, its
    first ingress record; the table's first second without it), and ``time``, ISO UTC time."""
    seconds = table["second"].astype("int64")
    start_s = start_ms // 1000 if start_ms is not None else int(seconds.min()) if len(seconds) else 0
    out = table.drop(columns="second")
    out.insert(0, "time", pd.to_datetime(seconds, unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ"))
    out.insert(0, "t_s", seconds - start_s)
    return out


def with_logged_time(epochs: pd.DataFrame, start_ms: int | None) -> pd.DataFrame:
    """``logged_ms`` (Unix milliseconds) replaced by ``t_s``, seconds since the run's start (as in
    :func:`with_run_time`), and ``logged_at``, ISO UTC time to the millisecond."""
    logged = epochs["logged_ms"].astype("int64")
    start = start_ms if start_ms is not None else int(logged.min()) if len(logged) else 0
    out = epochs.drop(columns="logged_ms")
    at = pd.to_datetime(logged, unit="ms", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%S.%f").str[:-3] + "Z"
    out.insert(2, "logged_at", at)
    out.insert(2, "t_s", ((logged - start) / 1000).round(3))
    return out


def analytics(facts: DataFrame, entries: DataFrame) -> dict[str, pd.DataFrame]:
    """Small result tables (pandas): latency, throughput, aborts, epochs."""
    traffic = F.when(F.col("request_id").startswith(CHECK_ID_PREFIX), F.lit(CHECK)).otherwise(F.lit(WORKLOAD))
    everything = facts.where(F.col("request_id").isNotNull() & (F.col("replies") > 0)).withColumn(
        "traffic", traffic
    )
    answered = everything.where(F.col("traffic") == WORKLOAD)
    second = F.floor(F.col("reply_ms") / 1000).cast("long").alias("second")
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
        everything.groupBy("traffic", "operator", "function")
        .agg(
            F.count("*").alias("replies"),
            count_status("committed"),
            count_status("aborted"),
            count_status("failed"),
            *percentiles(),
        )
        .orderBy(F.desc("traffic"), "operator", "function")
    )
    per_second = _pandas(
        answered.groupBy(second)
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
    check_per_second = _pandas(
        everything.where(F.col("traffic") == CHECK).groupBy(second).agg(F.count("*").alias("check_replies"))
    )
    latency_per_second_by_function = _pandas(
        answered.groupBy(second, "operator", "function")
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
    status = _pandas(
        everything.groupBy("traffic", "status")
        .agg(F.count("*").alias("replies"))
        .orderBy(F.desc("traffic"), "status")
    )
    first = everything.agg(F.min("ingress_ms").alias("start")).first()
    start_ms = first["start"] if first is not None else None
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
    per_second = per_second.merge(check_per_second, on="second", how="outer").sort_values("second")
    per_second = per_second.fillna({c: 0 for c in per_second.columns if c not in _LATENCY_COLUMNS})
    per_second = per_second.astype({c: "int64" for c in _COUNT_COLUMNS if c in per_second.columns})
    per_second = with_run_time(per_second.reset_index(drop=True), start_ms)
    latency_per_second_by_function = with_run_time(latency_per_second_by_function, start_ms)
    # An epoch lasts from its sequencer-log entries to the next epoch's (the log is written at its start).
    epochs["duration_ms"] = epochs["logged_ms"].shift(-1) - epochs["logged_ms"]
    epochs = with_logged_time(epochs, start_ms)
    return {
        "latency_by_function": latency_by_function,
        "per_second": per_second,
        "latency_per_second_by_function": latency_per_second_by_function,
        "abort_causes": abort_causes,
        "status": status,
        "epochs": epochs,
    }
