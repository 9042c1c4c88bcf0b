"""Replies pushed to clients, and requests pushed to workers: the paths without a broker hop.

A client (the SDK, and through it the gateway) dials every worker's port, proves the cluster secret
like any admin client, and sends :class:`SubscribeReplies`. Every request it sends names that
connection's node id in ``Request.reply_to``; a worker on which that node subscribed also sends it,
as :class:`PushedReply`, the request's reply at the moment the reply is handed to the egress
producer. The egress topic stays the record (and the path for every reply the push missed): the
client takes whichever copy comes first. A worker that pushes to as many clients as it takes answers
:class:`SubscribeRefused` instead.

On the same connection the client pushes each request the broker acknowledged to the worker that
reads its ingress partition, as :class:`PushedRequest`: the record as the broker stores it, with its
offset. The worker takes it in offset order like a fetched one (styx_worker.ingress) and skips the
fetched copy, which the ingress fetch still reads and compares: the request is sequenced a broker
fetch sooner, and what every epoch sequences is still exactly what the ingress topic holds.
"""

from __future__ import annotations

from styx_py.core.wire.codes import Msg
from styx_py.core.wire.logs import Reply


class SubscribeReplies(Msg, tag="sub"):
    """Client -> worker: push on this connection the replies to requests whose ``reply_to`` names the
    node id this connection proved; with ``marks``, also :class:`EgressAcked` now and then."""

    marks: bool = False


class EgressAcked(Msg, tag="eack"):
    """Worker -> client (subscribed with ``marks``): per egress partition, the packed offset
    (:func:`~styx_py.core.segments.pack`: segment and Kafka offset) below which the broker acknowledged
    this worker's replies. Every record below it was appended before this message was sent, whoever
    wrote it: a client whose requests sent before it arrived are all answered may skip that part of the
    log (styx_client.sdk.resting)."""

    ends: list[tuple[int, int]]


class PushedReply(Msg, tag="push"):
    """Worker -> client: one reply, as it leaves for the egress topic."""

    reply: Reply


class SubscribeRefused(Msg, tag="subno"):
    """Worker -> client: this worker pushes to ``limit`` clients already and took not this
    subscription; the client reads this worker's replies from the egress topic."""

    limit: int


class PushedRequest(Msg, tag="preq"):
    """Client -> worker: the ingress record the broker acknowledged at ``offset`` of ``partition`` in
    ingress segment ``segment`` (its key, value and Kafka timestamp, exactly as stored)."""

    segment: int
    partition: int
    offset: int
    ts_ms: int
    key: bytes | None
    value: bytes
