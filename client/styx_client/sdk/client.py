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
from styx_client.sdk.deployment import client_arguments, coordinator_status
from styx_client.sdk.entry import Pending
from styx_client.sdk.ids import RequestIds
from styx_client.sdk.kafka_transport import KafkaTransport
from styx_client.sdk.prepared import Prepared
from styx_client.sdk.push import worker_partitions
from styx_client.sdk.replies import result_of
from styx_client.sdk.requests import Targets
from styx_client.sdk.shell import Shell
from styx_client.sdk.stats import ClientStats
from styx_client.sdk.transport import Batching, ClientTransport
from styx_client.sdk.waiters import Waiter
from styx_py.core.errors import ConfigError, StyxError
from styx_py.core.requests import encode_request as checked_request
from styx_py.core.wire import Key, Reply
from styx_py.io.clusterfile import default_coordinator, default_secret

__all__ = ["BUSY_LINGER_MS", "Batching", "Call", "Prepared", "StyxClient"]

log = logging.getLogger("styx.client")

Call = tuple[str, Key, str, tuple[Any, ...]]
"""One entry of :meth:`StyxClient.submit_many`: ``(operator, key, function, args)``."""


class StyxClient:
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
        transport: ClientTransport | None = None,
    ) -> None:
        """Check and keep the configuration (:class:`~styx_client.sdk.config.ClientConfig`); nothing
        connects before :meth:`start`.

        ``functions`` (operator -> function names) is optional: when given, an unknown function is
        rejected locally like an unknown operator, without a round trip to the cluster.
        ``request_id_prefix`` starts every generated request id (default: 80 random bits);
        ``segment_poll_s`` is how often the client looks for a newer ingress segment. ``transport``
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
        )
        push = self.config.push
        self._core = ClientCore(
            max_pending, egress_topic, rest=push.rest_egress, push_requests=push.push_requests
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

    # ---- configuration and state -------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return self.config.bootstrap

    @property
    def ingress_topic(self) -> str:
        return self.config.ingress_topic

    @property
    def egress_topic(self) -> str:
        return self.config.egress_topic

    @property
    def client_id(self) -> str:
        return self.config.client_id

    @property
    def max_pending(self) -> int:
        return self.config.max_pending

    @property
    def timeout_s(self) -> float:
        return self.config.timeout_s

    @property
    def fetch_wait_ms(self) -> int:
        return self.config.kafka.fetch_wait_ms

    @property
    def linger_ms(self) -> int:
        return self.config.kafka.linger_ms

    @property
    def busy_linger_ms(self) -> float:
        return self.config.kafka.busy_linger_ms

    @property
    def coordinator(self) -> str | None:
        """Where the worker addresses come from, for pushed replies (None: no pushes)."""
        return self.config.push.coordinator

    @property
    def push_requests(self) -> bool:
        return self.config.push.push_requests

    @property
    def rest_egress(self) -> bool:
        return self.config.push.rest_egress

    @property
    def reply_partition(self) -> int:
        """The egress partition read (-1: all), known once started."""
        return -1 if self._shell is None else self._shell.reply_partition

    @property
    def segment(self) -> int:
        """The newest ingress segment known (:mod:`styx_py.core.segments`), where requests go."""
        return self._core.segment

    @property
    def stats(self) -> ClientStats:
        return self._core.stats

    @property
    def batching(self) -> Batching:
        """How the requests sent so far were batched (all zero before :meth:`start`)."""
        return self._transport.batching

    @property
    def requests_pushed(self) -> int:
        """Requests pushed to the worker reading their partition once the broker acknowledged them
        (styx_client.sdk.push); the others are fetched only."""
        return self._transport.requests_pushed

    @property
    def operators(self) -> dict[str, int]:
        return self._targets.operators

    @property
    def functions(self) -> dict[str, frozenset[str]] | None:
        return self._targets.functions

    def set_deployment(
        self, operators: Mapping[str, int], functions: Mapping[str, Collection[str]] | None = None
    ) -> None:
        """The cluster runs another version of its graph (a code update): check calls against its
        operators and functions from now on. Partition counts of existing operators never change in an
        update, so requests already sent stay where they are."""
        self._targets = Targets(operators, functions)

    @property
    def request_id_prefix(self) -> str:
        """What every request id this client generates starts with: a reader of the logs can tell this
        client's requests and replies apart (ids chosen by callers need not)."""
        return self._new_rid.prefix

    @property
    def pending_count(self) -> int:
        """Requests in flight (distinct request ids waiting for a reply)."""
        return len(self._core.table)

    def is_pending(self, request_id: str) -> bool:
        """Whether ``request_id`` is in flight: a submit of it now waits for the same reply."""
        return self._core.table.get(request_id) is not None

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
        coordinator = coordinator or default_coordinator()
        if not coordinator:
            raise ConfigError(
                "no coordinator: pass its host:port, set STYX_COORDINATOR or run 'styx up' here"
            )
        if cluster_secret is None:
            cluster_secret = default_secret(coordinator)
        body = await coordinator_status(coordinator, float(kw.get("timeout_s", 30.0)), cluster_secret)
        bootstrap, operators = client_arguments(coordinator, body, kw)
        kw.setdefault("coordinator", coordinator)
        kw.setdefault("cluster_secret", cluster_secret)
        kw.setdefault("workers", worker_partitions(body))
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
        opened = await self._transport.open(config, self._targets.operators, self, core.rest, self.reply_to)
        core.segment_seen(opened.segment, listed)
        shell = Shell(core, self._transport, opened.reply_partition, config.segment_poll_s, config.client_id)
        ready: asyncio.Future[None] = loop.create_future()
        self._tasks = loop.create_task(self._supervise(shell, ready), name=f"{config.client_id}-tasks")
        await ready
        self._shell = shell
        log.debug(
            "%s: started; reading replies from egress partition %d (-1: all)",
            config.client_id,
            opened.reply_partition,
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

    # ---- the transport's events (TransportEvents, forwarded to the shell) ---------------------------

    def acknowledged(self, entry: Pending, segment: int, offset: int) -> None:
        assert self._shell is not None
        self._shell.acknowledged(entry, segment, offset)

    def undelivered(self, entry: Pending, exc: BaseException, unavailable: bool) -> None:
        self._core.undelivered(entry, exc, unavailable)

    def from_log(self, key: bytes | None, value: bytes | None) -> None:
        assert self._shell is not None
        self._shell.from_log(key, value)

    def pushed(self, reply: Reply) -> None:
        self._core.pushed(reply)

    def marks(self, ends: list[tuple[int, int]]) -> None:
        assert self._shell is not None
        self._shell.marks(ends)

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
        caller = _Caller(core, future)
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

        outcomes = await asyncio.gather(
            *(one(rid, call) for rid, call in zip(rids, batch, strict=True)), return_exceptions=True
        )
        replies: list[Reply] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            replies.append(outcome)
        return replies


class _Caller:
    """One :meth:`StyxClient.submit_future` caller: the ``done`` of its waiter, which settles its future,
    and its future's done callback, which only does anything when the caller cancelled the future."""

    __slots__ = ("core", "future", "waiter")

    def __init__(self, core: ClientCore, future: asyncio.Future[Reply]) -> None:
        self.core = core
        self.future = future
        self.waiter: Waiter | None = None

    def __call__(self, reply: Reply | None, error: StyxError | None) -> None:
        future = self.future
        future.remove_done_callback(self.cancelled)
        if future.done():
            return  # cancelled, its callback not run yet: the core counted it out already
        if error is None:
            future.set_result(reply)  # type: ignore[arg-type]
        else:
            future.set_exception(error)

    def cancelled(self, _: asyncio.Future[Reply]) -> None:
        if self.waiter is not None:
            self.core.give_up(self.waiter)
