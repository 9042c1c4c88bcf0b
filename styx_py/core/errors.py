"""Exception tree of styx-py.

::

    StyxError                      operating errors a caller can handle
    ├── GraphError                 a graph failed validation at deploy time (unknown target, bad partitions…)
    ├── ConfigError                a configuration value is missing or invalid (names the key)
    ├── ProtocolError              bytes on the wire that are not a valid frame/message
    ├── MissingExtra               a command needs an extra that is not installed (``styx_py.extras``)
    ├── TransactionFailed          a transaction did not commit; raised by the SDK
    │   ├── TransactionAborted     user logic aborted it (``Abort`` or an exception in a function)
    │   └── BadRequest             unknown operator/function, undecodable arguments…
    ├── RequestTimeout             no reply within the deadline
    ├── Overloaded                 too many pending requests in the client
    └── Unavailable                the cluster cannot take requests now (unreachable, recovering)

    Abort(Exception)               raised by user code to abort the whole transaction;
                                   its message reaches the client

Internal control signals derive from ``BaseException`` so that a user's ``except Exception`` cannot
swallow them (``worker.executor`` defines them).
"""

from __future__ import annotations


class StyxError(Exception):
    """Base of every operating error raised by styx-py."""


class GraphError(StyxError):
    """A dataflow graph failed validation."""


class ConfigError(StyxError):
    """A configuration value is missing or invalid; the message names the key."""


class ProtocolError(StyxError):
    """Bytes received on a channel are not a valid frame or message."""


class TransactionFailed(StyxError):
    """A transaction did not commit. ``reply`` holds the server's reply."""

    def __init__(self, message: str, reply: object = None) -> None:
        super().__init__(message)
        self.reply = reply


class TransactionAborted(TransactionFailed):
    """User logic aborted the transaction (``Abort`` or an exception in a function)."""


class BadRequest(TransactionFailed):
    """The request cannot run: unknown operator or function, undecodable arguments."""


class RequestTimeout(StyxError):
    """No reply arrived before the deadline."""


class Overloaded(StyxError):
    """The client has too many requests in flight; retry later."""


class Unavailable(StyxError):
    """The cluster cannot take requests now (broker or coordinator unreachable, recovering,
    nothing deployed); retry later. The gateway answers it with 503."""


class Abort(Exception):
    """Raise inside a function to abort the whole transaction; the message reaches the client."""
