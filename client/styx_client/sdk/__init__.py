"""Client SDK: send requests to a styx-py cluster through Kafka and match the replies.

A request is a msgpack :class:`~styx_py.core.wire.Request` produced to the ingress topic, in the partition
that owns its key (``partition_of(key, operator partitions)``), so the worker that owns the entity
sequences it. Every request names the client's **reply partition**, and the cluster answers with a
:class:`~styx_py.core.wire.Reply` on that egress partition (its ``value`` is the decoded result). The
client reads only that partition, with one consumer task, and routes each reply to the callers
waiting for its request id. Clients with distinct reply partitions never see each other's replies.

Two properties matter and are kept on purpose:

* **No missed replies.** The reply future is registered before the request is produced, and
  :meth:`StyxClient.start` returns only once the consumer is positioned at the current end of every
  reply partition, so a reply to any request sent after ``start()`` lies ahead of the consumer.
* **No stale or duplicate deliveries.** Replies already in the topic when the client started are
  skipped (the consumer starts at the end), a reply whose id is not pending is ignored, and a second
  reply for an id that was already answered is ignored. Brokers and the server may redeliver (the
  server re-sends replies after recovery); none of that may crash the reader or resolve the wrong call.

The modules, in the order a request meets them:

=================  ==================================================================================
``client.py``      :class:`StyxClient`: construction, start, close, the task group; a facade
``calls.py``       what it sends: submit, submit_future, call, submit_many, prepare
``prepared.py``    :class:`Prepared`, the lean path
``state.py``       reads of committed state as of an epoch, outside transactions (scan, read)
``config.py``      the settings, checked once (:class:`~styx_client.sdk.config.ClientConfig`)
``deployment.py``  what the coordinator says is deployed (:meth:`StyxClient.connect`)
``requests.py``    local checks against the deployed graph, the key's partition, the encoded request
``ids.py``         generated request ids
``core.py``        the sans-I/O core: every decision, fed with events, returning what to do
``pending.py``     the pending table: requests in flight, their waiters, replies routed to them
``waiters.py``     the callers waiting, and their deadlines
``resting.py``     when the egress reader may skip the log (every worker pushing)
``stats.py``       :class:`ClientStats`
``shell.py``       the running client: core and transport wired, the segment and deadline loops
``transport.py``   :class:`~styx_client.sdk.transport.ClientTransport`, what a client needs of the world
``kafka_transport.py``  the Kafka transport; ``kafka.py`` its producer and positioned consumer,
                   ``reader.py`` its egress reader, ``push.py`` the workers' ports,
                   ``outbox.py`` the requests pushed on them
``replies.py``     :func:`result_of` (a reply's result or exception), :func:`decode_reply`
``sync.py``        :class:`SyncStyxClient`, the blocking facade on a private loop thread
=================  ==================================================================================
"""

from styx_client.sdk.client import Call, Prepared, StyxClient
from styx_client.sdk.config import ClientConfig
from styx_client.sdk.ids import RequestIds
from styx_client.sdk.replies import decode_reply, result_of
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.sync import SyncStyxClient
from styx_client.sdk.transport import ClientTransport

__all__ = [
    "Call",
    "ClientConfig",
    "ClientStats",
    "ClientTransport",
    "Prepared",
    "RequestIds",
    "StyxClient",
    "SyncStyxClient",
    "decode_reply",
    "result_of",
]
