"""The one exception of the local stack."""

from __future__ import annotations

__all__ = ["ServiceError"]


class ServiceError(RuntimeError):
    """A local service could not be found, started or reached.

    One exception type so that callers (``styx up``, fixtures) can report the problem
    without knowing which of the services or which step failed.
    """
