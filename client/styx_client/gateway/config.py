"""Settings of one gateway process, validated at construction: a bad value names its key.

:class:`GatewayConfig` says where the gateway listens, who may call it and which cluster it serves;
its two parts say what bounds its memory (:class:`GatewayLimits`: jobs, HTTP requests in the app, the
idempotency table and the body size; beyond them it answers 429 or 413) and how long it waits
(:class:`GatewayTiming`). ``styx gateway`` sets a few of them from its flags (docs/http-api.md).
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from styx_py.core.errors import ConfigError
from styx_py.core.limits import (
    MAX_REQUEST_BYTES,
    MIN_GATEWAY_BODY_BYTES,
    MIN_REPLY_CACHE_BYTES,
    MIN_TOKEN_CHARS,
)
from styx_py.core.security import is_placeholder
from styx_py.io.handshake import is_loopback

__all__ = ["TOKEN_RULE", "GatewayConfig", "GatewayLimits", "GatewayTiming"]

# A bearer token goes into an ``Authorization: Bearer …`` header: RFC 6750's token68 characters only.
TOKEN_RE = re.compile(rf"[A-Za-z0-9\-._~+/]{{{MIN_TOKEN_CHARS},}}=*")
TOKEN_RULE = (
    f"a token must be at least {MIN_TOKEN_CHARS} characters from A-Z a-z 0-9 - . _ ~ + / "
    "(then optional '=' padding)"
)


def _check(settings: object, checks: list[tuple[str, bool]]) -> None:
    """Raise :class:`ConfigError` naming the first key of ``settings`` whose check failed."""
    for key, ok in checks:
        if not ok:
            raise ConfigError(f"gateway: invalid value for {key}: {getattr(settings, key)!r}")


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """What bounds the gateway's memory; beyond each it sheds work (429, 413) instead of holding it."""

    max_pending: int = 1000
    """Invocations waiting for their reply (new ones beyond → 429)."""
    max_http_inflight: int = 4000
    """HTTP requests being handled (probes excepted; beyond → 429 before the body is read)."""
    max_body_bytes: int = MAX_REQUEST_BYTES
    max_cached_replies: int = 100_000
    """Entries of the idempotency table (final replies by request id)."""
    max_cache_bytes: int = 64 * 1024 * 1024
    idempotency_ttl_s: float = 600.0
    """How long the idempotency table keeps a reply."""
    max_recent_invocations: int = 1000
    """Entries of the recent-invocations window (``GET /v1/invocations``; the oldest go first)."""
    max_recent_bytes: int = 16 * 1024 * 1024
    """Bytes of that window (arguments and results, plus a fixed overhead per entry)."""

    def __post_init__(self) -> None:
        _check(
            self,
            [
                ("max_pending", self.max_pending >= 1),
                ("max_http_inflight", self.max_http_inflight >= 1),
                ("max_body_bytes", MIN_GATEWAY_BODY_BYTES <= self.max_body_bytes <= MAX_REQUEST_BYTES),
                ("max_cached_replies", self.max_cached_replies >= 1),
                ("max_cache_bytes", self.max_cache_bytes >= MIN_REPLY_CACHE_BYTES),
                ("idempotency_ttl_s", self.idempotency_ttl_s > 0),
                ("max_recent_invocations", self.max_recent_invocations >= 1),
                ("max_recent_bytes", self.max_recent_bytes >= MIN_REPLY_CACHE_BYTES),
            ],
        )


@dataclass(frozen=True, slots=True)
class GatewayTiming:
    """How long the gateway waits: for replies, between its looks at the cluster, to stop."""

    reply_timeout_s: float = 30.0
    """Default wait of ``POST /v1/invocations`` for its reply."""
    max_reply_timeout_s: float = 120.0
    """Upper bound of ``timeout_s``/``wait_s`` and how long a job waits for its reply."""
    retry_after_s: int = 1
    """The ``Retry-After`` of a 429 or 503."""
    lookup_interval_s: float = 0.05
    """First wait between two cluster reply lookups of one long-poll; doubled each time."""
    max_lookup_interval_s: float = 1.0
    """Upper bound of that wait."""
    status_interval_s: float = 0.5
    """How often the coordinator's status is polled."""
    connect_timeout_s: float = 10.0
    """To connect the SDK client behind the gateway."""
    shutdown_grace_s: int = 5
    """How long requests in flight may finish once the gateway is told to stop."""

    def __post_init__(self) -> None:
        _check(
            self,
            [
                ("reply_timeout_s", 0 < self.reply_timeout_s <= self.max_reply_timeout_s),
                ("retry_after_s", self.retry_after_s >= 1),
                ("lookup_interval_s", self.lookup_interval_s > 0),
                ("max_lookup_interval_s", self.max_lookup_interval_s >= self.lookup_interval_s),
                ("status_interval_s", self.status_interval_s > 0),
                ("connect_timeout_s", self.connect_timeout_s > 0),
                ("shutdown_grace_s", self.shutdown_grace_s >= 0),
            ],
        )

    @property
    def job_timeout_s(self) -> float:
        return self.max_reply_timeout_s


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Settings of one gateway process; validated at construction (a bad value names its key)."""

    coordinator: str
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    """Bearer token for ``/v1/*``; required when ``host`` is not a loopback address."""
    cluster_secret: str | None = field(default=None, repr=False)
    """Authenticates the status polls on the coordinator's port; None: ``$STYX_CLUSTER_SECRET``."""
    state_functions: Mapping[str, str] = field(default_factory=dict)
    """operator → read-only function (no arguments) that returns an entity's state, for ``/v1/state``."""
    limits: GatewayLimits = GatewayLimits()
    timing: GatewayTiming = GatewayTiming()

    def __post_init__(self) -> None:
        if self.token is not None and not TOKEN_RE.fullmatch(self.token):
            # Never echo the token (it lands in logs and terminals); say which rule it broke.
            raise ConfigError(
                f"gateway: invalid token (STYX_GATEWAY_TOKEN or --token-file; value not shown): "
                f"{TOKEN_RULE}; {_token_problem(self.token)}"
            )
        if self.token is not None and is_placeholder(self.token):
            raise ConfigError(
                "gateway: the token (STYX_GATEWAY_TOKEN or --token-file; value not shown) is a "
                "placeholder, not a secret: generate one (openssl rand -hex 24)"
            )
        _check(
            self,
            [
                ("coordinator", bool(self.coordinator) and ":" in self.coordinator),
                ("port", 0 <= self.port <= 65535),
            ],
        )
        if self.token is None and not is_loopback(self.host):
            raise ConfigError(
                f"gateway: token is required when binding to the non-loopback address {self.host!r} "
                "(set STYX_GATEWAY_TOKEN or pass --token-file)"
            )


def _token_problem(token: str) -> str:
    """Which part of :data:`TOKEN_RULE` ``token`` breaks, without showing it."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"this one has {len(token)}"
    if any(c.isspace() for c in token):
        return "this one contains whitespace"
    return "this one contains other characters"
