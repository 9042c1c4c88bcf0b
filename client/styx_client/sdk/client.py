"""The asynchronous client: one producer for requests, one reader task routing every reply.

A request is produced to the ingress partition that owns its key, so the worker that owns the entity
sequences it; it names the client's reply partition, and its reply comes back on that egress partition,
where the client's one reader routes it to the future registered for its request id (see
``pending.py``). The reply future is registered before the request is produced, and
:meth:`StyxClient.start` returns only once the reader is positioned at the end of the reply partition
(see ``kafka.py``), so no reply can be missed.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Collection, Iterable, Mapping
from types import TracebackType
from typing import Any, NamedTuple

from styx_client.sdk.deployment import client_arguments, coordinator_status
from styx_client.sdk.ids import RequestIds
from styx_client.sdk.kafka import KafkaError, egress_following, newest_segment, open_kafka, stop_quietly
from styx_client.sdk.pending import ClientStats, Done, Pending, PendingTable, Send
from styx_client.sdk.push import WorkerLinks, worker_partitions
from styx_client.sdk.replies import read_replies, result_of
from styx_client.sdk.requests import Targets, encode_request
from styx_client.sdk.resting import EgressRest
from styx_py.core.errors import ConfigError, StyxError
from styx_py.core.partitioning import partition_of
from styx_py.core.requests import encode_request as checked_request
from styx_py.core.requests import lean_request
from styx_py.core.segments import segment_topic
from styx_py.core.wire import Key, Reply
from styx_py.io.batching import BatchLanes
from styx_py.io.clusterfile import default_coordinator, default_secret

__all__ = ["BUSY_LINGER_MS", "Batching", "Call", "Prepared", "StyxClient"]

log = logging.getLogger("styx.client")

# How often the client looks for a newer ingress segment (its writes count as read for sure for
# core.segments.FRESH_S after a listing; workers read the newest two segments, core.segments.LIVE).
SEGMENT_POLL_S = 0.5

# The default busy linger (StyxClient): how long a busy partition waits before its next batch; a quiet
# one never waits. 8 ms against 2 ms, YCSB-T 500-12 000/s: the same latency or lower up to 8 000/s, a
# quarter less CPU in all at 4 000/s (the broker's cut by half) and the client's 40 -> 30 µs per request
# at 8 000/s (benchmarks/results/issue15-client.md, "A longer busy linger").
BUSY_LINGER_MS = 8.0
MAX_BUSY_LINGER_MS = 1000.0


class Batching(NamedTuple):
    """Requests acknowledged by the broker, the Kafka batches they went in, and how many of those
    batches waited for more requests first (busy linger)."""

    records: int
    batches: int
    lingered: int


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
    ) -> None:
        """Store the configuration; nothing connects before :meth:`start`.

        ``functions`` (operator -> function names) is optional: when given, an unknown function is
        rejected locally like an unknown operator, without a round trip to the cluster.
        """
        self._targets = Targets(operators, functions)
        _check_limits(max_pending, timeout_s, linger_ms, fetch_wait_ms)
        if not 0 <= busy_linger_ms <= MAX_BUSY_LINGER_MS:
            raise ConfigError(f"busy_linger_ms must be in 0..{MAX_BUSY_LINGER_MS}, not {busy_linger_ms!r}")
        self.bootstrap = bootstrap
        self.ingress_topic = ingress_topic
        self.egress_topic = egress_topic
        self.max_pending = max_pending
        self.timeout_s = timeout_s
        self.linger_ms = linger_ms
        self.busy_linger_ms = busy_linger_ms
        self.fetch_wait_ms = fetch_wait_ms
        self.client_id = client_id if client_id is not None else f"styx-client-{uuid.uuid4().hex[:8]}"
        if reply_partition is not None and reply_partition < -1:
            raise ConfigError(f"reply_partition must be >= 0, or -1 for all, not {reply_partition!r}")
        self._wanted_partition = reply_partition
        # Where the worker addresses come from, for replies pushed by the workers (sdk/push.py).
        self.coordinator = coordinator if push_replies else None
        self._cluster_secret = cluster_secret
        self._workers = workers
        self.push_requests = push_requests and self.coordinator is not None
        self.rest_egress = rest_egress and self.coordinator is not None
        self._rest: EgressRest | None = None
        self._push: WorkerLinks | None = None
        self._pusher: asyncio.Task[None] | None = None
        self.reply_partition = -1  # the egress partition read (-1: all), known once started
        self.stats = ClientStats()
        self._pending = PendingTable(max_pending, self.stats)
        self._new_rid = RequestIds()
        # The node id of this client's connections to the workers, named in every request it sends so
        # that the workers push the reply there; empty without pushes.
        self.reply_to = "" if self.coordinator is None else f"client-{self._new_rid.prefix}"
        self._producer: Any = None
        self._consumer: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._segments: asyncio.Task[None] | None = None
        self._lanes: BatchLanes | None = None
        # The newest ingress segment known (styx_py.core.segments) and its topic, where requests go;
        # the egress partitions the reader should read (it switches between two polls).
        self.segment = 0
        self._ingress_now = ingress_topic
        self._reply_partitions: list[int] = []
        self._egress_wanted: list[Any] = []
        self._egress_settled = True  # the reader reads exactly _egress_wanted
        self._loop: Any = None  # the running loop, from start()
        self._broken: BaseException | None = None
        self._started = False
        self._closed = False

    @property
    def batching(self) -> Batching:
        """How the requests sent so far were batched (all zero before :meth:`start`)."""
        lanes = self._lanes
        if lanes is None:
            return Batching(0, 0, 0)
        return Batching(lanes.records_sent, lanes.batches_sent, lanes.lingered)

    @property
    def requests_pushed(self) -> int:
        """Requests pushed to the worker reading their partition once the broker acknowledged them
        (styx_client.sdk.push); the others are fetched only."""
        return 0 if self._push is None else self._push.requests_pushed

    @property
    def operators(self) -> dict[str, int]:
        return self._targets.operators

    def set_deployment(
        self, operators: Mapping[str, int], functions: Mapping[str, Collection[str]] | None = None
    ) -> None:
        """The cluster runs another version of its graph (a code update): check calls against its
        operators and functions from now on. Partition counts of existing operators never change in an
        update, so requests already sent stay where they are."""
        self._targets = Targets(operators, functions)

    @property
    def functions(self) -> dict[str, frozenset[str]] | None:
        return self._targets.functions

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
        """Connect, choose the reply partition and position the reader at its current end.

        Returns only once positioned: from then on every reply to a request sent by this client lies
        ahead of the reader, so none can be missed; replies already in the topic are never seen.
        """
        if self._closed:
            raise StyxError("StyxClient is closed; create a new one")
        if self._started:
            return
        client_id = self.client_id
        listed = time.monotonic()
        ends = await open_kafka(self, client_id, self._wanted_partition)
        self._producer, self._consumer, self.reply_partition = (
            ends.producer,
            ends.consumer,
            ends.reply_partition,
        )
        self._reply_partitions = ends.reply_partitions
        self._egress_wanted = list(ends.consumer.assignment())
        self._use_segment(ends.segment)
        self._pending.saw_newest(listed)
        loop = self._loop = asyncio.get_running_loop()
        self._lanes = BatchLanes(self._producer, busy_linger_s=self.busy_linger_ms / 1000)
        self._sender = loop.create_task(self._lanes.run(), name=f"{client_id}-sender")
        if self.coordinator is not None:
            coordinator, secret, timeout_s = self.coordinator, self._cluster_secret, self.timeout_s
            if self.rest_egress:
                self._rest = EgressRest(
                    self._pending,
                    self._pushes_healthy,
                    self.egress_topic,
                    settled=lambda: self._egress_settled,
                )
            self._push = WorkerLinks(
                lambda: coordinator_status(coordinator, timeout_s, secret),
                secret,
                self.reply_to,
                self._pending.resolve_pushed,
                timeout_s,
                self._workers,
                None if self._rest is None else self._rest.mark,
            )
            self._pusher = loop.create_task(self._push.run(), name=f"{client_id}-pushed")
            if self.push_requests:
                self._pending.push = self._push_request
        reader = read_replies(
            self._consumer,
            self._from_log,
            self.stats,
            self.egress_topic,
            self._follow_egress,
            None if self._push is None else self._push.egress_wait_floor_ms,
            self._pending.taken_copy,
            self._rest,
        )
        self._reader = loop.create_task(reader, name=f"{client_id}-reader")
        self._reader.add_done_callback(self._reader_done)
        self._segments = loop.create_task(self._follow_segments(), name=f"{client_id}-segments")
        self._started = True
        log.debug(
            "%s: started; reading replies from egress partition %d (-1: all)", client_id, self.reply_partition
        )

    # ---- shutdown ----------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop reading, fail every pending request, stop the producer and the consumer.

        Pending callers get a :class:`~styx_py.core.errors.StyxError` at once rather than waiting for their
        timeout: no reply can reach them any more. Safe to call twice.
        """
        if self._closed:
            return
        self._closed = True
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            # wait() instead of awaiting the task: its CancelledError must not be mistaken for ours.
            await asyncio.wait([reader])
        self._pending.fail_all(StyxError("StyxClient closed before the reply arrived"))
        for task in (self._sender, self._segments, self._pusher):
            if task is not None:
                task.cancel()
                await asyncio.wait([task])
        self._sender = self._segments = self._pusher = None
        producer, self._producer = self._producer, None
        consumer, self._consumer = self._consumer, None
        await stop_quietly(producer, "producer")
        await stop_quietly(consumer, "consumer")

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

    def _reader_done(self, task: asyncio.Task[None]) -> None:
        """A reader that dies (not cancelled by close) fails every pending request and the client.

        Without this, callers would only learn about a broken consumer by timing out one by one.
        """
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:  # the loop never returns normally; treat it as a failure all the same
            exc = StyxError("reply reader ended unexpectedly")
        log.error("reply reader of the StyxClient failed: %r", exc)
        self._broken = exc
        error = StyxError(f"reply reader failed: {exc!r}")
        error.__cause__ = exc
        self._pending.fail_all(error)

    # ---- requests ----------------------------------------------------------------------------------

    @property
    def request_id_prefix(self) -> str:
        """What every request id this client generates starts with: a reader of the logs can tell this
        client's requests and replies apart (ids chosen by callers need not)."""
        return self._new_rid.prefix

    @property
    def pending_count(self) -> int:
        """Requests in flight (distinct request ids waiting for a reply)."""
        return len(self._pending)

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
        rid, entry, send = self._admit(operator, key, function, args, request_id)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return await self._pending.wait(rid, entry, send, timeout, (operator, function, key, rid))

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
        rid, entry, send = self._admit(operator, key, function, args, request_id)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return self._pending.future(rid, entry, send, timeout, (operator, function, key, rid))

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
        return Prepared(self, operator, function, self._targets.operators[operator], timeout)

    def _admit(
        self, operator: str, key: Key, function: str, args: tuple[Any, ...], request_id: str | None
    ) -> tuple[str, Pending, Send | None]:
        """Validate and encode locally (raising BadRequest/Overloaded, nothing sent); the request id, its
        in-flight entry (joined when the id is in flight already), and the send to call, if it is new."""
        self._check_usable()
        partition = self._targets.partition(operator, key, function)
        rid = request_id if request_id is not None else self._new_rid()
        payload = encode_request(rid, operator, function, key, args, self.reply_partition, self.reply_to)
        self._pending.check_reuse(rid, payload)
        entry = self._pending.get(rid)
        if entry is not None:
            return rid, entry, None
        self._pending.check_room()
        # Registered before producing: the reply may be read before send() even returns.
        new = self._pending.add(rid, asyncio.get_running_loop().create_future(), payload)
        return rid, new, lambda: self._produce(rid, partition, payload, new)

    def _pushes_healthy(self) -> bool:
        return self._push is not None and self._push.healthy

    def _from_log(self, reply: Reply) -> None:
        """A reply read from the egress topic."""
        push = self._push
        if self._pending.resolve(reply) and push is not None and push.healthy:
            # Every worker this client knows pushes to it, and still this reply came through the log
            # only: its request's partition may belong to a worker that joined since the client last
            # asked (styx_client.sdk.push). Asking now ends that sooner than the next REFRESH_S.
            push.ask_soon()

    def _check_usable(self) -> None:
        if self._closed:
            raise StyxError("StyxClient is closed")
        if self._broken is not None:
            raise StyxError(f"StyxClient's reply reader stopped: {self._broken!r}") from self._broken
        if not self._started:
            raise StyxError("StyxClient not started: use 'await client.start()' or 'async with'")

    def _produce(self, rid: str, partition: int, payload: bytes, entry: Pending) -> None:
        """Queue the request for its partition's next batch; a failed delivery fails its future.

        Nothing is awaited: the reply (which implies the broker's ack) is awaited anyway, and a
        delivery error still surfaces at once.
        """
        assert self._lanes is not None

        def on_done(offset: int, exc: BaseException | None) -> None:
            if exc is None:
                self._pending.acknowledged(entry, offset)
            else:
                self._pending.undelivered(entry, exc)

        entry.partition, entry.segment = partition, self.segment
        entry.stamp = self._lanes.add(self._ingress_now, partition, rid.encode(), payload, on_done)

    def _push_request(self, entry: Pending, offset: int) -> None:
        """The broker acknowledged ``entry``'s record at ``offset``: to its worker (styx_client.sdk.push)."""
        assert self._push is not None and self._lanes is not None
        if self._lanes.log_append_time:
            return  # the broker stores other timestamps than the ones this client would push
        self._push.push_request(
            entry.partition, entry.segment, offset, entry.stamp, entry.rid.encode(), entry.fingerprint
        )

    # ---- ingress segments ----------------------------------------------------------------------------

    def _use_segment(self, segment: int) -> None:
        self.segment = self._pending.segment = segment
        self._ingress_now = segment_topic(self.ingress_topic, segment)

    async def _follow_segments(self) -> None:
        """Write to the newest ingress segment (:mod:`styx_py.core.segments`), looking for a newer one
        every :data:`SEGMENT_POLL_S`.

        A request the broker acknowledged while its segment was the newest this client knew is read by
        the workers: they stop reading a segment only two rotations after the next one appeared, and
        only once they read it to its end (``KafkaIngress.live``). One acknowledged later (in flight
        when the client moved on, or written by a client that lagged) may be left unread: once the
        workers may have stopped reading its segment (:func:`~styx_py.core.segments.unread`) it is
        written again to the newest. A copy that did run is answered from the reply table, with the
        same reply."""
        while True:
            await asyncio.sleep(SEGMENT_POLL_S)
            asked = time.monotonic()
            try:
                newest = await newest_segment(self._producer, self.ingress_topic, self.segment)
                if newest > self.segment:
                    wanted = await egress_following(
                        self._producer, self.egress_topic, self._reply_partitions, newest
                    )
            except KafkaError as exc:
                log.debug("%s: cannot look for a newer segment: %r", self.client_id, exc)
                continue
            if newest <= self.segment:
                self._pending.saw_newest(asked)
                continue
            self._egress_wanted = wanted
            self._egress_settled = False
            self._use_segment(newest)
            self._pending.saw_newest(asked)
            self._write_again(self._pending.unread_late(newest))
            self._forget_old_segments()

    def _forget_old_segments(self) -> None:
        """Write (and ask the broker about) the two newest ingress segments only: earlier ones are
        dropped from the producer once nothing of theirs is in flight."""
        assert self._lanes is not None
        self._lanes.retire(
            {segment_topic(self.ingress_topic, s) for s in (self.segment - 1, self.segment) if s >= 0}
        )

    async def _follow_egress(self, consumer: Any) -> None:
        """Between two polls of the reader: read the egress segments :meth:`_follow_segments` chose, a
        new one from its start; one no longer chosen only once read to its end (workers stopped writing
        to it a rotation ago)."""
        if self._egress_settled:
            return
        have = set(consumer.assignment())
        want = set(self._egress_wanted)
        self._egress_settled = want == have
        if want == have:
            return
        for tp in have - want:
            hw = consumer.highwater(tp)
            if hw is None or await consumer.position(tp) < hw:
                want.add(tp)  # not read to its end yet
        if want == have:
            return
        self._egress_settled = want == set(self._egress_wanted)
        positions = {tp: await consumer.position(tp) for tp in have & want}
        consumer.assign(sorted(want))
        for tp in want:
            consumer.seek(tp, positions.get(tp, 0))

    def _write_again(self, entries: list[Pending]) -> None:
        lanes = self._lanes
        assert lanes is not None
        if entries:
            log.info(
                "%s: writing %d requests again to ingress segment %d",
                self.client_id,
                len(entries),
                self.segment,
            )
        for entry in entries:
            entry.segment, entry.on_time = self.segment, False
            self.stats.rewritten += 1

            def on_done(_offset: int, exc: BaseException | None, entry: Pending = entry) -> None:
                if exc is not None:
                    self._pending.undelivered(entry, exc)
                else:
                    entry.on_time = self._pending.on_time(entry.segment)

            lanes.add(self._ingress_now, entry.partition, entry.rid.encode(), entry.fingerprint, on_done)

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
            encode_request(rid, operator, function, key, args)
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


class Prepared:
    """Requests to one ``operator.function`` without a future per request: :meth:`send` hands each
    reply (or its failure) to a callback.

    Same checks and guarantees as :meth:`StyxClient.submit` (the record goes through the same
    :func:`~styx_py.core.requests.encode_request`; a generated request id is checked against the
    table; ``max_pending``; a timeout per request, reported by the shared deadline timer), minus what
    a load generator does not use: chosen request ids, joining an id in flight, cancellation. What it
    saves per request (the operator and function are looked up once; no ``*args``/keywords packing,
    caller future, done callback or delivery closure) is measured in benchmarks/results/client-cpu.md.
    """

    __slots__ = ("_client", "_partitions", "function", "operator", "timeout_s")

    def __init__(self, client: StyxClient, operator: str, function: str, partitions: int, timeout_s: float):
        self._client = client
        self._partitions = partitions
        self.operator = operator
        self.function = function
        self.timeout_s = timeout_s

    def send(self, key: Key, args: tuple[Any, ...] | list[Any], done: Done) -> str:
        """Send ``operator.function(key, *args)`` now; its request id.

        Raises :class:`BadRequest`, :class:`Overloaded` or :class:`StyxError` here, nothing sent,
        exactly as :meth:`StyxClient.submit`. Otherwise ``done(reply, None)`` or ``done(None, error)``
        is called exactly once: a :class:`RequestTimeout` after ``timeout_s``, :class:`Unavailable`
        when the record could not be delivered, :class:`StyxError` when the client closes first.
        ``done`` runs inside the client's reader or timer, so it must be quick and must not raise.
        """
        client = self._client
        client._check_usable()
        operator, function = self.operator, self.function
        if type(key) is str or type(key) is int:
            partition = partition_of(key, self._partitions)
        else:  # the message of a bad key, as on the normal path
            partition = client._targets.partition(operator, key, function)
        rid = client._new_rid()
        ts_ms = time.time_ns() // 1_000_000
        record = lean_request(
            rid, operator, function, key, args, ts_ms, client.reply_partition, client.reply_to
        )
        table = client._pending
        table.check_new(rid, record)
        # Registered before producing: the reply may be read before add() even returns.
        caller = table.callback(
            rid, record, done, self.timeout_s, (operator, function, key, rid), client._loop
        )
        lanes = client._lanes
        assert lanes is not None
        caller.entry.partition, caller.entry.segment = partition, client.segment
        caller.entry.stamp = lanes.add(client._ingress_now, partition, rid.encode(), record, caller.delivered)
        return rid


def _check_limits(max_pending: int, timeout_s: float, linger_ms: int, fetch_wait_ms: int) -> None:
    if max_pending < 1:
        raise ConfigError(f"max_pending must be >= 1, not {max_pending!r}")
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s must be > 0, not {timeout_s!r}")
    if linger_ms < 0:
        raise ConfigError(f"linger_ms must be >= 0, not {linger_ms!r}")
    if fetch_wait_ms < 5:
        # Tansu never answers a fetch with a 0 ms wait; tiny values only burn broker CPU.
        raise ConfigError(f"fetch_wait_ms must be >= 5, not {fetch_wait_ms!r}")
