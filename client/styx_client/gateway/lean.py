"""``POST /v1/invocations`` served as a plain ASGI app: msgspec decodes and validates the body, the
outcome's bytes go straight to ``send``.

FastAPI still declares the route (its OpenAPI schema comes from the declared signature and
:class:`~styx_client.gateway.models.InvocationRequest`), but the guard calls :func:`serve_lean`'s app
for it instead of FastAPI's: per request there is no middleware, routing, dependency injection,
pydantic model or Response object. Profiled with a backend that answers at once, FastAPI's request
handling (dependency solving, parameter validation, the body model) took ~70 % of the gateway's CPU
per invocation.

Every request the lean path is not sure about goes to the FastAPI app unchanged, with the buffered
body: a body msgspec refuses (not JSON, ``NaN``, nested too deep, outside the schema), a request id
outside ``[A-Za-z0-9._:~@+=-]``, or any query string other than ``wait=true|false``. So every error
body (400 ``malformed_json``, 422 ``invalid_request`` with pydantic's ``errors``) is the one FastAPI
gives, and :class:`InvocationBody` only has to accept a subset of what the pydantic model accepts.
"""

from collections.abc import Awaitable
from typing import Annotated, Any, Protocol

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

from styx_client.gateway.guard import replay_body
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.models import ID_RE, INT_KEY_MAX, INT_KEY_MIN, MAX_ID_CHARS
from styx_client.gateway.outcomes import Outcome, failure
from styx_py.core.limits import MAX_KEY_CHARS, MAX_NAME_CHARS

__all__ = ["InvocationBody", "serve_lean"]

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]


class InvocationBody(msgspec.Struct, forbid_unknown_fields=True):
    """The body of ``POST /v1/invocations`` (the same fields and limits as ``InvocationRequest``)."""

    operator: _Name
    # An int key's range (up to 2**64 - 1) is checked by _decode: msgspec's bounds stop at int64.
    key: Annotated[str, msgspec.Meta(max_length=MAX_KEY_CHARS)] | int
    function: _Name
    args: list[Any] = []
    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)] | None = None


class _Invoke(Protocol):
    def __call__(
        self, body: InvocationBody, idempotency_key: str | None, wait: bool, timeout_s: float | None
    ) -> Awaitable[Outcome]: ...


_DECODER = msgspec.json.Decoder(InvocationBody)
_WAIT = {b"": True, b"wait=true": True, b"wait=false": False}
_JSON = (b"content-type", b"application/json")


def serve_lean(slow: ASGIApp, invoke: _Invoke, metrics: GatewayMetrics) -> ASGIApp:
    """The route's ASGI app: the lean path for a body and query it is sure about, else ``slow``
    (the FastAPI app)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()  # the guard has buffered the whole body into this one message
        assert message["type"] == "http.request" and not message.get("more_body"), message["type"]
        body: bytes = message["body"]
        wait = _WAIT.get(scope["query_string"])
        call = None if wait is None else _decode(body)
        if wait is None or call is None:
            await slow(scope, replay_body(body, receive), send)
            return
        key = None
        for name, value in scope["headers"]:
            if name == b"idempotency-key":
                key = value.decode("latin-1")
                break  # the first, as FastAPI's Header() reads it
        try:
            outcome = await invoke(call, key, wait, None)
        except Exception as exc:
            # As FastAPI's handler of uncaught errors answers (app.py), then logged by uvicorn.
            await _send(failure(500, "internal", f"internal error: {type(exc).__name__}"), send)
            raise
        if outcome.code is not None:
            metrics.error(outcome.status, outcome.code)
        await _send(outcome, send)

    return app


def _decode(body: bytes) -> InvocationBody | None:
    """The body, or None for anything FastAPI should answer (and explain)."""
    try:
        call = _DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    if call.request_id is not None and not ID_RE.fullmatch(call.request_id):
        return None
    key = call.key
    if isinstance(key, int) and not INT_KEY_MIN <= key <= INT_KEY_MAX:
        return None
    return call


async def _send(outcome: Outcome, send: Send) -> None:
    body = outcome.body
    headers = [_JSON, (b"content-length", b"%d" % len(body))]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in outcome.headers]
    await send({"type": "http.response.start", "status": outcome.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
