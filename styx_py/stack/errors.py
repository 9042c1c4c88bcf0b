"""The one exception of the local stack."""

from __future__ import annotations

from styx_py.core.errors import StyxError

__all__ = ["BrokerLost", "ServiceError"]


class ServiceError(RuntimeError):
    """A local service could not be found, started or reached.

    One exception type so that callers (``styx up``, fixtures) can report the problem
    without knowing which of the services or which step failed.
    """


class BrokerLost(ServiceError, StyxError):
    """The stack's in-memory broker died: the cluster's logs are gone with it, so the stack stops
    (``styx up`` prints it in one line) rather than serve from state the logs no longer hold."""
