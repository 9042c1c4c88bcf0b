"""The outermost ASGI layer: cheap rejections before any parsing, and per-request metrics.

Order: 429 when ``max_http_inflight`` requests are being handled (probes are exempt, so health checks
stay answerable under overload), 401 for ``/v1/*`` without the token, 429 for a new invocation while
``max_pending`` jobs are pending (before its body is read), 415 for a ``/v1`` body declared as something
other than JSON, 413 for a body above ``max_body_bytes`` (by Content-Length at once, else while reading
it).

Why 415 and not a guess: a body without a Content-Type is taken as JSON (it is the only thing the API
takes), but one declared as another type (``curl -d`` says ``application/x-www-form-urlencoded``) is
refused with the exact fix, rather than parsed as JSON against its own label or answered with a schema
error that does not say what was wrong.
"""

import hmac
import time
from collections.abc import Mapping
from typing import Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from styx_client.gateway.config import GatewayConfig
from styx_client.gateway.jobs import GatewayStats, Jobs
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.outcomes import Outcome, failure, respond
from styx_client.gateway.replies import ReplyCache

__all__ = ["Guard", "Guarded", "replay_body"]

_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_INVOCATIONS = "/v1/invocations"


class Guarded(Protocol):
    """What the guard needs of the gateway."""

    config: GatewayConfig
    metrics: GatewayMetrics
    stats: GatewayStats
    jobs: Jobs
    replies: ReplyCache


class Guard:
    """In-flight bound, bearer token, pending bound and body size in front of ``app``; see the module."""

    def __init__(
        self, app: ASGIApp, gateway: Guarded, direct: Mapping[tuple[str, str], ASGIApp] | None = None
    ) -> None:
        self.app = app
        # (method, path) → the ASGI app of a route served without FastAPI's middleware and router
        # (:mod:`.lean`); FastAPI still declares it (OpenAPI) and answers everything else.
        self.direct = dict(direct or {})
        self.gateway = gateway
        self.in_flight = 0
        token = gateway.config.token
        self.expected = f"Bearer {token}".encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        metrics = self.gateway.metrics
        started = time.perf_counter()
        status = 500
        response_started = False

        async def send_and_record(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status = int(message["status"])
                response_started = True
                metrics.request_latency(_route(scope)).observe(time.perf_counter() - started)
            await send(message)

        metrics.in_flight.inc()
        try:
            await self._handle(scope, receive, send_and_record)
        finally:
            metrics.in_flight.dec()
            if not response_started:
                metrics.request_latency(_route(scope)).observe(time.perf_counter() - started)
            metrics.request_count(scope["method"], _route(scope), status).inc()

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        probe = path in _PROBES
        rejection = self._reject(scope, path, probe)
        if rejection is not None:
            await self._send(rejection, scope, receive, send)
            return
        if not probe:
            self.in_flight += 1
        try:
            if scope["method"] in _BODY_METHODS:
                if _content_type(scope) is None:
                    # No Content-Type: the body is JSON (the only thing the API takes); said so here
                    # because FastAPI would otherwise not parse it.
                    scope = {**scope, "headers": [*scope["headers"], (b"content-type", b"application/json")]}
                body = await _read_body(scope, receive, self.gateway.config.limits.max_body_bytes)
                if body is None:
                    return  # the client went away
                if isinstance(body, Outcome):
                    await self._send(body, scope, receive, send)
                    return
                receive = replay_body(body, receive)
            await self.direct.get((scope["method"], path), self.app)(scope, receive, send)
        finally:
            if not probe:
                self.in_flight -= 1

    def _reject(self, scope: Scope, path: str, probe: bool) -> Outcome | None:
        """The answer for a request refused before its body is read, or None to let it through."""
        gateway, config = self.gateway, self.gateway.config
        if not probe and self.in_flight >= config.limits.max_http_inflight:
            gateway.stats.shed += 1
            return gateway.jobs.overloaded(f"{self.in_flight} HTTP requests in flight")
        if self.expected is not None and path.startswith("/v1/") and not self._authorized(scope):
            return failure(
                401,
                "unauthorized",
                "missing or wrong bearer token",
                headers=(("WWW-Authenticate", 'Bearer realm="styx"'),),
            )
        if path.startswith("/v1/") and scope["method"] in _BODY_METHODS:
            declared = _content_type(scope)
            if declared is not None and not _is_json(declared):
                return failure(
                    415,
                    "unsupported_media_type",
                    f"the body must be JSON: send Content-Type: application/json (curl --json '{{...}}') "
                    f"or no Content-Type; got {declared!r}",
                    headers=(("Accept-Post", "application/json"),),
                )
        if path == _INVOCATIONS and scope["method"] == "POST" and self._full(scope):
            # The cheap shed: no body read, no parsing, no await before the 429 goes out, so a burst
            # far above capacity costs microseconds a request (a retry whose Idempotency-Key names a
            # pending job or a cached reply still gets through to join or fetch it).
            gateway.stats.shed += 1
            return gateway.jobs.overloaded(
                f"{len(gateway.jobs)} invocations pending (max_pending={config.limits.max_pending})"
            )
        return None

    def _full(self, scope: Scope) -> bool:
        """``max_pending`` jobs are pending and the request does not name one of them (or a cached reply)
        by its Idempotency-Key header."""
        gateway = self.gateway
        if len(gateway.jobs) < gateway.config.limits.max_pending:
            return False
        for name, value in scope["headers"]:
            if name == b"idempotency-key":
                rid = value.decode("latin-1")
                return rid not in gateway.jobs and gateway.replies.get(rid) is None
        return True

    def _authorized(self, scope: Scope) -> bool:
        assert self.expected is not None
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self.expected)
        return False

    async def _send(self, outcome: Outcome, scope: Scope, receive: Receive, send: Send) -> None:
        response = respond(outcome, self.gateway.metrics)
        await response(scope, receive, send)


def _content_type(scope: Scope) -> str | None:
    """The request's media type (lower case, without parameters), or None without a Content-Type."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media_type: str = value.decode("latin-1").split(";", 1)[0].strip().lower()
            return media_type
    return None


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def _route(scope: Scope) -> str:
    """Route template for metric labels (bounded), never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    # Answered by the guard before routing: a path without parameters is its own template.
    return _INVOCATIONS if scope["path"] == _INVOCATIONS else "unmatched"


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | Outcome | None:
    """The whole body (bounded), a 413 answer, or None when the client disconnected."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                if int(value) > limit:
                    return _too_large(limit)
            except ValueError:
                return failure(400, "malformed_request", "invalid Content-Length")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> Outcome:
    return failure(413, "body_too_large", f"request body larger than {limit} bytes")


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the buffered body once, then defers to the real one (disconnects)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
