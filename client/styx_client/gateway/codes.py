"""Every error code the gateway answers with: its HTTP status and what it means.

One table, used three ways: the OpenAPI document (the ``code`` enum of the error body and the error
table in the API description), ``docs/http-api.md``, and a test that checks every ``failure(...)`` in
the gateway names a code listed here with its status.
"""

from dataclasses import dataclass

__all__ = ["ERROR_CODES", "ErrorCode", "error_table"]


@dataclass(frozen=True, slots=True)
class ErrorCode:
    code: str
    status: int
    meaning: str
    retry: bool = False
    """Retrying the same request later may succeed (with the same Idempotency-Key)."""


ERROR_CODES: tuple[ErrorCode, ...] = (
    ErrorCode(
        "malformed_json", 400, "the body is not strict JSON (RFC 8259: no NaN/Infinity) or nests too deep"
    ),
    ErrorCode("malformed_request", 400, "the HTTP request cannot be parsed (e.g. an invalid Content-Length)"),
    ErrorCode("bad_idempotency_key", 400, "Idempotency-Key is not 1..128 characters of [A-Za-z0-9._:~@+=-]"),
    ErrorCode("conflicting_request_id", 400, "the Idempotency-Key header and the body's request_id differ"),
    ErrorCode("unauthorized", 401, "missing or wrong bearer token (/v1/* when the gateway has a token)"),
    ErrorCode("unknown_operator", 404, "no such operator in the deployed graph"),
    ErrorCode("unknown_function", 404, "the operator has no such function"),
    ErrorCode(
        "unknown_request",
        404,
        "this replica does not run the request id and no worker runs it or holds its reply (never "
        "sent, evicted from the reply table, or sent moments ago: long-poll with wait_s)",
    ),
    ErrorCode(
        "no_state_function",
        404,
        "the operator declares no state function and the gateway has no --state-function for it",
    ),
    ErrorCode("not_found", 404, "no such route"),
    ErrorCode("method_not_allowed", 405, "the route does not take this HTTP method"),
    ErrorCode(
        "epoch_not_committed",
        409,
        "as_of_epoch is newer than the newest committed epoch (the error names it)",
    ),
    ErrorCode(
        "epoch_out_of_window",
        410,
        "as_of_epoch (or the cursor's epoch) is older than the workers keep in memory "
        "(state_window_epochs, or their last recovery): styx sql --as-of-epoch reads older epochs",
    ),
    ErrorCode("aborted", 409, "the function raised Abort: a business rejection; error.reply has tid/epoch"),
    ErrorCode("body_too_large", 413, "the body is larger than the gateway's max_body_bytes"),
    ErrorCode(
        "unsupported_media_type",
        415,
        "the body is declared as something other than JSON: send Content-Type: application/json "
        "(curl --json) or no Content-Type",
    ),
    ErrorCode("invalid_request", 422, "the body or a parameter does not match the schema (see error.errors)"),
    ErrorCode(
        "bad_request", 422, "a limit of the core (sizes, argument nesting) or a wrong number of arguments"
    ),
    ErrorCode(
        "function_error", 422, "the function raised an exception (e.g. a TypeError from its arguments)"
    ),
    ErrorCode("idempotency_key_reused", 422, "the request id was already used for a different request"),
    ErrorCode(
        "overloaded",
        429,
        "too many invocations or HTTP requests in flight (error.reason client), or the cluster refused the "
        "request (reply.status refused: admission control, a new Idempotency-Key to retry; error.reason "
        "backlog: the cluster is over its bound, entity: calls queue behind this request's root entity, a "
        "hot key); see Retry-After",
        True,
    ),
    ErrorCode("http_error", 400, "another HTTP-level error from the framework (its own status)"),
    ErrorCode("internal", 500, "a bug in the gateway (its log has the traceback)"),
    ErrorCode("bad_reply", 502, "the cluster's reply cannot be decoded"),
    ErrorCode("recovering", 503, "the cluster is recovering from a failure; see Retry-After", True),
    ErrorCode(
        "unavailable",
        503,
        "the coordinator is unreachable, the gateway is stopping, or a worker could not say whether it "
        "holds a reply; see Retry-After",
        True,
    ),
    ErrorCode("not_deployed", 503, "nothing is deployed on the cluster", True),
    ErrorCode("not_ready", 503, "the gateway has not connected to the cluster yet", True),
    ErrorCode(
        "timeout",
        504,
        "no reply in time; the transaction may still commit: GET /v1/invocations/{id} or retry with "
        "the same Idempotency-Key",
        True,
    ),
)


def error_table() -> str:
    """The codes as a Markdown table (OpenAPI description, docs/http-api.md)."""
    rows = [
        f"| {e.status} | `{e.code}` | {e.meaning}{' (retryable)' if e.retry else ''} |"
        for e in sorted(ERROR_CODES, key=lambda e: (e.status, e.code))
    ]
    return "\n".join(["| status | code | meaning |", "|---|---|---|", *rows])
