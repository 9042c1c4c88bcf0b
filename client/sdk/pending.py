"""The pending table: requests in flight by id, each with the future its reply resolves.

Callers that submit an id already in flight share its entry instead of sending again; the entry leaves
the table when the reply arrives or when its last waiter gives up. A reply whose id is not pending is
ignored, and so is a second reply for an id that was just answered (brokers and the server may
redeliver): neither may resolve the wrong call.

A request id stands for one payload: the server answers a resent id with its first reply, so reusing an
id for a different request would silently return another request's reply. The table keeps a 16-byte
digest of what was sent under every pending id and under the last ``max(1024, 2 * max_pending)`` ids
that left it (answered, timed out or given up), and refuses a different payload under any of them with
:class:`~styx_py.core.errors.BadRequest`. Older ids are not checked (the server still answers them with
their first reply).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass

from styx_py.core.errors import BadRequest, Overloaded, RequestTimeout, StyxError
from styx_py.core.wire import Key, Reply

__all__ = ["ClientStats", "Named", "Pending", "PendingTable", "Send", "fail"]

Send = Callable[[], None]
"""Hands a new request to the producer (called once its entry is registered)."""

Named = tuple[str, str, Key, str]
"""A request as a timeout names it: ``(operator, function, key, request id)``."""


@dataclass(slots=True)
class ClientStats:
    """Counters of one client, for monitoring and tests (monotonic, never reset)."""

    sent: int = 0
    """Requests handed to the producer (a request id shared by several callers counts once)."""
    replied: int = 0
    """Replies that resolved a pending request."""
    timeouts: int = 0
    """Waits that ended in :class:`~styx_py.core.errors.RequestTimeout` (one per waiting caller)."""
    duplicates_ignored: int = 0
    """Replies for a request id that had just been answered (server or broker redelivery)."""
    unmatched_ignored: int = 0
    """Replies for an id nobody waits for (another client's, or one whose caller gave up)."""
    undecodable: int = 0
    """Egress records that are not a valid :class:`~styx_py.core.wire.Reply` (logged and skipped)."""


class Pending:
    """A request in flight: the future its reply resolves and how many callers wait on it."""

    __slots__ = ("fingerprint", "future", "waiters")

    def __init__(self, future: asyncio.Future[Reply], fingerprint: bytes) -> None:
        self.future = future
        self.fingerprint = fingerprint  # digest of the payload sent under this id
        self.waiters = 0


class PendingTable:
    """Requests in flight by id (at most ``max_pending``), and the routing of replies to them."""

    def __init__(self, max_pending: int, stats: ClientStats) -> None:
        self.max_pending = max_pending
        self.stats = stats
        self._entries: dict[str, Pending] = {}
        # Ids answered recently: a later reply with one of them is a duplicate, not a stranger. Bounded,
        # because redeliveries arrive close to the original and the table must not grow forever.
        self._answered: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._answered_cap = max(1024, 2 * max_pending)
        # Payload digests of ids that left the table (module docstring), bounded the same way.
        self._recent: collections.OrderedDict[str, bytes] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, rid: str) -> Pending | None:
        return self._entries.get(rid)

    def check_reuse(self, rid: str, fingerprint: bytes) -> None:
        """Raise :class:`BadRequest` when ``rid`` is pending or was recently sent for another payload."""
        entry = self._entries.get(rid)
        sent = entry.fingerprint if entry is not None else self._recent.get(rid)
        if sent is not None and sent != fingerprint:
            state = "is in flight" if entry is not None else "was recently sent"
            raise BadRequest(
                f"request id {rid!r} {state} with a different request; a request id stands for one "
                "request (the cluster answers it with its first reply), use a new id"
            )

    def check_room(self) -> None:
        """Raise :class:`Overloaded` when ``max_pending`` requests are in flight."""
        if len(self._entries) >= self.max_pending:
            raise Overloaded(f"{len(self._entries)} requests in flight (max_pending={self.max_pending})")

    def add(self, rid: str, future: asyncio.Future[Reply], fingerprint: bytes) -> Pending:
        """Register ``rid`` (not in flight yet): before it is produced, as its reply may come at once."""
        entry = self._entries[rid] = Pending(future, fingerprint)
        return entry

    def _remember(self, rid: str, entry: Pending) -> None:
        """``rid`` left the table: keep what was sent under it, among the most recent ones."""
        self._recent[rid] = entry.fingerprint
        self._recent.move_to_end(rid)
        if len(self._recent) > self._answered_cap:
            self._recent.popitem(last=False)

    async def wait(self, rid: str, entry: Pending, send: Send | None, wait_s: float, named: Named) -> Reply:
        """Wait (as one more waiter) for ``entry``'s reply; ``send`` it first if it is new.

        Raises :class:`RequestTimeout` after ``wait_s`` seconds, naming the request by ``named``.
        """
        entry.waiters += 1
        try:
            async with asyncio.timeout(wait_s):
                if send is not None:
                    send()
                return await asyncio.shield(entry.future)
        except TimeoutError:
            self.stats.timeouts += 1
            raise RequestTimeout(_timeout_message(named, wait_s)) from None
        finally:
            self.leave(rid, entry)

    def future(
        self, rid: str, entry: Pending, send: Send | None, wait_s: float, named: Named
    ) -> asyncio.Future[Reply]:
        """:meth:`wait` without a coroutine: a future of the reply, failed by a timer on timeout.

        No task, timeout context or shield per request; cancelling the future gives up on the reply.
        """
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[Reply] = loop.create_future()
        entry.waiters += 1

        def expire() -> None:
            if not mine.done():
                self.stats.timeouts += 1
                mine.set_exception(RequestTimeout(_timeout_message(named, wait_s)))

        timer = loop.call_at(loop.time() + wait_s, expire)

        def settle(done: asyncio.Future[Reply]) -> None:
            # The entry's outcome (reply or failure) becomes ours, unless we timed out or gave up.
            if not mine.done():
                if done.cancelled():
                    mine.cancel()
                elif (exc := done.exception()) is not None:
                    mine.set_exception(exc)
                else:
                    mine.set_result(done.result())

        def leave(_: asyncio.Future[Reply]) -> None:
            timer.cancel()
            entry.future.remove_done_callback(settle)
            self.leave(rid, entry)

        entry.future.add_done_callback(settle)
        mine.add_done_callback(leave)
        if send is not None:
            send()
        return mine

    def leave(self, rid: str, entry: Pending) -> None:
        """One waiter of ``entry`` is done; the last one takes the entry out of the table."""
        entry.waiters -= 1
        if entry.waiters == 0:
            if self._entries.get(rid) is entry:
                del self._entries[rid]
                self._remember(rid, entry)
            if not entry.future.done():
                entry.future.cancel()
            elif not entry.future.cancelled():
                # Mark a failure as observed (it was raised to a waiter, or the send failed before
                # anyone awaited): no "exception was never retrieved" noise at GC.
                entry.future.exception()

    def resolve(self, reply: Reply) -> None:
        """Hand ``reply`` to the request waiting for it; count it as a duplicate or a stranger if none."""
        rid = reply.request_id
        entry = self._entries.get(rid)
        if entry is None or entry.future.done():
            if rid in self._answered:
                self.stats.duplicates_ignored += 1
            else:
                self.stats.unmatched_ignored += 1
            return
        del self._entries[rid]
        self._remember(rid, entry)
        entry.future.set_result(reply)
        self.stats.replied += 1
        self._answered[rid] = None
        if len(self._answered) > self._answered_cap:
            self._answered.popitem(last=False)

    def fail_all(self, error: StyxError) -> None:
        """Fail every pending request with ``error`` (the client closed or its reader died)."""
        for entry in self._entries.values():
            fail(entry.future, error, error.__cause__)


def _timeout_message(named: Named, wait_s: float) -> str:
    operator, function, key, rid = named
    return f"no reply to {operator}.{function}(key={key!r}) request {rid} within {wait_s} s"


def fail(future: asyncio.Future[Reply], error: StyxError, cause: BaseException | None) -> None:
    """Fail ``future`` with ``error`` (caused by ``cause``) unless it is done already."""
    if not future.done():
        if cause is not None:
            error.__cause__ = cause
        future.set_exception(error)
