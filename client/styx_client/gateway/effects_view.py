"""The pending external calls and timers of one entity: ``GET /v1/effects?owner=`` (or ``operator``,
``key``, ``key_type``).

They are the state of the system operators ``styx.outbox`` (intents not completed yet) and
``styx.timers`` (timers not fired or cancelled), keyed by the calling entity (its owner key,
:func:`~styx_py.core.effectids.owner_of`, e.g. ``seat/'s1'``); each is read with the operator's
read-only ``pending`` function, as one transaction each (:meth:`Invocations.state`), so what it shows
is serializable with every other transaction. Which entities have some pending: each worker's row of
``GET /v1/cluster`` names them (``pending_owners``, the first 20 per worker) with its counts.
"""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at run time.
import time
from typing import Annotated, Any, Literal, Protocol

import msgspec
from fastapi import Depends, FastAPI, Query
from fastapi.security import HTTPBearer
from pydantic import BaseModel, Field
from starlette.responses import Response

from styx_client.gateway.invocations import Invocations
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.models import ErrorBody
from styx_client.gateway.outcomes import Outcome, failure, ok, parse_key, respond
from styx_py.core.effectids import OUTBOX, TIMERS, owner_of
from styx_py.core.limits import MAX_KEY_CHARS, MAX_NAME_CHARS

__all__ = ["PendingEffects", "add_effects_routes"]


class PendingCall(BaseModel):
    id: str = Field(description="the call's idempotency key")
    service: str
    function: str
    args: list[Any]
    then: str | None = Field(description="the continuation, operator.function(key), if any")


class PendingTimer(BaseModel):
    id: str
    due_ms: int = Field(description="when it is due (Unix time, ms)")
    due_in_s: float = Field(description="seconds from now (negative: due, its firing under way)")
    target: str = Field(description="what it calls, operator.function(key)")
    args: list[Any]


class PendingEffects(BaseModel):
    owner: str = Field(description="the system operators' key of the entity")
    calls: list[PendingCall] = Field(description="external calls asked for and not completed yet")
    timers: list[PendingTimer] = Field(description="timers set and not fired or cancelled")
    epoch: int = Field(description="the epoch the timers were read at")


class Effected(Protocol):
    metrics: GatewayMetrics
    invocations: Invocations


def add_effects_routes(app: FastAPI, gateway: Effected, bearer: HTTPBearer) -> None:
    invocations, metrics = gateway.invocations, gateway.metrics

    @app.get(
        "/v1/effects",
        response_model=PendingEffects,
        responses={s: {"model": ErrorBody} for s in (401, 404, 422, 503, 504)},
        summary="One entity's pending external calls and timers",
        operation_id="getPendingEffects",
        description=(
            "Reads `styx.outbox.pending` and `styx.timers.pending` of the entity (by `owner`, as "
            "`GET /v1/cluster` lists them, or by `operator` and `key`), each as a read-only transaction. "
            "404 when the deployed graph has no external calls or timers."
        ),
        tags=["admin"],
    )
    async def get_effects(
        owner: Annotated[str | None, Query(min_length=1, max_length=MAX_KEY_CHARS)] = None,
        operator: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_CHARS)] = None,
        key: Annotated[str | None, Query(min_length=1, max_length=MAX_KEY_CHARS)] = None,
        key_type: Annotated[Literal["str", "int"], Query()] = "str",
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        return respond(await _pending(invocations, owner, operator, key, key_type), metrics)


async def _pending(
    invocations: Invocations, owner: str | None, operator: str | None, key: str | None, key_type: str
) -> Outcome:
    if owner is None:
        if operator is None or key is None:
            return failure(422, "invalid_request", "give owner, or operator and key")
        entity = parse_key(key, key_type)
        if isinstance(entity, Outcome):
            return entity
        owner = owner_of(operator, entity)
    timeout_s = invocations.config.timing.reply_timeout_s
    read: dict[str, Any] = {}
    for system in (OUTBOX, TIMERS):
        outcome = await invocations.state(system, owner, timeout_s)
        if outcome.status != 200:
            return outcome
        read[system] = msgspec.json.decode(outcome.body)
    now_ms = time.time() * 1000
    calls = [
        PendingCall(id=cid, service=i[0], function=i[1], args=i[2], then=_target(i[3]) if i[3] else None)
        for cid, i in sorted((read[OUTBOX]["value"] or {}).items())
    ]
    timers = [
        PendingTimer(
            id=tid,
            due_ms=t[0],
            due_in_s=round((t[0] - now_ms) / 1000, 3),
            target=_target(t[1:4]),
            args=t[4],
        )
        for tid, t in sorted((read[TIMERS]["value"] or {}).items(), key=lambda it: it[1][0])
    ]
    return ok(PendingEffects(owner=owner, calls=calls, timers=timers, epoch=read[TIMERS]["epoch"]))


def _target(then: list[Any]) -> str:
    operator, function, key = then[:3]
    return f"{operator}.{function}({key!r})"
