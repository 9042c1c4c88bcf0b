"""Replies pushed to the clients that asked for them (:mod:`styx_py.core.wire.push`).

A client subscribes on its connection, whose node id its requests name in ``Request.reply_to``; every
reply that :class:`~styx_worker.replies.ReplyOut` hands to the egress producer for a request that
names a subscribed client is also sent to that client, in the same event-loop tick (the transport batches
one frame per connection per tick). So a push carries exactly what goes to the log, at the moment it
goes: after every worker's sequencer-log entry of the epoch is durable (the Votes wait for it), with
the fencing and holding of :meth:`ReplyOut.emit`. A replayed epoch produces the same replies
(determinism), so a client that took the pushed copy and then sees the logged one sees the same.

The push is best effort: nothing waits for it, a client whose connection drops is forgotten, and
the egress topic stays the record every client also reads.

A client that subscribed with ``marks`` is also sent :class:`~styx_py.core.wire.EgressAcked`, at most
every :data:`~styx_py.core.limits.EGRESS_MARK_EVERY_S` while replies flow: how far the broker
acknowledged this worker's egress records, per partition. Those offsets let it skip the parts of the
egress log that hold only replies it took pushed (styx_client.sdk.resting).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from styx_py.core.limits import EGRESS_MARK_EVERY_S, MAX_REPLY_SUBSCRIBERS
from styx_py.core.wire import EgressAcked, Message, PushedReply, Reply, SubscribeRefused

log = logging.getLogger("styx.worker")


class ReplyFeed:
    """The clients subscribed on this worker's port (their node ids), and the push of their replies."""

    def __init__(
        self,
        send: Callable[[str, Message], None],
        acked: Callable[[], dict[int, int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.send = send  # the worker's transport: buffered, one frame per connection per tick
        # Egress partition -> packed offset below which the broker acknowledged this worker's replies
        # (the egress sink's offsets()); None: no marks.
        self.acked = acked
        self.clock = clock
        self.clients: set[str] = set()
        self.marked: set[str] = set()  # of clients, those that asked for EgressAcked
        self.pushed = 0  # replies pushed since the start (metrics, tests)
        self._marked_at = -math.inf
        self._marks: dict[int, int] = {}  # the ends last sent

    def subscribe(self, client: str, marks: bool = False) -> bool:
        """Push to ``client`` the replies to requests that name it (with ``marks``, also the egress
        acknowledgements); False when the worker has ``MAX_REPLY_SUBSCRIBERS`` clients already (more
        read the egress topic only): the client is told so, nothing else changes."""
        if client not in self.clients and len(self.clients) >= MAX_REPLY_SUBSCRIBERS:
            log.warning(
                "refusing %s's reply subscription: %d clients subscribed", client, MAX_REPLY_SUBSCRIBERS
            )
            self.send(client, SubscribeRefused(MAX_REPLY_SUBSCRIBERS))
            return False
        self.clients.add(client)
        if marks and self.acked is not None:
            self.marked.add(client)
            self._marks = {}  # the new client has none yet
        return True

    def drop(self, client: str) -> None:
        """``client``'s connection closed: push nothing more to it."""
        self.clients.discard(client)
        self.marked.discard(client)

    def offer(self, reply: Reply, reply_to: str) -> bool:
        """``reply`` leaves for the egress topic now: push it to ``reply_to`` (its request's client),
        if that client subscribed here; whether it was pushed."""
        if reply_to not in self.clients:
            return False
        self.send(reply_to, PushedReply(reply))
        self.pushed += 1
        if self.marked:
            self._mark()
        return True

    def _mark(self) -> None:
        """Send the egress acknowledgements to the clients that asked, unless sent less than
        ``EGRESS_MARK_EVERY_S`` ago or unchanged since."""
        now = self.clock()
        if now - self._marked_at < EGRESS_MARK_EVERY_S or self.acked is None:
            return
        ends = self.acked()
        if ends == self._marks:
            return
        self._marked_at, self._marks = now, ends
        msg = EgressAcked(sorted(ends.items()))
        for client in self.marked:
            self.send(client, msg)
