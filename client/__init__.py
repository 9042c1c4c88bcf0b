"""Client SDK of styx-py: submit transactions to a cluster over Kafka and get their outcomes.

::

    from styx_py.client import StyxClient

    async with await StyxClient.connect("127.0.0.1:7000") as styx:   # or StyxClient(bootstrap, operators)
        balance = await styx.call("account", "alice", "deposit", 10)

:class:`SyncStyxClient` offers the same calls for blocking code. Errors are the ``styx_py`` ones:
:class:`BadRequest`, :class:`TransactionAborted` and :class:`TransactionFailed` for transactions that
did not commit, :class:`RequestTimeout` and :class:`Overloaded` for the client side, and
:class:`Unavailable` when the cluster cannot take requests (recovering, unreachable).

The HTTP gateway (``styx gateway``, started by ``styx up``) is :class:`Gateway` with its
:class:`GatewayConfig`; see ``styx_py.client.gateway`` (its ``app`` module) for the routes and status
codes.
"""

from typing import TYPE_CHECKING, Any

from styx_py.client.sdk import Call, ClientStats, StyxClient, SyncStyxClient, result_of
from styx_py.core.errors import (
    BadRequest,
    Overloaded,
    RequestTimeout,
    StyxError,
    TransactionAborted,
    TransactionFailed,
    Unavailable,
)
from styx_py.core.wire import Reply

__all__ = [
    "BadRequest",
    "Call",
    "ClientStats",
    "Gateway",
    "GatewayConfig",
    "Overloaded",
    "Reply",
    "RequestTimeout",
    "StyxClient",
    "StyxError",
    "SyncStyxClient",
    "TransactionAborted",
    "TransactionFailed",
    "Unavailable",
    "result_of",
]

if TYPE_CHECKING:
    from styx_py.client.gateway import Gateway, GatewayConfig

_GATEWAY_NAMES = frozenset({"Gateway", "GatewayConfig"})


def __getattr__(name: str) -> Any:
    """The gateway's names, imported on first use: SDK users do not pay for FastAPI's import (~0.3 s)."""
    if name in _GATEWAY_NAMES:
        from styx_py.client import gateway

        return getattr(gateway, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
