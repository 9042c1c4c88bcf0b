"""Replies pushed to the clients that asked for them (:mod:`styx_py.core.wire.push`).

A client subscribes on its connection, whose node id its requests name in ``Request.reply_to``; every
reply that :class:`~styx_py.worker.replies.ReplyOut` hands to the egress producer for a request that
names a subscribed client is also sent to that client, in the same event-loop tick (the transport batches
one frame per connection per tick). So a push carries exactly what goes to the log, at the moment it
goes: after every worker's sequencer-log entry of the epoch is durable (the Votes wait for it), with
the fencing and holding of :meth:`ReplyOut.emit`. A replayed epoch produces the same replies
(determinism), so a client that took the pushed copy and then sees the logged one sees the same.

The push is best effort: nothing waits for it, a client whose connection drops is forgotten, and
the egress topic stays the record every client also reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from styx_py.core.wire import Message, PushedReply, Reply, SubscribeRefused

log = logging.getLogger("styx.worker")

MAX_SUBSCRIBERS = 1024
"""Clients one worker pushes to; more are refused with :class:`SubscribeRefused` (they read the egress
topic only)."""


class ReplyFeed:
    """The clients subscribed on this worker's port (their node ids), and the push of their replies."""

    def __init__(self, send: Callable[[str, Message], None]) -> None:
        self.send = send  # the worker's transport: buffered, one frame per connection per tick
        self.clients: set[str] = set()
        self.pushed = 0  # replies pushed since the start (metrics, tests)

    def subscribe(self, client: str) -> bool:
        """Push to ``client`` the replies to requests that name it; False when the worker has
        :data:`MAX_SUBSCRIBERS` clients already: the client is told so, nothing else changes."""
        if client not in self.clients and len(self.clients) >= MAX_SUBSCRIBERS:
            log.warning("refusing %s's reply subscription: %d clients subscribed", client, MAX_SUBSCRIBERS)
            self.send(client, SubscribeRefused(MAX_SUBSCRIBERS))
            return False
        self.clients.add(client)
        return True

    def drop(self, client: str) -> None:
        """``client``'s connection closed: push nothing more to it."""
        self.clients.discard(client)

    def offer(self, reply: Reply, reply_to: str) -> None:
        """``reply`` leaves for the egress topic now: push it to ``reply_to`` (its request's client),
        if that client subscribed here."""
        if reply_to in self.clients:
            self.send(reply_to, PushedReply(reply))
            self.pushed += 1
