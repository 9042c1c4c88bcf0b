"""HTTP models of the gateway: the OpenAPI schema is generated from these, with the limits on names, ids
and keys of :mod:`styx_py.core.limits` (the ones every path checks), so the schema states them."""

# No ``from __future__ import annotations``: pydantic and FastAPI read these annotations at run time.
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from styx_client.gateway.codes import ERROR_CODES, error_table
from styx_py.core.limits import (
    MAX_INT_KEY,
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_REQUEST_ID_CHARS,
    MIN_INT_KEY,
)

__all__ = [
    "ClusterSummary",
    "ErrorBody",
    "ErrorDetail",
    "Health",
    "InvocationAccepted",
    "InvocationPage",
    "InvocationReply",
    "InvocationRequest",
    "InvocationView",
    "OperatorInfo",
    "Readiness",
    "StateView",
    "ValidationIssue",
]

MAX_ID_CHARS = MAX_REQUEST_ID_CHARS
# Request ids in URLs: the core limits their length; HTTP also limits their characters.
ID_PATTERN = r"^[A-Za-z0-9._:~@+=-]+$"
ID_RE = re.compile(ID_PATTERN.strip("^$"))  # used with fullmatch: "$" also matches before "\n"
INT_KEY_MIN, INT_KEY_MAX = MIN_INT_KEY, MAX_INT_KEY

RequestId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN, examples=["transfer-2f1c9a"]),
]
StrKey = Annotated[StrictStr, Field(max_length=MAX_KEY_CHARS)]
IntKey = Annotated[StrictInt, Field(ge=INT_KEY_MIN, le=INT_KEY_MAX)]


class InvocationRequest(BaseModel):
    """One transaction: call ``function`` of the entity ``(operator, key)`` with ``args``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"operator": "account", "key": "alice", "function": "transfer", "args": ["bob", 30]}]
        },
    )
    operator: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    key: StrKey | IntKey = Field(description="entity key: a string or an integer (they never collide)")
    function: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    args: list[Any] = Field(default_factory=list, description="positional arguments (JSON values)")
    request_id: RequestId | None = Field(
        default=None, description="client-chosen request id; the Idempotency-Key header takes precedence"
    )


class InvocationReply(BaseModel):
    """The transaction's reply (also embedded in 409/422 error bodies).

    A function of the cluster's reply alone, so every gateway replica and every retry returns the same
    bytes; the gateway's own submit → reply time is in the ``Server-Timing`` header."""

    request_id: str
    status: Literal["committed", "aborted", "failed", "refused"]
    result: Any = None
    error: str | None = None
    error_type: str | None = Field(
        default=None, description="Abort, BadRequest, UserError or Overloaded (status refused)"
    )
    tid: int = Field(description="transaction id")
    epoch: int
    phase: int = Field(description="0 lock-free commit, 1 fallback; serial order is (epoch, phase, tid)")
    reason: Literal["backlog", "entity"] | None = Field(
        default=None,
        description="status refused: which admission bound refused it (backlog or entity); absent otherwise",
        exclude_if=lambda v: v is None,
    )


class InvocationAccepted(BaseModel):
    request_id: str
    status: Literal["pending"] = "pending"
    location: str = Field(description="GET this to fetch the reply")


class CallNode(BaseModel):
    """One invocation of a transaction's call graph, as the worker that ran it retains it."""

    path: list[int] = Field(
        description="its place in the call graph: child indices from the root ([]: the root)"
    )
    operator: str
    key: str | int
    function: str
    status: Literal["ok", "abort", "error", "bad", "changed", "propagated"]
    wrote: bool = Field(description="the transaction wrote this entity (else it only read it)")


class EntityTouched(BaseModel):
    operator: str
    key: str | int
    wrote: bool = Field(description="written (a put or a delete) by the transaction, else only read")


class InvocationView(BaseModel):
    """One invocation as the window of recent invocations holds it (``source`` "gateway"), or as the
    cluster's reply tables do (``source`` "cluster": an invocation another replica sent; its call is
    not known here, only its reply)."""

    request_id: str
    cursor: str | None = Field(description="its place in the listing (pass as ?after= for the next page)")
    status: Literal["pending", "committed", "aborted", "failed", "error"] = Field(
        description="error: no reply from the cluster (timeout, unavailable, refused); see code"
    )
    operator: str | None
    key: str | int | None = Field(description="the entity the invocation called (with operator)")
    function: str | None
    args: list[Any] | None
    submitted_at: float | None = Field(description="Unix time (s) this gateway sent it")
    latency_ms: float | None = Field(description="submit to reply, as this gateway measured it")
    http_status: int | None = Field(description="the status POST /v1/invocations answered with")
    code: str | None = Field(description="the error code of that answer, if it was an error")
    tid: int | None
    epoch: int | None
    phase: int | None = Field(
        description="0 lock-free commit, 1 fallback; serial order is (epoch, phase, tid)"
    )
    result: Any = None
    error: str | None
    error_type: str | None
    source: Literal["gateway", "cluster"]
    calls: list[CallNode] | None = Field(
        None,
        description="the call graph of the transaction that gave the reply, root first (only in the view "
        "of one invocation; null without a reply); each worker retains the invocations of its 1 000 most "
        "recent request ids, at most 64 each",
    )
    entities: list[EntityTouched] | None = Field(None, description="the entities those invocations ran on")
    graph_complete: bool | None = Field(
        None, description="every worker answered (false: a worker was recovering or did not answer)"
    )


class InvocationPage(BaseModel):
    invocations: list[InvocationView] = Field(description="newest first")
    next_after: str | None = Field(description="cursor of the next (older) page; null: no more")
    retained: int = Field(description="invocations the window holds now (scope cluster: found)")
    window: int = Field(
        description="its size: the most it holds (max_recent_invocations; scope cluster: asked per worker)"
    )
    scope: Literal["gateway", "cluster"] = "gateway"
    complete: bool = Field(default=True, description="scope cluster: every worker answered")


class ValidationIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorDetail(BaseModel):
    status: int
    code: str = Field(
        description=f"Stable machine-readable error code:\n\n{error_table()}",
        json_schema_extra={"enum": [e.code for e in sorted(ERROR_CODES, key=lambda e: e.code)]},
    )
    message: str
    request_id: str | None = None
    reply: InvocationReply | None = Field(default=None, description="the transaction's reply (409/422)")
    errors: list[ValidationIssue] | None = Field(default=None, description="what failed validation")
    reason: Literal["client", "backlog", "entity"] | None = Field(
        default=None,
        exclude_if=lambda v: v is None,  # absent from the other errors' bodies
        description=(
            "429 overloaded: which bound refused it: client (this gateway's own limits: max_pending, "
            "HTTP requests in flight), backlog (the cluster is over its admission bound: back off) or entity "
            "(calls of the function queue behind the request's root entity, named in the message: a hot "
            "key, other entities are admitted)"
        ),
    )


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
