"""The pending table: requests in flight by id, their waiters, and the replies routed to them.

Plain synchronous code with no event loop: the client's core (:mod:`styx_client.sdk.core`) feeds it
and it settles waiters (:mod:`styx_client.sdk.waiters`) by calling their ``done`` function.

Callers that submit an id already in flight join its entry instead of sending again; the entry leaves
the table when the reply arrives, when it fails, or when its last waiter gives up. A reply whose id is
not pending is ignored, and so is a second reply for an id that was just answered (brokers and the
server may redeliver): neither may resolve the wrong call.

A request id stands for one payload: the server answers a resent id with its first reply, so reusing an
id for a different request would silently return another request's reply. The table keeps the record
sent under every pending id and under at least the last ``2 * max_pending`` ids that left it
(:data:`~styx_py.core.limits.MIN_RECENT_REQUEST_IDS` at least; answered, timed out or given up:
:class:`Recent`), and refuses a different request under any of
them with :class:`~styx_py.core.errors.BadRequest`. Older ids are not checked (the server still answers
them with their first reply). Keeping the record costs a reference per id; comparing it (without its
timestamp, :func:`~styx_client.sdk.requests.same_request`) is done only when an id is reused, so a
new id costs no digest.
"""

from __future__ import annotations

from typing import Any

from styx_client.sdk.entry import Pending
from styx_client.sdk.requests import same_request
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.waiters import Deadlines, Done, Named, Waiter, timeout_error
from styx_client.sdk.window import InFlightWindow
from styx_py.core.errors import BadRequest, Overloaded, StyxError
from styx_py.core.limits import MIN_RECENT_REQUEST_IDS
from styx_py.core.wire import Refusal, Reply

__all__ = ["EGRESS", "PUSHED", "Pending", "PendingTable", "Recent"]

EGRESS = 1
"""A reply read from the egress topic."""
PUSHED = 2
"""A reply a worker pushed on its port."""


class Recent:
    """Request ids that left the table recently, with a value each: at least the last ``cap`` put, at
    most twice that many.

    Two generations of plain dicts: puts go to the current one, which becomes the old one, the one before
    it dropped whole, once it holds ``cap``; a look-up tries the current one first. A put is one dict
    store, where an ``OrderedDict``'s move and eviction cost about four times as much (two per
    request on the lean path: ~0.6 µs of the load generator's CPU)."""

    __slots__ = ("_cap", "_current", "_old")

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._current: dict[str, Any] = {}
        self._old: dict[str, Any] = {}

    def get(self, rid: str) -> Any:
        value = self._current.get(rid)
        return self._old.get(rid) if value is None else value

    def __contains__(self, rid: str) -> bool:
        return rid in self._current or rid in self._old

    def put(self, rid: str, value: Any) -> None:
        """``value`` (not None) for ``rid``, the newest."""
        current = self._current
        current[rid] = value
        if len(current) >= self._cap:
            self._old, self._current = current, {}


class PendingTable:
    """Requests in flight by id (at most ``max_pending``), and the routing of replies to them."""

    def __init__(self, max_pending: int, stats: ClientStats, shed_when_refused: bool = True) -> None:
        self.max_pending = max_pending
        self.stats = stats
        # At most max_pending in flight, fewer while the cluster refuses (styx_client.sdk.window).
        self.window = InFlightWindow(max_pending, shed_when_refused)
        # In the order they were registered (a dict keeps it): the first is the oldest in flight.
        self.entries: dict[str, Pending] = {}
        self.registered = 0  # entries registered so far (each one's Pending.seq is the count before it)
        # The newest epoch of a reply handed to a caller: this client's reads of committed state read
        # that epoch or a newer one, so they see what the replies it got said (styx_client.sdk.state).
        self.newest_epoch = -1
        # Ids answered recently: a later reply with one of them is a duplicate, not a stranger. Bounded,
        # because redeliveries arrive close to the original and the table must not grow forever.
        # The value: the paths (EGRESS | PUSHED) its reply came by so far.
        self._answered = Recent(max(MIN_RECENT_REQUEST_IDS, 2 * max_pending))
        # What was sent under the ids that left the table (module docstring), bounded the same way.
        self._recent = Recent(max(MIN_RECENT_REQUEST_IDS, 2 * max_pending))
        self.deadlines = Deadlines()

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, rid: str) -> Pending | None:
        return self.entries.get(rid)

    def oldest(self) -> tuple[int, int]:
        """The ``seq`` and ``stamp`` of the oldest request in flight; ``(registered, 0)`` if none: every
        request registered before ``seq`` has left the table (answered, failed or given up)."""
        for entry in self.entries.values():
            return entry.seq, entry.stamp
        return self.registered, 0

    # ---- admission -----------------------------------------------------------------------------------

    def check_reuse(self, rid: str, fingerprint: bytes) -> None:
        """Raise :class:`BadRequest` when ``rid`` is pending or was recently sent for another payload.

        Two dict look-ups for a new id; the records are compared only when the id is reused."""
        entry = self.entries.get(rid)
        sent = entry.fingerprint if entry is not None else self._recent.get(rid)
        if sent is not None and not same_request(sent, fingerprint):
            state = "is in flight" if entry is not None else "was recently sent"
            raise BadRequest(
                f"request id {rid!r} {state} with a different request; a request id stands for one "
                "request (the cluster answers it with its first reply), use a new id"
            )

    def check_room(self) -> None:
        """Raise :class:`Overloaded` when ``max_pending`` requests are in flight, or as many as the
        window allows while the cluster refuses requests."""
        n = len(self.entries)
        if n >= self.max_pending:
            raise Overloaded(f"{n} requests in flight (max_pending={self.max_pending})")
        if n >= self.window.limit:
            self.stats.shed += 1
            raise Overloaded(
                f"{n} requests in flight: the cluster is refusing requests (in-flight window "
                f"{int(self.window.limit)} of max_pending={self.max_pending})"
            )

    def check_new(self, rid: str, fingerprint: bytes) -> None:
        """:meth:`check_reuse` for a generated id, the lean path's: a new id costs two look-ups. Its
        room was asked before the id and the record were made (:meth:`check_room`)."""
        if rid in self.entries or rid in self._recent:  # a generated id a caller chose before
            self.check_reuse(rid, fingerprint)

    def register(self, rid: str, fingerprint: bytes, partition: int, segment: int) -> Pending:
        """Register ``rid`` (not in flight: the checks passed) before it is produced, as its reply may
        come at once."""
        seq = self.registered
        entry = self.entries[rid] = Pending(rid, fingerprint, partition, segment, seq)
        self.registered = seq + 1
        return entry

    def wait(self, entry: Pending, done: Done, wait_s: float, named: Named, now: float) -> Waiter:
        """One more waiter of ``entry``, timed out ``wait_s`` after ``now``; the shell wakes the table
        at ``deadlines.wake_at``, which may now be this waiter's deadline."""
        waiter = Waiter(entry, done, named, wait_s, now + wait_s)
        entry.waiters.append(waiter)
        self.deadlines.add(waiter)
        return waiter

    # ---- leaving -------------------------------------------------------------------------------------

    def give_up(self, waiter: Waiter) -> None:
        """``waiter`` waits no more (a cancelled future); nothing is told. No-op once it left."""
        entry = waiter.entry
        if entry is None:
            return
        waiter.entry = None
        self.deadlines.discard(waiter)
        entry.waiters.remove(waiter)
        if not entry.waiters:
            self._release(entry)

    def expire(self, now: float) -> None:
        """Time out every waiter whose deadline passed by ``now``."""
        for waiter in self.deadlines.expire(now):
            entry = waiter.entry
            assert entry is not None, "a waiter that left is still queued for its deadline"
            waiter.entry = None
            entry.waiters.remove(waiter)
            if not entry.waiters:
                self._release(entry)
            self.stats.timeouts += 1
            waiter.done(None, timeout_error(waiter))

    def _release(self, entry: Pending) -> None:
        if self.entries.get(entry.rid) is entry:
            del self.entries[entry.rid]
            self._recent.put(entry.rid, entry.fingerprint)

    def _settle(self, entry: Pending, reply: Reply | None, error: StyxError | None) -> None:
        """``entry`` leaves the table; every waiter of it is told ``reply`` or ``error``."""
        self._release(entry)
        waiters, entry.waiters = entry.waiters, []
        discard = self.deadlines.discard
        for waiter in waiters:
            discard(waiter)
            waiter.entry = None
            waiter.done(reply, error)

    # ---- replies -------------------------------------------------------------------------------------

    def resolve(self, reply: Reply, path: int = EGRESS) -> bool:
        """Hand ``reply``, which came by ``path`` (:data:`EGRESS` or :data:`PUSHED`), to the request
        waiting for it, and say so (True). If none waits (False): the other path's copy of a reply
        already taken (an echo), a second copy by the same path (a duplicate), or a stranger's."""
        rid = reply.request_id
        entry = self.entries.get(rid)
        if entry is None:
            came = self._answered.get(rid)
            if came is None:
                self.stats.unmatched_ignored += 1
                if rid not in self._recent:
                    self.stats.foreign_ignored += 1
            elif came & path:
                self.stats.duplicates_ignored += 1
            else:
                self._answered.put(rid, came | path)
                self.stats.echoes_ignored += 1
            return False
        stats = self.stats
        stats.replied += 1
        if reply.epoch > self.newest_epoch:
            self.newest_epoch = reply.epoch
        if path == PUSHED:
            stats.pushed += 1
        self._answered.put(rid, path)
        if reply.status == "refused":
            stats.refused += 1
            if reply.reason == Refusal.ENTITY:
                stats.refused_entity += 1  # the caller's hot key: every other request is admitted
            else:
                self.window.refused(entry.seq, len(self.entries), self.registered)
        else:
            self.window.admitted()
        self._settle(entry, reply, None)
        return True

    def taken_copy(self, key: bytes) -> bool:
        """Whether the egress record keyed ``key`` is a copy of a reply already taken, judged by its
        key alone (workers key every reply record by its request id, styx_worker.egress): then it is
        counted here as :meth:`resolve` would count it (an echo, or a duplicate) and the reader skips
        decoding it, which at high rates, with every worker pushing, is nearly every egress record
        (0.4 instead of 0.7-1.1 µs each, benchmarks/results/resting-reader.md). False: decode it and
        :meth:`resolve` it."""
        try:
            rid = key.decode()
        except UnicodeDecodeError:
            return False
        if rid in self.entries:
            return False
        came = self._answered.get(rid)
        if came is None:
            return False
        if came & EGRESS:
            self.stats.duplicates_ignored += 1
        else:
            self._answered.put(rid, came | EGRESS)
            self.stats.echoes_ignored += 1
        return True

    # ---- failures ------------------------------------------------------------------------------------

    def fail(self, entry: Pending, error: StyxError, cause: BaseException | None = None) -> None:
        """Fail ``entry`` (unless it left already): its send failed, or the client stops."""
        if self.entries.get(entry.rid) is not entry:
            return
        if cause is not None:
            error.__cause__ = cause
        self._settle(entry, None, error)

    def fail_all(self, error: StyxError) -> None:
        """Fail every pending request with ``error`` (the client closed or a background task failed)."""
        for entry in list(self.entries.values()):
            self.fail(entry, error, error.__cause__)
        self.deadlines.clear()
