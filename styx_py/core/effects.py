"""External calls and durable timers: the two system operators that hold them as entity state.

A function asks for an external call with ``ctx.call_external`` and for a timer with
``ctx.call_later``; both are ordinary asynchronous calls, in the same transaction, to a system
operator whose state holds what is pending (:data:`OUTBOX`: intents; :data:`TIMERS`: timers), keyed by
the calling entity (:func:`owner_of`). They commit or abort with the transaction's other writes (the
transactional outbox). After the commit, the worker that owns the entity's partition performs the call
(``styx_worker.outbox``) and writes its outcome to the ingress log as a new request,
``styx.outbox.complete``, which clears the intent and runs the continuation; a due timer is fired the
same way, by ``styx.timers.fire``, which runs its target only once the request's sequenced time
(``ctx.now()``) has reached the due time. A replay runs these functions from the logged requests and
never calls anything. docs/effects.md gives the semantics.

Every identifier is derived from the request id and the call's place in the call tree (or given), so a
re-run, a fallback re-execution and a replay ask for the same call under the same idempotency key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from styx_py.core.context import Context
from styx_py.core.effectids import OUTBOX, TIMERS, owner_of, timer_owner
from styx_py.core.errors import ExternalCallFailed, PendingLimit
from styx_py.core.operator import Operator

__all__ = [
    "MAX_PENDING_CALLS_PER_ENTITY",
    "MAX_PENDING_PER_PARTITION",
    "MAX_TIMERS_PER_ENTITY",
    "OUTBOX",
    "TIMERS",
    "Service",
    "completion_request_id",
    "effect_operators",
    "external_value",
    "fire_request_id",
    "owner_of",
    "timer_owner",
]

MAX_PENDING_CALLS_PER_ENTITY = 64  # intents of one calling entity not yet completed
MAX_TIMERS_PER_ENTITY = 64  # timers of one entity not yet fired or cancelled
# Intents (and, apart, timers) one partition holds at most, as of the start of the epoch: the default of
# ``Graph(max_pending_per_partition=…)``.
MAX_PENDING_PER_PARTITION = 100_000

# An external service, as the worker's runner calls it: ``await service(function, args, key)`` returns
# the response (any msgpack-encodable value) or raises; ``key`` is the call's idempotency key, which
# the service must honour (the same key: the same effect and the same response).
Service = Callable[[str, list[Any], str], Awaitable[Any]]


def completion_request_id(call_id: str, ok: bool, value: Any) -> str:
    """The request id of an intent's completion: the same outcome, the same id (a repeat is answered
    from the reply table); another outcome (a retry that ended otherwise) another id, which finds the
    intent cleared and does nothing."""
    digest = hashlib.sha256(repr((call_id, ok, value)).encode()).hexdigest()[:16]
    return f"styx-ext-{hashlib.sha256(call_id.encode()).hexdigest()[:24]}-{digest}"


def fire_request_id(timer_id: str, stamp_ms: int) -> str:
    """The request id of one firing of a timer (a timer found early is fired again, under another)."""
    return f"styx-timer-{hashlib.sha256(timer_id.encode()).hexdigest()[:24]}-{stamp_ms}"


def external_value(outcome: dict[str, Any]) -> Any:
    """The response an external call's continuation was given, or :class:`ExternalCallFailed`."""
    if outcome.get("ok"):
        return outcome.get("value")
    raise ExternalCallFailed(str(outcome.get("call")), str(outcome.get("error")))


def _admit(ctx: Context, pending: dict[str, Any], entry: str, per_entity: int, per_partition: int) -> None:
    """Refuse a new ``entry`` (PendingLimit) when the entity holds ``per_entity`` of them, or its
    partition held ``per_partition`` at the start of the epoch (state only: the same on every replay)."""
    if entry in pending:
        return
    what = "external calls" if ctx.operator == OUTBOX else "timers"
    if len(pending) >= per_entity:
        raise PendingLimit(f"{ctx.key}: more than {per_entity} {what} pending")
    held = ctx.partition_pending()
    if held >= per_partition:
        raise PendingLimit(
            f"the partition of {ctx.key} holds {held} {what} pending "
            f"(max_pending_per_partition {per_partition})"
        )


async def _record(
    ctx: Context,
    call_id: str,
    service: str,
    function: str,
    args: list[Any],
    then: Any,
    place: str = "",
    *,
    limit: int = MAX_PENDING_PER_PARTITION,
) -> str:
    calls: dict[str, Any] = await ctx.get({})
    _admit(ctx, calls, call_id, MAX_PENDING_CALLS_PER_ENTITY, limit)
    calls[call_id] = [service, function, args, then, place]
    await ctx.put(calls)
    return call_id


async def _complete(
    ctx: Context, call_id: str, ok: bool, value: Any, error: str, failed: str = ""
) -> bool | str:
    """The outcome of intent ``call_id``: clear it and run its continuation; False if it was cleared
    already (a repeat, or a retry that ended otherwise). With ``failed`` (a completion whose
    continuation failed with that error, written again by the worker): clear it without the
    continuation (``styx_worker.outbox.settle_request``), and return ``failed``."""
    calls: dict[str, Any] = await ctx.get({})
    intent = calls.pop(call_id, None)
    if intent is None:
        return False
    if calls:
        await ctx.put(calls)
    else:
        await ctx.delete()
    if failed:
        return f"continuation failed: {failed}"
    then = intent[3]
    if then:
        operator, function, key, extra = then
        outcome = {"call": call_id, "ok": ok, "value": value, "error": error}
        ctx.call_async(operator, function, key, outcome, *extra)
    return True


async def _add(
    ctx: Context, timer_id: str, due_ms: int, target: list[Any], *, limit: int = MAX_PENDING_PER_PARTITION
) -> str:
    timers: dict[str, Any] = await ctx.get({})
    _admit(ctx, timers, timer_id, MAX_TIMERS_PER_ENTITY, limit)
    timers[timer_id] = [due_ms, *target]
    await ctx.put(timers)
    return timer_id


async def _cancel(ctx: Context, timer_id: str) -> bool:
    timers: dict[str, Any] = await ctx.get({})
    if timers.pop(timer_id, None) is None:
        return False
    if timers:
        await ctx.put(timers)
    else:
        await ctx.delete()
    return True


async def _fire(ctx: Context, timer_id: str) -> str:
    """Run timer ``timer_id``'s target if it is due by this transaction's sequenced time: "fired";
    "early" (not due yet: it stays) or "gone" (fired or cancelled already)."""
    timers: dict[str, Any] = await ctx.get({})
    timer = timers.get(timer_id)
    if timer is None:
        return "gone"
    due_ms, operator, function, key, args = timer
    if ctx.now() * 1000 < due_ms:
        return "early"
    del timers[timer_id]
    if timers:
        await ctx.put(timers)
    else:
        await ctx.delete()
    ctx.call_async(operator, function, key, *args)
    return "fired"


async def _pending(ctx: Context) -> Any:
    return await ctx.get({})


def effect_operators(partitions: int, per_partition: int = MAX_PENDING_PER_PARTITION) -> list[Operator]:
    """The two system operators a graph that uses external calls or timers gets; a partition of each
    holds at most ``per_partition`` entries (as of the start of the epoch)."""

    async def record(
        ctx: Context, call_id: str, service: str, function: str, args: list[Any], then: Any, place: str = ""
    ) -> str:
        return await _record(ctx, call_id, service, function, args, then, place, limit=per_partition)

    async def add(ctx: Context, timer_id: str, due_ms: int, target: list[Any]) -> str:
        return await _add(ctx, timer_id, due_ms, target, limit=per_partition)

    outbox = Operator(OUTBOX, partitions)
    outbox.function(record, name="record")
    outbox.function(_complete, name="complete")
    outbox.function(_pending, name="pending", state=True)
    timers = Operator(TIMERS, partitions)
    timers.function(add, name="add")
    timers.function(_cancel, name="cancel")
    timers.function(_fire, name="fire")
    timers.function(_pending, name="pending", state=True)
    return [outbox, timers]
