"""The client's core: everything a client decides, as plain synchronous code fed with events.

No asyncio, sockets or clocks in here: the shell (:class:`~styx_client.sdk.client.StyxClient`) and its
transport (:mod:`styx_client.sdk.transport`) run the I/O, call one method of :class:`ClientCore` per
event, with the time as an argument, and carry out what it returns:

=============================================  ============================================================
event                                          what the core does, and what it returns to act on
=============================================  ============================================================
:meth:`~ClientCore.admit` (a caller's          checks the id's reuse and the room, registers the entry;
request, encoded)                              whether it is new (then the shell produces its record)
:meth:`~ClientCore.wait`                       one more waiter, with its deadline (the shell wakes the core
                                               at :attr:`~ClientCore.wake_at`)
:meth:`~ClientCore.acknowledged` (the broker   notes whether the write is read for sure; True: push the
took a record)                                 request to the worker that reads its partition
:meth:`~ClientCore.undelivered`                settles its waiters with the failure
:meth:`~ClientCore.from_log` (an egress        skips copies of replies already taken, decodes, settles the
record)                                        waiters; True: ask the coordinator for the workers again
:meth:`~ClientCore.pushed` (a pushed reply)    settles the waiters
:meth:`~ClientCore.segment_seen` (a look at    the requests to write again to the newest segment
the ingress segments)
:meth:`~ClientCore.tick` (time passed)         times out the waiters due; when to be woken next
:meth:`~ClientCore.stop` (closing, or a        fails every request in flight; refuses new ones
background task failed)
=============================================  ============================================================

Waiters are settled by calling their ``done`` (:mod:`styx_client.sdk.waiters`): that is the one thing
the core calls, and it calls nothing of the client. The per-request events return plain values, not
lists of action objects: the lean path (:class:`~styx_client.sdk.prepared.Prepared`) costs a few
microseconds per request and an object per action would be a tenth of that.

Ingress segments (:mod:`styx_py.core.segments`): requests go to the newest segment the client knows. A
request the broker acknowledged while its segment was the newest (a look less than ``FRESH_S`` before
found the next one missing) is read by the workers: they stop reading a segment only two rotations
after the next one appeared, and only once they read it to its end. One acknowledged later (in flight
when the client moved on, or written by a client that lagged) may be left unread: once the workers may
have stopped reading its segment (:func:`~styx_py.core.segments.unread`) it is written again to the
newest. A copy that did run is answered from the reply table, with the same reply.
"""

from __future__ import annotations

import logging
import math

import msgspec

from styx_client.sdk.pending import EGRESS, PUSHED, Pending, PendingTable
from styx_client.sdk.resting import EgressRest
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.waiters import Done, Named, Waiter
from styx_py.core.errors import StyxError, Unavailable
from styx_py.core.segments import FRESH_S, LIVE, unread
from styx_py.core.wire import Reply, reply_decoder

__all__ = ["ClientCore"]

log = logging.getLogger("styx.client")


class ClientCore:
    """The state of one client's requests and what it knows of the cluster (module docstring)."""

    def __init__(
        self,
        max_pending: int,
        egress_topic: str,
        *,
        rest: bool,
        push_requests: bool,
        fresh_s: float = FRESH_S,
        shed_when_refused: bool = True,
    ) -> None:
        self.stats = ClientStats()
        self.fresh_s = fresh_s  # a write this soon after a look found its segment newest is read for sure
        self.table = PendingTable(max_pending, self.stats, shed_when_refused)
        # The egress reader rests while every worker pushes (styx_client.sdk.resting); None: it never does.
        self.rest = EgressRest(self.table, egress_topic) if rest else None
        self.push_requests = push_requests
        self.segment = 0  # the newest ingress segment known, where requests go
        # Segment -> when the client last looked and found it the newest: its next one did not exist
        # then. The last few segments only.
        self.looked: dict[int, float] = {}
        self.stopped: StyxError | None = None  # why the client takes no more requests

    @property
    def wake_at(self) -> float:
        """When :meth:`tick` has something to do (inf: nothing is waited for)."""
        return self.table.deadlines.wake_at

    def check_open(self) -> None:
        """Raise :class:`~styx_py.core.errors.StyxError` (a new one, naming the same cause) once stopped."""
        stopped = self.stopped
        if stopped is not None:
            raise StyxError(str(stopped)) from stopped.__cause__

    # ---- requests ------------------------------------------------------------------------------------

    def admit(self, rid: str, record: bytes, partition: int) -> tuple[Pending, bool]:
        """A caller's request ``rid`` with its ``record``: its entry, and whether it is new (the shell then
        produces it to ``entry.segment``). One in flight with the same request is joined. Raises
        :class:`~styx_py.core.errors.BadRequest` for an id reused for another request,
        :class:`~styx_py.core.errors.Overloaded` without room."""
        table = self.table
        table.check_reuse(rid, record)
        entry = table.get(rid)
        if entry is not None:
            return entry, False
        table.check_room()
        return table.register(rid, record, partition, self.segment), True

    def admit_new(self, rid: str, record: bytes, partition: int) -> Pending:
        """:meth:`admit` of a generated id, for the lean path, once ``table.check_room()`` passed
        (before the id and the record were made): two look-ups."""
        table = self.table
        table.check_new(rid, record)
        return table.register(rid, record, partition, self.segment)

    def wait(self, entry: Pending, done: Done, wait_s: float, named: Named, now: float) -> Waiter:
        """One more waiter of ``entry``; if its deadline is now :attr:`wake_at`, the shell wakes earlier."""
        return self.table.wait(entry, done, wait_s, named, now)

    def give_up(self, waiter: Waiter) -> None:
        self.table.give_up(waiter)

    # ---- the broker ----------------------------------------------------------------------------------

    def acknowledged(self, entry: Pending, segment: int, offset: int, now: float) -> bool:
        """The broker acknowledged a write of ``entry`` to ``segment`` at ``offset``, at ``now``
        (monotonic s). True: push the request to the worker reading its partition."""
        if segment == entry.segment:  # the latest write; an older copy's acknowledgement says nothing
            entry.on_time = self.on_time(segment, now)
        if entry.acked:
            return False  # a copy written again
        entry.acked = True
        self.stats.sent += 1
        # Pushed even when answered already: the worker counts on every record coming pushed (its
        # ingress waits longer once they all do, styx_worker.ingress).
        return self.push_requests

    def undelivered(self, entry: Pending, exc: BaseException, unavailable: bool) -> None:
        """The producer could not deliver ``entry``'s record (``unavailable``: the broker's fault)."""
        if unavailable:
            self.table.fail(entry, Unavailable(f"could not send request {entry.rid}: {exc!r}"), exc)
        else:
            self.table.fail(entry, StyxError(f"request {entry.rid} was not sent: {exc!r}"), exc)

    def on_time(self, segment: int, now: float) -> bool:
        """Whether a record written to ``segment`` and acknowledged at ``now`` is read by the workers for
        sure: a look less than :data:`FRESH_S` before found ``segment`` the newest (see
        ``core.segments.LIVE``). The client may have moved on since (the record was in flight then):
        what counts is that the one after ``segment`` did not exist at that look."""
        return now - self.looked.get(segment, -math.inf) < self.fresh_s

    # ---- replies -------------------------------------------------------------------------------------

    def from_log(self, key: bytes | None, value: bytes | None, pushes_healthy: bool) -> bool:
        """An egress record. True when it answered a request although every worker pushes to this client
        (``pushes_healthy``): its partition may belong to a worker that joined since the client last
        asked (styx_client.sdk.push), so ask the coordinator for the workers now."""
        table = self.table
        if key is not None and table.taken_copy(key):
            return False
        try:
            if value is None:
                raise msgspec.DecodeError("empty record value")
            reply = reply_decoder.decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.stats.undecodable += 1
            log.warning("skipping an undecodable egress record (key %r): %s", key, exc)
            return False
        return table.resolve(reply, EGRESS) and pushes_healthy

    def pushed(self, reply: Reply) -> None:
        """A reply a worker pushed (:mod:`styx_client.sdk.push`)."""
        self.table.resolve(reply, PUSHED)

    def marks(self, ends: list[tuple[int, int]], now: float) -> None:
        """A worker's egress acknowledgements (:mod:`styx_client.sdk.resting`)."""
        if self.rest is not None:
            self.rest.mark(ends, now)

    # ---- segments and time ---------------------------------------------------------------------------

    def segment_seen(self, newest: int, asked_at: float) -> list[Pending]:
        """A look at ``asked_at`` found ``newest`` the newest ingress segment. The requests to write
        again to it (each now names it, and counts as rewritten): those not acknowledged on time and
        last written to a segment the workers may no longer read (module docstring)."""
        if newest < self.segment:
            return []  # an answer older than one already taken
        moved = newest > self.segment
        self.segment = newest
        self.looked[newest] = asked_at
        for old in [s for s in self.looked if s < newest - LIVE]:
            del self.looked[old]
        if not moved:
            return []
        again = [e for e in self.table.entries.values() if not e.on_time and unread(e.segment, newest)]
        for entry in again:
            entry.segment, entry.on_time = newest, False
        self.stats.rewritten += len(again)
        return again

    def tick(self, now: float) -> float:
        """Time out the waiters due by ``now``; when to be woken next (:attr:`wake_at`)."""
        self.table.expire(now)
        return self.table.deadlines.wake_at

    def stop(self, error: StyxError) -> None:
        """Take no more requests (raising ``error``) and fail every one in flight with it."""
        if self.stopped is None:
            self.stopped = error
        self.table.fail_all(error)
