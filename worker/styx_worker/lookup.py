"""Answering a reply lookup (a gateway replica looking for a request's reply, via the coordinator).

Pure: the worker passes in its reply table, the request ids running here and whether its tables are
whole. A request id may be in several partitions' tables (ids are the client's: one reused for
another key lands in another partition) and every such reply is returned; the gateway picks. A
worker recovering, or still replaying logged epochs, has tables that miss replies the cluster already
gave: its answer says ``complete=False`` so a miss is not taken for "no such request".
"""

from __future__ import annotations

from collections.abc import Collection

from styx_py.core.wire import MAX_LOOKUP_REPLY_BYTES, FindReplies, FoundReplies, Reply
from styx_worker.dedup import ReplyTable
from styx_worker.traces import Traces

__all__ = ["find_replies"]

_REPLY_OVERHEAD_BYTES = 64  # ids, tid, epoch, status: counted with each result against the budget


def find_replies(
    msg: FindReplies,
    node_id: str,
    table: ReplyTable,
    running: Collection[str],
    complete: bool,
    traces: Traces | None = None,
) -> FoundReplies:
    """What this worker knows of ``msg``'s request ids: their replies (up to the byte budget; the ids
    past it are deferred), the ids still running here, and, when ``msg`` asks, the invocations
    ``traces`` retains of them (bounded by :data:`~styx_worker.traces.MAX_TRACE_NODES` per id) and
    the roots and replies of the ``msg.recent`` most recent transactions that started here."""
    roots = traces.recent(msg.recent) if msg.recent and traces is not None else []
    wanted = set(msg.request_ids) | {t.request_id for t in roots}
    replies: list[Reply] = []
    deferred: set[str] = set()
    budget = MAX_LOOKUP_REPLY_BYTES
    for partition in sorted(table.replies):
        for rid in sorted(wanted):
            reply = table.get(partition, rid)
            if reply is None:
                continue
            size = len(reply.result) + len(reply.error or "") + len(rid) + _REPLY_OVERHEAD_BYTES
            if size > budget:
                deferred.add(rid)
                continue
            budget -= size
            replies.append(reply)
    found = {r.request_id for r in replies}
    pending = sorted(rid for rid in wanted - found if rid in running)
    traced = traces.find(msg.request_ids) if msg.traces and traces is not None else []
    traced += roots
    return FoundReplies(msg.lookup, node_id, replies, pending, sorted(deferred - found), complete, traced)
