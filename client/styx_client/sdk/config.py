"""A client's settings, checked once when it is made: :class:`ClientConfig` and its two parts.

:class:`~styx_client.sdk.StyxClient` takes them as keyword arguments (see its docstring for what each
one means) and keeps them here; a bad value raises :class:`~styx_py.core.errors.ConfigError` naming it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from styx_py.core.errors import ConfigError
from styx_py.core.limits import BUSY_LINGER_MS, MAX_BUSY_LINGER_MS, MIN_FETCH_WAIT_MS, SEGMENT_POLL_S
from styx_py.core.security import PLAINTEXT, KafkaSecurity
from styx_py.core.segments import FRESH_S

__all__ = ["ClientConfig", "KafkaTuning", "PushSettings", "client_config"]


@dataclass(frozen=True, slots=True)
class KafkaTuning:
    """How the Kafka transport batches and fetches."""

    linger_ms: int = 0
    busy_linger_ms: float = BUSY_LINGER_MS
    fetch_wait_ms: int = MIN_FETCH_WAIT_MS
    security: KafkaSecurity = PLAINTEXT  # TLS and SASL (default: from STYX_KAFKA_*, see client_config)

    def __post_init__(self) -> None:
        if self.linger_ms < 0:
            raise ConfigError(f"linger_ms must be >= 0, not {self.linger_ms!r}")
        if not 0 <= self.busy_linger_ms <= MAX_BUSY_LINGER_MS:
            raise ConfigError(
                f"busy_linger_ms must be in 0..{MAX_BUSY_LINGER_MS}, not {self.busy_linger_ms!r}"
            )
        if self.fetch_wait_ms < MIN_FETCH_WAIT_MS:
            raise ConfigError(f"fetch_wait_ms must be >= {MIN_FETCH_WAIT_MS}, not {self.fetch_wait_ms!r}")


@dataclass(frozen=True, slots=True)
class PushSettings:
    """The workers' ports (:mod:`styx_client.sdk.push`): ``coordinator`` None means none are used."""

    coordinator: str | None = None
    cluster_secret: str | None = None
    # The workers' addresses if known already, with the partitions each reads when a mapping.
    workers: Collection[str] | Mapping[str, list[int]] = ()
    push_requests: bool = True
    rest_egress: bool = True

    @property
    def on(self) -> bool:
        return self.coordinator is not None


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Everything a :class:`~styx_client.sdk.StyxClient` is told when it is made."""

    bootstrap: str
    ingress_topic: str = "styx-ingress"
    egress_topic: str = "styx-egress"
    max_pending: int = 10_000
    timeout_s: float = 30.0
    client_id: str = field(default_factory=lambda: f"styx-client-{uuid.uuid4().hex[:8]}")
    reply_partition: int | None = None  # None: a hash of client_id; -1: every partition
    request_id_prefix: str | None = None  # None: 80 random bits (styx_client.sdk.ids)
    segment_poll_s: float = SEGMENT_POLL_S
    fresh_s: float = FRESH_S  # a write this soon after a look counts as read (core.segments.FRESH_S)
    kafka: KafkaTuning = KafkaTuning()
    push: PushSettings = PushSettings()

    def __post_init__(self) -> None:
        if self.max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1, not {self.max_pending!r}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, not {self.timeout_s!r}")
        if self.reply_partition is not None and self.reply_partition < -1:
            raise ConfigError(f"reply_partition must be >= 0, or -1 for all, not {self.reply_partition!r}")
        if self.segment_poll_s <= 0:
            raise ConfigError(f"segment_poll_s must be > 0, not {self.segment_poll_s!r}")
        if not 0 < self.fresh_s <= FRESH_S:
            raise ConfigError(f"fresh_s must be in (0, {FRESH_S}], not {self.fresh_s!r}")


def client_config(
    bootstrap: str,
    *,
    linger_ms: int = 0,
    busy_linger_ms: float = BUSY_LINGER_MS,
    fetch_wait_ms: int = MIN_FETCH_WAIT_MS,
    coordinator: str | None = None,
    cluster_secret: str | None = None,
    push_replies: bool = True,
    push_requests: bool = True,
    workers: Collection[str] | Mapping[str, list[int]] = (),
    rest_egress: bool = True,
    client_id: str | None = None,
    kafka_security: KafkaSecurity | None = None,
    **rest: Any,
) -> ClientConfig:
    """The :class:`ClientConfig` of :class:`~styx_client.sdk.StyxClient`'s keyword arguments."""
    coordinator = coordinator if push_replies else None
    push = PushSettings(
        coordinator,
        cluster_secret,
        workers,
        push_requests and coordinator is not None,
        rest_egress and coordinator is not None,
    )
    security = KafkaSecurity.from_env() if kafka_security is None else kafka_security
    kafka = KafkaTuning(linger_ms, busy_linger_ms, fetch_wait_ms, security)
    if client_id is not None:
        rest["client_id"] = client_id
    return ClientConfig(bootstrap, kafka=kafka, push=push, **rest)
