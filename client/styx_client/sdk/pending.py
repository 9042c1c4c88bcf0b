"""The pending table: requests in flight by id, each with the future its reply resolves.

Callers that submit an id already in flight share its entry instead of sending again; the entry leaves
the table when the reply arrives or when its last waiter gives up. A reply whose id is not pending is
ignored, and so is a second reply for an id that was just answered (brokers and the server may
redeliver): neither may resolve the wrong call.

A request id stands for one payload: the server answers a resent id with its first reply, so reusing an
id for a different request would silently return another request's reply. The table keeps the record
sent under every pending id and under at least the last ``max(1024, 2 * max_pending)`` ids that left
it (answered, timed out or given up; :class:`Recent`), and refuses a different request under any of
them with :class:`~styx_py.core.errors.BadRequest`. Older ids are not checked (the server still answers
them with their first reply). Keeping the record costs a reference per id; comparing it (without its
timestamp, :func:`~styx_client.sdk.requests.same_request`) is done only when an id is reused, so a
new id costs no digest.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from styx_client.sdk.kafka import KafkaError
from styx_client.sdk.requests import same_request
from styx_py.core.errors import BadRequest, Overloaded, RequestTimeout, StyxError, Unavailable
from styx_py.core.segments import FRESH_S, LIVE, unread
from styx_py.core.wire import Key, Reply

__all__ = [
    "Callback",
    "ClientStats",
    "Deadlines",
    "Done",
    "Listener",
    "Named",
    "Pending",
    "PendingTable",
    "Send",
    "fail",
]

Send = Callable[[], None]
"""Hands a new request to the producer (called once its entry is registered)."""

Named = tuple[str, str, Key, str]
"""A request as a timeout names it: ``(operator, function, key, request id)``."""

Done = Callable[[Reply | None, StyxError | None], None]
"""What a :class:`Callback` caller is told, once: the reply, or why there is none (a timeout, a failed
send, the client closing). Runs inside the reply reader or the deadline timer: it must not raise."""


EGRESS = 1
"""A reply read from the egress topic."""
PUSHED = 2
"""A reply a worker pushed on its port."""


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
    """Replies for a request id that had just been answered, by the same path (server or broker
    redelivery)."""
    pushed: int = 0
    """Of ``replied``, replies a worker pushed that came before their egress copy
    (:mod:`styx_client.sdk.push`)."""
    echoes_ignored: int = 0
    """The later copy of a reply that came both ways: pushed by a worker and read from the egress topic."""
    unmatched_ignored: int = 0
    """Replies for an id nobody waits for (another client's, or one whose caller gave up)."""
    foreign_ignored: int = 0
    """Of ``unmatched_ignored``, replies for an id this client did not send recently: another client's
    that shares its reply partition (or an answer this client gave up on long ago)."""
    rewritten: int = 0
    """Requests written again to a newer ingress segment (the workers may have stopped reading theirs)."""
    undecodable: int = 0
    """Egress records that are not a valid :class:`~styx_py.core.wire.Reply` (logged and skipped)."""
    egress_skipped: int = 0
    """Egress records the reader moved over without reading them: all replies already taken pushed
    (:mod:`styx_client.sdk.resting`)."""


class Pending:
    """A request in flight: its outcome once settled, the future that outcome resolves and how many
    callers wait on it.

    :meth:`StyxClient.submit` callers await ``future`` (shielded); :meth:`StyxClient.submit_future`
    callers and the lean path's are ``listeners``, which the table settles directly when the reply or a
    failure comes (no callback chain through ``future``). An entry of the lean path has no ``future``
    until a caller joins it (:meth:`PendingTable.future_of`): one per request was ~0.4 µs of the load
    generator's CPU for nobody to await.
    """

    __slots__ = (
        "fingerprint",
        "future",
        "listeners",
        "on_time",
        "outcome",
        "partition",
        "rid",
        "segment",
        "seq",
        "stamp",
        "waiters",
    )

    def __init__(self, rid: str, future: asyncio.Future[Reply] | None, fingerprint: bytes) -> None:
        self.rid = rid
        self.future = future
        self.outcome: Reply | StyxError | None = None  # the reply or the failure, once settled
        self.fingerprint = fingerprint  # what was sent under this id (see requests.same_request)
        self.waiters = 0
        self.listeners: list[AnyListener] = []
        # Where it was written: the ingress partition and segment, and whether the broker acknowledged
        # it while that segment was still the newest the client knew (then the workers read it before
        # they stop reading the segment; else it is written again to a newer one once they may have:
        # StyxClient._follow_segments).
        self.partition = 0
        self.segment = 0
        self.on_time = False
        self.stamp = 0  # its record's Kafka timestamp (ms), as the producer stamped it
        self.seq = 0  # how many entries the table registered before this one (PendingTable.registered)


class Listener:
    """One :meth:`StyxClient.submit_future` caller: its future, deadline and how a timeout names it.

    It is also its future's done callback, which only ever runs when the caller cancelled the future:
    the table removes it before settling the future itself.
    """

    __slots__ = ("deadline", "entry", "future", "named", "table", "wait_s")

    def __init__(
        self,
        table: PendingTable,
        entry: Pending,
        future: asyncio.Future[Reply],
        named: Named,
        wait_s: float,
        deadline: float,
    ) -> None:
        self.table = table
        self.entry = entry
        self.future = future
        self.named = named
        self.wait_s = wait_s
        self.deadline = deadline

    def __call__(self, _: asyncio.Future[Reply]) -> None:
        self.table.given_up(self)


class Callback:
    """One caller of the lean path (:meth:`PendingTable.callback`): a function instead of a future.

    No future, done callback or cancellation per request: ``done`` is called exactly once, from
    :meth:`PendingTable.resolve`, a failure, or the shared deadline timer. Also the record's delivery
    callback (:meth:`delivered`), so a request costs one object of the table's besides its entry.
    """

    __slots__ = ("deadline", "done", "entry", "named", "table", "wait_s")

    def __init__(
        self, table: PendingTable, entry: Pending, done: Done, named: Named, wait_s: float, deadline: float
    ) -> None:
        self.table = table
        self.entry = entry
        self.done = done
        self.named = named
        self.wait_s = wait_s
        self.deadline = deadline

    def delivered(self, offset: int, exc: BaseException | None) -> None:
        """The producer's verdict on the request's record (``BatchLanes`` ``on_done``)."""
        if exc is None:
            self.table.acknowledged(self.entry, offset)
        else:
            self.table.undelivered(self.entry, exc)


AnyListener = Listener | Callback


class Deadlines:
    """When each listener times out: one loop timer for all of them, not one per request.

    Listeners are queued per ``wait_s`` in the order they came, which is also the order of their
    deadlines (the loop's clock never goes back), so the earliest deadline is at the head of a queue.
    One timer is armed for the earliest head; when it fires, every listener whose deadline has passed
    expires, and the timer is re-armed for the next head, at least ``_SWEEP_S`` later so a burst of
    expiries is handled in one sweep. A timeout is therefore reported up to ``_SWEEP_S`` (plus loop
    lag) after its deadline, never before. Answered listeners leave their queue at once (O(1)).
    """

    def __init__(self, expire: Callable[[AnyListener], None]) -> None:
        self._expire = expire
        self._queues: dict[float, collections.OrderedDict[AnyListener, None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def add(self, listener: AnyListener, loop: asyncio.AbstractEventLoop) -> None:
        queue = self._queues.get(listener.wait_s)
        if queue is None:
            queue = self._queues[listener.wait_s] = collections.OrderedDict()
        queue[listener] = None
        if listener.deadline < self._timer_at:
            self._arm(loop, listener.deadline)

    def discard(self, listener: AnyListener) -> None:
        queue = self._queues.get(listener.wait_s)
        if queue is not None:
            queue.pop(listener, None)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._sweep, loop)
        self._timer_at = when

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._timer_at = None, math.inf
        now = loop.time()
        due: list[AnyListener] = []
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
        if earliest < math.inf:
            self._arm(loop, max(earliest, now + _SWEEP_S))
        for listener in due:
            self._expire(listener)


# How often at most the deadline timer fires while requests are due (so how late a timeout may be).
_SWEEP_S = 0.01


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

    def __init__(self, max_pending: int, stats: ClientStats) -> None:
        self.max_pending = max_pending
        self.stats = stats
        # In the order they were registered (a dict keeps it): the first is the oldest in flight.
        self._entries: dict[str, Pending] = {}
        self.registered = 0  # entries registered so far (each one's Pending.seq is the count before it)
        # Ids answered recently: a later reply with one of them is a duplicate, not a stranger. Bounded,
        # because redeliveries arrive close to the original and the table must not grow forever.
        # The value: the paths (EGRESS | PUSHED) its reply came by so far.
        self._answered = Recent(max(1024, 2 * max_pending))
        # What was sent under the ids that left the table (module docstring), bounded the same way.
        self._recent = Recent(max(1024, 2 * max_pending))
        self._deadlines = Deadlines(self._timed_out)
        self.segment = 0  # the newest ingress segment the client knows (core.segments)
        # Called with each entry whose record the broker acknowledged, and its offset: the push of the
        # request to its worker (styx_client.sdk.push), when the client pushes requests.
        self.push: Callable[[Pending, int], None] | None = None
        # Segment -> when (time.monotonic) the client last looked and found it the newest: its next one
        # did not exist then. The last few segments only.
        self.looked: dict[int, float] = {}

    def saw_newest(self, when: float) -> None:
        """A look at ``when`` (time.monotonic) found :attr:`segment` the newest: its next did not exist."""
        self.looked[self.segment] = when
        for old in [s for s in self.looked if s < self.segment - LIVE]:
            del self.looked[old]

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, rid: str) -> Pending | None:
        return self._entries.get(rid)

    def oldest(self) -> tuple[int, int]:
        """The ``seq`` and ``stamp`` of the oldest request in flight; ``(registered, 0)`` if none: every
        request registered before ``seq`` has left the table (answered, failed or given up)."""
        for entry in self._entries.values():
            return entry.seq, entry.stamp
        return self.registered, 0

    def unread_late(self, newest: int) -> list[Pending]:
        """The requests in flight not acknowledged on time (:class:`Pending`) and last written to a
        segment the workers may have stopped reading now that ``newest`` is the newest."""
        return [e for e in self._entries.values() if not e.on_time and unread(e.segment, newest)]

    def acknowledged(self, entry: Pending, offset: int) -> None:
        """The broker acknowledged ``entry``'s record at ``offset``."""
        self.stats.sent += 1
        entry.on_time = self.on_time(entry.segment)
        if self.push is not None:
            self.push(entry, offset)

    def on_time(self, segment: int) -> bool:
        """Whether a record written to ``segment`` and acknowledged now is read by the workers for sure:
        a look less than :data:`FRESH_S` ago found ``segment`` the newest (see ``core.segments.LIVE``).
        The client may have moved on to a newer segment since (the record was in flight then): what
        counts is that the one after ``segment`` did not exist at that look."""
        return time.monotonic() - self.looked.get(segment, -math.inf) < FRESH_S

    def check_reuse(self, rid: str, fingerprint: bytes) -> None:
        """Raise :class:`BadRequest` when ``rid`` is pending or was recently sent for another payload.

        Two dict look-ups for a new id; the records are compared only when the id is reused."""
        entry = self._entries.get(rid)
        sent = entry.fingerprint if entry is not None else self._recent.get(rid)
        if sent is not None and not same_request(sent, fingerprint):
            state = "is in flight" if entry is not None else "was recently sent"
            raise BadRequest(
                f"request id {rid!r} {state} with a different request; a request id stands for one "
                "request (the cluster answers it with its first reply), use a new id"
            )

    def check_room(self) -> None:
        """Raise :class:`Overloaded` when ``max_pending`` requests are in flight."""
        if len(self._entries) >= self.max_pending:
            raise Overloaded(f"{len(self._entries)} requests in flight (max_pending={self.max_pending})")

    def check_new(self, rid: str, fingerprint: bytes) -> None:
        """:meth:`check_reuse` then :meth:`check_room`, in one call for the lean path: a new id costs
        two look-ups and a length."""
        entries = self._entries
        if rid in entries or rid in self._recent:  # a generated id a caller chose before
            self.check_reuse(rid, fingerprint)
        if len(entries) >= self.max_pending:
            self.check_room()

    def add(self, rid: str, future: asyncio.Future[Reply], fingerprint: bytes) -> Pending:
        """Register ``rid`` (not in flight yet): before it is produced, as its reply may come at once."""
        entry = self._entries[rid] = Pending(rid, future, fingerprint)
        entry.seq, self.registered = self.registered, self.registered + 1
        return entry

    def future_of(self, entry: Pending) -> asyncio.Future[Reply]:
        """``entry``'s future, made now for an entry of the lean path (settled already if it is)."""
        future = entry.future
        if future is None:
            future = entry.future = asyncio.get_running_loop().create_future()
            outcome = entry.outcome
            if isinstance(outcome, StyxError):
                future.set_exception(outcome)
            elif outcome is not None:
                future.set_result(outcome)
        return future

    async def wait(self, rid: str, entry: Pending, send: Send | None, wait_s: float, named: Named) -> Reply:
        """Wait (as one more waiter) for ``entry``'s reply; ``send`` it first if it is new.

        Raises :class:`RequestTimeout` after ``wait_s`` seconds, naming the request by ``named``.
        """
        entry.waiters += 1
        try:
            async with asyncio.timeout(wait_s):
                if send is not None:
                    send()
                return await asyncio.shield(self.future_of(entry))
        except TimeoutError:
            self.stats.timeouts += 1
            raise _timeout(named, wait_s) from None
        finally:
            self.leave(rid, entry)

    def future(
        self, rid: str, entry: Pending, send: Send | None, wait_s: float, named: Named
    ) -> asyncio.Future[Reply]:
        """:meth:`wait` without a coroutine: a future of the reply, failed with :class:`RequestTimeout`
        by the shared deadline timer (:class:`Deadlines`) on timeout.

        No task, timeout context, shield or timer per request, and no callback runs when the reply
        comes: :meth:`resolve` settles the future directly. Cancelling it gives up on the reply.
        """
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[Reply] = loop.create_future()
        listener = Listener(self, entry, mine, named, wait_s, loop.time() + wait_s)
        entry.waiters += 1
        entry.listeners.append(listener)
        self._deadlines.add(listener, loop)
        mine.add_done_callback(listener)  # runs only if the caller cancels (Listener docstring)
        if send is not None:
            send()
        return mine

    def callback(
        self,
        rid: str,
        record: bytes,
        done: Done,
        wait_s: float,
        named: Named,
        loop: asyncio.AbstractEventLoop,
    ) -> Callback:
        """Register a new ``rid`` (not in flight: :meth:`check_reuse` and :meth:`check_room` passed)
        with one :class:`Callback` caller, timed out by the shared timer after ``wait_s``.

        The lean path of :meth:`future`: no caller future, done callback or join. Later callers of
        the same id join the entry as usual (:meth:`wait`, :meth:`future`)."""
        entry = self._entries[rid] = Pending(rid, None, record)
        entry.seq, self.registered = self.registered, self.registered + 1
        caller = Callback(self, entry, done, named, wait_s, loop.time() + wait_s)
        entry.waiters = 1
        entry.listeners.append(caller)
        self._deadlines.add(caller, loop)
        return caller

    def undelivered(self, entry: Pending, exc: BaseException) -> None:
        """The producer could not deliver ``entry``'s record: fail it, naming why."""
        if isinstance(exc, KafkaError):
            self.fail(entry, Unavailable(f"could not send request {entry.rid}: {exc!r}"), exc)
        else:
            self.fail(entry, StyxError(f"request {entry.rid} was not sent: {exc!r}"), exc)

    def given_up(self, listener: Listener) -> None:
        """A listener's future was cancelled by its caller: it waits no more."""
        self._deadlines.discard(listener)
        entry = listener.entry
        entry.listeners.remove(listener)
        self.leave(entry.rid, entry)

    def _timed_out(self, listener: AnyListener) -> None:
        """A listener's deadline passed (it already left the deadline queue)."""
        if type(listener) is Callback:
            entry = listener.entry
            entry.listeners.remove(listener)
            self.stats.timeouts += 1
            listener.done(None, _timeout(listener.named, listener.wait_s))
            self.leave(entry.rid, entry)
            return
        assert type(listener) is Listener
        mine = listener.future
        mine.remove_done_callback(listener)
        entry = listener.entry
        entry.listeners.remove(listener)
        if not mine.done():
            self.stats.timeouts += 1
            mine.set_exception(_timeout(listener.named, listener.wait_s))
        self.leave(entry.rid, entry)

    def _settle(self, entry: Pending, reply: Reply | None, error: StyxError | None) -> None:
        """Hand the reply (or the failure) to every listener of ``entry``; they all stop waiting."""
        for listener in entry.listeners:
            self._deadlines.discard(listener)
            if type(listener) is Callback:
                entry.waiters -= 1
                listener.done(reply, error)
                continue
            assert type(listener) is Listener
            mine = listener.future
            mine.remove_done_callback(listener)
            if not mine.done():  # else cancelled, its callback not run yet: counted out here instead
                if error is None:
                    mine.set_result(reply)  # type: ignore[arg-type]
                else:
                    mine.set_exception(error)
            entry.waiters -= 1
        entry.listeners.clear()
        if entry.waiters == 0:
            self._release(entry.rid, entry)

    def leave(self, rid: str, entry: Pending) -> None:
        """One waiter of ``entry`` is done; the last one takes the entry out of the table."""
        entry.waiters -= 1
        if entry.waiters == 0:
            self._release(rid, entry)

    def _release(self, rid: str, entry: Pending) -> None:
        if self._entries.get(rid) is entry:
            del self._entries[rid]
            self._recent.put(rid, entry.fingerprint)
        future = entry.future
        if future is None:
            return
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            # Mark a failure as observed (it was raised to a waiter, or the send failed before
            # anyone awaited): no "exception was never retrieved" noise at GC.
            future.exception()

    def resolve(self, reply: Reply, path: int = EGRESS) -> bool:
        """Hand ``reply``, which came by ``path`` (:data:`EGRESS` or :data:`PUSHED`), to the request
        waiting for it, and say so (True). If none waits (False): the other path's copy of a reply
        already taken (an echo), a second copy by the same path (a duplicate), or a stranger's."""
        rid = reply.request_id
        entry = self._entries.get(rid)
        if entry is None or entry.outcome is not None:
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
        del self._entries[rid]
        self._recent.put(rid, entry.fingerprint)
        entry.outcome = reply
        if entry.future is not None:
            entry.future.set_result(reply)
        stats = self.stats
        stats.replied += 1
        if path == PUSHED:
            stats.pushed += 1
        self._answered.put(rid, path)
        if entry.listeners:
            self._settle(entry, reply, None)
        return True

    def taken_copy(self, key: bytes) -> bool:
        """Whether the egress record keyed ``key`` is a copy of a reply already taken, judged by its
        key alone (workers key every reply record by its request id, styx_worker.egress): then it is
        counted here as :meth:`resolve` would count it (an echo, or a duplicate) and the reader skips
        decoding it, which at high rates, with every worker pushing, is nearly every egress record
        (0.4 instead of 0.7-1.1 µs each, benchmarks/results/issue15-client.md). False: decode it and
        :meth:`resolve` it."""
        try:
            rid = key.decode()
        except UnicodeDecodeError:
            return False
        entry = self._entries.get(rid)
        if entry is not None and entry.outcome is None:
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

    def resolve_pushed(self, reply: Reply) -> None:
        """A reply a worker pushed (:mod:`styx_client.sdk.push`)."""
        self.resolve(reply, PUSHED)

    def fail(self, entry: Pending, error: StyxError, cause: BaseException | None) -> None:
        """Fail ``entry`` (unless it is settled already): its send failed, or the client stops."""
        if entry.outcome is not None:
            return
        if cause is not None:
            error.__cause__ = cause
        entry.outcome = error
        if entry.future is not None:
            fail(entry.future, error, cause)
        if entry.listeners:
            self._settle(entry, None, error)

    def fail_all(self, error: StyxError) -> None:
        """Fail every pending request with ``error`` (the client closed or its reader died)."""
        for entry in list(self._entries.values()):
            self.fail(entry, error, error.__cause__)
        self._deadlines.stop()


def _timeout(named: Named, wait_s: float) -> RequestTimeout:
    operator, function, key, rid = named
    return RequestTimeout(
        f"no reply to {operator}.{function}(key={key!r}) request {rid} within {wait_s} s", rid
    )


def fail(future: asyncio.Future[Reply], error: StyxError, cause: BaseException | None) -> None:
    """Fail ``future`` with ``error`` (caused by ``cause``) unless it is done already."""
    if not future.done():
        if cause is not None:
            error.__cause__ = cause
        future.set_exception(error)
