"""Replies pushed to the clients that asked for them (:mod:`styx_py.core.wire.push`).

A client subscribes on its connection with the prefix of its generated request ids; every reply that
:class:`~styx_py.worker.replies.ReplyOut` hands to the egress producer and whose request id starts with
a subscribed prefix is also sent to that client, in the same event-loop tick (the transport batches
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

from styx_py.core.wire import MAX_PREFIX, MIN_PREFIX, Message, PushedReply, Reply

log = logging.getLogger("styx.worker")

MAX_SUBSCRIBERS = 1024
"""Clients one worker pushes to; more are refused (they read the egress topic only)."""


class ReplyFeed:
    """Who gets which replies pushed: request-id prefix -> the client's node id on this worker's port."""

    def __init__(self, send: Callable[[str, Message], None]) -> None:
        self.send = send  # the worker's transport: buffered, one frame per connection per tick
        self.clients: dict[str, str] = {}  # prefix -> client
        self.lengths: tuple[int, ...] = ()  # the distinct prefix lengths, longest first
        self.pushed = 0  # replies pushed since the start (metrics, tests)

    def subscribe(self, client: str, prefix: str) -> bool:
        """Push replies to ids starting with ``prefix`` to ``client``; False (and nothing changes) when
        the prefix is outside ``MIN_PREFIX..MAX_PREFIX`` characters or the worker has enough clients."""
        if not MIN_PREFIX <= len(prefix) <= MAX_PREFIX:
            log.warning("refusing %s's reply subscription: a prefix of %d characters", client, len(prefix))
            return False
        if prefix not in self.clients and len(self.clients) >= MAX_SUBSCRIBERS:
            log.warning("refusing %s's reply subscription: %d clients subscribed", client, MAX_SUBSCRIBERS)
            return False
        self.clients[prefix] = client
        self._index()
        return True

    def drop(self, client: str) -> None:
        """``client``'s connection closed: push nothing more to it."""
        if client in self.clients.values():
            self.clients = {p: c for p, c in self.clients.items() if c != client}
            self._index()

    def _index(self) -> None:
        self.lengths = tuple(sorted({len(p) for p in self.clients}, reverse=True))

    def offer(self, reply: Reply) -> None:
        """``reply`` leaves for the egress topic now: push it to its client, if one subscribed."""
        if not self.lengths:
            return
        rid = reply.request_id
        for n in self.lengths:
            client = self.clients.get(rid[:n])
            if client is not None:
                self.send(client, PushedReply(reply))
                self.pushed += 1
                return
