"""Replies pushed to clients on the workers' ports: the reply path without the broker hop.

A client (the SDK, and through it the gateway) dials every worker's port, proves the cluster secret
like any admin client, and sends :class:`SubscribeReplies` with the prefix its generated request ids
start with. From then on the worker also sends it, as :class:`PushedReply`, every reply to such a
request at the moment the reply is handed to the egress producer. The egress topic stays the record
(and the path for every reply the push missed): the client takes whichever copy comes first.
"""

from __future__ import annotations

from styx_py.core.wire.codes import Msg
from styx_py.core.wire.logs import Reply

MIN_PREFIX = 8
"""Shortest prefix a worker accepts: a shorter one would claim other clients' replies."""
MAX_PREFIX = 64


class SubscribeReplies(Msg, tag="sub"):
    """Client -> worker: push the replies to request ids that start with ``prefix`` on this connection."""

    prefix: str


class PushedReply(Msg, tag="push"):
    """Worker -> client: one reply, as it leaves for the egress topic."""

    reply: Reply
