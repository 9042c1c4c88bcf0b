"""HTTP gateway: submit transactions to a styx-py cluster over HTTP (FastAPI on uvicorn).

The data path of one HTTP invocation::

    HTTP ──> guard (in-flight bound → bearer token → body size) ──> route (validation; POST
         /v1/invocations: the lean path of :mod:`.lean`, FastAPI for what it leaves)
         ──> idempotency table: cached final reply | join the in-flight job | start a job
         ──> the gateway's one StyxClient (one producer, ONE egress consumer for every waiter)
         ──> Kafka ──> cluster ──> reply ──> JSON body, cached under the request id

Routes (JSON everywhere; OpenAPI at ``/openapi.json``, Swagger UI at ``/docs``, Redoc at ``/redoc``,
served offline by :mod:`.apidoc`; the user-facing description and the error table are there and in
:mod:`.codes`):

==========================================  =================================================================
``POST /v1/invocations``                    run ``{operator, key, function, args}``; ``?wait=false`` → 202
``GET  /v1/invocations/{request_id}``       the reply of an earlier invocation (``?wait_s=`` long-polls)
``GET  /v1/invocations``                    this replica's recent invocations (:mod:`.listing`)
``GET  /v1/invocations/{request_id}/view``  one invocation: its call, reply, call graph and entities
``GET  /v1/cluster``                        the cluster's status and its recent history (:mod:`.console`)
``GET  /v1/effects?owner=``                 one entity's pending external calls and timers
``GET  /console``                           the web console (static; its data from the routes above)
``GET  /v1/state/{operator}/{key}``         one entity's state through a read-only transaction (debug/admin)
``GET  /v1/state/{operator}``               committed entities as of one epoch, by pages (:mod:`.stateread`)
``GET  /v1/state/{operator}/{key}/stored``  one entity's stored value as of a committed epoch
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
400   ``malformed_json``, ``bad_idempotency_key``,   the request cannot be parsed (strict JSON: no
      ``conflicting_request_id``                     ``NaN``/``Infinity``) or identified
401   ``unauthorized``                               missing or wrong bearer token (``/v1/*`` only)
404   ``unknown_operator``, ``unknown_function``,    checked locally against the deployed graph
      ``unknown_request``, ``no_state_function``,
      ``not_found``
409   ``aborted``                                    user logic raised ``Abort``; ``reply`` has tid/epoch
413   ``body_too_large``                             body above ``max_body_bytes``
422   ``invalid_request`` (schema),                  a limit of ``styx_py.core.limits`` (size, argument
      ``bad_request``, ``function_error``,           nesting: ``bad_request``, nothing sent), wrong
      ``idempotency_key_reused``                     argument count (server ``BadRequest``), an
                                                     exception in user code (``function_error``:
                                                     e.g. a ``TypeError`` from wrongly typed arguments)
429   ``overloaded`` + ``Retry-After``               ``max_pending`` invocations or ``max_http_inflight``
                                                     HTTP requests already in flight, or the cluster
                                                     refused it (admission control; ``reply`` status
                                                     ``refused``)
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
from typing import Annotated, Any, Literal, Protocol

from fastapi import Depends, FastAPI, Header, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.types import ASGIApp

from styx_client.gateway.apidoc import API_DESCRIPTION, add_doc_routes
from styx_client.gateway.cluster import ClusterLink
from styx_client.gateway.config import GatewayConfig
from styx_client.gateway.console import add_console_routes
from styx_client.gateway.effects_view import add_effects_routes
from styx_client.gateway.history import ClusterHistory
from styx_client.gateway.invocations import Invocations
from styx_client.gateway.jobs import Jobs
from styx_client.gateway.lean import serve_lean
from styx_client.gateway.listing import add_listing_routes
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.models import (
    ID_PATTERN,
    MAX_ID_CHARS,
    ClusterSummary,
    ErrorBody,
    Health,
    InvocationAccepted,
    InvocationReply,
    InvocationRequest,
    Readiness,
    StateView,
    ValidationIssue,
)
from styx_client.gateway.outcomes import Outcome, failure, ok, parse_key, respond
from styx_client.gateway.recent import RecentInvocations
from styx_client.gateway.stateread import add_state_routes
from styx_client.gateway.strict_json import StrictJsonRoute
from styx_py.core.limits import MAX_KEY_CHARS, MAX_NAME_CHARS
from styx_py.io.stateread import ReadSource

__all__ = ["Served", "build_app", "direct_routes"]

_V1_ERRORS = (401, 429)  # from the guard, on every /v1 route


class Served(Protocol):
    """What the app needs of the gateway."""

    config: GatewayConfig
    metrics: GatewayMetrics
    link: ClusterLink
    invocations: Invocations
    recent: RecentInvocations
    jobs: Jobs
    history: ClusterHistory
    state_reads: ReadSource


def build_app(gateway: Served) -> FastAPI:
    """Routes and error handlers of ``gateway`` (limits in the schema come from its config).

    Every route has an explicit ``operation_id`` (``submitInvocation``, ...): clients are generated from
    them, so they never change with a function's name.
    """
    app = FastAPI(
        title="styx-py gateway",
        version="1",
        summary="Submit serializable transactions to a styx-py cluster over HTTP.",
        description=API_DESCRIPTION,
        docs_url=None,  # served by add_doc_routes, from local assets
        redoc_url=None,
    )
    app.router.route_class = StrictJsonRoute
    add_doc_routes(app)
    bearer = HTTPBearer(auto_error=False, description="required when the gateway has a token")
    _add_error_handlers(app, gateway.metrics)
    _add_invocation_routes(app, gateway, bearer)
    add_listing_routes(app, gateway, bearer)
    add_console_routes(app, gateway, bearer)
    add_effects_routes(app, gateway, bearer)
    _add_admin_routes(app, gateway, bearer)
    add_state_routes(app, gateway, bearer)
    _add_probe_routes(app, gateway)
    return app


def direct_routes(app: FastAPI, gateway: Served) -> dict[tuple[str, str], ASGIApp]:
    """(method, path) → the ASGI app the guard calls for it instead of ``app`` (:mod:`.lean`).

    ``POST /v1/invocations`` as declared in ``app`` is its OpenAPI schema and the answer to what the
    lean path leaves to FastAPI (errors, uncommon query strings), through the whole app."""
    return {("POST", "/v1/invocations"): serve_lean(app, gateway.invocations.invoke, gateway.metrics)}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody} for s in statuses}


def _add_error_handlers(app: FastAPI, metrics: GatewayMetrics) -> None:
    """Every error, FastAPI's and Starlette's included, answers with the gateway's error body."""

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: StarletteRequest, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return respond(_invalid(exc), metrics)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: StarletteRequest, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {400: "malformed_request", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        headers = tuple((exc.headers or {}).items())
        return respond(failure(exc.status_code, code, str(exc.detail), headers=headers), metrics)

    @app.exception_handler(Exception)
    async def on_bug(request: StarletteRequest, exc: Exception) -> Response:
        # Starlette logs and re-raises the exception after sending this; the shape stays JSON.
        return respond(failure(500, "internal", f"internal error: {type(exc).__name__}"), metrics)


def _invalid(exc: RequestValidationError) -> Outcome:
    """400 for a body that is not JSON, else 422: the request does not match the schema."""
    issues = [
        ValidationIssue(
            loc=[p if isinstance(p, int) else str(p) for p in e.get("loc", ())],
            msg=str(e.get("msg", "")),
            type=str(e.get("type", "")),
        )
        for e in exc.errors()
    ]
    if any(i.type == "json_invalid" for i in issues):
        why = next((str(e["ctx"]["error"]) for e in exc.errors() if "error" in e.get("ctx", {})), "")
        message = f"the body is not valid JSON: {why}" if why else "the body is not valid JSON"
        return failure(400, "malformed_json", message, errors=issues)
    return failure(422, "invalid_request", "the request does not match the schema", errors=issues)


def _add_invocation_routes(app: FastAPI, gateway: Served, bearer: HTTPBearer) -> None:
    invocations, metrics = gateway.invocations, gateway.metrics
    max_wait = gateway.config.timing.max_reply_timeout_s

    @app.post(
        "/v1/invocations",
        response_model=InvocationReply,
        status_code=200,
        responses={
            202: {"model": InvocationAccepted, "description": "accepted (wait=false); fetch the reply later"},
            **_errors(400, 404, 409, 413, 415, 422, 503, 504, *_V1_ERRORS),
        },
        summary="Run one transaction",
        operation_id="submitInvocation",
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
                description=f"1..{MAX_ID_CHARS} of [A-Za-z0-9._:~@+=-]; retries with it run once",
            ),
        ] = None,
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        return respond(await invocations.invoke(body, idempotency_key, wait, timeout_s), metrics)

    @app.get(
        "/v1/invocations/{request_id}",
        response_model=InvocationReply,
        responses={
            202: {"model": InvocationAccepted, "description": "still running"},
            **_errors(404, 409, 422, 503, 504, *_V1_ERRORS),
        },
        summary="Fetch the reply of an earlier invocation (from any gateway replica)",
        operation_id="getInvocation",
        tags=["invocations"],
    )
    async def get_invocation(
        request_id: Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN)],
        wait_s: Annotated[float, Query(ge=0, le=max_wait, description="long-poll up to this long")] = 0.0,
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        return respond(await invocations.fetch(request_id, wait_s), metrics)


def _add_admin_routes(app: FastAPI, gateway: Served, bearer: HTTPBearer) -> None:
    invocations, link, metrics = gateway.invocations, gateway.link, gateway.metrics
    max_wait, default_wait = gateway.config.timing.max_reply_timeout_s, gateway.config.timing.reply_timeout_s

    @app.get(
        "/v1/state/{operator}/{key}",
        response_model=StateView,
        responses=_errors(404, 409, 422, 503, 504, *_V1_ERRORS),
        summary="Read one entity's state (debug/admin) through a read-only transaction",
        operation_id="getState",
        description=(
            "Runs the operator's state function as a read-only transaction: the value is serializable "
            "with every other transaction. The function is the one the deployed app declares "
            "(`@op.function(state=True)`, or the operator's only read-only function without "
            "arguments); the gateway's `--state-function OPERATOR=FUNCTION` overrides it. Not for hot "
            "paths."
        ),
        tags=["admin"],
    )
    async def get_state(
        operator: Annotated[str, Path(min_length=1, max_length=MAX_NAME_CHARS)],
        key: Annotated[str, Path(min_length=1, max_length=MAX_KEY_CHARS)],
        key_type: Annotated[Literal["str", "int"], Query(description="how to read the key")] = "str",
        timeout_s: Annotated[float | None, Query(gt=0, le=max_wait)] = None,
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        entity_key = parse_key(key, key_type)
        if isinstance(entity_key, Outcome):
            return respond(entity_key, metrics)
        return respond(await invocations.state(operator, entity_key, timeout_s or default_wait), metrics)

    @app.get(
        "/v1/operators",
        response_model=ClusterSummary,
        responses=_errors(*_V1_ERRORS),
        summary="What is deployed and the cluster's state",
        operation_id="listOperators",
        tags=["admin"],
    )
    async def get_operators(_auth: Annotated[Any, Depends(bearer)] = None) -> Response:
        return respond(ok(link.summary()), metrics)


def _add_probe_routes(app: FastAPI, gateway: Served) -> None:
    link, gateway_metrics = gateway.link, gateway.metrics

    @app.get(
        "/healthz",
        response_model=Health,
        summary="Liveness: the process answers",
        operation_id="getHealth",
        tags=["probes"],
    )
    async def healthz() -> Response:
        return respond(ok(Health()), gateway_metrics)

    @app.get(
        "/readyz",
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "not ready (see reason)"}},
        summary="Readiness: cluster running and the client connected",
        operation_id="getReadiness",
        tags=["probes"],
    )
    async def readyz() -> Response:
        ready = link.readiness()
        return respond(ok(ready, 200 if ready.ready else 503), gateway_metrics)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus exposition"}},
        summary="Prometheus metrics",
        operation_id="getMetrics",
        tags=["probes"],
    )
    async def metrics() -> Response:
        body, content_type = gateway_metrics.render()
        return Response(body, media_type=content_type)
