"""What an audit reads and checks: its configuration and command-line arguments (no PySpark here, so
``styx --help`` stays fast and works without the 'spark' extra)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minio import Minio

from styx_py.core.addresses import bootstrap_option
from styx_py.core.errors import ConfigError
from styx_py.core.security import PLAINTEXT, KafkaSecurity
from styx_py.io.s3 import s3_client

DEFAULT_SPLIT_RECORDS = 250_000  # largest offset range one Spark task reads
DEFAULT_TIMEOUT_S = 120.0  # a Kafka read that makes no progress for this long fails


@dataclass(frozen=True, slots=True)
class S3Options:
    """Where the snapshots are; unset fields come from the ``STYX_S3_*`` environment, as for the cluster."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str = "styx-snapshots"
    region: str = "us-east-1"
    secure: bool = False
    ca_file: str = ""  # the CA bundle S3's certificate is verified against (secure; empty: the system's)

    @staticmethod
    def parse(options: Mapping[str, str]) -> S3Options:
        env = os.environ
        endpoint = options.get("endpoint") or env.get("STYX_S3_ENDPOINT", "")
        if not endpoint:
            raise ValueError("option 'endpoint' (S3 host:port) is required")
        return S3Options(
            endpoint,
            options.get("access_key") or env.get("STYX_S3_ACCESS_KEY", ""),
            options.get("secret_key") or env.get("STYX_S3_SECRET_KEY", ""),
            options.get("bucket") or env.get("STYX_SNAPSHOT_BUCKET", "styx-snapshots"),
            options.get("region") or env.get("STYX_S3_REGION", "us-east-1"),
            (options.get("secure") or env.get("STYX_S3_SECURE", "false")).lower() in ("1", "true", "yes"),
            options.get("ca_file") or env.get("STYX_S3_CA_FILE", ""),
        )

    def as_options(self) -> dict[str, str]:
        return {
            "endpoint": self.endpoint,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "bucket": self.bucket,
            "region": self.region,
            "secure": str(self.secure).lower(),
            "ca_file": self.ca_file,
        }

    def client(self) -> Minio:
        return s3_client(
            self.endpoint,
            self.access_key,
            self.secret_key,
            self.region,
            secure=self.secure,
            ca_file=self.ca_file,
        )


@dataclass
class AuditConfig:
    kafka: str
    ingress_topic: str
    egress_topic: str
    seqlog_topic: str
    out: Path
    changelog_topic: str = ""  # "": the changelog checks are skipped
    workload: str | None = None
    workload_options: dict[str, Any] = field(default_factory=dict)  # benchmarks.workload.Options fields
    app: str | None = None  # graph import path for the serial replay (default: the workload's app)
    s3: S3Options | None = None
    kafka_security: KafkaSecurity = PLAINTEXT  # from STYX_KAFKA_SECURITY_PROTOCOL, _SSL_*, _SASL_*
    snapshot: str = "latest"
    serial: bool = True
    write_facts: bool = False
    split_records: int = DEFAULT_SPLIT_RECORDS
    timeout_s: float = DEFAULT_TIMEOUT_S
    driver_memory: str = "2g"
    master: str | None = None  # the Spark master (None: spark-submit's, else local[2])
    executor_memory: str | None = None  # per executor, on a cluster master (None: Spark's default, 1g)
    verbose: bool = False  # Spark's own output on the terminal, tracebacks
    strict: bool = False  # a skipped check fails the audit


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """Where a run's logs and snapshots are (``styx audit``, ``styx sql``): Kafka, the topics, S3."""
    p.add_argument(
        "--kafka", type=bootstrap_option, help="Kafka bootstrap HOST:PORT (default $STYX_KAFKA_BOOTSTRAP)"
    )
    p.add_argument("--ingress-topic", help="default $STYX_INGRESS_TOPIC or styx-ingress")
    p.add_argument("--egress-topic", help="default $STYX_EGRESS_TOPIC or styx-egress")
    p.add_argument("--seqlog-topic", help="default $STYX_SEQLOG_TOPIC or styx-seqlog")
    p.add_argument(
        "--changelog-topic",
        help="default $STYX_CHANGELOG_TOPIC; empty (the default): none (no changelog checks or as-of reads)",
    )
    p.add_argument(
        "--s3-endpoint",
        help="S3 HOST:PORT of the snapshots (default $STYX_S3_ENDPOINT; none: no state checks or tables)",
    )
    p.add_argument("--s3-access-key", help="default $STYX_S3_ACCESS_KEY")
    p.add_argument("--s3-secret-key", help="default $STYX_S3_SECRET_KEY")
    p.add_argument("--s3-region", help="default $STYX_S3_REGION or us-east-1")
    p.add_argument("--s3-secure", action="store_true", help="HTTPS (default $STYX_S3_SECURE)")
    p.add_argument("--s3-ca-file", help="PEM CA bundle of S3's certificate (default $STYX_S3_CA_FILE)")
    p.add_argument("--bucket", help="snapshot bucket (default $STYX_SNAPSHOT_BUCKET or styx-snapshots)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_source_arguments(p)
    p.add_argument("--snapshot", default="latest", help="'latest' (default) or a snapshot epoch")
    p.add_argument("--workload", help="check this workload's invariants (ycsbt, tpcc, …)")
    p.add_argument("--keys", type=int, help="workload option: YCSB-T accounts")
    p.add_argument("--warehouses", type=int, help="workload option: TPC-C warehouses")
    p.add_argument("--scale", type=float, help="workload option: population scale")
    p.add_argument("--app", help="graph import path for the serial replay (default: the workload's app)")
    p.add_argument("--no-serial", action="store_true", help="skip the serial replay of the log")
    p.add_argument("--write-facts", action="store_true", help="also write the per-request table (Parquet)")
    p.add_argument("--split-records", type=int, default=DEFAULT_SPLIT_RECORDS, help="records per Spark task")
    p.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds without progress on a Kafka read"
    )
    p.add_argument("--driver-memory", default="2g", help="Spark driver memory (default 2g)")
    p.add_argument(
        "--master",
        help="Spark master URL, e.g. spark://HOST:7077 (default: spark-submit's --master, else local[2])",
    )
    p.add_argument("--executor-memory", help="memory per executor on a cluster master (Spark's default: 1g)")
    p.add_argument("--strict", action="store_true", help="a check that had to be skipped fails the audit")
    p.add_argument(
        "--verbose", action="store_true", help="show Spark's log and progress bars, and tracebacks of errors"
    )
    p.add_argument("--out", required=True, help="directory for report.html, report.md, plots/ and tables/")


def s3_from(args: argparse.Namespace) -> S3Options | None:
    """The snapshots' S3 from :func:`add_source_arguments`, then ``STYX_S3_*``; None when no endpoint."""
    if not (args.s3_endpoint or os.environ.get("STYX_S3_ENDPOINT")):
        return None
    return S3Options.parse(
        {
            "endpoint": args.s3_endpoint or "",
            "access_key": args.s3_access_key or "",
            "secret_key": args.s3_secret_key or "",
            "region": args.s3_region or "",
            "secure": "true" if args.s3_secure else "",
            "ca_file": args.s3_ca_file or "",
            "bucket": args.bucket or "",
        }
    )


def config_from(args: argparse.Namespace) -> AuditConfig:
    """The audit's configuration from the command line, then the cluster's ``STYX_*`` environment."""
    env = os.environ
    kafka = args.kafka or env.get("STYX_KAFKA_BOOTSTRAP", "")
    if not kafka:
        raise ConfigError("no Kafka bootstrap address: pass --kafka HOST:PORT or set STYX_KAFKA_BOOTSTRAP")
    s3 = s3_from(args)
    named = (("keys", args.keys), ("warehouses", args.warehouses), ("scale", args.scale))
    return AuditConfig(
        kafka=kafka,
        ingress_topic=args.ingress_topic or env.get("STYX_INGRESS_TOPIC", "styx-ingress"),
        egress_topic=args.egress_topic or env.get("STYX_EGRESS_TOPIC", "styx-egress"),
        seqlog_topic=args.seqlog_topic or env.get("STYX_SEQLOG_TOPIC", "styx-seqlog"),
        changelog_topic=(
            args.changelog_topic if args.changelog_topic is not None else env.get("STYX_CHANGELOG_TOPIC", "")
        ),
        out=Path(args.out),
        workload=args.workload,
        workload_options={k: v for k, v in named if v is not None},
        app=args.app,
        s3=s3,
        kafka_security=KafkaSecurity.from_env(),
        snapshot=args.snapshot,
        serial=not args.no_serial,
        write_facts=args.write_facts,
        split_records=args.split_records,
        timeout_s=args.timeout,
        driver_memory=args.driver_memory,
        master=args.master,
        executor_memory=args.executor_memory,
        verbose=args.verbose,
        strict=args.strict,
    )
