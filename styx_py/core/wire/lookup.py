"""Reply lookup: any gateway replica asks the cluster for the reply to a request id.

The gateway sends :class:`ReplyLookup` to the coordinator's admin port; the coordinator asks every
worker (:class:`FindReplies`), each answers from its reply tables (:class:`FoundReplies`), and the
coordinator answers the gateway with an :class:`~styx_py.core.wire.admin.AdminReply` whose body is
``{"replies": [msgpack Reply, ...], "pending": [id, ...], "deferred": [id, ...], "complete": bool}``.
"""

from __future__ import annotations

from styx_py.core.wire.codes import Msg
from styx_py.core.wire.logs import Reply


class ReplyLookup(Msg, tag="lookup"):
    """Admin → coordinator: the replies to these request ids, wherever they are in the cluster."""

    request_ids: list[str]


class FindReplies(Msg, tag="find"):
    """Coordinator → every worker: look these request ids up in your reply tables."""

    lookup: int
    request_ids: list[str]
    gen: int


class FoundReplies(Msg, tag="found"):
    """Worker → coordinator: what this worker knows of the ids of lookup ``lookup``."""

    lookup: int
    node_id: str
    replies: list[Reply]  # every recorded reply to one of the ids (one id may have several: tids differ)
    pending: list[str]  # ids of transactions running here now (no reply yet)
    deferred: list[str]  # ids found but left out of this answer (reply byte budget)
    complete: bool  # False while this worker recovers: its tables are not whole yet
