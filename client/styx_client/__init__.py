"""Client SDK of styx-py: submit transactions to a cluster over Kafka and get their outcomes.

::

    from styx_client import StyxClient

    async with await StyxClient.connect("127.0.0.1:7000") as styx:   # or StyxClient(bootstrap, operators)
        balance = await styx.call("account", "alice", "deposit", 10)    # the decoded result
        reply = await styx.submit("account", "alice", "deposit", 10)    # the Reply, whatever its status
        print(reply.status, reply.value, reply.tid)
        epoch, rows = await styx.scan("account", prefix="acct")         # committed state, one epoch

:class:`SyncStyxClient` offers the same calls for blocking code. :class:`Reply` is the server's answer:
``value`` (the decoded result), ``status``, ``error``, ``error_type``, ``request_id``, ``tid``,
``epoch``. Errors are the ``styx_py`` ones (tree in :mod:`styx_py.core.errors`)::

    StyxError
    ├── TransactionFailed      did not commit: an exception in a function (``exception_type`` names it)
    │   ├── TransactionAborted     the function raised ``Abort``
    │   └── BadRequest             unknown operator/function, bad key or arguments, a limit
    ├── RequestTimeout         no reply in time (``request_id``: resend it to get the reply)
    ├── Overloaded             ``max_pending`` requests in flight in this client, or refused by
    │                          the cluster's admission control (``reply`` status ``refused``)
    ├── Unavailable            the cluster cannot take requests (unreachable, recovering)
    ├── StateReadRefused       ``scan``/``read`` refused (``code``: unknown operator, epoch not committed)
    │   └── EpochOutOfWindow       ``as_of_epoch`` older than the workers keep in memory (``oldest``)
    └── ConfigError            a bad argument (e.g. ``reply_partition`` the egress topic lacks)

A :class:`TransactionFailed` carries the ``reply`` and its ``request_id``, ``tid``, ``epoch``,
``error`` and ``error_type``. Each client reads only its reply partition of the egress topic
(``reply_partition=``, default a stable hash of ``client_id=``): see :class:`StyxClient`.

A client reaches Kafka with TLS and SASL when given a :class:`KafkaSecurity` (``kafka_security=``,
default from the ``STYX_KAFKA_SECURITY_PROTOCOL``, ``STYX_KAFKA_SSL_*`` and ``STYX_KAFKA_SASL_*``
environment), and the cluster's ports in mutual TLS with the ``STYX_TLS_*`` files (docs/deploy.md).

The HTTP gateway (``styx gateway``, started by ``styx up``) is :class:`Gateway` with its
:class:`GatewayConfig` (and its parts :class:`GatewayLimits` and :class:`GatewayTiming`); see
``styx_client.gateway`` (its ``app`` module) for the routes and status codes.
"""

from typing import TYPE_CHECKING, Any

from styx_client.sdk import Call, ClientStats, StyxClient, SyncStyxClient, result_of
from styx_py.core.errors import (
    BadRequest,
    ConfigError,
    EpochOutOfWindow,
    Overloaded,
    RequestTimeout,
    StateReadRefused,
    StyxError,
    TransactionAborted,
    TransactionFailed,
    Unavailable,
)
from styx_py.core.security import KafkaSecurity
from styx_py.core.wire import Reply, ReplyStatus

__all__ = [
    "BadRequest",
    "Call",
    "ClientStats",
    "ConfigError",
    "EpochOutOfWindow",
    "Gateway",
    "GatewayConfig",
    "GatewayLimits",
    "GatewayTiming",
    "KafkaSecurity",
    "Overloaded",
    "Reply",
    "ReplyStatus",
    "RequestTimeout",
    "StateReadRefused",
    "StyxClient",
    "StyxError",
    "SyncStyxClient",
    "TransactionAborted",
    "TransactionFailed",
    "Unavailable",
    "result_of",
]

if TYPE_CHECKING:
    from styx_client.gateway import Gateway, GatewayConfig, GatewayLimits, GatewayTiming

_GATEWAY_NAMES = frozenset({"Gateway", "GatewayConfig", "GatewayLimits", "GatewayTiming"})


def __getattr__(name: str) -> Any:
    """The gateway's names, imported on first use: SDK users do not pay for FastAPI's import (~0.3 s)."""
    if name in _GATEWAY_NAMES:
        from styx_client import gateway

        return getattr(gateway, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
