"""HTTP gateway: submit transactions to a styx-py cluster over HTTP (FastAPI on uvicorn).

The data path of one HTTP invocation::

    HTTP ──> guard (in-flight bound → bearer token → body size) ──> route (validation)
         ──> idempotency table: cached final reply | join the in-flight job | start a job
         ──> the gateway's one StyxClient (one producer, ONE egress consumer for every waiter)
         ──> Kafka ──> cluster ──> reply ──> JSON body, cached under the request id

Routes (JSON everywhere; OpenAPI at ``/openapi.json``, docs at ``/docs``):

==========================================  =================================================================
``POST /v1/invocations``                    run ``{operator, key, function, args}``; ``?wait=false`` → 202
``GET  /v1/invocations/{request_id}``       the reply of an earlier invocation (``?wait_s=`` long-polls)
``GET  /v1/state/{operator}/{key}``         one entity's state through a read-only transaction (debug/admin)
``GET  /v1/operators``                      what is deployed, and the cluster's state
``GET  /healthz`` / ``/readyz``             liveness / readiness (cluster running and client connected)
``GET  /metrics``                           Prometheus exposition
==========================================  =================================================================

Status mapping. Every error body is ``{"error": {"status", "code", "message", "request_id", "reply",
"errors"}}``; ``code`` is one of a fixed set and is what programs should switch on:

====  ============================================  ===============================================
200   committed                                      body: request_id, status, result, tid, epoch,
                                                     phase, latency_ms
202   accepted (``wait=false``) / still pending      body: request_id, status "pending", location
400   ``malformed_json``, ``bad_idempotency_key``,   the request cannot be parsed or identified
      ``conflicting_request_id``
401   ``unauthorized``                               missing or wrong bearer token (``/v1/*`` only)
404   ``unknown_operator``, ``unknown_function``,    checked locally against the deployed graph
      ``unknown_request``, ``no_state_function``,
      ``not_found``
409   ``aborted``                                    user logic raised ``Abort``; ``reply`` has tid/epoch
413   ``body_too_large``                             body above ``max_body_bytes``
422   ``invalid_request`` (schema),                  wrong argument count (server ``BadRequest``),
      ``bad_request``, ``function_error``,           an exception in user code (``function_error``:
      ``idempotency_key_reused``                     e.g. a ``TypeError`` from wrongly typed arguments)
429   ``overloaded`` + ``Retry-After``               ``max_pending`` invocations or ``max_http_inflight``
                                                     HTTP requests already in flight
503   ``recovering``, ``unavailable``,              cluster recovering / coordinator unreachable /
      ``not_deployed``, ``not_ready`` + Retry-After  nothing deployed / gateway not connected yet
504   ``timeout``                                    no reply in time; the job goes on: fetch it later
====  ============================================  ===============================================

An uncaught exception in user code is reported as 422 ``function_error``, not 5xx: it is the
outcome of *this* request (typically arguments the function cannot handle), the cluster is healthy.
Business rejections should ``raise Abort(...)`` and get 409.

Idempotency: a request id comes from the ``Idempotency-Key`` header, else the body's ``request_id``,
else a fresh UUID, and is the request id the cluster sees (so server-side dedup applies as well).
Final replies (200/409/422 from the cluster) are cached for ``idempotency_ttl_s`` in a table bounded
by entries and bytes; a retry with the same id gets the identical body. A retry while the first is
still running waits on the same job (it is never sent twice by this gateway). Reusing a key with a
different payload is 422 ``idempotency_key_reused``. While ``max_pending`` jobs are pending, a new
invocation is shed with 429 before its body is read, so only an ``Idempotency-Key`` header (not a
body ``request_id``) lets a retry through to join its job or fetch its cached reply. Timeouts and
429/503 are not cached: nothing was decided, so a retry runs (and a job that timed out for its HTTP
caller keeps waiting for its reply until ``max_reply_timeout_s``, so a retry usually just joins it).

Memory is bounded by ``max_pending`` (jobs), ``max_http_inflight`` (HTTP requests in the app),
``max_cached_replies``/``max_cache_bytes`` (idempotency table) and ``max_body_bytes``.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route signatures at run time, and
# their constraints come from the gateway's config (closure variables a string annotation cannot see).
import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import signal
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Protocol

import msgspec
import uvicorn
from fastapi import Depends, FastAPI, Header, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from styx_py.client.metrics import GatewayMetrics
from styx_py.client.sdk import RequestIds, StyxClient
from styx_py.core.errors import (
    BadRequest,
    ConfigError,
    Overloaded,
    ProtocolError,
    RequestTimeout,
    StyxError,
    Unavailable,
)
from styx_py.core.limits import MAX_KEY_CHARS, MAX_REQUEST_BYTES
from styx_py.core.wire import UNDECODABLE, Key, Reply, StatusRequest, decode_value
from styx_py.io.tcp import admin_request

__all__ = [
    "Backend",
    "ClusterInfo",
    "Gateway",
    "GatewayConfig",
    "StatusSource",
    "Unavailable",
    "build_gateway",
    "serve_gateway",
]

log = logging.getLogger("styx.gateway")


# ---- configuration ---------------------------------------------------------------------------------

_MAX_NAME_CHARS = 256
_MAX_ID_CHARS = 128
_ID_PATTERN = r"^[A-Za-z0-9._:~@+=-]+$"
_ID_RE = re.compile(_ID_PATTERN.strip("^$"))  # used with fullmatch: "$" also matches before "\n"
# Consecutive failed status polls before the cluster counts as unreachable: one slow answer from a busy
# coordinator must not turn every request into a 503.
_UNREACHABLE_AFTER = 3
_INT_KEY_MIN, _INT_KEY_MAX = -(2**63), 2**64 - 1  # what msgpack can carry
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_INVOCATIONS = "/v1/invocations"
_AVAILABLE_STATES = frozenset({"running", "idle"})


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
    status_interval_s: float = 0.5
    connect_timeout_s: float = 10.0
    shutdown_grace_s: int = 5
    state_functions: Mapping[str, str] = field(default_factory=dict)
    """operator → read-only function (no arguments) that returns an entity's state, for ``/v1/state``."""

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool]] = [
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
            ("status_interval_s", self.status_interval_s > 0),
            ("connect_timeout_s", self.connect_timeout_s > 0),
            ("shutdown_grace_s", self.shutdown_grace_s >= 0),
            ("token", self.token is None or len(self.token) >= 8),
        ]
        for key, ok in checks:
            if not ok:
                raise ConfigError(f"gateway: invalid value for {key}: {getattr(self, key)!r}")
        if self.token is None and not _is_loopback(self.host):
            raise ConfigError(
                f"gateway: token is required when binding to the non-loopback address {self.host!r} "
                "(set STYX_GATEWAY_TOKEN or pass --token-file)"
            )

    @property
    def job_timeout_s(self) -> float:
        return self.max_reply_timeout_s


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---- HTTP models (the OpenAPI schema is generated from these) -------------------------------------

RequestId = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_ID_CHARS, pattern=_ID_PATTERN, examples=["transfer-2f1c9a"]),
]
StrKey = Annotated[StrictStr, Field(max_length=MAX_KEY_CHARS)]
IntKey = Annotated[StrictInt, Field(ge=_INT_KEY_MIN, le=_INT_KEY_MAX)]


class InvocationRequest(BaseModel):
    """One transaction: call ``function`` of the entity ``(operator, key)`` with ``args``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"operator": "account", "key": "alice", "function": "transfer", "args": ["bob", 30]}]
        },
    )
    operator: str = Field(min_length=1, max_length=_MAX_NAME_CHARS)
    key: StrKey | IntKey = Field(description="entity key: a string or an integer (they never collide)")
    function: str = Field(min_length=1, max_length=_MAX_NAME_CHARS)
    args: list[Any] = Field(default_factory=list, description="positional arguments (JSON values)")
    request_id: RequestId | None = Field(
        default=None, description="client-chosen request id; the Idempotency-Key header takes precedence"
    )


class InvocationReply(BaseModel):
    """The transaction's reply (also embedded in 409/422 error bodies)."""

    request_id: str
    status: Literal["committed", "aborted", "failed"]
    result: Any = None
    error: str | None = None
    error_type: str | None = Field(default=None, description="Abort, BadRequest or UserError")
    tid: int = Field(description="transaction id")
    epoch: int
    phase: int = Field(description="0 lock-free commit, 1 fallback; serial order is (epoch, phase, tid)")
    latency_ms: float = Field(description="from handing the request to Kafka to reading its reply")


class InvocationAccepted(BaseModel):
    request_id: str
    status: Literal["pending"] = "pending"
    location: str = Field(description="GET this to fetch the reply")


class ValidationIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorDetail(BaseModel):
    status: int
    code: str = Field(description="stable machine-readable error code (see the module documentation)")
    message: str
    request_id: str | None = None
    reply: InvocationReply | None = Field(default=None, description="the transaction's reply (409/422)")
    errors: list[ValidationIssue] | None = Field(default=None, description="what failed validation")


class ErrorBody(BaseModel):
    error: ErrorDetail


class StateView(BaseModel):
    operator: str
    key: str | int
    value: Any
    function: str
    consistency: Literal["read-only transaction"] = "read-only transaction"
    tid: int
    epoch: int


class OperatorInfo(BaseModel):
    name: str
    partitions: int
    functions: list[str]
    state_function: str | None = None


class ClusterSummary(BaseModel):
    state: str
    ready: bool
    graph: str | None
    operators: list[OperatorInfo]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    ready: bool
    state: str
    reason: str | None = None


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody} for s in statuses}


_V1_ERRORS = (401, 429)  # from the guard, on every /v1 route


# ---- cluster state and the backend -----------------------------------------------------------------

StatusSource = Callable[[], Awaitable[Mapping[str, Any]]]
"""Returns the coordinator's status body; injectable so tests can play a recovering cluster."""


class Backend(Protocol):
    """What the gateway needs of the SDK (:class:`~client.sdk.StyxClient` is one)."""

    async def submit(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Reply: ...

    async def close(self) -> None: ...


BackendFactory = Callable[[Mapping[str, Any], "GatewayConfig"], Awaitable[Backend]]


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The gateway's latest view of the cluster, refreshed every ``status_interval_s``."""

    state: str
    """starting | running | idle | recovering | undeployed | unreachable (or a newer server state)"""
    graph: str | None = None
    operators: Mapping[str, int] = field(default_factory=dict)
    functions: Mapping[str, frozenset[str]] = field(default_factory=dict)
    reason: str = ""

    @classmethod
    def from_status(cls, body: Mapping[str, Any]) -> "ClusterInfo":
        """Parse a coordinator status body; a missing ``state`` means running (older coordinators)."""
        try:
            ops = body.get("operators") or []
            operators = {str(op["name"]): int(op["partitions"]) for op in ops}
            functions = {str(op["name"]): frozenset(str(f) for f in op.get("functions") or []) for op in ops}
            graph = body.get("graph")
            state = str(body.get("state") or "running")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed coordinator status: {exc!r}") from exc
        if not graph or not operators:
            return cls("undeployed", None, {}, {}, "nothing is deployed")
        return cls(state, str(graph), operators, functions)

    @property
    def available(self) -> bool:
        return self.state in _AVAILABLE_STATES


def coordinator_status(address: str, timeout_s: float = 2.0) -> StatusSource:
    """The default :data:`StatusSource`: the coordinator's admin ``StatusRequest``."""

    async def fetch() -> Mapping[str, Any]:
        reply = await admin_request(address, StatusRequest(), timeout_s=timeout_s)
        if not reply.ok:
            raise StyxError(f"coordinator at {address} refused the status request: {reply.error}")
        return reply.body

    return fetch


async def connect_client(status: Mapping[str, Any], config: GatewayConfig) -> Backend:
    """The default :data:`BackendFactory`: a started :class:`StyxClient` for the deployed graph."""
    info = ClusterInfo.from_status(status)
    bootstrap = status.get("kafka_bootstrap")
    if not bootstrap:
        raise StyxError(f"the coordinator at {config.coordinator} reports no kafka_bootstrap")
    client = StyxClient(
        str(bootstrap),
        info.operators,
        ingress_topic=str(status.get("ingress_topic") or "styx-ingress"),
        egress_topic=str(status.get("egress_topic") or "styx-egress"),
        # The gateway bounds pending jobs itself; the client's bound is a backstop at the same size.
        max_pending=config.max_pending,
        timeout_s=config.connect_timeout_s,
        functions=info.functions,
    )
    await client.start()
    return client


# ---- outcomes, the reply cache and jobs -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished HTTP answer: status, JSON body bytes and extra headers (cached as is)."""

    status: int
    body: bytes
    code: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def response(self) -> Response:
        return Response(self.body, self.status, dict(self.headers), media_type="application/json")


def _json(value: Any) -> bytes:
    """JSON bytes; strings with lone surrogates (valid JSON escapes, invalid UTF-8) go through json."""
    try:
        return msgspec.json.encode(value)
    except UnicodeEncodeError:
        return json.dumps(msgspec.to_builtins(value), ensure_ascii=True).encode()


def ok(model: BaseModel, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Outcome:
    return Outcome(status, _json(model.model_dump()), None, headers)


def failure(
    status: int,
    code: str,
    message: str,
    *,
    request_id: str | None = None,
    reply: InvocationReply | None = None,
    errors: list[ValidationIssue] | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> Outcome:
    detail = ErrorDetail(
        status=status, code=code, message=message, request_id=request_id, reply=reply, errors=errors
    )
    return Outcome(status, _json(ErrorBody(error=detail).model_dump()), code, headers)


def reply_outcome(reply: Reply, latency_ms: float) -> Outcome:
    """Map the cluster's reply to the HTTP answer (see the status table in the module docstring)."""
    try:
        result = decode_value(reply.result)
    except UNDECODABLE as exc:
        return failure(502, "bad_reply", f"undecodable result: {exc}", request_id=reply.request_id)
    if reply.status not in ("committed", "aborted", "failed"):
        return failure(
            502, "bad_reply", f"unknown reply status {reply.status!r}", request_id=reply.request_id
        )
    body = InvocationReply(
        request_id=reply.request_id,
        status=reply.status,  # type: ignore[arg-type]  # checked just above
        result=result,
        error=reply.error,
        error_type=reply.error_type,
        tid=reply.tid,
        epoch=reply.epoch,
        phase=reply.phase,
        latency_ms=round(latency_ms, 3),
    )
    rid, message = reply.request_id, reply.error or "transaction did not commit"
    if reply.status == "committed":
        return ok(body)
    if reply.status == "aborted":
        return failure(409, "aborted", message, request_id=rid, reply=body)
    if reply.error_type == "BadRequest":
        return failure(422, "bad_request", message, request_id=rid, reply=body)
    return failure(
        422, "function_error", f"{reply.error_type or 'error'}: {message}", request_id=rid, reply=body
    )


@dataclass(slots=True)
class _Cached:
    fingerprint: bytes | None
    outcome: Outcome
    expires: float
    size: int


class ReplyCache:
    """Final replies by request id, for idempotent retries: LRU-by-completion, TTL, entry and byte caps."""

    def __init__(
        self, max_entries: int, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[str, _Cached] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, rid: str) -> _Cached | None:
        entry = self._entries.get(rid)
        if entry is not None and entry.expires <= self.clock():
            self._remove(rid)
            return None
        return entry

    def put(self, rid: str, fingerprint: bytes | None, outcome: Outcome) -> None:
        if rid in self._entries:
            self._remove(rid)
        size = len(outcome.body) + len(rid) + 256  # the body dominates; 256 covers the entry's objects
        self._entries[rid] = _Cached(fingerprint, outcome, self.clock() + self.ttl_s, size)
        self.bytes += size
        now = self.clock()
        while self._entries and (
            len(self._entries) > self.max_entries
            or self.bytes > self.max_bytes
            or next(iter(self._entries.values())).expires <= now
        ):
            self._remove(next(iter(self._entries)))

    def _remove(self, rid: str) -> None:
        self.bytes -= self._entries.pop(rid).size


@dataclass(slots=True)
class _Job:
    """One request handed to the cluster; every HTTP waiter for its id awaits ``done``."""

    rid: str
    fingerprint: bytes | None
    done: asyncio.Future[Outcome]
    cache: bool


def _fingerprint(operator: str, key: Key, function: str, args: list[Any]) -> bytes:
    """Identity of a payload, to refuse an idempotency key reused for a different request."""
    call = [operator, key, function, args]
    try:
        canonical = msgspec.json.encode(call, order="sorted")
    except UnicodeEncodeError:
        canonical = json.dumps(call, sort_keys=True, ensure_ascii=True).encode()
    return hashlib.sha256(canonical).digest()


# ---- the gateway --------------------------------------------------------------------------------------


@dataclass(slots=True)
class GatewayStats:
    """Counters for tests and monitoring (monotonic)."""

    jobs_started: int = 0
    peak_pending: int = 0
    idempotent_hits: int = 0
    joined_in_flight: int = 0
    shed: int = 0


class Gateway:
    """The HTTP gateway: an ASGI app (:attr:`asgi`) plus the background work it needs.

    :meth:`run` serves it with uvicorn and, in one task group, polls the coordinator's status (which
    also connects the SDK client once a graph is deployed) and runs the invocation jobs.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        status_source: StatusSource | None = None,
        backend_factory: BackendFactory | None = None,
    ) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.status_source = status_source or coordinator_status(config.coordinator)
        self.backend_factory = backend_factory or connect_client
        self.cluster = ClusterInfo("starting", reason="the coordinator has not answered yet")
        self.backend: Backend | None = None
        self.jobs: dict[str, _Job] = {}
        self._new_rid = RequestIds()  # for requests without a client-chosen id
        self.replies = ReplyCache(config.max_cached_replies, config.max_cache_bytes, config.idempotency_ttl_s)
        self.stats = GatewayStats()
        self.metrics.track(lambda: len(self.jobs), lambda: len(self.replies))
        self.app = build_app(self)
        self.asgi: ASGIApp = _Guard(self.app, self)
        self.port: int | None = None
        self._tasks: asyncio.TaskGroup | None = None
        self._job_tasks: set[asyncio.Task[None]] = set()
        self._server: _Server | None = None
        self._stop_requested = False

    # ---- lifecycle ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self.port is not None, "the gateway is not bound yet"
        host = self.config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def bind(self) -> socket.socket:
        """Bind the listening socket now, so the port (even ``port=0``) is known before serving."""
        return bind_socket(self.config.host, self.config.port)

    async def run(self, sock: socket.socket | None = None, *, handle_signals: bool = False) -> None:
        """Serve until :meth:`stop` (or SIGINT/SIGTERM with ``handle_signals``); then clean up."""
        sock = sock if sock is not None else self.bind()
        self.port = int(sock.getsockname()[1])
        server = _Server(
            uvicorn.Config(
                self.asgi,
                lifespan="off",  # the gateway's own task group is the lifecycle
                access_log=False,
                log_config=None,
                log_level="warning",
                # Longer than clients' idle pools: a server closing an idle keep-alive connection
                # races a client reusing it (httpx ReadError); uvicorn's default is 5 s.
                timeout_keep_alive=75,
                timeout_graceful_shutdown=self.config.shutdown_grace_s,
            )
        )
        self._server = server
        if self._stop_requested:
            server.should_exit = True
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.stop)
        try:
            async with asyncio.TaskGroup() as tg:
                self._tasks = tg
                watcher = tg.create_task(self._watch(), name="gateway-status")
                await server.serve(sockets=[sock])
                # No HTTP request is being handled any more: end the background work.
                watcher.cancel()
                for task in list(self._job_tasks):
                    task.cancel()
        finally:
            self._tasks = None
            if handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            backend, self.backend = self.backend, None
            if backend is not None:
                await backend.close()
            sock.close()

    def stop(self) -> None:
        """Ask the server to finish (in-flight requests get ``shutdown_grace_s``). Loop-thread only."""
        self._stop_requested = True
        if self._server is not None:
            self._server.should_exit = True

    async def _watch(self) -> None:
        """Poll the coordinator's status; connect the client once something is deployed."""
        failures = 0
        while True:
            try:
                status = await self.status_source()
                info = ClusterInfo.from_status(status)
            except (StyxError, OSError, TimeoutError, EOFError) as exc:
                failures += 1
                if failures >= _UNREACHABLE_AFTER and self.cluster.state != "unreachable":
                    log.warning("coordinator at %s unreachable: %r", self.config.coordinator, exc)
                    self.cluster = replace(self.cluster, state="unreachable", reason=f"{exc!r}")
            else:
                failures = 0
                if info.state != self.cluster.state:
                    log.info("cluster state: %s", info.state)
                self.cluster = info
                if self.backend is None and info.state != "undeployed":
                    await self._connect(status)
            await asyncio.sleep(self.config.status_interval_s)

    async def _connect(self, status: Mapping[str, Any]) -> None:
        try:
            self.backend = await self.backend_factory(status, self.config)
        except StyxError as exc:
            # Retried at the next status poll; until then /readyz says why.
            log.warning("cannot connect the gateway's client yet: %s", exc)
            self.cluster = replace(self.cluster, reason=f"client not connected: {exc}")
        else:
            log.info("gateway client connected (%s)", ", ".join(sorted(self.cluster.operators)))

    # ---- readiness ----------------------------------------------------------------------------------

    def readiness(self) -> Readiness:
        cluster = self.cluster
        if self.backend is None:
            reason = cluster.reason or "client not connected yet"
            return Readiness(ready=False, state=cluster.state, reason=reason)
        if not cluster.available:
            return Readiness(ready=False, state=cluster.state, reason=cluster.reason or None)
        return Readiness(ready=True, state=cluster.state)

    def _unavailable(self, request_id: str | None) -> Outcome | None:
        """503 (with Retry-After) when a new invocation cannot be taken; None when it can."""
        cluster = self.cluster
        retry = (("Retry-After", str(self.config.retry_after_s)),)
        match cluster.state:
            case state if state in _AVAILABLE_STATES and self.backend is not None:
                return None
            case "recovering":
                code, message = "recovering", "the cluster is recovering from a failure; retry shortly"
            case "unreachable":
                code, message = "unavailable", f"the coordinator is unreachable ({cluster.reason})"
            case "undeployed":
                code, message = "not_deployed", "nothing is deployed on the cluster"
            case state if state in _AVAILABLE_STATES or state == "starting":
                code, message = "not_ready", f"the gateway is not connected yet: {cluster.reason or state}"
            case state:
                code, message = "unavailable", f"the cluster is {state!r}"
        return failure(503, code, message, request_id=request_id, headers=retry)

    def _check_target(self, operator: str, function: str | None) -> Outcome | None:
        """404 for an operator (or, unless ``function`` is None, a function) that is not deployed."""
        functions = self.cluster.functions.get(operator)
        if functions is None:
            known = sorted(self.cluster.operators)
            return failure(404, "unknown_operator", f"unknown operator {operator!r}; known: {known}")
        if function is not None and function not in functions:
            return failure(
                404,
                "unknown_function",
                f"operator {operator!r} has no function {function!r}; known: {sorted(functions)}",
            )
        return None

    # ---- jobs ---------------------------------------------------------------------------------------

    def _start_job(
        self, rid: str, fingerprint: bytes | None, call: tuple[str, Key, str, list[Any]], *, cache: bool
    ) -> _Job | Outcome:
        """Admit and start one invocation, or answer 429 (nothing is sent then).

        The caller has checked availability (:meth:`_unavailable`) and the target first.
        """
        if len(self.jobs) >= self.config.max_pending:
            self.stats.shed += 1
            return self._overloaded(
                f"{len(self.jobs)} invocations pending (max_pending={self.config.max_pending})"
            )
        assert self._tasks is not None, "Gateway.run() is not running"
        job = _Job(rid, fingerprint, asyncio.get_running_loop().create_future(), cache)
        self.jobs[rid] = job
        self.stats.jobs_started += 1
        self.stats.peak_pending = max(self.stats.peak_pending, len(self.jobs))
        task = self._tasks.create_task(self._execute(job, call), name=f"job-{rid[:16]}")
        self._job_tasks.add(task)
        task.add_done_callback(self._job_tasks.discard)
        return job

    def _overloaded(self, message: str) -> Outcome:
        return failure(429, "overloaded", message, headers=(("Retry-After", str(self.config.retry_after_s)),))

    async def _execute(self, job: _Job, call: tuple[str, Key, str, list[Any]]) -> None:
        operator, key, function, args = call
        backend = self.backend
        assert backend is not None
        outcome: Outcome | None = None
        started = time.perf_counter()
        try:
            reply = await backend.submit(
                operator, key, function, *args, request_id=job.rid, timeout_s=self.config.job_timeout_s
            )
        except RequestTimeout:
            outcome = failure(
                504,
                "timeout",
                f"no reply within {self.config.job_timeout_s} s; the transaction may still commit",
                request_id=job.rid,
            )
        except Overloaded as exc:
            outcome = self._overloaded(str(exc))
        except BadRequest as exc:  # raised locally by the client: nothing was sent
            outcome = failure(422, "bad_request", str(exc), request_id=job.rid)
        except StyxError as exc:
            outcome = failure(
                503,
                "unavailable",
                f"cannot reach the cluster: {exc}",
                request_id=job.rid,
                headers=(("Retry-After", str(self.config.retry_after_s)),),
            )
        except asyncio.CancelledError:
            outcome = failure(503, "unavailable", "the gateway is shutting down", request_id=job.rid)
            raise
        else:
            elapsed = time.perf_counter() - started
            self.metrics.transactions.labels(reply.status).observe(elapsed)
            outcome = reply_outcome(reply, elapsed * 1000)
            if job.cache and outcome.status < 500:
                self.replies.put(job.rid, job.fingerprint, outcome)
        finally:
            del self.jobs[job.rid]
            if outcome is not None and not job.done.done():
                job.done.set_result(outcome)

    async def _wait(self, job: _Job, timeout_s: float) -> Outcome:
        try:
            return await asyncio.wait_for(asyncio.shield(job.done), timeout_s)
        except TimeoutError:
            return failure(
                504,
                "timeout",
                f"no reply within {timeout_s} s; the transaction may still commit: GET "
                f"/v1/invocations/{job.rid} or retry with the same Idempotency-Key",
                request_id=job.rid,
            )

    # ---- route logic --------------------------------------------------------------------------------

    def _respond(self, outcome: Outcome) -> Response:
        if outcome.code is not None:
            self.metrics.error(outcome.status, outcome.code)
        return outcome.response()

    async def invoke(
        self, body: InvocationRequest, idempotency_key: str | None, wait: bool, timeout_s: float | None
    ) -> Response:
        rid, problem = _request_id(idempotency_key, body.request_id)
        if problem is not None:
            return self._respond(problem)
        client_chosen = rid is not None
        rid = rid or self._new_rid()
        fingerprint = (
            _fingerprint(body.operator, body.key, body.function, body.args) if client_chosen else None
        )
        accepted = ok(
            InvocationAccepted(request_id=rid, location=f"/v1/invocations/{rid}"),
            202,
            (("Location", f"/v1/invocations/{rid}"),),
        )

        cached = self.replies.get(rid) if client_chosen else None
        if cached is not None:
            if cached.fingerprint != fingerprint:
                return self._respond(_reused(rid))
            self.stats.idempotent_hits += 1
            return self._respond(cached.outcome if wait else accepted)
        job = self.jobs.get(rid) if client_chosen else None
        if job is not None:
            if job.fingerprint != fingerprint:
                return self._respond(_reused(rid))
            self.stats.joined_in_flight += 1
        else:
            problem = self._unavailable(rid) or self._check_target(body.operator, body.function)
            if problem is None and isinstance(body.key, str) and not _utf8(body.key):
                problem = failure(422, "invalid_request", "key is not valid UTF-8 (lone surrogate)")
            if problem is not None:
                return self._respond(problem)
            started = self._start_job(
                rid, fingerprint, (body.operator, body.key, body.function, body.args), cache=True
            )
            if isinstance(started, Outcome):
                return self._respond(started)
            job = started
        if not wait:
            return self._respond(accepted)
        return self._respond(await self._wait(job, timeout_s or self.config.reply_timeout_s))

    async def fetch(self, rid: str, wait_s: float) -> Response:
        cached = self.replies.get(rid)
        if cached is not None:
            return self._respond(cached.outcome)
        job = self.jobs.get(rid)
        if job is None:
            return self._respond(
                failure(
                    404,
                    "unknown_request",
                    f"no invocation {rid!r} is pending or remembered (replies are kept "
                    f"{self.config.idempotency_ttl_s:g} s)",
                    request_id=rid,
                )
            )
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                return self._respond(await asyncio.wait_for(asyncio.shield(job.done), wait_s))
        return self._respond(ok(InvocationAccepted(request_id=rid, location=f"/v1/invocations/{rid}"), 202))

    async def state(self, operator: str, key: Key, timeout_s: float) -> Response:
        function = self.config.state_functions.get(operator)
        if function is None:
            return self._respond(
                self._unavailable(None)
                or self._check_target(operator, None)
                or failure(
                    404,
                    "no_state_function",
                    f"no state function is configured for operator {operator!r} "
                    "(gateway option --state-function OPERATOR=FUNCTION)",
                )
            )
        problem = self._unavailable(None) or self._check_target(operator, function)
        if problem is None and isinstance(key, str) and not _utf8(key):
            problem = failure(422, "invalid_request", "key is not valid UTF-8 (lone surrogate)")
        if problem is not None:
            return self._respond(problem)
        rid = f"state-{self._new_rid()}"
        started = self._start_job(rid, None, (operator, key, function, []), cache=False)
        if isinstance(started, Outcome):
            return self._respond(started)
        outcome = await self._wait(started, timeout_s)
        if outcome.status != 200:
            return self._respond(outcome)
        reply = msgspec.json.decode(outcome.body)
        view = StateView(
            operator=operator,
            key=key,
            value=reply["result"],
            function=function,
            tid=reply["tid"],
            epoch=reply["epoch"],
        )
        return self._respond(ok(view))

    def summary(self) -> ClusterSummary:
        cluster = self.cluster
        return ClusterSummary(
            state=cluster.state,
            ready=self.readiness().ready,
            graph=cluster.graph,
            operators=[
                OperatorInfo(
                    name=name,
                    partitions=partitions,
                    functions=sorted(cluster.functions.get(name, ())),
                    state_function=self.config.state_functions.get(name),
                )
                for name, partitions in sorted(cluster.operators.items())
            ],
        )


def _request_id(header: str | None, body_id: str | None) -> tuple[str | None, Outcome | None]:
    """The client-chosen request id (header first), or an answer saying why it is unusable."""
    if header is not None:
        if not (0 < len(header) <= _MAX_ID_CHARS and _ID_RE.fullmatch(header)):
            return None, failure(
                400,
                "bad_idempotency_key",
                f"Idempotency-Key must be 1..{_MAX_ID_CHARS} characters of [A-Za-z0-9._:~@+=-]",
            )
        if body_id is not None and body_id != header:
            return None, failure(
                400,
                "conflicting_request_id",
                "the Idempotency-Key header and the body's request_id differ",
                request_id=header,
            )
        return header, None
    return body_id, None


def _reused(rid: str) -> Outcome:
    return failure(
        422,
        "idempotency_key_reused",
        f"request id {rid!r} was already used for a different request",
        request_id=rid,
    )


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# ---- the ASGI guard: in-flight bound, auth, body size, metrics --------------------------------------


class _Guard:
    """Outermost ASGI layer: cheap rejections before any parsing, and per-request metrics.

    Order: 429 when ``max_http_inflight`` requests are being handled (probes are exempt, so health
    checks stay answerable under overload), 401 for ``/v1/*`` without the token, 429 for a new
    invocation while ``max_pending`` jobs are pending (before its body is read), 413 for a body above
    ``max_body_bytes`` (by Content-Length at once, else while reading it).
    """

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
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
                metrics.latency.labels(_route(scope)).observe(time.perf_counter() - started)
            await send(message)

        metrics.in_flight.inc()
        try:
            await self._handle(scope, receive, send_and_record)
        finally:
            metrics.in_flight.dec()
            if not response_started:
                metrics.latency.labels(_route(scope)).observe(time.perf_counter() - started)
            metrics.requests.labels(scope["method"], _route(scope), str(status)).inc()

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway, config = self.gateway, self.gateway.config
        path: str = scope["path"]
        probe = path in _PROBES
        if not probe and self.in_flight >= config.max_http_inflight:
            gateway.stats.shed += 1
            overloaded = gateway._overloaded(f"{self.in_flight} HTTP requests in flight")
            await _send(gateway._respond(overloaded), scope, receive, send)
            return
        if self.expected is not None and path.startswith("/v1/") and not self._authorized(scope):
            unauthorized = failure(
                401,
                "unauthorized",
                "missing or wrong bearer token",
                headers=(("WWW-Authenticate", 'Bearer realm="styx"'),),
            )
            await _send(gateway._respond(unauthorized), scope, receive, send)
            return
        if path == _INVOCATIONS and scope["method"] == "POST" and self._full(scope):
            # The cheap shed: no body read, no parsing, no await before the 429 goes out, so a burst
            # far above capacity costs microseconds a request (a retry whose Idempotency-Key names a
            # pending job or a cached reply still gets through to join or fetch it).
            gateway.stats.shed += 1
            overloaded = gateway._overloaded(
                f"{len(gateway.jobs)} invocations pending (max_pending={config.max_pending})"
            )
            await _send(gateway._respond(overloaded), scope, receive, send)
            return
        if not probe:
            self.in_flight += 1
        try:
            if scope["method"] in _BODY_METHODS:
                body = await _read_body(scope, receive, config.max_body_bytes)
                if body is None:
                    return  # the client went away
                if isinstance(body, Outcome):
                    await _send(gateway._respond(body), scope, receive, send)
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send)
        finally:
            if not probe:
                self.in_flight -= 1

    def _full(self, scope: Scope) -> bool:
        """``max_pending`` jobs are pending and the request does not name one of them (or a cached reply)
        by its Idempotency-Key header."""
        gateway = self.gateway
        if len(gateway.jobs) < gateway.config.max_pending:
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


def _route(scope: Scope) -> str:
    """Route template for metric labels (bounded), never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    # Answered by the guard before routing: a path without parameters is its own template.
    return _INVOCATIONS if scope["path"] == _INVOCATIONS else "unmatched"


async def _send(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    await response(scope, receive, send)


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | Outcome | None:
    """The whole body (bounded), a 413 answer, or None when the client disconnected."""
    too_large = failure(413, "body_too_large", f"request body larger than {limit} bytes")
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                if int(value) > limit:
                    return too_large
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
            return too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the buffered body once, then defers to the real one (disconnects)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# ---- the FastAPI app ----------------------------------------------------------------------------------


def build_app(gateway: Gateway) -> FastAPI:
    """Routes and error handlers of ``gateway`` (limits in the schema come from its config)."""
    config = gateway.config
    max_wait = config.max_reply_timeout_s
    app = FastAPI(
        title="styx-py gateway",
        version="1",
        summary="Submit serializable transactions to a styx-py cluster over HTTP.",
        description=(__doc__ or "").split("Routes")[0].strip(),
    )
    bearer = HTTPBearer(auto_error=False, description="required when the gateway has a token")

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: StarletteRequest, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        issues = [
            ValidationIssue(
                loc=[p if isinstance(p, int) else str(p) for p in e.get("loc", ())],
                msg=str(e.get("msg", "")),
                type=str(e.get("type", "")),
            )
            for e in exc.errors()
        ]
        if any(i.type == "json_invalid" for i in issues):
            return gateway._respond(
                failure(400, "malformed_json", "the body is not valid JSON", errors=issues)
            )
        return gateway._respond(
            failure(422, "invalid_request", "the request does not match the schema", errors=issues)
        )

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: StarletteRequest, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {400: "malformed_request", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        headers = tuple((exc.headers or {}).items())
        return gateway._respond(failure(exc.status_code, code, str(exc.detail), headers=headers))

    @app.exception_handler(Exception)
    async def on_bug(request: StarletteRequest, exc: Exception) -> Response:
        # Starlette logs and re-raises the exception after sending this; the shape stays JSON.
        return gateway._respond(failure(500, "internal", f"internal error: {type(exc).__name__}"))

    @app.post(
        "/v1/invocations",
        response_model=InvocationReply,
        status_code=200,
        responses={
            202: {"model": InvocationAccepted, "description": "accepted (wait=false); fetch the reply later"},
            **_errors(400, 404, 409, 413, 422, 503, 504, *_V1_ERRORS),
        },
        summary="Run one transaction",
        tags=["invocations"],
    )
    async def post_invocation(
        body: InvocationRequest,
        wait: Annotated[bool, Query(description="wait for the reply (false: 202 at once)")] = True,
        timeout_s: Annotated[
            float | None, Query(gt=0, le=max_wait, description="reply deadline (default: gateway's)")
        ] = None,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                description=f"1..{_MAX_ID_CHARS} of [A-Za-z0-9._:~@+=-]; retries with it run once",
            ),
        ] = None,
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        return await gateway.invoke(body, idempotency_key, wait, timeout_s)

    @app.get(
        "/v1/invocations/{request_id}",
        response_model=InvocationReply,
        responses={
            202: {"model": InvocationAccepted, "description": "still running"},
            **_errors(404, 409, 422, 503, 504, *_V1_ERRORS),
        },
        summary="Fetch the reply of an earlier invocation",
        tags=["invocations"],
    )
    async def get_invocation(
        request_id: Annotated[str, Path(min_length=1, max_length=_MAX_ID_CHARS, pattern=_ID_PATTERN)],
        wait_s: Annotated[float, Query(ge=0, le=max_wait, description="long-poll up to this long")] = 0.0,
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        return await gateway.fetch(request_id, wait_s)

    @app.get(
        "/v1/state/{operator}/{key}",
        response_model=StateView,
        responses=_errors(404, 409, 422, 503, 504, *_V1_ERRORS),
        summary="Read one entity's state (debug/admin) through a read-only transaction",
        description=(
            "Runs the operator's configured state function (``--state-function OPERATOR=FUNCTION``, a "
            "read-only function without arguments) as a transaction: the value is serializable with "
            "every other transaction. Not for hot paths."
        ),
        tags=["admin"],
    )
    async def get_state(
        operator: Annotated[str, Path(min_length=1, max_length=_MAX_NAME_CHARS)],
        key: Annotated[str, Path(min_length=1, max_length=MAX_KEY_CHARS)],
        key_type: Annotated[Literal["str", "int"], Query(description="how to read the key")] = "str",
        timeout_s: Annotated[float | None, Query(gt=0, le=max_wait)] = None,
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        entity_key: Key = key
        if key_type == "int":
            try:
                entity_key = int(key)
            except ValueError:
                return gateway._respond(failure(422, "invalid_request", f"key {key!r} is not an integer"))
            if not _INT_KEY_MIN <= entity_key <= _INT_KEY_MAX:
                return gateway._respond(failure(422, "invalid_request", "integer key out of range"))
        return await gateway.state(operator, entity_key, timeout_s or config.reply_timeout_s)

    @app.get(
        "/v1/operators",
        response_model=ClusterSummary,
        responses=_errors(*_V1_ERRORS),
        summary="What is deployed and the cluster's state",
        tags=["admin"],
    )
    async def get_operators(_auth: Annotated[Any, Depends(bearer)] = None) -> Response:
        return gateway._respond(ok(gateway.summary()))

    @app.get("/healthz", response_model=Health, summary="Liveness: the process answers", tags=["probes"])
    async def healthz() -> Response:
        return gateway._respond(ok(Health()))

    @app.get(
        "/readyz",
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "not ready (see reason)"}},
        summary="Readiness: cluster running and the client connected",
        tags=["probes"],
    )
    async def readyz() -> Response:
        ready = gateway.readiness()
        return gateway._respond(ok(ready, 200 if ready.ready else 503))

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus exposition"}},
        summary="Prometheus metrics",
        tags=["probes"],
    )
    async def metrics() -> Response:
        body, content_type = gateway.metrics.render()
        return Response(body, media_type=content_type)

    return app


# ---- serving -------------------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn minus its signal capture: :meth:`Gateway.run` owns the signals (also off the main thread)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; a clear error when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise StyxError(f"gateway: cannot resolve {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise StyxError(f"gateway: cannot listen on {host}:{port}: {exc}") from exc
    return sock


def build_gateway(config: GatewayConfig, **kw: Any) -> Gateway:
    """A gateway for ``config``; keyword arguments go to :class:`Gateway` (test injection points)."""
    return Gateway(config, **kw)


async def serve_gateway(config: GatewayConfig, *, announce: Callable[[str], None] | None = None) -> None:
    """Run a gateway until SIGINT/SIGTERM (the ``styx gateway`` command)."""
    gateway = build_gateway(config)
    sock = gateway.bind()
    gateway.port = int(sock.getsockname()[1])
    if announce is not None:
        announce(gateway.url)
    await gateway.run(sock, handle_signals=True)
