"""Committed state as of one epoch, outside transactions: ``GET /v1/state/{operator}`` (a scan, by
pages) and ``GET /v1/state/{operator}/{key}/stored`` (one entity's stored value).

Both go to the coordinator's admin port (:mod:`styx_py.io.stateread`), which asks the workers; they
answer from memory as of one committed epoch across every partition, without a transaction and without
pausing the epochs. A page's ``cursor`` carries its epoch and last key: the next page (``?cursor=``)
reads the same epoch, so the pages of one scan are one consistent cut. An epoch older than the workers
keep (``state_window_epochs``, or one from before their last recovery) is 410 ``epoch_out_of_window``,
never a newer state; ``styx sql --as-of-epoch`` reads those.

Without ``as_of_epoch`` (or a cursor), a read is of the newest committed epoch, and of none older than
``min_epoch`` or than the newest reply the gateway's SDK client has received: an invocation's reply
leaves before its epoch is over, and a read after it waits for that epoch, so it sees the invocation's
writes (read-your-writes, here across every caller of this gateway; pass the reply's ``epoch`` as
``min_epoch`` to another gateway).
"""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at run time.
from typing import Annotated, Any, Literal, Protocol

from fastapi import Depends, FastAPI, Path, Query
from fastapi.security import HTTPBearer
from pydantic import BaseModel, Field
from starlette.responses import Response

from styx_client.gateway.cluster import ClusterLink
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.models import ErrorBody
from styx_client.gateway.outcomes import Outcome, failure, ok, parse_key, respond, retry_after
from styx_py.core.errors import EpochOutOfWindow, StateReadRefused, Unavailable
from styx_py.core.limits import MAX_KEY_CHARS, MAX_NAME_CHARS, MAX_SCAN_LIMIT
from styx_py.core.partitioning import Key
from styx_py.core.wire import ReadState
from styx_py.io.stateread import ReadSource, StatePage, from_cursor, read_page

__all__ = ["StateEntry", "StatePageView", "StoredValue", "add_state_routes"]

KeyType = Literal["str", "int"]
MAX_EPOCH = 2**62  # far beyond any cluster's epochs; a bound keeps the number encodable


class StateEntry(BaseModel):
    key: str | int
    value: Any


class StatePageView(BaseModel):
    operator: str
    epoch: int = Field(description="the committed epoch every entry is as of (the same on every page)")
    items: list[StateEntry] = Field(description="in key order: int keys before str keys")
    cursor: str | None = Field(description="pass as ?cursor= for the next page; null: this is the last")


class StoredValue(BaseModel):
    operator: str
    key: str | int
    epoch: int = Field(description="the committed epoch the value is as of")
    found: bool = Field(description="false: no such entity at that epoch (value null)")
    value: Any


class StateReading(Protocol):
    metrics: GatewayMetrics
    state_reads: ReadSource
    link: ClusterLink


def _min_epoch(gateway: StateReading, asked: int | None) -> int:
    """The epoch a read of the newest one must not be older than: ``asked`` or the newest reply the
    gateway's SDK client received (:attr:`styx_client.sdk.StyxClient.newest_epoch`), whichever is newer."""
    seen = getattr(gateway.link.backend, "newest_epoch", -1)
    return max(-1 if asked is None else asked, seen if isinstance(seen, int) else -1)


_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (401, 404, 409, 410, 422, 429, 503)
}


_MIN_EPOCH = (
    "without as_of_epoch: read no epoch older than this one (an invocation reply's epoch: the read "
    "then sees its writes; it waits, briefly, for that epoch to finish)"
)


def add_state_routes(app: FastAPI, gateway: StateReading, bearer: HTTPBearer) -> None:
    metrics = gateway.metrics

    @app.get(
        "/v1/state/{operator}",
        response_model=StatePageView,
        responses=_ERRORS,
        summary="List an operator's committed entities as of one epoch, by pages",
        operation_id="scanState",
        description=(
            "A consistent read outside transactions: every partition's entries as of one committed "
            "epoch (the newest, at least `min_epoch` and the newest reply the gateway has received, or "
            "`as_of_epoch` within the workers' in-memory window). Every page "
            "asks every partition for up to `limit` rows; the `cursor` of a page carries its epoch, so "
            "the pages of one scan are one cut. Bounds: `prefix` (str keys), `start` (inclusive) or "
            "`after` (exclusive), `end` (exclusive), read as `key_type`."
        ),
        tags=["admin"],
    )
    async def scan_state(
        operator: Annotated[str, Path(min_length=1, max_length=MAX_NAME_CHARS)],
        prefix: Annotated[str | None, Query(max_length=MAX_KEY_CHARS)] = None,
        start: Annotated[str | None, Query(max_length=MAX_KEY_CHARS)] = None,
        after: Annotated[str | None, Query(max_length=MAX_KEY_CHARS)] = None,
        end: Annotated[str | None, Query(max_length=MAX_KEY_CHARS)] = None,
        key_type: Annotated[KeyType, Query(description="how to read start, after and end")] = "str",
        limit: Annotated[int, Query(ge=1, le=MAX_SCAN_LIMIT)] = 100,
        as_of_epoch: Annotated[int | None, Query(ge=-1, le=MAX_EPOCH)] = None,
        cursor: Annotated[str | None, Query(max_length=4 * MAX_KEY_CHARS)] = None,
        min_epoch: Annotated[int | None, Query(ge=-1, le=MAX_EPOCH, description=_MIN_EPOCH)] = None,
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        bounds: list[Key | None] = []
        for raw in (start, after, end):
            key = None if raw is None else parse_key(raw, key_type)
            if isinstance(key, Outcome):
                return respond(key, metrics)
            bounds.append(key)
        epoch = -1 if as_of_epoch is None else as_of_epoch
        if cursor is not None:
            try:
                epoch, bounds[1] = from_cursor(cursor)
            except ValueError as exc:
                return respond(failure(422, "invalid_request", str(exc)), metrics)
            bounds[0] = None
        least = _min_epoch(gateway, min_epoch)
        msg = ReadState(operator, bounds[0], bounds[1], bounds[2], prefix, limit, epoch, min_epoch=least)
        outcome = await _read(gateway.state_reads, msg)
        if isinstance(outcome, StatePage):
            items = [StateEntry(key=k, value=v) for k, v in outcome.rows]
            view = StatePageView(operator=operator, epoch=outcome.epoch, items=items, cursor=outcome.cursor)
            outcome = ok(view)
        return respond(outcome, metrics)

    @app.get(
        "/v1/state/{operator}/{key}/stored",
        response_model=StoredValue,
        responses=_ERRORS,
        summary="One entity's stored value as of a committed epoch",
        operation_id="getStoredState",
        description=(
            "The raw stored value (no state function runs) as of the newest committed epoch, or "
            "`as_of_epoch` within the workers' in-memory window; `found` is false when the entity does "
            "not exist at that epoch."
        ),
        tags=["admin"],
    )
    async def get_stored(
        operator: Annotated[str, Path(min_length=1, max_length=MAX_NAME_CHARS)],
        key: Annotated[str, Path(min_length=1, max_length=MAX_KEY_CHARS)],
        key_type: Annotated[KeyType, Query(description="how to read the key")] = "str",
        as_of_epoch: Annotated[int | None, Query(ge=-1, le=MAX_EPOCH)] = None,
        min_epoch: Annotated[int | None, Query(ge=-1, le=MAX_EPOCH, description=_MIN_EPOCH)] = None,
        _auth: Annotated[Any, Depends(bearer)] = None,
    ) -> Response:
        entity = parse_key(key, key_type)
        if isinstance(entity, Outcome):
            return respond(entity, metrics)
        epoch = -1 if as_of_epoch is None else as_of_epoch
        msg = ReadState(operator, limit=1, epoch=epoch, key=entity, min_epoch=_min_epoch(gateway, min_epoch))
        outcome = await _read(gateway.state_reads, msg)
        if isinstance(outcome, StatePage):
            found = bool(outcome.rows)
            value = outcome.rows[0][1] if found else None
            stored = StoredValue(operator=operator, key=entity, epoch=outcome.epoch, found=found, value=value)
            outcome = ok(stored)
        return respond(outcome, metrics)


_CODES = {
    "unknown-operator": (404, "unknown_operator"),
    "not-committed": (409, "epoch_not_committed"),
    "out-of-window": (410, "epoch_out_of_window"),
    "bad-request": (422, "invalid_request"),
}


async def _read(source: ReadSource, msg: ReadState) -> StatePage | Outcome:
    try:
        return await read_page(source, msg)
    except EpochOutOfWindow as exc:
        return failure(410, "epoch_out_of_window", str(exc))
    except StateReadRefused as exc:
        status, code = _CODES.get(exc.code, (422, "invalid_request"))
        return failure(status, code, str(exc))
    except (Unavailable, OSError) as exc:
        return failure(503, "unavailable", f"state reads: {exc}", headers=retry_after(1))
