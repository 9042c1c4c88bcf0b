"""Client SDK of styx-py: submit transactions to a cluster over Kafka and get their outcomes.

::

    from client import StyxClient

    async with await StyxClient.connect("127.0.0.1:7000") as styx:   # or StyxClient(bootstrap, operators)
        balance = await styx.call("account", "alice", "deposit", 10)

:class:`SyncStyxClient` offers the same calls for blocking code. Errors are the ``styx_py`` ones:
:class:`BadRequest`, :class:`TransactionAborted` and :class:`TransactionFailed` for transactions that
did not commit, :class:`RequestTimeout` and :class:`Overloaded` for the client side.
"""

from client.sdk import Call, ClientStats, StyxClient, SyncStyxClient, result_of
from styx_py.errors import (
    BadRequest,
    Overloaded,
    RequestTimeout,
    StyxError,
    TransactionAborted,
    TransactionFailed,
)
from styx_py.wire import Reply

__all__ = [
    "BadRequest",
    "Call",
    "ClientStats",
    "Overloaded",
    "Reply",
    "RequestTimeout",
    "StyxClient",
    "StyxError",
    "SyncStyxClient",
    "TransactionAborted",
    "TransactionFailed",
    "result_of",
]
