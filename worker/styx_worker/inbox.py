"""The one place a worker keeps a message until it can be handled, keyed by what it waits for.

Peers run ahead of each other: a peer's call may come before this worker's ``EpochStart``, a fallback
ack before this worker's decision, the next epoch's messages before this one finished here. Each such
message waits in the :class:`Inbox` under ``(epoch, Until, tid)`` and is handled, in arrival order, when
the epoch machine reaches that point (:meth:`Inbox.release`). What an epoch still holds when it finishes
(a late copy of a serial transaction's message) is dropped with it.

The inbox is bounded (:data:`~styx_py.core.limits.MAX_HELD_MESSAGES`): beyond it a message is dropped and
counted; the epoch it belonged to stalls and the coordinator's epoch watchdog recovers the cluster, as
for a message lost on the network.
"""

from __future__ import annotations

from enum import IntEnum

from styx_py.core.limits import MAX_HELD_MESSAGES
from styx_py.core.wire import Ack, CallResult, EpochStart, ExecDone, Final, Invoke, Revote, Vote

__all__ = ["EpochMessage", "Inbox", "Until"]

EpochMessage = Invoke | Ack | CallResult | Final | EpochStart | ExecDone | Vote | Revote
"""Every message that belongs to an epoch."""


class Until(IntEnum):
    """What a held message waits for."""

    VIEW = 0  # the worker's first cluster view (a restarted worker hears peers before the coordinator)
    OPEN = 1  # the epoch before it finished here
    STARTED = 2  # its EpochStart came: the code its invocations run is known
    DECIDED = 3  # its decision: the fallback's messages
    TURN = 4  # its serial transaction's turn (the key's tid)


Key = tuple[int, Until, int]


class Inbox:
    __slots__ = ("dropped", "held", "limit", "size")

    def __init__(self, limit: int = MAX_HELD_MESSAGES) -> None:
        self.held: dict[Key, list[EpochMessage]] = {}
        self.size = 0
        self.limit = limit
        self.dropped = 0  # messages refused at the limit (metrics)

    def hold(self, epoch: int, until: Until, msg: EpochMessage, tid: int = 0) -> None:
        if self.size >= self.limit:
            self.dropped += 1
            return
        key = (epoch, until, tid)
        queue = self.held.get(key)
        if queue is None:
            self.held[key] = [msg]
        else:
            queue.append(msg)
        self.size += 1

    def release(self, epoch: int, until: Until, tid: int = 0) -> list[EpochMessage]:
        """The messages that waited for this, in the order they came (they may be held again)."""
        queue = self.held.pop((epoch, until, tid), None)
        if queue is None:
            return []
        self.size -= len(queue)
        return queue

    def drop_epoch(self, epoch: int) -> None:
        """``epoch`` finished here: what it still holds will never be needed."""
        for key in [k for k in self.held if k[0] == epoch]:
            self.size -= len(self.held.pop(key))

    def clear(self) -> None:
        self.held.clear()
        self.size = 0

    def __len__(self) -> int:
        return self.size
