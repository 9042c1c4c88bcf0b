"""Reply lookup: any gateway replica asks the cluster for the reply to a request id.

The gateway sends :class:`ReplyLookup` to the coordinator's admin port; the coordinator asks every
worker (:class:`FindReplies`), each answers from its reply tables (:class:`FoundReplies`), and the
coordinator answers the gateway with an :class:`~styx_py.core.wire.admin.AdminReply` whose body is
``{"replies": [msgpack Reply, ...], "pending": [id, ...], "deferred": [id, ...], "complete": bool,
"traces": [msgpack Traced, ...]}`` (``traces`` only when the lookup asked for them: the invocations
each worker retains of those requests' transactions, see :mod:`styx_worker.traces`; with ``recent``,
also the root invocation and the reply of each worker's ``recent`` most recent transactions).
"""

from __future__ import annotations

import msgspec

from styx_py.core.wire.codes import Key, Msg
from styx_py.core.wire.logs import Reply


class Traced(msgspec.Struct, array_like=True, frozen=True):
    """One invocation of a transaction, as the worker that ran it retains it: where it sits in the
    call graph (``path``, child indices from the root), the entity it ran on and what it did there."""

    request_id: str
    epoch: int
    phase: int  # the Phase it ran in (a transaction re-run in the fallback has both)
    tid: int
    path: list[int]
    operator: str
    function: str
    key: Key
    status: int  # its Status (OK, ABORT, ...)
    wrote: bool  # its transaction wrote this entity (a put or a delete; read-only otherwise)


class ReplyLookup(Msg, tag="lookup"):
    """Admin → coordinator: the replies to these request ids, wherever they are in the cluster."""

    request_ids: list[str]
    traces: bool = False  # also the invocations the workers retain of these requests
    recent: int = 0  # also each worker's most recent transactions (their roots and replies): a listing


class FindReplies(Msg, tag="find"):
    """Coordinator → every worker: look these request ids up in your reply tables."""

    lookup: int
    request_ids: list[str]
    gen: int
    traces: bool = False
    recent: int = 0


class FoundReplies(Msg, tag="found"):
    """Worker → coordinator: what this worker knows of the ids of lookup ``lookup``."""

    lookup: int
    node_id: str
    replies: list[Reply]  # every recorded reply to one of the ids (one id may have several: tids differ)
    pending: list[str]  # ids of transactions running here now (no reply yet)
    deferred: list[str]  # ids found but left out of this answer (reply byte budget)
    complete: bool  # False while this worker recovers: its tables are not whole yet
    traces: list[Traced] = msgspec.field(
        default_factory=list
    )  # when asked: the invocations retained here of those requests
