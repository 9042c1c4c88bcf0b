"""What a simulation asked for and what the egress log answered: :class:`Submissions`, the record the
checks compare (every request answered as often as it was sent, identically, on a partition its
request named)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import msgspec

from styx_py.core.segments import segment_topic, segments_in, unread
from styx_py.core.wire import Reply, Request
from styx_py.testing.memory import MemoryLog

__all__ = ["Submissions", "call_of"]


class Submissions:
    """Every request id submitted, how often, where its copies went, and every reply the egress log got."""

    def __init__(self, log: MemoryLog, ingress_topic: str, egress_topic: str) -> None:
        self.log = log
        self.ingress_topic = ingress_topic
        self.egress_topic = egress_topic
        self.requests: dict[str, Request] = {}  # by id, as it ran (its time is the copy's that ran)
        self.submissions: Counter[str] = Counter()  # the sends of each request id (by a client, or raw)
        # Every record of a request id appended to the ingress log (a client writes one again to a newer
        # segment when the workers may have stopped reading the one it went to late), and the oldest
        # segment one of its copies went to late (not the newest when appended: by a client that has not
        # seen the newest yet).
        self.written: Counter[str] = Counter()
        self.late_segment: dict[str, int] = {}
        self.routes: dict[str, set[int]] = {}  # the reply partitions each id may be answered on (-1: any)
        self.replies: list[Reply] = []
        self._ids = itertools.count()

    def new_id(self) -> str:
        """The next generated request id (``r0``, ``r1``, ...)."""
        return f"r{next(self._ids)}"

    def newest_segment(self) -> int:
        """The newest ingress segment."""
        return segments_in(self.log.topics, self.ingress_topic)[-1]

    def on_write(self, rid: str, segment: int) -> None:
        """A record of ``rid`` was appended to ingress ``segment``."""
        self.written[rid] += 1
        if segment < self.newest_segment():
            self.late_segment.setdefault(rid, segment)

    def on_reply(self, reply: Reply) -> None:
        """A reply reached the egress log."""
        # The request as it ran: its time (ctx.time()) is the one its client stamped on the copy that
        # ran, which the reply names (a resend by another client has another).
        req = self.requests.get(reply.request_id)
        if req is not None and req.ts_ms != reply.request_ts_ms:
            self.requests[reply.request_id] = msgspec.structs.replace(req, ts_ms=reply.request_ts_ms)
        self.replies.append(reply)

    def unanswered(self) -> bool:
        """Some submission of a request id has no reply on the log yet. Of a request id with a late copy
        in a segment the workers may no longer read, one reply will do: that copy may have been left
        unread (its client, answered, does not write it again)."""
        newest = self.newest_segment()
        if not unread(0, newest):
            return len(self.replies) < self.submissions.total()
        counts = Counter(r.request_id for r in self.replies)
        return any(
            counts[rid] < (1 if unread(self.late_segment.get(rid, newest), newest) else n)
            for rid, n in self.submissions.items()
        )

    def misrouted_replies(self) -> list[tuple[int, Reply]]:
        """Replies on an egress partition that no submission of their request id named (a submission
        that named none may be answered on any), in every egress segment."""
        egress = self.egress_topic
        out = []
        for s in segments_in(self.log.topics, egress):
            for q, part in enumerate(self.log.topics[segment_topic(egress, s)]):
                for r in part:
                    routes = self.routes.get(r.request_id, ())
                    if q not in routes and -1 not in routes:
                        out.append((q, r))
        return out

    def duplicate_replies(self) -> list[str]:
        """Request ids answered more often than they were submitted, or answered differently."""
        counts = Counter(r.request_id for r in self.replies)
        first: dict[str, Reply] = {}
        differing = {r.request_id for r in self.replies if first.setdefault(r.request_id, r) != r}
        allowed = self.submissions + (self.written - self.submissions)  # copies written again count too
        return sorted({rid for rid, n in counts.items() if n > allowed[rid]} | differing)

    def unique_replies(self) -> list[Reply]:
        """One reply per request id (resent ids are answered with an identical reply)."""
        return list({r.request_id: r for r in self.replies}.values())


def call_of(req: Request) -> tuple[Any, ...]:
    """What a request asks, without when it was stamped."""
    return (req.operator, req.function, req.key, bytes(req.args))
