"""styx-py: deterministic, transactional stateful functions.

The public API for application code::

    from styx_py import Operator, Context, Graph, Abort
"""

from styx_py.core.context import Context
from styx_py.core.errors import (
    Abort,
    BadRequest,
    ConfigError,
    GraphError,
    Overloaded,
    ProtocolError,
    RequestTimeout,
    StyxError,
    TransactionAborted,
    TransactionFailed,
    Unavailable,
)
from styx_py.core.graph import Graph, load_graph
from styx_py.core.operator import Operator
from styx_py.core.partitioning import partition_of

__all__ = [
    "Abort",
    "BadRequest",
    "ConfigError",
    "Context",
    "Graph",
    "GraphError",
    "Operator",
    "Overloaded",
    "ProtocolError",
    "RequestTimeout",
    "StyxError",
    "TransactionAborted",
    "TransactionFailed",
    "Unavailable",
    "load_graph",
    "partition_of",
]
