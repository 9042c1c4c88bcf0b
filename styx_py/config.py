"""Configuration, parsed once at start-up (never at import), with units in the names.

Values come from keyword arguments or ``STYX_*`` environment variables; a bad value fails fast with
the key's name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgspec

from styx_py.errors import ConfigError


class Config(msgspec.Struct, kw_only=True, frozen=True):
    epoch_interval_ms: float = 1.0  # minimum spacing between epoch starts while work waits
    epoch_size_max: int = 1000  # max new transactions one worker sequences per epoch
    heartbeat_interval_ms: int = 200
    failure_timeout_ms: int = 1000  # missed heartbeats for this long => worker failed
    epoch_timeout_ms: int = 30_000  # an epoch stage (or a recovery) stuck this long => recover
    max_pending_requests: int = 100_000  # per worker ingress buffer; consumption pauses beyond
    call_graph_caching: bool = True
    ingress_topic: str = "styx-ingress"
    egress_topic: str = "styx-egress"
    seqlog_topic: str = "styx-seqlog"
    kafka_fetch_wait_ms: int = 5  # Tansu answers a waiting fetch only at its deadline
    kafka_linger_ms: int = 1
    snapshot_bucket: str = "styx-snapshots"
    s3_endpoint: str = ""  # host:port of the S3 service; empty: no snapshots (recovery replays the logs)
    s3_access_key: str = ""
    s3_secret_key: str = ""
    s3_region: str = "us-east-1"
    s3_secure: bool = False
    snapshot_interval_s: float = 10.0  # take an incremental snapshot this often (at an epoch boundary)
    snapshot_interval_epochs: int = 0  # if > 0, every this many epochs instead (deterministic tests)
    snapshot_compact_after: int = 8  # merge a partition's deltas into one base beyond this many
    dedup_replies_per_partition: int = 100_000  # replies kept to answer resent request ids

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool]] = [
            ("epoch_interval_ms", self.epoch_interval_ms >= 0),
            ("epoch_size_max", 1 <= self.epoch_size_max <= 1_000_000),
            ("heartbeat_interval_ms", self.heartbeat_interval_ms > 0),
            ("failure_timeout_ms", self.failure_timeout_ms > self.heartbeat_interval_ms),
            ("max_pending_requests", self.max_pending_requests >= self.epoch_size_max),
            ("kafka_fetch_wait_ms", self.kafka_fetch_wait_ms >= 5),
        ]
        for key, ok in checks:
            if not ok:
                raise ConfigError(f"invalid value for {key}: {getattr(self, key)!r}")


def load_config(overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Build a Config from ``STYX_<KEY>`` environment variables, then ``overrides``."""
    env = os.environ if env is None else env
    fields = {f.name: f.type for f in msgspec.structs.fields(Config)}
    raw: dict[str, Any] = {}
    for name in fields:
        value = env.get(f"STYX_{name.upper()}")
        if value is not None:
            raw[name] = value
    for name, value in (overrides or {}).items():
        if name not in fields:
            raise ConfigError(f"unknown configuration key {name!r}")
        raw[name] = value
    try:
        return msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
