"""Callers waiting for a reply, and when each of them times out: plain data, no event loop.

A :class:`Waiter` is one caller of one request id. Every kind of caller (``submit``, ``submit_future``,
the lean path's callback) is a waiter with a ``done(reply, error)`` function that the core calls exactly
once: with the reply, or with why there is none (a timeout, a failed send, the client stopping). A
caller that gives up first (a cancelled future) leaves without being called.

:class:`Deadlines` orders the waiters by deadline without a timer per request. Waiters are queued per
``wait_s`` in the order they came, which is also the order of their deadlines (time never goes back),
so the earliest deadline is at the head of a queue. The client's shell wakes the core at
:attr:`Deadlines.wake_at`; then every waiter whose deadline has passed expires, and the next wake-up is
at least :data:`~styx_py.core.limits.DEADLINE_SWEEP_S` later, so a burst of expiries is handled in one
sweep. A timeout is therefore reported up to ``DEADLINE_SWEEP_S`` (plus scheduling lag) after its
deadline, never before.
"""

from __future__ import annotations

import collections
import math

from styx_client.sdk.entry import Done, Named, Waiter
from styx_py.core.errors import RequestTimeout
from styx_py.core.limits import DEADLINE_SWEEP_S

__all__ = ["Deadlines", "Done", "Named", "Waiter", "timeout_error"]


def timeout_error(waiter: Waiter) -> RequestTimeout:
    operator, function, key, rid = waiter.named
    return RequestTimeout(
        f"no reply to {operator}.{function}(key={key!r}) request {rid} within {waiter.wait_s} s", rid
    )


class Deadlines:
    """When each waiter times out (module docstring)."""

    __slots__ = ("_queues", "wake_at")

    def __init__(self) -> None:
        self._queues: dict[float, collections.OrderedDict[Waiter, None]] = {}
        self.wake_at = math.inf  # when the earliest deadline may have passed

    def add(self, waiter: Waiter) -> bool:
        """Queue ``waiter``; True when its deadline is earlier than :attr:`wake_at` (which it becomes)."""
        queue = self._queues.get(waiter.wait_s)
        if queue is None:
            queue = self._queues[waiter.wait_s] = collections.OrderedDict()
        queue[waiter] = None
        if waiter.deadline < self.wake_at:
            self.wake_at = waiter.deadline
            return True
        return False

    def discard(self, waiter: Waiter) -> None:
        queue = self._queues.get(waiter.wait_s)
        if queue is not None:
            queue.pop(waiter, None)

    def clear(self) -> None:
        self._queues.clear()
        self.wake_at = math.inf

    def expire(self, now: float) -> list[Waiter]:
        """The waiters whose deadline passed by ``now``, out of their queues; :attr:`wake_at` is then
        the next deadline, but at least :data:`~styx_py.core.limits.DEADLINE_SWEEP_S` after ``now``."""
        due: list[Waiter] = []
        earliest = math.inf
        for wait_s, queue in list(self._queues.items()):
            while queue:
                head = next(iter(queue))
                if head.deadline > now:
                    earliest = min(earliest, head.deadline)
                    break
                queue.popitem(last=False)
                due.append(head)
            if not queue:
                del self._queues[wait_s]
        self.wake_at = max(earliest, now + DEADLINE_SWEEP_S) if earliest < math.inf else math.inf
        return due
