"""The routes over the window of recent invocations (:mod:`.recent`): the listing, and the view of one.

``GET /v1/invocations`` lists this replica's recent invocations, newest first, filtered by status and
operator, a page at a time (``after`` is the ``next_after`` cursor of the previous page). With
``scope=cluster`` it lists the cluster's instead: each worker's most recent transactions (the roots it
retains, :mod:`styx_worker.traces`, with their replies from the reply tables), newest first in the
serial order, one page (no cursor), their calls' arguments not known.
``GET /v1/invocations/{id}/view`` shows one: the call and its reply from the window, else the reply
alone from the cluster's reply tables (an invocation another replica sent, or one the window has
dropped), else why there is none (202 pending, 404 unknown, 503 cannot tell); and, from the workers,
the call graph of the transaction that gave the reply and the entities it touched
(:mod:`styx_worker.traces`).
"""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at run time.
from typing import Annotated, Any, Literal, Protocol

from fastapi import Depends, FastAPI, Path, Query
from fastapi.security import HTTPBearer
from starlette.responses import Response

from styx_client.gateway.config import GatewayConfig
from styx_client.gateway.invocations import Invocations
from styx_client.gateway.lookups import Found
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.models import (
    ID_PATTERN,
    MAX_ID_CHARS,
    CallNode,
    EntityTouched,
    ErrorBody,
    InvocationAccepted,
    InvocationPage,
    InvocationView,
)
from styx_client.gateway.outcomes import Outcome, failure, ok, respond
from styx_client.gateway.recent import RecentInvocations, reply_fields
from styx_py.core.limits import MAX_NAME_CHARS, MAX_RECENT_LOOKUP
from styx_py.core.wire import Reply, Status

__all__ = ["MAX_LIST_LIMIT", "add_listing_routes"]

MAX_LIST_LIMIT = 500  # invocations in one page
DEFAULT_LIST_LIMIT = 50


class Listed(Protocol):
    config: GatewayConfig
    metrics: GatewayMetrics
    invocations: Invocations
    recent: RecentInvocations


def add_listing_routes(app: FastAPI, gateway: Listed, bearer: HTTPBearer) -> None:
    recent, invocations, metrics = gateway.recent, gateway.invocations, gateway.metrics
    errors: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (401, 422, 429, 503)}

    @app.get(
        "/v1/invocations",
        response_model=InvocationPage,
        responses=errors,
        summary="List this gateway's recent invocations, newest first",
        operation_id="listInvocations",
        description=(
            "The window of the invocations this gateway replica sent (`max_recent_invocations` "
            "entries, 1 000 by default, and `max_recent_bytes`; the oldest go first), with their "
            "call and reply. Page with `after` = the previous page's `next_after`."
        ),
        tags=["invocations"],
    )
    async def list_invocations(
        status: Annotated[
            Literal["pending", "committed", "aborted", "failed", "error"] | None,
            Query(description="only invocations with this status"),
        ] = None,
        operator: Annotated[
            str | None, Query(min_length=1, max_length=MAX_NAME_CHARS, description="only this operator")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = DEFAULT_LIST_LIMIT,
        after: Annotated[
            str | None, Query(pattern=r"^[0-9]{1,18}$", description="cursor: list what is older than it")
        ] = None,
        scope: Annotated[
            Literal["gateway", "cluster"],
            Query(description="gateway: what this replica sent; cluster: every worker's recent transactions"),
        ] = "gateway",
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        if scope == "cluster":
            return respond(await _cluster_page(invocations, status, operator, limit), metrics)
        entries, next_seq = recent.page(
            status=status, operator=operator, limit=limit, after=None if after is None else int(after)
        )
        page = InvocationPage(
            invocations=[InvocationView(**e.view()) for e in entries],
            next_after=None if next_seq is None else str(next_seq),
            retained=len(recent),
            window=recent.max_entries,
        )
        return respond(ok(page), metrics)

    @app.get(
        "/v1/invocations/{request_id}/view",
        response_model=InvocationView,
        responses={
            202: {"model": InvocationAccepted, "description": "running, no reply yet"},
            **{s: {"model": ErrorBody} for s in (401, 404, 429, 503)},
        },
        summary="One invocation: its call (if this gateway sent it), its reply, its call graph and entities",
        operation_id="viewInvocation",
        tags=["invocations"],
    )
    async def view_invocation(
        request_id: Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN)],
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        return respond(await _view(recent, invocations, request_id), metrics)


async def _view(recent: RecentInvocations, invocations: Invocations, rid: str) -> Outcome:
    entry = recent.get(rid)
    found = await invocations.cluster_replies.trace(rid)
    if entry is not None:
        return ok(InvocationView(**entry.view(), **_graph(found, entry.reply)))
    reply = found.reply
    if reply is None:
        return invocations.not_found(rid, found)
    return ok(_from_cluster(rid, reply.status, reply, **_graph(found, reply)))


def _from_cluster(rid: str, status: str, reply: Reply | None, **known: Any) -> InvocationView:
    """The view of an invocation this gateway did not submit, from what the workers tell (its reply;
    ``known`` the call's operator, key, function or graph when they are known): nothing of the
    submission (arguments, submit time, latency, HTTP status) is."""
    fields: dict[str, Any] = {"operator": None, "key": None, "function": None, **known}
    return InvocationView(
        request_id=rid,
        cursor=None,
        status=status,  # type: ignore[arg-type]  # committed | aborted | failed | pending
        args=None,
        submitted_at=None,
        latency_ms=None,
        http_status=None,
        code=None,
        source="cluster",
        **fields,
        **reply_fields(reply),
    )


async def _cluster_page(
    invocations: Invocations, status: str | None, operator: str | None, limit: int
) -> Outcome:
    """The newest ``limit`` of every worker's recent transactions that match; 503 if the cluster cannot
    be asked. A transaction neither answered nor running (its reply no longer kept) is left out."""
    asked = limit if status is None and operator is None else MAX_RECENT_LOOKUP
    found, complete, error = await invocations.cluster_replies.recent(asked)
    if error:
        return failure(503, "unavailable", f"cannot list the cluster's invocations: {error}")
    views: list[InvocationView] = []
    for root, what in found:
        reply = what.reply
        state = reply.status if reply is not None else "pending" if what.pending else None
        if state is None or (status is not None and state != status):
            continue
        if operator is not None and root.operator != operator:
            continue
        views.append(
            _from_cluster(
                root.request_id, state, reply, operator=root.operator, key=root.key, function=root.function
            )
        )
        if len(views) == limit:
            break
    page = InvocationPage(
        invocations=views,
        next_after=None,
        retained=len(found),
        window=asked,
        scope="cluster",
        complete=complete,
    )
    return ok(page)


def _graph(found: Found, reply: Reply | None) -> dict[str, Any]:
    """The call graph of the transaction that gave ``reply`` (its epoch, phase and tid) and the
    entities it ran on, in the order first reached."""
    if reply is None:
        return {"calls": None, "entities": None, "graph_complete": None}
    nodes = sorted(
        (t for t in found.traces if (t.epoch, t.phase, t.tid) == (reply.epoch, int(reply.phase), reply.tid)),
        key=lambda t: t.path,
    )
    calls = [
        CallNode(
            path=t.path,
            operator=t.operator,
            key=t.key,
            function=t.function,
            status=Status(t.status).name.lower(),  # type: ignore[arg-type]  # one of Status's names
            wrote=t.wrote,
        )
        for t in nodes
    ]
    entities: dict[tuple[str, Any], EntityTouched] = {}
    for t in nodes:
        seen = entities.setdefault(
            (t.operator, t.key), EntityTouched(operator=t.operator, key=t.key, wrote=False)
        )
        seen.wrote |= t.wrote
    return {"calls": calls, "entities": list(entities.values()), "graph_complete": found.complete}
