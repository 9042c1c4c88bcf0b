"""One request in flight (:class:`Pending`) and one caller waiting for it (:class:`Waiter`), as the
client's core keeps them: plain data."""

from __future__ import annotations

from collections.abc import Callable

from styx_py.core.errors import StyxError
from styx_py.core.wire import Key, Reply

__all__ = ["Done", "Named", "Pending", "Waiter"]

Named = tuple[str, str, Key, str]
"""A request as a timeout names it: ``(operator, function, key, request id)``."""

Done = Callable[[Reply | None, StyxError | None], None]
"""What a waiter is told, once: the reply, or why there is none. It runs inside the client's reader or
deadline task: it must be quick and must not raise."""


class Pending:
    """A request in flight: what was sent, where, and who waits for its reply."""

    __slots__ = ("acked", "fingerprint", "on_time", "partition", "rid", "segment", "seq", "stamp", "waiters")

    def __init__(self, rid: str, fingerprint: bytes, partition: int, segment: int, seq: int) -> None:
        self.rid = rid
        self.fingerprint = fingerprint  # what was sent under this id (see requests.same_request)
        self.waiters: list[Waiter] = []
        # Where it was written: the ingress partition and segment, and whether the broker acknowledged
        # it while that segment was still the newest the client knew (then the workers read it before
        # they stop reading the segment; else it is written again to a newer one once they may have:
        # ClientCore.segment_seen).
        self.partition = partition
        self.segment = segment
        self.on_time = False
        self.acked = False  # the broker acknowledged its first write
        self.stamp = 0  # its record's Kafka timestamp (ms), as the producer stamped it
        self.seq = seq  # how many entries the table registered before this one (PendingTable.registered)


class Waiter:
    """One caller waiting for ``entry``'s reply until ``deadline``."""

    __slots__ = ("deadline", "done", "entry", "named", "wait_s")

    def __init__(self, entry: Pending, done: Done, named: Named, wait_s: float, deadline: float) -> None:
        self.entry: Pending | None = entry  # None once it left (settled or given up)
        self.done = done
        self.named = named
        self.wait_s = wait_s
        self.deadline = deadline
