"""Reply lookups: a gateway replica asks for the replies to some request ids; every worker is asked.

A reply lives in the reply table of the worker that owns the request's ingress partition (see
:mod:`styx_worker.dedup`); the coordinator does not know which partition a request id went to, so
it asks every worker (:class:`~styx_py.core.wire.FindReplies`) and answers the admin client once all
have answered, or after ``LOOKUP_TIMEOUT_S``. The answer is ``complete`` only if every worker
answered with whole tables (none of them recovering) while the cluster was running: a miss in an
incomplete answer is not a "no such request".

Bounded: at most ``MAX_OPEN_LOOKUPS`` lookups wait for workers at once (more are refused, the gateway
retries), each with at most ``MAX_LOOKUP_IDS`` ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from styx_coordinator.cluster import Cluster
from styx_coordinator.tasks import Tasks
from styx_py.core.limits import LOOKUP_TIMEOUT_S, MAX_OPEN_LOOKUPS, MAX_RECENT_LOOKUP
from styx_py.core.ports import Clock
from styx_py.core.wire import (
    MAX_LOOKUP_IDS,
    AdminReply,
    FindReplies,
    FoundReplies,
    Reply,
    ReplyLookup,
    Traced,
)

__all__ = ["LOOKUP_TIMEOUT_S", "MAX_OPEN_LOOKUPS", "ReplyLookups"]


_encoder = msgspec.msgpack.Encoder()


@dataclass(slots=True)
class _Lookup:
    src: str
    waiting: set[str]  # workers that have not answered yet
    complete: bool
    replies: dict[tuple[str, int], Reply] = field(default_factory=dict)  # by (request id, tid)
    pending: set[str] = field(default_factory=set)
    deferred: set[str] = field(default_factory=set)
    traces: list[Traced] | None = None  # when the lookup asked for them


class ReplyLookups:
    def __init__(self, cluster: Cluster, clock: Clock, tasks: Tasks) -> None:
        self.cluster = cluster
        self.clock = clock
        self.tasks = tasks
        self.open: dict[int, _Lookup] = {}
        self.next_id = 0

    def start(self, src: str, msg: ReplyLookup) -> None:
        """Ask every worker for ``msg``'s ids; the admin client ``src`` is answered later."""
        c = self.cluster
        if len(msg.request_ids) > MAX_LOOKUP_IDS or not 0 <= msg.recent <= MAX_RECENT_LOOKUP:
            error = f"{len(msg.request_ids)} request ids in one lookup (max {MAX_LOOKUP_IDS})"
            if msg.recent:
                error = f"recent={msg.recent} in one lookup (max {MAX_RECENT_LOOKUP})"
            c.transport.send(src, AdminReply(False, error, {}))
            return
        if len(self.open) >= MAX_OPEN_LOOKUPS:
            c.transport.send(src, AdminReply(False, f"{len(self.open)} lookups in flight; retry", {}))
            return
        workers = set(c.workers) if c.graph_path is not None else set()
        lookup_id, self.next_id = self.next_id, self.next_id + 1
        lookup = _Lookup(src, workers, complete=c.state == "running" and bool(workers))
        lookup.traces = [] if msg.traces or msg.recent else None
        self.open[lookup_id] = lookup
        for node_id in sorted(workers):
            c.transport.send(
                node_id, FindReplies(lookup_id, list(msg.request_ids), c.gen, msg.traces, msg.recent)
            )
        if workers:
            self.tasks.spawn(self._expire(lookup_id))
        else:
            self._answer(lookup_id)

    def on_found(self, msg: FoundReplies) -> None:
        lookup = self.open.get(msg.lookup)
        if lookup is None or msg.node_id not in lookup.waiting:
            return  # answered already (timed out), or a duplicate
        lookup.waiting.discard(msg.node_id)
        lookup.complete &= msg.complete
        for reply in msg.replies:
            lookup.replies[(reply.request_id, reply.tid)] = reply
        lookup.pending.update(msg.pending)
        lookup.deferred.update(msg.deferred)
        if lookup.traces is not None:
            lookup.traces.extend(msg.traces)
        if not lookup.waiting:
            self._answer(msg.lookup)

    async def _expire(self, lookup_id: int) -> None:
        await self.clock.sleep(LOOKUP_TIMEOUT_S)
        lookup = self.open.get(lookup_id)
        if lookup is not None:
            lookup.complete = False  # a worker did not answer: its replies are unknown
            self._answer(lookup_id)

    def _answer(self, lookup_id: int) -> None:
        lookup = self.open.pop(lookup_id)
        found = {rid for rid, _ in lookup.replies}
        body = {
            "replies": [_encoder.encode(r) for _, r in sorted(lookup.replies.items())],
            "pending": sorted(lookup.pending - found),
            "deferred": sorted(lookup.deferred),
            "complete": lookup.complete,
        }
        if lookup.traces is not None:
            body["traces"] = [_encoder.encode(t) for t in lookup.traces]
        self.cluster.transport.send(lookup.src, AdminReply(True, "", body))
