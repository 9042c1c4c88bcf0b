"""Configuration, parsed once at start-up (never at import), with units in the names.

Every setting is a field of :class:`Config` and carries its own metadata (:class:`Setting`: unit,
description, bounds, who reads it), so this module is the one place that defines a setting's name,
type, default, unit and meaning. The configuration table of ``docs/operations.md`` is rendered from
it (``python -m styx_py.core.config --write docs/operations.md``; a test checks that the two agree), and the
deployment files may only use ``STYX_*`` variables defined here (checked by ``tests/test_deploy.py``).

Values come from keyword arguments or ``STYX_<NAME>`` environment variables; a bad value fails fast
with the setting's name and its environment variable.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from styx_py.core.errors import ConfigError
from styx_py.core.security import (
    KAFKA_PROTOCOLS,
    SASL_MECHANISMS,
    KafkaSecurity,
    TlsFiles,
    is_placeholder,
    tls_files,
)

Scope = Literal["cluster", "process", "client"]
SCOPES: dict[str, str] = {
    "cluster": "coordinator and every worker (must be the same on all of them)",
    "process": "each coordinator and worker process on its own",
    "client": "`styx` commands (gateway, deploy, call, status)",
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Setting:
    """Metadata of one setting, attached to its :class:`Config` field with ``Annotated``."""

    description: str
    unit: str = ""  # ms, s, bytes, requests, … ("" when the value has none)
    ge: float | None = None  # inclusive bounds, checked at start-up
    le: float | None = None
    choices: tuple[str, ...] = ()  # allowed values (case-insensitive) of a string setting
    scope: Scope = "cluster"
    secret: bool = False  # never printed (the docs show no default)


class Config(msgspec.Struct, kw_only=True, frozen=True):
    # ---- epochs and failure detection ------------------------------------------------------------------
    # 5 ms, not 1: at 500-2 000/s epochs of 1-10 transactions ran back to back (~280 a second at
    # 500/s), each costing every process its fixed share (Kafka requests, barrier messages). Spaced by
    # 5 ms the cluster used 2-14 % less CPU per transaction at 500-4 000/s and p50 was lower at
    # 500-2 000/s; unchanged at 8 000/s and above (benchmarks/results/epoch-interval.md).
    epoch_interval_ms: Annotated[
        float, Setting("minimum spacing between epoch starts while work is waiting", "ms", ge=0)
    ] = 5.0
    epoch_size_max: Annotated[
        int,
        Setting("max new transactions one worker sequences into one epoch", "transactions", 1, 1_000_000),
    ] = 1000
    # Admission control (styx_worker.admission): past its knee a cluster that admits everything queues,
    # its epochs grow with the backlog and commit less; bounded, it keeps its best throughput for what
    # it admits and refuses the rest at once.
    admission_epoch_ms: Annotated[
        float,
        Setting(
            "target duration of an epoch: each worker sizes its batches from the durations of its own "
            "epochs so that one takes about this long (at most epoch_size_max transactions); 0: batches "
            "of epoch_size_max and nothing refused",
            "ms",
            ge=0,
        ),
    ] = 100.0
    admission_queue_ms: Annotated[
        float,
        Setting(
            "new requests buffered on a worker beyond what it admits in this long (admission_queue_ms / "
            "admission_epoch_ms batches; resent copies do not count), and those that would not run "
            "within this long behind the rescheduled calls of their function queued at their root "
            "entity (one runs per epoch; the batch's calls admitted into the queue before count), are "
            "refused at once: "
            "answered `refused`, which the SDK raises as Overloaded and the gateway answers with 429 (not "
            "the backlog of a stall: after a recovery, a partition move or 8 epochs' durations without an "
            "epoch end it is worked through first); 0: never refuse",
            "ms",
            ge=0,
        ),
    ] = 500.0
    heartbeat_interval_ms: Annotated[
        int, Setting("worker heartbeat period (sent from the worker's event loop)", "ms", ge=1)
    ] = 200
    failure_timeout_ms: Annotated[
        int,
        Setting(
            "a worker silent this long is reported failed; a worker that hears nothing from the "
            "coordinator this long fences itself off (must exceed heartbeat_interval_ms)",
            "ms",
            ge=1,
        ),
    ] = 1000
    takeover_after_ms: Annotated[
        int,
        Setting(
            "a worker silent this long is lost for good: its partitions move to the others (restored "
            "from the last snapshot and the logs) and the cluster runs on without it; 0: never (wait "
            "for it to come back). A value below 2 * failure_timeout_ms + 1 000 counts as that (the "
            "lost worker's lease must have run out first)",
            "ms",
            ge=0,
        ),
    ] = 30_000
    epoch_timeout_ms: Annotated[
        int, Setting("an epoch stage or a recovery stuck this long triggers a recovery", "ms", ge=1)
    ] = 30_000
    # Ten minutes rides out a restart or failover of S3 or the broker (seconds to a few minutes); an
    # outage longer than that needs a person, and the cluster says so instead of retrying unseen. With
    # the backoff capped at 2 s, failures that come at once take 300 attempts to fill ten minutes.
    recovery_max_s: Annotated[
        float,
        Setting(
            "a recovery that keeps failing (S3 or the broker away, a worker that cannot restore) is "
            "retried for at most this long (no attempt begins later after the first), then the "
            "cluster stops, degraded (`styx status`, /readyz), until the coordinator is restarted",
            "s",
            ge=1,
        ),
    ] = 600.0
    recovery_max_attempts: Annotated[
        int,
        Setting(
            "... and for at most this many attempts in a row (whichever bound comes first)", "attempts", ge=1
        ),
    ] = 300
    max_pending_requests: Annotated[
        int,
        Setting(
            "per-worker ingress buffer; fetching pauses beyond it (at least epoch_size_max)", "requests", ge=1
        ),
    ] = 100_000
    call_graph_caching: Annotated[
        bool, Setting("re-invoke cached calls in parallel in the fallback phase")
    ] = True
    # ---- internal ports (coordinator and workers; docs/deploy.md#security) -------------------------------
    cluster_secret: Annotated[
        str,
        Setting(
            "shared secret every connection to a coordinator or worker port proves it knows (HMAC "
            "handshake), admin clients (`styx deploy/status/call`, the SDK, the gateway) included; at "
            "least 16 characters; empty: allowed only while the process binds a loopback address",
            secret=True,
        ),
    ] = ""
    frame_timeout_s: Annotated[
        float,
        Setting("a connection whose started frame does not complete this long is closed", "s", ge=0.1),
    ] = 30.0
    connection_idle_timeout_s: Annotated[
        float,
        Setting(
            "a connection that delivers no frame this long is closed (live links send a keepalive "
            "every third of it)",
            "s",
            ge=1,
        ),
    ] = 60.0
    tls_cert_file: Annotated[
        str,
        Setting(
            "PEM certificate of this process on the internal ports: with tls_key_file and tls_ca_file, "
            "every connection to and from a coordinator or worker port is mutual TLS (both sides "
            "verify the other's certificate against the CA) under the HMAC handshake; admin clients, "
            "the SDK and the gateway read the same variables; empty: plain TCP",
            scope="process",
        ),
    ] = ""
    tls_key_file: Annotated[str, Setting("PEM private key of tls_cert_file", scope="process")] = ""
    tls_ca_file: Annotated[
        str, Setting("PEM CA certificate(s) the peers' certificates must be signed by", scope="process")
    ] = ""
    tls_server_name: Annotated[
        str,
        Setting(
            "a DNS name (subjectAltName) every node's certificate carries, checked by whoever dials a "
            "node; empty: the CA signature is checked, the name is not (nodes are dialed by address)",
            scope="process",
        ),
    ] = ""
    # ---- Kafka ---------------------------------------------------------------------------------------------
    kafka_bootstrap: Annotated[
        str,
        Setting(
            "Kafka bootstrap servers, host:port[,host:port…]; `--kafka` overrides it; required by the "
            "coordinator and the workers"
        ),
    ] = ""
    ingress_topic: Annotated[str, Setting("Kafka topic of requests (partition = entity partition)")] = (
        "styx-ingress"
    )
    egress_topic: Annotated[str, Setting("Kafka topic of replies")] = "styx-egress"
    reply_routing: Annotated[
        bool,
        Setting(
            "SDK clients that connect through the coordinator read only their own egress partition; "
            "off (each reads every partition) for brokers that list a partition on every fetch "
            "(Tansu: `styx up` turns it off, docs/operations.md#durable-mode)"
        ),
    ] = True
    seqlog_topic: Annotated[str, Setting("Kafka topic of the sequencer log (one partition)")] = "styx-seqlog"
    changelog_topic: Annotated[
        str,
        Setting(
            "Kafka topic of every committed write, in commit order, exactly once (one partition per "
            "state partition, keyed by entity: docs/architecture.md#changelog), e.g. styx-changelog; "
            "empty (the default): no changelog"
        ),
    ] = ""
    log_segment_s: Annotated[
        float,
        Setting(
            "start new segments of the ingress and egress topics this often while requests flow "
            "(topics `<topic>.<n>`; clients follow): on a broker whose fetches list the whole partition "
            "(Tansu, the local default: `styx up` sets 2) no partition grows for ever; 0: one topic; "
            "0 or >= 1.5",
            "s",
            ge=0,
        ),
    ] = 0.0
    kafka_fetch_wait_ms: Annotated[
        int,
        Setting(
            "consumer fetch wait, also of SDK clients that connect through the coordinator: how long "
            "a fetch with nothing to return waits. Apache Kafka answers as soon as records come, so a "
            "longer wait there only saves empty fetches (docker-compose and Kubernetes set 100); Tansu "
            "notices them after up to half of it, so keep the local default",
            "ms",
            5,
            10_000,
        ),
    ] = 5
    kafka_idle_fetch_wait_ms: Annotated[
        int,
        Setting(
            "the ingress fetch wait of a worker that took no request for a second (none fetched, none "
            "pushed); the first fetched record puts kafka_fetch_wait_ms back. On Tansu each waiting "
            "consumer costs CPU by the fetch (an idle 2-worker cluster used 53 % of a core at 5 ms), and "
            "only a request that was not pushed waits for it, up to half of it once; 0: never longer",
            "ms",
            0,
            10_000,
        ),
    ] = 100
    kafka_linger_ms: Annotated[
        int,
        Setting(
            "producer linger (records are batched per partition while one batch is in flight anyway)",
            "ms",
            0,
            10_000,
        ),
    ] = 0
    kafka_replication_factor: Annotated[
        int,
        Setting(
            "replication factor of the topics the coordinator creates at deploy (3 on a production "
            "Kafka; topics that exist are left as they are)",
            "replicas",
            1,
            32,
        ),
    ] = 1
    kafka_security_protocol: Annotated[
        str,
        Setting(
            "how every Kafka client of the cluster (workers, coordinator, SDK, gateway, audit) reaches the "
            "broker",
            choices=KAFKA_PROTOCOLS,
            scope="process",
        ),
    ] = "PLAINTEXT"
    kafka_ssl_ca_file: Annotated[
        str,
        Setting("PEM CA of the broker's certificate (SSL, SASL_SSL; empty: the system's)", scope="process"),
    ] = ""
    kafka_ssl_cert_file: Annotated[
        str,
        Setting("PEM client certificate, for a broker that requires one (SSL, SASL_SSL)", scope="process"),
    ] = ""
    kafka_ssl_key_file: Annotated[str, Setting("PEM key of kafka_ssl_cert_file", scope="process")] = ""
    kafka_sasl_mechanism: Annotated[
        str,
        Setting(f"SASL mechanism (SASL_*): one of {', '.join(SASL_MECHANISMS)}", scope="process"),
    ] = ""
    kafka_sasl_username: Annotated[str, Setting("SASL user name (SASL_*)", scope="process")] = ""
    kafka_sasl_password: Annotated[str, Setting("SASL password (SASL_*)", scope="process", secret=True)] = ""
    # ---- S3 and snapshots ------------------------------------------------------------------------------
    snapshot_bucket: Annotated[
        str,
        Setting("S3 bucket for snapshots, manifests and the coordinator's state (created if missing)"),
    ] = "styx-snapshots"
    s3_endpoint: Annotated[
        str,
        Setting("host:port of the S3 service; empty: no snapshots (recovery replays the whole log)"),
    ] = ""
    s3_access_key: Annotated[str, Setting("S3 access key", secret=True)] = ""
    s3_secret_key: Annotated[str, Setting("S3 secret key", secret=True)] = ""
    s3_region: Annotated[str, Setting("S3 region")] = "us-east-1"
    s3_secure: Annotated[bool, Setting("use HTTPS to reach S3 (the certificate is verified)")] = False
    s3_ca_file: Annotated[
        str,
        Setting("PEM CA bundle that S3's certificate is verified against (s3_secure; empty: the system's)"),
    ] = ""
    snapshot_interval_s: Annotated[
        float,
        Setting("take an incremental snapshot this often (at an epoch boundary)", "s", ge=0),
    ] = 10.0
    snapshot_interval_epochs: Annotated[
        int,
        Setting("if > 0, snapshot every this many epochs instead (deterministic tests)", "epochs", ge=0),
    ] = 0
    # Done at once, a snapshot of ~5 000 writes and ~10 000 replies per worker (10 s at 2 000/s) held the
    # loop 5-20 ms, and the epoch barrier with it. In steps of 1 000 rows run back to back, the epoch after
    # the cut still took ~20 ms longer: every message of its many hops waited for a step, on every
    # process. Steps of 300 rows 2 ms apart cut that to a few ms (benchmarks/results/snapshot-stall.md).
    snapshot_step_rows: Annotated[
        int,
        Setting(
            "rows a worker splits or encodes for a snapshot before it lets the epochs run again", "rows", ge=1
        ),
    ] = 300
    snapshot_step_pause_ms: Annotated[
        float,
        Setting("pause between two such steps, so that a snapshot never holds the worker's loop", "ms", ge=0),
    ] = 2.0
    snapshot_compact_after: Annotated[
        int, Setting("merge a partition's deltas into one base beyond this many", "deltas", ge=1)
    ] = 8
    dedup_replies_per_partition: Annotated[
        int, Setting("replies kept per partition to answer resent request ids", "replies", ge=0)
    ] = 100_000
    # Consistent reads outside transactions (styx_worker.window): each worker keeps the value before
    # every write of its last this-many epochs, so a read as of any of them needs no pause. Memory:
    # one reference per entity written per epoch (the old value's bytes are shared, not copied).
    state_window_epochs: Annotated[
        int,
        Setting(
            "epochs back that `styx state`, `client.scan` and `GET /v1/state/{operator}` can read "
            "from memory (as_of_epoch); older ones: `styx sql --as-of-epoch`",
            "epochs",
            1,
            1_000_000,
        ),
    ] = 2000
    # ---- each process ------------------------------------------------------------------------------------
    metrics_port: Annotated[
        int,
        Setting(
            "port of the Prometheus endpoint (`/metrics`, `/healthz`, `/readyz`) of a coordinator or "
            "worker; 0: none",
            "port",
            0,
            65_535,
            scope="process",
        ),
    ] = 0
    metrics_host: Annotated[str, Setting("address the metrics endpoint listens on", scope="process")] = (
        "127.0.0.1"
    )
    log_level: Annotated[
        str,
        Setting(
            "log level of coordinator, worker and gateway processes", choices=LOG_LEVELS, scope="process"
        ),
    ] = "INFO"
    # ---- clients -----------------------------------------------------------------------------------------
    coordinator: Annotated[
        str,
        Setting(
            "host:port of the coordinator for workers, the gateway and `styx deploy/call/status` "
            "(`--coordinator` overrides it)",
            scope="client",
        ),
    ] = ""
    connect_timeout_s: Annotated[
        float,
        Setting(
            "how long an admin client (`styx deploy/status/call/scale`, the SDK, the gateway) waits for "
            "a coordinator to take its connection and answer the handshake before it gives up, naming "
            "the address",
            "s",
            ge=0.001,
            scope="client",
        ),
    ] = 5.0
    gateway_url: Annotated[
        str,
        Setting(
            "URL of the HTTP gateway for `styx invocations get` (`--gateway` overrides it; default: the "
            "gateway `styx up` started)",
            scope="client",
        ),
    ] = ""
    gateway_token: Annotated[
        str,
        Setting(
            "bearer token the HTTP gateway requires on /v1/* (required when it binds a non-loopback "
            "address; `--token-file` overrides it)",
            scope="client",
            secret=True,
        ),
    ] = ""

    def __post_init__(self) -> None:
        for spec in SETTINGS:
            problem = spec.problem(getattr(self, spec.name))
            if problem:
                raise ConfigError(f"invalid value for {spec.name} ({spec.env}): {problem}")
        checks: list[tuple[str, bool, str]] = [
            (
                "failure_timeout_ms",
                self.failure_timeout_ms > self.heartbeat_interval_ms,
                "must exceed heartbeat_interval_ms",
            ),
            (
                "max_pending_requests",
                self.max_pending_requests >= self.epoch_size_max,
                "must be at least epoch_size_max",
            ),
            (
                "cluster_secret",
                not self.cluster_secret or len(self.cluster_secret) >= 16,
                "must be at least 16 characters (or empty on a loopback-only cluster)",
            ),
            ("s3_ca_file", self.s3_secure or not self.s3_ca_file, "is set but s3_secure is not"),
        ]
        hidden = {s.name for s in SETTINGS if s.meta.secret}
        checks += [
            (key, not is_placeholder(getattr(self, key)), "a placeholder, not a secret: generate one")
            for key in sorted(hidden)
        ]
        for key, ok, why in checks:
            if not ok:
                value = "(hidden)" if key in hidden else repr(getattr(self, key))
                raise ConfigError(f"invalid value for {key} (STYX_{key.upper()}): {value}: {why}")
        self.internal_tls()
        self.kafka_security()

    def internal_tls(self) -> TlsFiles | None:
        """TLS on the internal ports, None for plain TCP (see :mod:`styx_py.core.security`)."""
        return tls_files(self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_server_name)

    def kafka_security(self) -> KafkaSecurity:
        """How this process's Kafka clients reach the broker (see :mod:`styx_py.core.security`)."""
        return KafkaSecurity(
            self.kafka_security_protocol,
            self.kafka_ssl_ca_file,
            self.kafka_ssl_cert_file,
            self.kafka_ssl_key_file,
            self.kafka_sasl_mechanism,
            self.kafka_sasl_username,
            self.kafka_sasl_password,
        )


@dataclass(frozen=True)
class SettingSpec:
    """One setting as the schema describes it: name, environment variable, type, default, metadata."""

    name: str
    type: type
    default: Any
    meta: Setting

    @property
    def env(self) -> str:
        return f"STYX_{self.name.upper()}"

    def problem(self, value: Any) -> str:
        """Why ``value`` is out of bounds for this setting ("" when it is fine)."""
        m = self.meta
        if m.ge is not None and value < m.ge:
            return f"{value!r}: must be >= {m.ge:g}"
        if m.le is not None and value > m.le:
            return f"{value!r}: must be <= {m.le:g}"
        if m.choices and str(value).upper() not in m.choices:
            return f"{value!r}: must be one of {', '.join(m.choices)}"
        return ""


def _schema() -> tuple[SettingSpec, ...]:
    hints = typing.get_type_hints(Config, include_extras=True)
    out: list[SettingSpec] = []
    for field in msgspec.structs.fields(Config):
        hint = hints[field.name]
        base, *extras = typing.get_args(hint)
        meta = next((x for x in extras if isinstance(x, Setting)), None)
        assert meta is not None, f"Config.{field.name} has no Setting metadata"
        out.append(SettingSpec(field.name, base, field.default, meta))
    return tuple(out)


SETTINGS: tuple[SettingSpec, ...] = _schema()
ENV_VARS: frozenset[str] = frozenset(s.env for s in SETTINGS)

_AT_FIELD = re.compile(r"at `\$\.(\w+)`")


def load_config(overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Build a Config from ``STYX_<KEY>`` environment variables, then ``overrides``."""
    env = os.environ if env is None else env
    names = {s.name for s in SETTINGS}
    raw: dict[str, Any] = {}
    for spec in SETTINGS:
        value = env.get(spec.env)
        if value is not None:
            raw[spec.name] = value
    for name, value in (overrides or {}).items():
        if name not in names:
            raise ConfigError(f"unknown configuration key {name!r}")
        raw[name] = value
    try:
        return msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        found = _AT_FIELD.search(str(exc))
        if found is None:
            raise ConfigError(f"invalid configuration: {exc}") from exc
        key = found.group(1)
        hidden = {s.name for s in SETTINGS if s.meta.secret}
        value = "(hidden)" if key in hidden else repr(raw.get(key))
        raise ConfigError(f"invalid value for {key} (STYX_{key.upper()}): {value}: {exc}") from exc


# ---- documentation -----------------------------------------------------------------------------------

TABLE_FILE = "docs/operations.md"  # the document that holds the table, relative to the repository root
TABLE_BEGIN = (
    f"<!-- BEGIN CONFIG TABLE: generated by `python -m styx_py.core.config --write {TABLE_FILE}` -->"
)
TABLE_END = "<!-- END CONFIG TABLE -->"


def _default_text(spec: SettingSpec) -> str:
    if spec.meta.secret or spec.default == "":
        return "(empty)"
    if isinstance(spec.default, bool):
        return "`true`" if spec.default else "`false`"
    if isinstance(spec.default, float) and spec.default.is_integer():
        return f"`{int(spec.default)}`"
    return f"`{spec.default}`"


def markdown_table() -> str:
    """The configuration table of :data:`TABLE_FILE`, one row per setting, grouped by who reads it."""
    lines = [
        "| environment variable | type | default | unit | read by | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for spec in SETTINGS:
        m = spec.meta
        description = m.description + (f" (one of {', '.join(m.choices)})" if m.choices else "")
        lines.append(
            f"| `{spec.env}` | {spec.type.__name__} | {_default_text(spec)} | {m.unit or '—'} | "
            f"{m.scope} | {description} |"
        )
    return "\n".join(lines)


def render_into(text: str) -> str:
    """``text`` (a document) with the part between the table markers replaced by :func:`markdown_table`."""
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        raise ConfigError(f"no configuration table markers ({TABLE_BEGIN!r} … {TABLE_END!r})")
    return text[: begin + len(TABLE_BEGIN)] + "\n" + markdown_table() + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m styx_py.core.config", description="print (or write) the configuration table"
    )
    parser.add_argument(
        "--write",
        metavar="FILE",
        help=f"replace the table between the markers in FILE (it lives in {TABLE_FILE})",
    )
    args = parser.parse_args(argv)
    if args.write:
        with open(args.write, encoding="utf-8") as f:
            text = f.read()
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(render_into(text))
    else:
        print(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
