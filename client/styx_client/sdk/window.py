"""How many requests a client keeps in flight once the cluster refuses some (pure).

``max_pending`` bounds a client's requests in flight. Past the cluster's knee that bound is far more
than the cluster admits: every request over what it admits is still produced, fetched, logged and
answered ``refused`` (styx_worker.admission), work that competes with the requests it admits. So the
client narrows its own window when refusals come, and the requests over it are refused here, at
once, with :class:`~styx_py.core.errors.Overloaded`, nothing sent: the cheapest refusal there is.

Only refusals for the cluster's backlog (``Reply.reason`` ``backlog``, or none) narrow it. A request
refused behind its root entity's queue (``entity``: a hot key, TPC-C's district) says nothing about
the rest: the cluster admits every other entity's requests, and a steady trickle of such refusals
would keep the whole client small; the caller gets :class:`Overloaded` with that reason and the
entity, the window stays.

Additive increase, multiplicative decrease, without a clock: a refusal of a request sent after the
last decrease (its ``seq`` at or past :attr:`InFlightWindow.recover_seq`) sets the window to
:data:`BETA` of the requests in flight then (at least :data:`MIN_WINDOW`); refusals of requests sent
before it were sent under the old window and change nothing. Every admitted reply (committed,
aborted or failed) widens it by :data:`ALPHA`, up to ``max_pending``.
"""

from __future__ import annotations

__all__ = ["ALPHA", "BETA", "MIN_WINDOW", "InFlightWindow"]

MIN_WINDOW = 16  # requests in flight a client always may have
BETA = 0.7  # of the requests in flight, on a refusal
ALPHA = 0.1  # requests more per admitted reply (a window's worth of replies widens it by a tenth)


class InFlightWindow:
    __slots__ = ("enabled", "limit", "max_pending", "recover_seq")

    def __init__(self, max_pending: int, enabled: bool = True) -> None:
        self.max_pending = max_pending
        self.enabled = enabled  # False: always max_pending (a test that offers the cluster everything)
        self.limit = float(max_pending)
        self.recover_seq = 0  # refusals of requests registered before this one are of the old window

    def refused(self, seq: int, in_flight: int, registered: int) -> None:
        """The request registered ``seq``-th was refused; ``in_flight`` are, ``registered`` so far."""
        if self.enabled and seq >= self.recover_seq:
            self.limit = max(float(min(MIN_WINDOW, self.max_pending)), min(self.limit, in_flight * BETA))
            self.recover_seq = registered

    def admitted(self) -> None:
        if self.limit < self.max_pending:
            self.limit = min(float(self.max_pending), self.limit + ALPHA)
