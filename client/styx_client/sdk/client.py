"""The asynchronous client: a facade over its core (:mod:`.core`) and a transport (:mod:`.transport`).

A request is produced to the ingress partition that owns its key, so the worker that owns the entity
sequences it; it names the client's reply partition, and its reply comes back on that egress partition,
where the client's reader hands it to the core, which settles the waiters of its request id. The entry
is registered before the request is produced, and :meth:`StyxClient.start` returns only once the reader
is positioned at the end of the reply partition, so no reply can be missed.

Every background task (the transport's sender, reader and worker links, the segment look, the deadline
sweep) is a child of one :class:`asyncio.TaskGroup` that the client owns: if any fails, the client is
broken, every request in flight fails with that cause, new ones are refused, and :meth:`StyxClient.close`
raises it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Mapping
from types import TracebackType
from typing import Any

from styx_client.sdk.config import BUSY_LINGER_MS, SEGMENT_POLL_S, ClientConfig, client_config
from styx_client.sdk.core import ClientCore
from styx_client.sdk.deployment import connect_arguments
from styx_client.sdk.ids import RequestIds
from styx_client.sdk.kafka_transport import KafkaTransport
from styx_client.sdk.prepared import Prepared
from styx_client.sdk.replies import result_of
from styx_client.sdk.requests import Call, Targets
from styx_client.sdk.shell import Caller, Shell
from styx_client.sdk.transport import Batching, ClientTransport
from styx_client.sdk.view import ClientView
from styx_py.core.errors import ConfigError, StyxError
from styx_py.core.requests import encode_request as checked_request
from styx_py.core.segments import FRESH_S
from styx_py.core.wire import Key, Reply

__all__ = ["BUSY_LINGER_MS", "Batching", "Call", "Prepared", "StyxClient"]

log = logging.getLogger("styx.client")


class StyxClient(ClientView):
    """Asynchronous client of a styx-py cluster (one producer, one reply-reader task).

    Use :meth:`connect` to learn the operators and the Kafka address from the coordinator, or pass
    them directly. ``operators`` maps each operator name to its partition count: the client needs it
    to produce a request to the partition that owns the key.

    ``client_id`` names the client to Kafka (default: ``styx-client-`` and random hex).
    ``reply_partition`` is the egress partition the cluster sends this client's replies to, the only
    one it reads; by default a stable hash of ``client_id``. Clients sharing a partition each skip
    the others' replies (counted in ``stats.foreign_ignored``), so give clients that run together
    distinct partitions (the egress topic has one per entity partition). ``reply_partition=-1``
    reads every egress partition instead and lets each reply go to its request's ingress partition
    (the behaviour before routing): use it on Tansu with S3 storage (``styx up --durable``), whose
    fetch lists every stored batch of a partition and answers empty once that takes longer than the
    fetch wait, so one client's replies concentrated on one partition starve its reader (measured in
    the durable chaos test: 6x the resends of the spread layout, and runs that never finish).

    ``timeout_s`` is the default reply deadline of :meth:`submit` and also bounds :meth:`start`
    (metadata and positioning). ``fetch_wait_ms`` is the consumer's ``fetch_max_wait_ms``: Tansu hands
    a waiting fetch the records that reach it after up to half of it, so it adds to reply latency;
    keep it small (>= 5, Tansu never answers a 0 ms wait).

    ``linger_ms`` delays every batch of requests (aiokafka's linger; default 0). ``busy_linger_ms``
    delays only the batches of a busy ingress partition, one whose previous batch carried at least
    :data:`~styx_py.io.batching.BUSY_RECORDS` requests: more requests share the next batch, which at
    high rates saves CPU in the client and the broker, and costs nothing at low rates (0: off;
    :mod:`styx_py.io.batching`).

    ``coordinator`` (filled in by :meth:`connect`) lets the client also take replies the workers push
    on their ports (:mod:`styx_client.sdk.push`), a broker hop sooner than the egress topic, which
    stays the record and the fallback; ``cluster_secret`` authenticates those connections (default:
    ``$STYX_CLUSTER_SECRET``); ``workers`` are the workers' addresses if known already (from the
    coordinator's status, which is otherwise asked at the start; a mapping of address to partitions
    also says which worker reads which ingress partition). ``push_replies=False`` reads the egress
    topic only. On the same connections the client pushes each request the broker acknowledged to
    the worker that reads its partition, which can then sequence it a broker fetch sooner
    (``push_requests=False``: the workers only fetch them). While every worker pushes, the egress
    reader skips the parts of the log that hold only replies already taken, as the workers' egress
    acknowledgements allow (:mod:`styx_client.sdk.resting`; ``rest_egress=False``: it reads every
    copy).
    """

    def __init__(
        self,
        bootstrap: str,
        operators: Mapping[str, int],
        *,
        ingress_topic: str = "styx-ingress",
        egress_topic: str = "styx-egress",
        max_pending: int = 10_000,
        timeout_s: float = 30.0,
        linger_ms: int = 0,
        busy_linger_ms: float = BUSY_LINGER_MS,
        fetch_wait_ms: int = 5,
        functions: Mapping[str, Collection[str]] | None = None,
        client_id: str | None = None,
        reply_partition: int | None = None,
        coordinator: str | None = None,
        cluster_secret: str | None = None,
        push_replies: bool = True,
        push_requests: bool = True,
        workers: Collection[str] | Mapping[str, list[int]] = (),
        rest_egress: bool = True,
        request_id_prefix: str | None = None,
        segment_poll_s: float = SEGMENT_POLL_S,
        fresh_s: float = FRESH_S,
        transport: ClientTransport | None = None,
    ) -> None:
        """Check and keep the configuration (:class:`~styx_client.sdk.config.ClientConfig`); nothing
        connects before :meth:`start`.

        ``functions`` (operator -> function names) is optional: when given, an unknown function is
        rejected locally like an unknown operator, without a round trip to the cluster.
        ``request_id_prefix`` starts every generated request id (default: 80 random bits);
        ``segment_poll_s`` is how often the client looks for a newer ingress segment, and ``fresh_s`` how
        long after a look a write to the segment it found newest counts as read for sure (keep it below
        the cluster's shortest segment period, :data:`~styx_py.core.segments.MIN_PERIOD_S`; the
        simulation, whose segments are milliseconds long, shrinks both). ``transport``
        replaces Kafka and the workers' ports (the simulation's in-memory one, for instance).
        """
        self._targets = Targets(operators, functions)
        self.config: ClientConfig = client_config(
            bootstrap,
            ingress_topic=ingress_topic,
            egress_topic=egress_topic,
            max_pending=max_pending,
            timeout_s=timeout_s,
            linger_ms=linger_ms,
            busy_linger_ms=busy_linger_ms,
            fetch_wait_ms=fetch_wait_ms,
            client_id=client_id,
            reply_partition=reply_partition,
            coordinator=coordinator,
            cluster_secret=cluster_secret,
            push_replies=push_replies,
            push_requests=push_requests,
            workers=workers,
            rest_egress=rest_egress,
            request_id_prefix=request_id_prefix,
            segment_poll_s=segment_poll_s,
            fresh_s=fresh_s,
        )
        push = self.config.push
        self._core = ClientCore(
            max_pending,
            egress_topic,
            rest=push.rest_egress,
            push_requests=push.push_requests,
            fresh_s=fresh_s,
        )
        self._new_rid = RequestIds(request_id_prefix)
        # The node id of this client's connections to the workers, named in every request it sends so
        # that the workers push the reply there; empty without pushes.
        self.reply_to = f"client-{self._new_rid.prefix}" if push.on else ""
        self._transport: ClientTransport = transport or KafkaTransport(self._core.stats)
        self._shell: Shell | None = None  # once started
        self._tasks: asyncio.Task[None] | None = None  # runs the task group (_supervise)
        self._failure: BaseException | None = None  # what failed in the task group
        self._closed = False

    # ---- construction ------------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls, coordinator: str | None = None, *, cluster_secret: str | None = None, **kw: Any
    ) -> StyxClient:
        """Ask the coordinator at ``host:port`` what is deployed, then return a started client.

        Without ``coordinator``: ``$STYX_COORDINATOR``, else the cluster ``styx up`` runs from the
        current directory (``.styx/cluster.json``, whose cluster secret is then used too).

        The coordinator's status gives the operators (with partition counts and functions) and the
        Kafka bootstrap address, so applications only need the coordinator's address. Keyword
        arguments are passed to the constructor; ``bootstrap`` may override the coordinator's value
        (e.g. when the client reaches Kafka by another address). ``cluster_secret`` authenticates the
        connection to the coordinator's port (default: ``$STYX_CLUSTER_SECRET``, else that file's for its
        coordinator).
        """
        bootstrap, operators = await connect_arguments(coordinator, cluster_secret, kw)
        client = cls(bootstrap, operators, **kw)
        await client.start()
        return client

    async def start(self) -> None:
        """Connect, choose the reply partition and position the reader at its current end; start the
        background tasks.

        Returns only once positioned: from then on every reply to a request sent by this client lies
        ahead of the reader, so none can be missed; replies already in the topic are never seen.
        """
        if self._closed:
            raise StyxError("StyxClient is closed; create a new one")
        if self._shell is not None:
            return
        loop = asyncio.get_running_loop()
        listed = loop.time()
        core, config = self._core, self.config
        shell = Shell(core, self._transport, config.segment_poll_s, config.client_id)
        opened = await self._transport.open(config, self._targets.operators, shell, core.rest, self.reply_to)
        shell.reply_partition = opened.reply_partition
        core.segment_seen(opened.segment, listed)
        ready: asyncio.Future[None] = loop.create_future()
        self._tasks = loop.create_task(self._supervise(shell, ready), name=f"{config.client_id}-tasks")
        await ready
        self._shell = shell
        log.debug(
            "%s: started; reading egress partition %d (-1: all)", config.client_id, shell.reply_partition
        )

    async def _supervise(self, shell: Shell, ready: asyncio.Future[None]) -> None:
        """Run every background task in one group until :meth:`close` cancels it. A task that fails
        ends the others; the failure breaks the client (module docstring)."""
        try:
            async with asyncio.TaskGroup() as group:
                shell.start(group)
                ready.set_result(None)
        except BaseExceptionGroup as failed:
            cause = failed.exceptions[0] if len(failed.exceptions) == 1 else failed
            log.error("%s: a background task failed: %r", self.config.client_id, cause)
            self._failure = cause
            error = StyxError(f"StyxClient's background task failed: {cause!r}")
            error.__cause__ = cause
            self._core.stop(error)
        finally:
            if not ready.done():  # the tasks could not even start
                ready.set_exception(
                    StyxError(f"StyxClient's background tasks did not start: {self._failure!r}")
                )

    # ---- shutdown ----------------------------------------------------------------------------------

    async def close(self) -> None:
        """Fail every pending request, stop the background tasks, the producer and the reader.

        Pending callers get a :class:`~styx_py.core.errors.StyxError` at once rather than waiting for their
        timeout: no reply can reach them any more. Safe to call twice. Raises what failed in a
        background task, if anything did (the requests in flight failed with it already).
        """
        if self._closed:
            return
        self._closed = True
        self._core.stop(StyxError("StyxClient closed before the reply arrived"))
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            tasks.cancel()
            # wait() instead of awaiting the task: its CancelledError must not be mistaken for ours.
            await asyncio.wait([tasks])
        await self._transport.close()
        if self._failure is not None:
            raise self._failure

    async def __aenter__(self) -> StyxClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ---- requests ----------------------------------------------------------------------------------

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
