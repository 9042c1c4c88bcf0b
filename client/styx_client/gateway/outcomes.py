"""Finished HTTP answers: a status, JSON body bytes and headers, built once and cached as they are.

:func:`reply_outcome` maps the cluster's reply onto one (the status table is in ``app.py``);
:func:`failure` builds every error body, ``{"error": {"status", "code", "message", "request_id",
"reply", "errors"}}``; :func:`respond` turns an outcome into a response and counts the error codes.
"""

import json
from dataclasses import dataclass
from typing import Any

import msgspec
from pydantic import BaseModel
from starlette.responses import Response

from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.models import (
    INT_KEY_MAX,
    INT_KEY_MIN,
    ErrorBody,
    ErrorDetail,
    InvocationReply,
    ValidationIssue,
)
from styx_py.core.wire import UNDECODABLE, Key, Reply, decode_value

__all__ = [
    "Outcome",
    "failure",
    "json_bytes",
    "ok",
    "overloaded",
    "parse_key",
    "reply_outcome",
    "respond",
    "retry_after",
]

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished HTTP answer: status, JSON body bytes and extra headers (cached as is)."""

    status: int
    body: bytes
    code: str | None = None
    headers: Headers = ()

    def response(self) -> Response:
        return Response(self.body, self.status, dict(self.headers), media_type="application/json")


def respond(outcome: Outcome, metrics: GatewayMetrics) -> Response:
    """The response of ``outcome``; an error outcome counts in the error metrics."""
    if outcome.code is not None:
        metrics.error(outcome.status, outcome.code)
    return outcome.response()


def json_bytes(value: Any) -> bytes:
    """JSON bytes; strings with lone surrogates (valid JSON escapes, invalid UTF-8) go through json."""
    try:
        return msgspec.json.encode(value)
    except UnicodeEncodeError:
        return json.dumps(msgspec.to_builtins(value), ensure_ascii=True).encode()


def ok(model: BaseModel, status: int = 200, headers: Headers = ()) -> Outcome:
    return Outcome(status, json_bytes(model.model_dump()), None, headers)


def failure(
    status: int,
    code: str,
    message: str,
    *,
    request_id: str | None = None,
    reply: InvocationReply | None = None,
    errors: list[ValidationIssue] | None = None,
    headers: Headers = (),
    reason: str | None = None,
) -> Outcome:
    detail = ErrorDetail(
        status=status,
        code=code,
        message=message,
        request_id=request_id,
        reply=reply,
        errors=errors,
        reason=reason,  # type: ignore[arg-type]  # a Refusal, or "client"
    )
    return Outcome(status, json_bytes(ErrorBody(error=detail).model_dump()), code, headers)


def retry_after(seconds: int) -> Headers:
    return (("Retry-After", str(seconds)),)


def overloaded(message: str, retry_after_s: int) -> Outcome:
    return failure(429, "overloaded", message, headers=retry_after(retry_after_s), reason="client")


def reply_outcome(reply: Reply, latency_ms: float | None = None, retry_after_s: int = 1) -> Outcome:
    """Map the cluster's reply to the HTTP answer (see the status table in ``app.py``).

    The body depends on ``reply`` alone (byte-identical on every replica, for every retry);
    ``latency_ms``, when this gateway measured one, goes in a ``Server-Timing`` header. A request the
    cluster refused (not admitted: over its admission bound) is 429 ``overloaded`` with Retry-After and
    the bound that refused it (``reason``: backlog or entity)."""
    try:
        result = decode_value(reply.result)
    except UNDECODABLE as exc:
        return failure(502, "bad_reply", f"undecodable result: {exc}", request_id=reply.request_id)
    if reply.status not in ("committed", "aborted", "failed", "refused"):
        return failure(
            502, "bad_reply", f"unknown reply status {reply.status!r}", request_id=reply.request_id
        )
    # InvocationReply's fields in its order: the bytes its model_dump() would give, without the model
    # on the hot path (a committed reply), ~10 % of the gateway's CPU per invocation when profiled.
    fields = {
        "request_id": reply.request_id,
        "status": reply.status,
        "result": result,
        "error": reply.error,
        "error_type": reply.error_type,
        "tid": reply.tid,
        "epoch": reply.epoch,
        "phase": int(reply.phase),
    }
    timing: Headers = () if latency_ms is None else (("Server-Timing", f"cluster;dur={latency_ms:.3f}"),)
    if reply.status == "committed":
        return Outcome(200, json_bytes(fields), None, timing)
    reason = (reply.reason or "backlog") if reply.status == "refused" else None
    body = InvocationReply(**fields, reason=reason)  # type: ignore[arg-type]  # a Refusal
    rid, message = reply.request_id, reply.error or "transaction did not commit"
    if reply.status == "aborted":
        return failure(409, "aborted", message, request_id=rid, reply=body, headers=timing)
    if reply.status == "refused":
        headers = timing + retry_after(retry_after_s)
        return failure(
            429, "overloaded", message, request_id=rid, reply=body, headers=headers, reason=body.reason
        )
    if reply.error_type == "BadRequest":
        return failure(422, "bad_request", message, request_id=rid, reply=body, headers=timing)
    return failure(
        422,
        "function_error",
        f"{reply.error_type or 'error'}: {message}",
        request_id=rid,
        reply=body,
        headers=timing,
    )


def parse_key(key: str, key_type: str) -> Key | Outcome:
    """The path's key as ``key_type`` says, or 422 for an integer key that is not one (or too large)."""
    if key_type != "int":
        return key
    try:
        number = int(key)
    except ValueError:
        return failure(422, "invalid_request", f"key {key!r} is not an integer")
    if not INT_KEY_MIN <= number <= INT_KEY_MAX:
        return failure(422, "invalid_request", "integer key out of range")
    return number
