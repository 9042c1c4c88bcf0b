"""What a started client sends: :meth:`~ClientCalls.submit` and the calls built on it.

:class:`ClientCalls` is the request side of :class:`~styx_client.sdk.StyxClient` (which adds the
construction, the start and the shutdown): each call checks the request locally, registers it with the
client's core (:mod:`styx_client.sdk.core`) and hands its record to the shell (:mod:`.shell`), before any
reply can arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from styx_client.sdk.prepared import Prepared
from styx_client.sdk.replies import result_of
from styx_client.sdk.requests import Call
from styx_client.sdk.shell import Caller, Shell
from styx_client.sdk.view import ClientView
from styx_py.core.errors import ConfigError, StyxError
from styx_py.core.requests import encode_request as checked_request
from styx_py.core.wire import Key, Reply

__all__ = ["ClientCalls"]


class ClientCalls(ClientView):
    """The request side of a client; :class:`~styx_client.sdk.StyxClient` sets these in its constructor
    and :meth:`~styx_client.sdk.StyxClient.start`."""

    reply_to: str
    _closed: bool

    def _started(self) -> Shell:
        """The shell, or raise why there is none to send with."""
        if self._closed:
            raise StyxError("StyxClient is closed")
        self._core.check_open()
        shell = self._shell
        if shell is None:
            raise StyxError("StyxClient not started: use 'await client.start()' or 'async with'")
        return shell

    async def submit(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        """Send one request and return the server's :class:`~styx_py.core.wire.Reply`, whatever its status.

        ``reply.value`` is the decoded result (decoded when read; ``reply.result`` holds its msgpack
        bytes), ``reply.status`` is ``"committed"``, ``"aborted"`` or ``"failed"`` (then ``error`` and
        ``error_type`` say why), and ``request_id``, ``tid``, ``epoch``, ``phase`` place it in the
        serial order. :meth:`call` returns the value or raises instead.

        Raises :class:`BadRequest` locally (nothing sent) for an unknown operator, a bad key,
        unencodable arguments, a request above a limit of :mod:`styx_py.core.limits` (id, name and key
        lengths, 1 MiB, argument nesting) or a ``request_id`` recently used for a different request;
        :class:`Overloaded` at once when ``max_pending`` requests are in flight, and
        :class:`RequestTimeout` when no reply came in time. Submitting an id that is already in
        flight waits for the same reply instead of sending again, so retries with the same
        ``request_id`` and the same request are safe.
        """
        return await self.submit_future(
            operator, key, function, *args, request_id=request_id, timeout_s=timeout_s
        )

    def submit_future(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> asyncio.Future[Reply]:
        """:meth:`submit` without a coroutine: send now, return a future of the reply.

        Same semantics and errors (local ones are raised here; a timeout or a failed send fails the
        future), but no task, timeout context or shield per request: for load generators and
        pipelines that keep thousands in flight. Cancelling the returned future gives up on the
        reply (the request may still run, as with a timeout).
        """
        shell = self._started()
        partition = self._targets.partition(operator, key, function)
        rid = request_id if request_id is not None else self._new_rid()
        transport = self._transport
        record = checked_request(
            rid, operator, function, key, args, transport.wall_ms(), shell.reply_partition, self.reply_to
        )
        core = self._core
        entry, new = core.admit(rid, record, partition)
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        future: asyncio.Future[Reply] = shell.loop.create_future()
        caller = Caller(core, future)
        caller.waiter = waiter = core.wait(
            entry, caller, wait_s, (operator, function, key, rid), shell.loop.time()
        )
        future.add_done_callback(caller.cancelled)
        shell.deadline_added(waiter.deadline)
        if new:  # registered before producing: the reply may be read before produce() even returns
            shell.produce(entry)
        return future

    def prepare(self, operator: str, function: str, *, timeout_s: float | None = None) -> Prepared:
        """The lean path for one ``operator.function``, for load generators: see :class:`Prepared`.

        Raises :class:`BadRequest` at once for an unknown operator or function, or a name above its
        limit; the rest (key, arguments, size, nesting, room) is checked per request.
        """
        self._targets.partition(operator, "", function)
        checked_request("0", operator, function, "", ())  # the names' limits, as the workers check them
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ConfigError(f"timeout_s must be > 0, not {timeout!r}")
        targets = self._targets
        partitions = targets.operators[operator]
        return Prepared(
            self._started, self.reply_to, operator, function, partitions, timeout, self._new_rid, targets
        )

    async def call(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Run a function and return its decoded result, raising if the transaction did not commit.

        ``aborted`` raises :class:`TransactionAborted` (the user's ``Abort`` message), a ``failed``
        reply of type ``BadRequest`` raises :class:`BadRequest`, any other failure (an exception in
        a function) :class:`TransactionFailed`, whose ``exception_type`` names the exception's class.
        The exception's ``reply`` holds the server's reply; ``request_id``, ``tid``, ``epoch``,
        ``error`` and ``error_type`` repeat its fields. Raises like :meth:`submit` otherwise
        (:class:`RequestTimeout`, :class:`Overloaded`, :class:`Unavailable`, a local
        :class:`BadRequest`).
        """
        reply = await self.submit(operator, key, function, *args, request_id=request_id, timeout_s=timeout_s)
        return result_of(reply)

    async def submit_many(self, calls: Iterable[Call], *, concurrency: int = 1000) -> list[Reply]:
        """Submit many requests with at most ``concurrency`` in flight; replies in the order of ``calls``.

        Every call is validated before the first is sent, so a local error (unknown operator, bad key,
        a limit) sends nothing. If a request fails (timeout, send error), the others still run to the
        end and the first failure in call order is raised: no request is left unobserved in the
        background.
        """
        batch = list(calls)
        rids = [self._new_rid() for _ in batch]
        for rid, (operator, key, function, args) in zip(rids, batch, strict=True):
            self._targets.partition(operator, key, function)
            checked_request(rid, operator, function, key, args)
        limit = asyncio.Semaphore(max(1, min(concurrency, self.max_pending)))

        async def one(rid: str, call: Call) -> Reply:
            operator, key, function, args = call
            async with limit:
                return await self.submit(operator, key, function, *args, request_id=rid)

        calls_ = zip(rids, batch, strict=True)
        outcomes = await asyncio.gather(*(one(rid, call) for rid, call in calls_), return_exceptions=True)
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:
            raise failed
        return [o for o in outcomes if not isinstance(o, BaseException)]
