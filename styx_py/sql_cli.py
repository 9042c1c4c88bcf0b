"""``styx sql "SELECT …"``: Spark SQL over each operator's state and the run's logs
(:mod:`styx_py.audit.sql`), printed as a table or as JSON.

Kafka, the topics and S3 come from the same options and ``STYX_*`` settings as ``styx audit``'s
(after ``styx up``, from its cluster file). Progress lines (Spark's start, the reads) go to stderr;
the result to stdout. Exit code 0, or 2 with one line when the query cannot be answered.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from styx_py.core.errors import StyxError

__all__ = ["add_sql_arguments", "cmd_sql", "format_table", "rows_json"]

DEFAULT_LIMIT = 1000  # rows printed
MAX_CELL = 60  # characters of one cell in the table output


def add_sql_arguments(p: argparse.ArgumentParser) -> None:
    from styx_py.audit.options import DEFAULT_TIMEOUT_S, add_source_arguments  # light: no PySpark

    p.add_argument("query", metavar="SQL", help='a Spark SQL query, e.g. "SELECT count(*) FROM account"')
    p.add_argument(
        "--as-of-epoch",
        type=int,
        metavar="E",
        help="the operator tables as of epoch E (default: the newest snapshot); needs the changelog "
        "unless E is a snapshot epoch",
    )
    p.add_argument("--json", action="store_true", help="print the rows as a JSON array of objects")
    p.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help=f"rows to print (default {DEFAULT_LIMIT})"
    )
    add_source_arguments(p)
    p.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds without progress on a Kafka read"
    )
    p.add_argument("--driver-memory", default="1g", help="Spark driver memory (default 1g)")
    p.add_argument("--master", help="Spark master URL (default: spark-submit's --master, else local[2])")
    p.add_argument(
        "--verbose", action="store_true", help="show Spark's log and progress bars, and tracebacks of errors"
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_sql(
    args: argparse.Namespace, out: Callable[[str], None] = print, err: Callable[[str], None] = _stderr
) -> int:
    from styx_py.audit.failures import check_s3, could_not_run
    from styx_py.audit.job import RUN_FAILURES, command_session
    from styx_py.audit.options import s3_from
    from styx_py.audit.sql import SqlSources, query
    from styx_py.core.security import KafkaSecurity

    if args.limit < 1:
        raise StyxError(f"--limit must be 1 or more, got {args.limit}")
    env = os.environ
    changelog = args.changelog_topic
    if changelog is None:
        changelog = env.get("STYX_CHANGELOG_TOPIC", "")
    sources = SqlSources(
        kafka=args.kafka or env.get("STYX_KAFKA_BOOTSTRAP", ""),
        s3=s3_from(args),
        ingress_topic=args.ingress_topic or env.get("STYX_INGRESS_TOPIC", "styx-ingress"),
        egress_topic=args.egress_topic or env.get("STYX_EGRESS_TOPIC", "styx-egress"),
        seqlog_topic=args.seqlog_topic or env.get("STYX_SEQLOG_TOPIC", "styx-seqlog"),
        changelog_topic=changelog,
        kafka_security=KafkaSecurity.from_env(),
        timeout_s=args.timeout,
    )
    if not args.verbose:  # PySpark logs every error it converts; the error line below says it once
        from pyspark.logger import PySparkLogger

        for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
            PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
    started = time.monotonic()

    def say(line: str) -> None:
        err(f"sql [{time.monotonic() - started:5.1f}s] {line}")

    try:
        if sources.s3 is not None:
            check_s3(sources.s3)  # in a second, before the JVM's start
        log = Path(tempfile.gettempdir()) / "styx-sql-spark.log"
        say("starting Spark" + ("" if args.verbose else f" (its own log: {log})"))
        session = command_session(
            "styx-sql", driver_memory=args.driver_memory, log=log, verbose=args.verbose, master=args.master
        )
        with session as spark:
            result = query(
                args.query, sources, as_of_epoch=args.as_of_epoch, spark=spark, max_rows=args.limit, echo=say
            )
    except StyxError:
        raise
    except RUN_FAILURES as exc:  # one line (exit code 2); anything else is a bug: its traceback
        if args.verbose:
            traceback.print_exc()
        raise could_not_run(exc, args.verbose) from exc
    for note in result.notes:
        say(f"note: {note}")
    if args.json:
        out(json.dumps(rows_json(result.rows), ensure_ascii=False))
    else:
        out(format_table(result.columns, result.rows))
    shown = f"{len(result.rows)} row{'' if len(result.rows) == 1 else 's'}"
    say(shown + (f" (the first {args.limit}: --limit)" if result.truncated else ""))
    return 0


def _plain(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def rows_json(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with JSON-able values (times ISO 8601, decimals as numbers, bytes as hex)."""
    return [{k: _plain(v) for k, v in row.items()} for row in rows]


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    plain = _plain(value)
    text = plain if isinstance(plain, str) else json.dumps(plain, ensure_ascii=False)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def format_table(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """The rows as an aligned text table under a header (numbers right-aligned)."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    numeric = [
        all(isinstance(row.get(c), int | float | decimal.Decimal) or row.get(c) is None for row in rows)
        for c in columns
    ]

    def line(values: Sequence[str]) -> str:
        return " | ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(columns), rule, *(line(r) for r in cells)])
