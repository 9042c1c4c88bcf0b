"""Client SDK: send requests to a styx-py cluster through Kafka and match the replies.

A request is a msgpack :class:`~styx_py.core.wire.Request` produced to the ingress topic, in the partition
that owns its key (``partition_of(key, operator partitions)``), so the worker that owns the entity
sequences it. The cluster answers with a :class:`~styx_py.core.wire.Reply` on the egress topic, in any
partition. The client therefore reads *every* egress partition with one consumer task and routes each
reply to the future registered for its request id.

Two properties matter and are kept on purpose:

* **No missed replies.** The reply future is registered before the request is produced, and
  :meth:`StyxClient.start` returns only once the consumer is positioned at the current end of every
  egress partition, so a reply to any request sent after ``start()`` lies ahead of the consumer.
* **No stale or duplicate deliveries.** Replies already in the topic when the client started are
  skipped (the consumer starts at the end), a reply whose id is not pending is ignored, and a second
  reply for an id that was already answered is ignored. Brokers and the server may redeliver (the
  server re-sends replies after recovery); none of that may crash the reader or resolve the wrong call.

The end of a partition is taken from the fetch **high watermark** (``consumer.highwater``), not from
``end_offsets()``/``seek_to_end()``: the latter are wrong on the Tansu broker used locally (see
``shared/LOCAL_SERVICES.md``), while the high watermark is correct on Tansu and on Apache Kafka.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import msgspec

# aiokafka ships no type information; the extra code keeps these lines clean whether or not the
# project's mypy config already ignores missing stubs.
from aiokafka import (  # type: ignore[import-untyped,unused-ignore]
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)
from aiokafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from styx_py.core.errors import (
    BadRequest,
    ConfigError,
    Overloaded,
    ProtocolError,
    RequestTimeout,
    StyxError,
    TransactionAborted,
    TransactionFailed,
    Unavailable,
)
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import Key, Reply, Request, StatusRequest, decode_value, encode_value, reply_decoder
from styx_py.io.batching import MAX_BATCH_BYTES, BatchLanes
from styx_py.io.tcp import admin_request

__all__ = ["Call", "ClientStats", "StyxClient", "SyncStyxClient", "decode_reply", "result_of"]

log = logging.getLogger("styx.client")

Call = tuple[str, Key, str, tuple[Any, ...]]
"""One entry of :meth:`StyxClient.submit_many`: ``(operator, key, function, args)``."""

_T = TypeVar("_T")

# How long one getmany() may block. Only bounds how quickly the reader notices cancellation when no
# replies flow; replies themselves are returned as soon as a fetch brings them.
_READ_POLL_MS = 1000
# Upper bound of one positioning fetch, so the start-up deadline is checked regularly.
_POSITION_POLL_MS = 200


def decode_reply(data: bytes) -> Reply:
    """Decode one egress record into a :class:`~styx_py.core.wire.Reply` (``result`` is msgpack, nil if none).

    Raises ``msgspec.DecodeError``/``msgspec.ValidationError`` for bytes that are not a reply.
    """
    return reply_decoder.decode(data)


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


class _Pending:
    """A request in flight: the future its reply resolves and how many callers wait on it.

    Callers that submit an id already in flight share the future instead of sending again; the entry
    leaves the table when the reply arrives or when its last waiter gives up.
    """

    __slots__ = ("future", "waiters")

    def __init__(self, future: asyncio.Future[Reply]) -> None:
        self.future = future
        self.waiters = 0


class RequestIds:
    """Generated request ids: 80 random bits per generator, then a counter. 32 hex digits like a uuid4,
    unique without a ``urandom`` call per request (that call was ~6 % of a load generator's CPU)."""

    __slots__ = ("_prefix", "_seq")

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:20]
        self._seq = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._seq):012x}"


class StyxClient:
    """Asynchronous client of a styx-py cluster (one producer, one reply-reader task).

    Use :meth:`connect` to learn the operators and the Kafka address from the coordinator, or pass
    them directly. ``operators`` maps each operator name to its partition count: the client needs it
    to produce a request to the partition that owns the key.

    ``timeout_s`` is the default reply deadline of :meth:`submit` and also bounds :meth:`start`
    (metadata and positioning). ``fetch_wait_ms`` is the consumer's ``fetch_max_wait_ms``: a broker
    like Tansu answers a waiting fetch only at its deadline, so it is a floor on reply latency; keep
    it small (>= 5, Tansu never answers a 0 ms wait).
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
        fetch_wait_ms: int = 5,
        functions: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """Store the configuration; nothing connects before :meth:`start`.

        ``functions`` (operator -> function names) is optional: when given, an unknown function is
        rejected locally like an unknown operator, without a round trip to the cluster.
        """
        if not operators:
            raise ConfigError("operators: at least one operator (name -> partition count) is needed")
        for name, partitions in operators.items():
            if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
                raise ConfigError(
                    f"operators[{name!r}]: partition count must be an int >= 1, not {partitions!r}"
                )
        if max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1, not {max_pending!r}")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, not {timeout_s!r}")
        if linger_ms < 0:
            raise ConfigError(f"linger_ms must be >= 0, not {linger_ms!r}")
        if fetch_wait_ms < 5:
            # Tansu never answers a fetch with a 0 ms wait; tiny values only burn broker CPU.
            raise ConfigError(f"fetch_wait_ms must be >= 5, not {fetch_wait_ms!r}")
        self.bootstrap = bootstrap
        self.operators: dict[str, int] = dict(operators)
        self.functions: dict[str, frozenset[str]] | None = (
            {name: frozenset(fns) for name, fns in functions.items()} if functions is not None else None
        )
        self.ingress_topic = ingress_topic
        self.egress_topic = egress_topic
        self.max_pending = max_pending
        self.timeout_s = timeout_s
        self.linger_ms = linger_ms
        self.fetch_wait_ms = fetch_wait_ms
        self.stats = ClientStats()
        self._pending: dict[str, _Pending] = {}
        self._new_rid = RequestIds()
        # Ids answered recently: a later reply with one of them is a duplicate, not a stranger. Bounded,
        # because redeliveries arrive close to the original and the table must not grow forever.
        self._answered: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._answered_cap = max(1024, 2 * max_pending)
        self._producer: Any = None
        self._consumer: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._lanes: BatchLanes | None = None
        self._broken: BaseException | None = None
        self._started = False
        self._closed = False

    # ---- construction ------------------------------------------------------------------------------

    @classmethod
    async def connect(cls, coordinator: str, **kw: Any) -> StyxClient:
        """Ask the coordinator at ``host:port`` what is deployed, then return a started client.

        The coordinator's status gives the operators (with partition counts and functions) and the
        Kafka bootstrap address, so applications only need the coordinator's address. Keyword
        arguments are passed to the constructor; ``bootstrap`` may override the coordinator's value
        (e.g. when the client reaches Kafka by another address).
        """
        try:
            timeout = float(kw.get("timeout_s", 30.0))
            reply = await admin_request(coordinator, StatusRequest(), timeout_s=timeout)
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot reach the coordinator at {coordinator}: {exc}") from exc
        if not reply.ok:
            raise StyxError(f"coordinator at {coordinator} refused the status request: {reply.error}")
        body = reply.body
        ops = body.get("operators") or []
        if not ops:
            raise StyxError(f"nothing is deployed on the coordinator at {coordinator}: deploy a graph first")
        bootstrap = kw.pop("bootstrap", None) or body.get("kafka_bootstrap")
        if not bootstrap:
            raise ConfigError(
                f"the coordinator at {coordinator} reports no kafka_bootstrap; pass bootstrap=HOST:PORT"
            )
        try:
            operators = {str(op["name"]): int(op["partitions"]) for op in ops}
            functions = {str(op["name"]): [str(f) for f in op.get("functions") or []] for op in ops}
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed operator list in the coordinator's status: {ops!r}") from exc
        for topic in ("ingress_topic", "egress_topic"):
            if topic not in kw and body.get(topic):
                kw[topic] = str(body[topic])
        kw.setdefault("functions", functions)
        client = cls(str(bootstrap), operators, **kw)
        await client.start()
        return client

    async def start(self) -> None:
        """Connect, discover the egress partitions and position the reader at their current end.

        Returns only once positioned: from then on every reply to a request sent by this client lies
        ahead of the reader, so none can be missed; replies already in the topic are never seen.
        """
        if self._closed:
            raise StyxError("StyxClient is closed; create a new one")
        if self._started:
            return
        client_id = f"styx-client-{uuid.uuid4().hex[:8]}"
        # No idempotence: aiokafka's idempotent producer cannot start on Tansu, and duplicates are
        # harmless here (the server deduplicates by request id, the client ignores second replies).
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=client_id,
            acks="all",
            linger_ms=self.linger_ms,
            enable_idempotence=False,
            max_batch_size=MAX_BATCH_BYTES,
        )
        # No group and manual assignment: a group join takes seconds on Tansu and the client must read
        # every partition anyway. "earliest" only matters if a position is ever lost (retention on a
        # real broker): re-reading old replies is harmless, skipping new ones would lose answers.
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=client_id,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.fetch_wait_ms,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            try:
                await producer.start()
                await consumer.start()
                async with asyncio.timeout_at(deadline):
                    await self._require_topics(consumer)
                    ingress_partitions = await self._partitions(producer, self.ingress_topic)
                    egress_partitions = await self._partitions(producer, self.egress_topic)
            except TimeoutError as exc:
                raise StyxError(
                    f"Kafka at {self.bootstrap} did not give topic metadata within {self.timeout_s} s"
                ) from exc
            except KafkaError as exc:
                raise Unavailable(f"cannot use Kafka at {self.bootstrap}: {exc!r}") from exc
            needed = max(self.operators.values())
            if ingress_partitions < needed:
                raise ConfigError(
                    f"ingress topic {self.ingress_topic!r} has {ingress_partitions} partitions but an "
                    f"operator needs {needed}; operators={self.operators}"
                )
            tps = [TopicPartition(self.egress_topic, p) for p in range(egress_partitions)]
            consumer.assign(tps)
            await self._position_at_end(consumer, tps, deadline)
        except BaseException:
            await _stop_quietly(consumer, "consumer")
            await _stop_quietly(producer, "producer")
            raise
        self._producer = producer
        self._consumer = consumer
        self._lanes = BatchLanes(producer)
        self._sender = loop.create_task(self._lanes.run(), name=f"{client_id}-sender")
        self._reader = loop.create_task(self._read_replies(), name=f"{client_id}-reader")
        self._reader.add_done_callback(self._reader_done)
        self._started = True
        log.debug("%s: started; %d egress partitions positioned at their end", client_id, len(tps))

    async def _require_topics(self, consumer: Any) -> None:
        """Fail unless both topics exist, *before* any request names them.

        Asking for a missing topic's metadata (or producing to it) makes Kafka and Tansu auto-create
        it with the broker's default partition count (Tansu: 4), after which the coordinator's own
        CreateTopics would find it "already existing" with the wrong number of partitions. The
        all-topics listing creates nothing.
        """
        existing = await consumer.topics()
        missing = [t for t in (self.ingress_topic, self.egress_topic) if t not in existing]
        if missing:
            raise ConfigError(
                f"topics {missing} do not exist on {self.bootstrap}; deploy a graph first "
                "(the coordinator creates them with the right partition counts)"
            )

    async def _partitions(self, producer: Any, topic: str) -> int:
        """Partition count of ``topic``; waits for its metadata (aiokafka polls until it has it).

        Asked through the producer because a consumer without subscription does not track topic
        metadata, so ``partitions_for_topic`` on it would stay ``None``.
        """
        partitions = await producer.partitions_for(topic)
        if not partitions:
            raise ConfigError(f"topic {topic!r} has no partitions on {self.bootstrap}")
        count = len(partitions)
        if set(partitions) != set(range(count)):
            raise ProtocolError(f"topic {topic!r} reports non-contiguous partitions {sorted(partitions)}")
        return count

    async def _position_at_end(self, consumer: Any, tps: list[TopicPartition], deadline: float) -> None:
        """Seek every partition to its current high watermark.

        ``end_offsets``/``seek_to_end`` are wrong on Tansu, but every fetch response carries the
        correct high watermark. So: fetch from the beginning (records fetched now are old replies
        and dropped) until each partition's high watermark is known, then seek there. Any record
        produced after the fetch has an offset >= that watermark, hence is read later.
        """
        loop = asyncio.get_running_loop()
        await consumer.seek_to_beginning(*tps)
        while True:
            unknown = [tp for tp in tps if consumer.highwater(tp) is None]
            if not unknown:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise StyxError(
                    f"no high watermark for {len(unknown)} egress partitions of {self.egress_topic!r} "
                    f"within {self.timeout_s} s (is the broker at {self.bootstrap} serving fetches?)"
                )
            await consumer.getmany(*tps, timeout_ms=max(1, min(int(remaining * 1000), _POSITION_POLL_MS)))
        for tp in tps:
            consumer.seek(tp, consumer.highwater(tp))

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
        self._fail_pending(StyxError("StyxClient closed before the reply arrived"))
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            await asyncio.wait([sender])
        producer, self._producer = self._producer, None
        consumer, self._consumer = self._consumer, None
        await _stop_quietly(producer, "producer")
        await _stop_quietly(consumer, "consumer")

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

    @property
    def pending_count(self) -> int:
        """Requests in flight (distinct request ids waiting for a reply)."""
        return len(self._pending)

    def _check_usable(self) -> None:
        if self._closed:
            raise StyxError("StyxClient is closed")
        if self._broken is not None:
            raise StyxError(f"StyxClient's reply reader stopped: {self._broken!r}") from self._broken
        if not self._started:
            raise StyxError("StyxClient not started: use 'await client.start()' or 'async with'")

    def _validate(self, operator: str, key: Key, function: str) -> int:
        """Reject what the cluster would reject anyway, before anything is sent; return the partition."""
        partitions = self.operators.get(operator)
        if partitions is None:
            raise BadRequest(f"unknown operator {operator!r}; known: {sorted(self.operators)}")
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise BadRequest(f"entity keys must be str or int, got {type(key).__name__}")
        if self.functions is not None:
            known = self.functions.get(operator)
            if known is not None and function not in known:
                raise BadRequest(
                    f"operator {operator!r} has no function {function!r}; known: {sorted(known)}"
                )
        return partition_of(key, partitions)

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

        Raises :class:`BadRequest` locally (nothing sent) for an unknown operator, a bad key or
        unencodable arguments, :class:`Overloaded` at once when ``max_pending`` requests are in
        flight, and :class:`RequestTimeout` when no reply came in time. Submitting an id that is
        already in flight waits for the same reply instead of sending again, so retries with the
        same ``request_id`` are safe.
        """
        rid, entry, send = self._admit(operator, key, function, args, request_id)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        entry.waiters += 1
        try:
            async with asyncio.timeout(timeout):
                if send is not None:
                    send()
                return await asyncio.shield(entry.future)
        except TimeoutError:
            self.stats.timeouts += 1
            raise RequestTimeout(_timeout_message(operator, function, key, rid, timeout)) from None
        finally:
            self._leave(rid, entry)

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
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[Reply] = loop.create_future()
        entry.waiters += 1

        def expire() -> None:
            if not mine.done():
                self.stats.timeouts += 1
                mine.set_exception(RequestTimeout(_timeout_message(operator, function, key, rid, timeout)))

        timer = loop.call_at(loop.time() + timeout, expire)

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
            self._leave(rid, entry)

        entry.future.add_done_callback(settle)
        mine.add_done_callback(leave)
        if send is not None:
            send()
        return mine

    def _admit(
        self, operator: str, key: Key, function: str, args: tuple[Any, ...], request_id: str | None
    ) -> tuple[str, _Pending, Callable[[], None] | None]:
        """Validate and encode locally (raising BadRequest/Overloaded, nothing sent); the request id, its
        in-flight entry (joined when the id is in flight already), and the send to call, if it is new."""
        self._check_usable()
        partition = self._validate(operator, key, function)
        rid = request_id if request_id is not None else self._new_rid()
        entry = self._pending.get(rid)
        if entry is not None:
            return rid, entry, None
        if len(self._pending) >= self.max_pending:
            raise Overloaded(f"{len(self._pending)} requests in flight (max_pending={self.max_pending})")
        ts_ms = time.time_ns() // 1_000_000
        try:
            args_raw = msgspec.Raw(encode_value(list(args)))
            payload = encode_value(Request(rid, operator, function, key, args_raw, ts_ms))
        except (TypeError, ValueError, OverflowError) as exc:
            raise BadRequest(f"request {operator}.{function}(key={key!r}) cannot be encoded: {exc}") from exc
        # Registered before producing: the reply may be read before send() even returns.
        new = self._pending[rid] = _Pending(asyncio.get_running_loop().create_future())
        return rid, new, lambda: self._produce(rid, partition, payload, new)

    def _leave(self, rid: str, entry: _Pending) -> None:
        """One waiter of ``entry`` is done; the last one takes the entry out of the table."""
        entry.waiters -= 1
        if entry.waiters == 0:
            if self._pending.get(rid) is entry:
                del self._pending[rid]
            if not entry.future.done():
                entry.future.cancel()
            elif not entry.future.cancelled():
                # Mark a failure as observed (it was raised to a waiter, or the send failed before
                # anyone awaited): no "exception was never retrieved" noise at GC.
                entry.future.exception()

    def _produce(self, rid: str, partition: int, payload: bytes, entry: _Pending) -> None:
        """Queue the request for its partition's next batch; a failed delivery fails its future.

        Nothing is awaited: the reply (which implies the broker's ack) is awaited anyway, and a
        delivery error still surfaces at once.
        """
        assert self._lanes is not None

        def on_done(_offset: int, exc: BaseException | None) -> None:
            if exc is None:
                self.stats.sent += 1
            elif isinstance(exc, KafkaError):
                _fail(entry.future, Unavailable(f"could not send request {rid}: {exc!r}"), exc)
            else:
                _fail(entry.future, StyxError(f"request {rid} was not sent: {exc!r}"), exc)

        self._lanes.add(self.ingress_topic, partition, rid.encode(), payload, on_done)

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
        reply of type ``BadRequest`` raises :class:`BadRequest`, any other failure
        :class:`TransactionFailed`; the exception's ``reply`` holds the server's reply.
        """
        reply = await self.submit(operator, key, function, *args, request_id=request_id, timeout_s=timeout_s)
        return result_of(reply)

    async def submit_many(self, calls: Iterable[Call], *, concurrency: int = 1000) -> list[Reply]:
        """Submit many requests with at most ``concurrency`` in flight; replies in the order of ``calls``.

        Every call is validated before the first is sent, so a local error (unknown operator, bad key)
        sends nothing. If a request fails (timeout, send error), the others still run to the end and
        the first failure in call order is raised: no request is left unobserved in the background.
        """
        batch = list(calls)
        for operator, key, function, _args in batch:
            self._validate(operator, key, function)
        limit = asyncio.Semaphore(max(1, min(concurrency, self.max_pending)))

        async def one(call: Call) -> Reply:
            operator, key, function, args = call
            async with limit:
                return await self.submit(operator, key, function, *args)

        outcomes = await asyncio.gather(*(one(call) for call in batch), return_exceptions=True)
        replies: list[Reply] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            replies.append(outcome)
        return replies

    # ---- reply reader ------------------------------------------------------------------------------

    async def _read_replies(self) -> None:
        """The one consumer loop: route every egress record to the future waiting for it."""
        consumer = self._consumer
        while True:
            batches = await consumer.getmany(timeout_ms=_READ_POLL_MS)
            for records in batches.values():
                for record in records:
                    self._dispatch(record.value, record.partition, record.offset)

    def _dispatch(self, value: bytes | None, partition: int, offset: int) -> None:
        try:
            if value is None:
                raise msgspec.DecodeError("empty record value")
            reply = decode_reply(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.stats.undecodable += 1
            log.warning(
                "skipping undecodable record at %s[%d]@%d: %s", self.egress_topic, partition, offset, exc
            )
            return
        rid = reply.request_id
        entry = self._pending.get(rid)
        if entry is None or entry.future.done():
            if rid in self._answered:
                self.stats.duplicates_ignored += 1
            else:
                self.stats.unmatched_ignored += 1
            return
        del self._pending[rid]
        entry.future.set_result(reply)
        self.stats.replied += 1
        self._answered[rid] = None
        if len(self._answered) > self._answered_cap:
            self._answered.popitem(last=False)

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
        self._fail_pending(error)

    def _fail_pending(self, error: StyxError) -> None:
        for entry in self._pending.values():
            _fail(entry.future, error, error.__cause__)


def result_of(reply: Reply) -> Any:
    """Decoded result of a committed reply; the matching exception otherwise (see :meth:`StyxClient.call`)."""
    match reply.status:
        case "committed":
            return decode_value(reply.result)
        case "aborted":
            raise TransactionAborted(reply.error or "transaction aborted", reply)
        case "failed" if reply.error_type == "BadRequest":
            raise BadRequest(reply.error or "bad request", reply)
        case "failed":
            message = f"{reply.error_type or 'error'}: {reply.error or 'transaction failed'}"
            raise TransactionFailed(message, reply)
        case _:
            raise ProtocolError(f"reply {reply.request_id} has unknown status {reply.status!r}")


def _timeout_message(operator: str, function: str, key: Key, rid: str, timeout: float) -> str:
    return f"no reply to {operator}.{function}(key={key!r}) request {rid} within {timeout} s"


def _fail(future: asyncio.Future[Reply], error: StyxError, cause: BaseException | None) -> None:
    if not future.done():
        if cause is not None:
            error.__cause__ = cause
        future.set_exception(error)


async def _stop_quietly(part: Any, what: str) -> None:
    """Stop an aiokafka producer/consumer during shutdown; a failure to stop must not mask the cause."""
    if part is None:
        return
    try:
        await part.stop()
    except (KafkaError, OSError) as exc:
        log.warning("error while stopping the Kafka %s: %r", what, exc)


# ---- synchronous facade ------------------------------------------------------------------------------


class _LoopThread:
    """A private event loop in a daemon thread, so synchronous code can drive the async client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="styx-client-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("SyncStyxClient cannot be used from its own event loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # E.g. KeyboardInterrupt while waiting: do not leave the coroutine running behind our back.
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            self.run(_cancel_other_tasks())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.loop.close()


async def _cancel_other_tasks() -> None:
    """Cancel what libraries left running so the loop closes without 'Task was destroyed' noise."""
    current = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not current]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others)
    await asyncio.get_running_loop().shutdown_asyncgens()


class SyncStyxClient:
    """Blocking facade of :class:`StyxClient` for scripts, notebooks and threaded servers.

    The async client runs on a private event loop in a daemon thread; every method blocks the calling
    thread only. Safe to call from several threads at once. Do not call it from inside a running
    event loop: it would block that loop (use :class:`StyxClient` there).
    """

    def __init__(self, bootstrap: str, operators: Mapping[str, int], **kw: Any) -> None:
        """Start the client (same arguments as :class:`StyxClient`); returns once it is positioned."""
        self._runner = _LoopThread()
        self._client = StyxClient(bootstrap, operators, **kw)
        try:
            self._runner.run(self._client.start())
        except BaseException:
            self._runner.stop()
            raise

    @classmethod
    def connect(cls, coordinator: str, **kw: Any) -> SyncStyxClient:
        """Like :meth:`StyxClient.connect`: learn the deployment from the coordinator, then start."""
        runner = _LoopThread()
        try:
            client = runner.run(StyxClient.connect(coordinator, **kw))
        except BaseException:
            runner.stop()
            raise
        self = cls.__new__(cls)
        self._runner = runner
        self._client = client
        return self

    @property
    def client(self) -> StyxClient:
        """The underlying async client (its methods must run on :attr:`loop`)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._runner.loop

    @property
    def stats(self) -> ClientStats:
        return self._client.stats

    @property
    def pending_count(self) -> int:
        return self._client.pending_count

    def _run(self, awaitable: Awaitable[_T]) -> _T:
        async def wrapper() -> _T:
            return await awaitable

        return self._runner.run(wrapper())

    def submit(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        """Blocking :meth:`StyxClient.submit`."""
        return self._run(
            self._client.submit(operator, key, function, *args, request_id=request_id, timeout_s=timeout_s)
        )

    def call(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Blocking :meth:`StyxClient.call`."""
        return self._run(
            self._client.call(operator, key, function, *args, request_id=request_id, timeout_s=timeout_s)
        )

    def submit_many(self, calls: Iterable[Call], *, concurrency: int = 1000) -> list[Reply]:
        """Blocking :meth:`StyxClient.submit_many`."""
        return self._run(self._client.submit_many(calls, concurrency=concurrency))

    def close(self) -> None:
        """Close the client and stop its loop thread; safe to call twice."""
        if self._runner.loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncStyxClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
