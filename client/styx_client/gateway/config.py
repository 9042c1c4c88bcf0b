"""Settings of one gateway process, validated at construction: a bad value names its key.

Memory is bounded by ``max_pending`` (jobs), ``max_http_inflight`` (HTTP requests in the app),
``max_cached_replies``/``max_cache_bytes`` (idempotency table) and ``max_body_bytes``.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from styx_py.core.errors import ConfigError
from styx_py.core.limits import MAX_REQUEST_BYTES
from styx_py.io.handshake import is_loopback

__all__ = ["TOKEN_RULE", "GatewayConfig"]

# A bearer token goes into an ``Authorization: Bearer …`` header: RFC 6750's token68 characters only.
TOKEN_RE = re.compile(r"[A-Za-z0-9\-._~+/]{8,}=*")
TOKEN_RULE = "a token must be at least 8 characters from A-Z a-z 0-9 - . _ ~ + / (then optional '=' padding)"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Settings of one gateway process; validated at construction (a bad value names its key)."""

    coordinator: str
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    """Bearer token for ``/v1/*``; required when ``host`` is not a loopback address."""
    max_pending: int = 1000
    """Invocations waiting for their reply (new ones beyond → 429)."""
    max_http_inflight: int = 4000
    """HTTP requests being handled (probes excepted; beyond → 429 before the body is read)."""
    max_body_bytes: int = MAX_REQUEST_BYTES
    max_cached_replies: int = 100_000
    max_cache_bytes: int = 64 * 1024 * 1024
    idempotency_ttl_s: float = 600.0
    reply_timeout_s: float = 30.0
    """Default wait of ``POST /v1/invocations`` for its reply."""
    max_reply_timeout_s: float = 120.0
    """Upper bound of ``timeout_s``/``wait_s`` and how long a job waits for its reply."""
    retry_after_s: int = 1
    lookup_interval_s: float = 0.05
    """First wait between two cluster reply lookups of one long-poll; doubled each time."""
    max_lookup_interval_s: float = 1.0
    """Upper bound of that wait."""
    status_interval_s: float = 0.5
    connect_timeout_s: float = 10.0
    shutdown_grace_s: int = 5
    state_functions: Mapping[str, str] = field(default_factory=dict)
    """operator → read-only function (no arguments) that returns an entity's state, for ``/v1/state``."""
    cluster_secret: str | None = field(default=None, repr=False)
    """Authenticates the status polls on the coordinator's port; None: ``$STYX_CLUSTER_SECRET``."""

    def __post_init__(self) -> None:
        if self.token is not None and not TOKEN_RE.fullmatch(self.token):
            # Never echo the token (it lands in logs and terminals); say which rule it broke.
            raise ConfigError(
                f"gateway: invalid token (STYX_GATEWAY_TOKEN or --token-file; value not shown): "
                f"{TOKEN_RULE}; {_token_problem(self.token)}"
            )
        for key, ok in self._checks():
            if not ok:
                raise ConfigError(f"gateway: invalid value for {key}: {getattr(self, key)!r}")
        if self.token is None and not is_loopback(self.host):
            raise ConfigError(
                f"gateway: token is required when binding to the non-loopback address {self.host!r} "
                "(set STYX_GATEWAY_TOKEN or pass --token-file)"
            )

    def _checks(self) -> list[tuple[str, bool]]:
        return [
            ("coordinator", bool(self.coordinator) and ":" in self.coordinator),
            ("port", 0 <= self.port <= 65535),
            ("max_pending", self.max_pending >= 1),
            ("max_http_inflight", self.max_http_inflight >= 1),
            ("max_body_bytes", 1024 <= self.max_body_bytes <= MAX_REQUEST_BYTES),
            ("max_cached_replies", self.max_cached_replies >= 1),
            ("max_cache_bytes", self.max_cache_bytes >= 1024),
            ("idempotency_ttl_s", self.idempotency_ttl_s > 0),
            ("reply_timeout_s", 0 < self.reply_timeout_s <= self.max_reply_timeout_s),
            ("retry_after_s", self.retry_after_s >= 1),
            ("lookup_interval_s", self.lookup_interval_s > 0),
            ("max_lookup_interval_s", self.max_lookup_interval_s >= self.lookup_interval_s),
            ("status_interval_s", self.status_interval_s > 0),
            ("connect_timeout_s", self.connect_timeout_s > 0),
            ("shutdown_grace_s", self.shutdown_grace_s >= 0),
        ]

    @property
    def job_timeout_s(self) -> float:
        return self.max_reply_timeout_s


def _token_problem(token: str) -> str:
    """Which part of :data:`TOKEN_RULE` ``token`` breaks, without showing it."""
    if len(token) < 8:
        return f"this one has {len(token)}"
    if any(c.isspace() for c in token):
        return "this one contains whitespace"
    return "this one contains other characters"
