"""Replies pushed to clients on the workers' ports: the reply path without the broker hop.

A client (the SDK, and through it the gateway) dials every worker's port, proves the cluster secret
like any admin client, and sends :class:`SubscribeReplies`. Every request it sends names that
connection's node id in ``Request.reply_to``; a worker on which that node subscribed also sends it,
as :class:`PushedReply`, the request's reply at the moment the reply is handed to the egress
producer. The egress topic stays the record (and the path for every reply the push missed): the
client takes whichever copy comes first. A worker that pushes to as many clients as it takes answers
:class:`SubscribeRefused` instead.
"""

from __future__ import annotations

from styx_py.core.wire.codes import Msg
from styx_py.core.wire.logs import Reply


class SubscribeReplies(Msg, tag="sub"):
    """Client -> worker: push on this connection the replies to requests whose ``reply_to`` names the
    node id this connection proved."""


class PushedReply(Msg, tag="push"):
    """Worker -> client: one reply, as it leaves for the egress topic."""

    reply: Reply


class SubscribeRefused(Msg, tag="subno"):
    """Worker -> client: this worker pushes to ``limit`` clients already and took not this
    subscription; the client reads this worker's replies from the egress topic."""

    limit: int
