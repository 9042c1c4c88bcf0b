"""The asynchronous client: a facade over its core (:mod:`.core`) and a transport (:mod:`.transport`).

A request is produced to the ingress partition that owns its key, so the worker that owns the entity
sequences it; it names the client's reply partition, and its reply comes back on that egress partition,
where the client's reader hands it to the core, which settles the waiters of its request id. The entry
is registered before the request is produced, and :meth:`StyxClient.start` returns only once the reader
is positioned at the end of the reply partition, so no reply can be missed. The calls themselves
(submit, call, submit_many, prepare) are :class:`~styx_client.sdk.calls.ClientCalls`, its base class;
this module makes, starts and closes a client.

Every background task (the transport's sender, reader and worker links, the segment look, the deadline
sweep) is a child of one :class:`asyncio.TaskGroup` that the client owns: if any fails, the client is
broken, every request in flight fails with that cause, new ones are refused, and :meth:`StyxClient.close`
raises it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from types import TracebackType
from typing import Any

from styx_client.sdk.calls import ClientCalls
from styx_client.sdk.config import ClientConfig, client_config
from styx_client.sdk.core import ClientCore
from styx_client.sdk.deployment import connect_arguments
from styx_client.sdk.ids import RequestIds
from styx_client.sdk.kafka_transport import KafkaTransport
from styx_client.sdk.prepared import Prepared
from styx_client.sdk.requests import Call, Targets
from styx_client.sdk.shell import Shell
from styx_client.sdk.state import ClientState
from styx_client.sdk.transport import Batching, ClientTransport
from styx_py.core.errors import StyxError
from styx_py.core.limits import BUSY_LINGER_MS, MIN_FETCH_WAIT_MS, SEGMENT_POLL_S
from styx_py.core.security import KafkaSecurity
from styx_py.core.segments import FRESH_S

__all__ = ["Batching", "Call", "Prepared", "StyxClient"]

log = logging.getLogger("styx.client")


class StyxClient(ClientCalls, ClientState):
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

    The same ``coordinator`` serves reads of committed state outside transactions, as of one epoch
    across every partition (:meth:`scan`, :meth:`read`, :mod:`styx_client.sdk.state`).
    """

    def __init__(
        self,
        bootstrap: str,
        operators: Mapping[str, int],
        *,
        ingress_topic: str = "styx-ingress",
        egress_topic: str = "styx-egress",
        max_pending: int = 10_000,
        shed_when_refused: bool = True,
        timeout_s: float = 30.0,
        linger_ms: int = 0,
        busy_linger_ms: float = BUSY_LINGER_MS,
        fetch_wait_ms: int = MIN_FETCH_WAIT_MS,
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
        kafka_security: KafkaSecurity | None = None,
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
        ``kafka_security`` is how the client reaches Kafka (TLS, SASL; default: from the
        ``STYX_KAFKA_SECURITY_PROTOCOL``, ``STYX_KAFKA_SSL_*`` and ``STYX_KAFKA_SASL_*`` environment, as
        the cluster's processes do); the connections to the coordinator and the workers take mutual TLS
        from ``STYX_TLS_*`` (:func:`~styx_py.io.tls.client_tls`).
        """
        self._targets = Targets(operators, functions)
        self._admin = (coordinator, cluster_secret)  # for reads of committed state (styx_client.sdk.state)
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
            kafka_security=kafka_security,
        )
        push = self.config.push
        self._core = ClientCore(
            max_pending,
            egress_topic,
            rest=push.rest_egress,
            push_requests=push.push_requests,
            fresh_s=fresh_s,
            shed_when_refused=shed_when_refused,
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
