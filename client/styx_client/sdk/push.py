"""Replies pushed by the workers, requests pushed to them (:mod:`styx_py.core.wire.push`): the paths
without a broker hop.

A client made by :meth:`StyxClient.connect <styx_client.sdk.StyxClient.connect>` knows its
coordinator, whose status lists every worker's address. :class:`WorkerLinks` dials each worker's
port as ``name`` (the client's ``reply_to``, which every request it sends names), proves the cluster
secret and subscribes; each worker then sends it the reply to each of its requests as the reply
leaves for the egress topic, which saves the reply its trip through the broker (a produce, then a
fetch that Tansu answers after up to half its wait).

Nothing depends on it: the client reads the egress topic as before (waiting longer per fetch while
every worker pushes, :data:`~styx_py.core.limits.PUSHED_EGRESS_FETCH_WAIT_MS`) and takes whichever
copy of a reply comes first (:meth:`PendingTable.resolve <styx_client.sdk.pending.PendingTable.resolve>`
counts the later one as an echo). A worker that cannot be reached, a connection that drops, a worker that
restarts elsewhere: the replies keep coming through the egress topic while the addresses are asked
again (every :data:`~styx_py.core.limits.WORKER_LINK_RETRY_S` while a connection is down, every
:data:`~styx_py.core.limits.WORKER_LIST_REFRESH_S` otherwise, so a worker that joins is found too). A
reply that came through the log only, while every connection was up, asks again at once
(:meth:`WorkerLinks.ask_soon`, at most every ``WORKER_LINK_RETRY_S``): its request's partition
may belong to a worker that joined since the last look, which does not push to this client yet. A
worker that pushes to as many clients as it takes answers ``SubscribeRefused``: the client then reads
that worker's replies from the egress topic at the cluster's fetch wait, and keeps the connection open
without asking again.

The same connections carry the client's requests the other way (:meth:`WorkerLinks.push_request`):
once the broker acknowledged a request, it goes, with its offset, to the worker that reads its ingress
partition (the coordinator's status names each worker's partitions), which can sequence it without
waiting for its fetch; only while the client sends few requests a second (:mod:`styx_client.sdk.outbox`).
That worker's ingress fetch still reads every request, and is the path for every request the push misses
(no subscription to the worker yet, a placement that changed since the status was read, a connection
with :data:`~styx_py.core.limits.MAX_PUSH_BUFFER_BYTES` not yet written).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from styx_client.sdk.deployment import worker_partitions
from styx_client.sdk.outbox import RequestOutbox
from styx_py.core.errors import ProtocolError, StyxError
from styx_py.core.limits import (
    PUSHED_EGRESS_FETCH_WAIT_MS,
    WORKER_LINK_KEEPALIVE_S,
    WORKER_LINK_RETRY_S,
    WORKER_LIST_REFRESH_S,
)
from styx_py.core.wire import (
    HEADER_BYTES,
    Batch,
    EgressAcked,
    PushedReply,
    PushedRequest,
    Reply,
    SubscribeRefused,
    SubscribeReplies,
    decode_batch,
    encode_frame,
    frame_length,
)
from styx_py.io.handshake import client_secret, dial_handshake
from styx_py.io.tls import client_tls, open_connection

__all__ = ["Subscriptions", "WorkerLinks", "worker_addresses", "worker_partitions"]

log = logging.getLogger("styx.client")


def worker_addresses(status: Mapping[str, Any]) -> set[str]:
    """The ``host:port`` of every worker in a coordinator's status body."""
    return set(worker_partitions(status))


class Subscriptions:
    """What each worker's connection came to, by address: plain data that the connections' tasks write."""

    __slots__ = ("refused", "reported", "subscribed", "writers")

    def __init__(self) -> None:
        self.subscribed: set[str] = set()  # addresses whose worker took the subscription
        # Addresses whose worker refused it (SubscribeRefused: it pushes to as many clients as it
        # takes). The connection stays open and idle, so the client does not ask again and again;
        # a new connection (the worker restarted) asks again.
        self.refused: set[str] = set()
        self.reported: set[str] = set()  # addresses whose failure was logged at INFO already
        self.writers: dict[str, asyncio.StreamWriter] = {}  # subscribed connections

    def up(self, address: str, writer: asyncio.StreamWriter) -> None:
        """The worker at ``address`` was asked to push on ``writer``'s connection."""
        self.subscribed.add(address)
        self.writers[address] = writer
        self.refused.discard(address)
        self.reported.discard(address)

    def refuse(self, address: str) -> None:
        self.subscribed.discard(address)
        self.refused.add(address)

    def down(self, address: str, writer: asyncio.StreamWriter | None) -> None:
        """``writer``'s connection to ``address`` ended (None: it never opened)."""
        self.subscribed.discard(address)
        if writer is not None and self.writers.get(address) is writer:
            del self.writers[address]

    def failure_level(self, address: str) -> int:
        """The log level of a failure of ``address``: INFO the first time in a row, then DEBUG."""
        level = logging.DEBUG if address in self.reported else logging.INFO
        self.reported.add(address)
        return level


class WorkerLinks:
    """One connection per worker, kept up while the client runs (:meth:`run`): the subscription to
    its pushed replies, and the way for pushed requests."""

    def __init__(
        self,
        status: Callable[[], Any],
        secret: str | None,
        name: str,
        deliver: Callable[[Reply], None],
        timeout_s: float,
        known: Collection[str] | Mapping[str, list[int]] = (),
        marks: Callable[[list[tuple[int, int]]], None] | None = None,
    ) -> None:
        self.status = status  # coroutine function: the coordinator's status body
        # Where each worker's EgressAcked goes (styx_client.sdk.resting); None: not asked for.
        self.marks = marks
        # Worker addresses already known at the start (no status request then), with their partitions
        # when known too.
        self.known = set(known)
        self.owners: dict[int, str] = {}  # ingress partition -> the address of the worker reading it
        if isinstance(known, Mapping):
            self._own(known)
        self.key = client_secret(secret).encode()
        self.tls = client_tls()  # STYX_TLS_*: mutual TLS to the workers' ports, as to the coordinator's
        self.name = name  # the node id the connections prove, named by the requests' reply_to
        self.deliver = deliver
        self.timeout_s = timeout_s
        self.links: dict[str, asyncio.Task[None]] = {}
        self.subscriptions = Subscriptions()
        self.outbox = RequestOutbox(name, self.subscriptions.writers)
        self.clock: Callable[[], float] = time.monotonic
        self.asked = 0  # times the addresses were asked for
        self._ask_now = asyncio.Event()  # ask_soon() was called since the last look
        self._group: asyncio.TaskGroup | None = None  # where the subscriptions run (run())

    @property
    def healthy(self) -> bool:
        """Subscribed on every worker known."""
        return bool(self.links) and len(self.subscriptions.subscribed) == len(self.links)

    def egress_wait_floor_ms(self) -> int:
        """The least fetch wait the egress reader needs now
        (:data:`~styx_py.core.limits.PUSHED_EGRESS_FETCH_WAIT_MS` while :attr:`healthy`, else none)."""
        return PUSHED_EGRESS_FETCH_WAIT_MS if self.healthy else 0

    def ask_soon(self) -> None:
        """Ask the coordinator for the workers again without waiting for the regular refresh: at once, or
        :data:`~styx_py.core.limits.WORKER_LINK_RETRY_S` after the last time if that was sooner. For a
        reply that came through the log only while every connection was up (module docstring)."""
        self._ask_now.set()

    async def run(self, group: asyncio.TaskGroup | None = None) -> None:
        """Keep one subscription per worker until cancelled; each one a task of ``group`` (the client's),
        or of a group of its own."""
        if group is None:
            async with asyncio.TaskGroup() as own:
                await self.run(own)
            return
        self._group = group
        clock = self.clock
        asked = -WORKER_LIST_REFRESH_S
        if self.known:
            self._follow(self.known)
            asked = clock()
        try:
            while True:
                # A subscription ends when its connection fails or drops (an unexpected error fails
                # the group instead): ask for the addresses again.
                down = [a for a, t in self.links.items() if t.done()]
                for address in down:
                    del self.links[address]
                now = clock()
                if down or not self.links or now - asked >= WORKER_LIST_REFRESH_S or self._ask_now.is_set():
                    asked = now
                    self._ask_now.clear()
                    await self._ask_workers()
                # The retry wait, cut short by ask_soon(), but never less than it since the last ask.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WORKER_LINK_RETRY_S):
                        await self._ask_now.wait()
                if self._ask_now.is_set():
                    await asyncio.sleep(max(0.0, asked + WORKER_LINK_RETRY_S - clock()))
        finally:
            for task in self.links.values():
                task.cancel()
            self.links.clear()

    async def _ask_workers(self) -> None:
        self.asked += 1
        try:
            workers = worker_partitions(await self.status())
        except (StyxError, OSError, TimeoutError) as exc:
            log.debug("%s: cannot ask for the worker addresses: %r", self.name, exc)
            return
        self._own(workers)
        self._follow(set(workers))

    def _own(self, workers: Mapping[str, list[int]]) -> None:
        self.owners = {p: address for address, partitions in workers.items() for p in partitions}

    def push_request(
        self, partition: int, segment: int, offset: int, ts_ms: int, key: bytes | None, value: bytes
    ) -> None:
        """The broker acknowledged this request at ``offset``: push it to the worker reading its
        partition, with the others of this event-loop tick, unless the client sends too many a second
        (:mod:`styx_client.sdk.outbox`)."""
        outbox = self.outbox
        if not outbox.rate.push(self.clock()):
            outbox.too_fast += 1
            return
        address = self.owners.get(partition)
        if address is None or address not in self.subscriptions.subscribed:
            outbox.not_pushed += 1
            return
        outbox.add(address, PushedRequest(segment, partition, offset, ts_ms, key, value))

    def _follow(self, addresses: set[str]) -> None:
        """One subscription per address in ``addresses``, and none to a worker that left."""
        for address in self.links.keys() - addresses:
            self.links.pop(address).cancel()  # a worker that left
        assert self._group is not None, "links followed before run()"
        for address in addresses - self.links.keys():
            self.links[address] = self._group.create_task(
                self._subscribe(address), name=f"{self.name}-{address}"
            )

    async def _subscribe(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        writer: asyncio.StreamWriter | None = None
        subscriptions = self.subscriptions
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await open_connection(host or "127.0.0.1", int(port), self.tls)
                await dial_handshake(reader, writer, self.key, self.name, self.name)
            writer.write(encode_frame(Batch(self.name, [SubscribeReplies(self.marks is not None)])))
            subscriptions.up(address, writer)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_keepalive(writer, encode_frame(Batch(self.name, []))))
                tg.create_task(self._read(reader, address))
        except* (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError, ValueError) as group:
            exc = group.exceptions[0]
            level = subscriptions.failure_level(address)
            log.log(level, "%s: no replies pushed from %s (%r); egress has them", self.name, address, exc)
        finally:
            subscriptions.down(address, writer)
            if writer is not None:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def _read(self, reader: asyncio.StreamReader, address: str) -> None:
        deliver, marks = self.deliver, self.marks
        while True:
            header = await reader.readexactly(HEADER_BYTES)
            payload = await reader.readexactly(frame_length(header))
            for msg in decode_batch(payload, "admin").msgs:
                if isinstance(msg, PushedReply):
                    deliver(msg.reply)
                elif isinstance(msg, EgressAcked):
                    if marks is not None:
                        marks(msg.ends)
                elif isinstance(msg, SubscribeRefused):
                    self.subscriptions.refuse(address)
                    log.info(
                        "%s: %s pushes to %d clients already and refused this one; its replies come "
                        "from the egress topic",
                        self.name,
                        address,
                        msg.limit,
                    )


async def _keepalive(writer: asyncio.StreamWriter, frame: bytes) -> None:
    while True:
        await asyncio.sleep(WORKER_LINK_KEEPALIVE_S)
        writer.write(frame)
        await writer.drain()
