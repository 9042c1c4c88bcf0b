"""Replies pushed by the workers, requests pushed to them (:mod:`styx_py.core.wire.push`): the paths
without a broker hop.

A client made by :meth:`StyxClient.connect <styx_client.sdk.StyxClient.connect>` knows its
coordinator, whose status lists every worker's address. :class:`WorkerLinks` dials each worker's
port as ``name`` (the client's ``reply_to``, which every request it sends names), proves the cluster
secret and subscribes; each worker then sends it the reply to each of its requests as the reply
leaves for the egress topic, which saves the reply its trip through the broker (a produce, then a
fetch that Tansu answers after up to half its wait).

Nothing depends on it: the client reads the egress topic as before (waiting longer per fetch while
every worker pushes, :data:`PUSHED_FETCH_WAIT_MS`) and takes whichever copy of a reply comes first
(:meth:`PendingTable.resolve <styx_client.sdk.pending.PendingTable.resolve>` counts the later
one as an echo). A worker that cannot be reached, a connection that drops, a worker that
restarts elsewhere: the replies keep coming through the egress topic while the addresses are asked
again (every :data:`RETRY_S` while a connection is down, every :data:`REFRESH_S` otherwise, so a worker
that joins is found too). A reply that came through the log only, while every connection was up, asks
again at once (:meth:`WorkerLinks.ask_soon`, at most every :data:`RETRY_S`): its request's partition
may belong to a worker that joined since the last look, which does not push to this client yet. A
worker that pushes to as many clients as it takes answers ``SubscribeRefused``: the client then reads
that worker's replies from the egress topic at the cluster's fetch wait, and keeps the connection open
without asking again.

The same connections carry the client's requests the other way (:meth:`WorkerLinks.push_request`):
once the broker acknowledged a request, it goes, with its offset, to the worker that reads its ingress
partition (the coordinator's status names each worker's partitions), which can sequence it without
waiting for its fetch. Only while the client sends fewer than :data:`PUSH_BELOW_RATE` requests a
second (:data:`PUSH_AGAIN_BELOW` once it stopped): a push saves a fetch that Tansu answers after up to
half its wait, which is most of a request's latency at low rates, and costs a write on the client and
a wake-up on the worker, which at higher rates cost more latency than the fetch did
(benchmarks/results/issue15-pushreq.md, issue15-hops.md). That worker's ingress
fetch still reads every request, and is the path for every request the push misses (no subscription
to the worker yet, a placement that changed since the status was read, a connection with
:data:`MAX_PUSH_BUFFER` bytes not yet written).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from styx_client.sdk.deployment import worker_partitions
from styx_py.core.errors import ProtocolError, StyxError
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
    encode_frames,
    frame_length,
)
from styx_py.io.handshake import client_secret, dial_handshake

__all__ = [
    "MAX_PUSH_BUFFER",
    "PUSHED_FETCH_WAIT_MS",
    "PUSH_AGAIN_BELOW",
    "PUSH_BELOW_RATE",
    "REFRESH_S",
    "RETRY_S",
    "WorkerLinks",
    "worker_addresses",
    "worker_partitions",
]

log = logging.getLogger("styx.client")

RETRY_S = 1.0
"""How long a connection that failed or dropped waits before its worker's address is asked again."""
REFRESH_S = 10.0
"""How often the worker addresses are asked again while every connection is up."""
PUSHED_FETCH_WAIT_MS = 25
"""The egress consumer's fetch wait while every worker pushes: the log then only confirms, and an idle
consumer polling Tansu every 5 ms cost the client ~7 % and the broker ~2 % of a core at 500/s
(benchmarks/results/issue15-push.md). A reply that is not pushed (a worker that refused the
subscription, a copy written by a worker not subscribed to yet) waits for it: Tansu answers a waiting
fetch after up to half of it."""
KEEPALIVE_S = 1.0
"""An empty frame this often, so the worker does not close the connection as idle (its idle timeout
is at least 1 s; a keepalive of its own arrives every third of it)."""
MAX_PUSH_BUFFER = 1 << 20
"""Bytes a worker's connection may hold unwritten before requests are no longer pushed on it (its
worker fetches them anyway): a slow worker never makes the client buffer without bound."""
PUSH_BELOW_RATE = 2_500
"""Requests a second (acknowledged, measured over :data:`RATE_WINDOW_S`) below which they are pushed
(benchmarks/results/issue15-hops.md: at 2 000/s a push saved 3-4 ms of p50, at 3 000/s nothing, at
4 000/s it cost 2-3 ms)."""
PUSH_AGAIN_BELOW = 2_000
"""Requests a second below which a client that stopped pushing pushes again."""
RATE_WINDOW_S = 0.25


def worker_addresses(status: Mapping[str, Any]) -> set[str]:
    """The ``host:port`` of every worker in a coordinator's status body."""
    return set(worker_partitions(status))


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
        self.name = name  # the node id the connections prove, named by the requests' reply_to
        self.deliver = deliver
        self.timeout_s = timeout_s
        self.links: dict[str, asyncio.Task[None]] = {}
        self.subscribed: set[str] = set()  # addresses whose worker took the subscription
        # Addresses whose worker refused it (SubscribeRefused: it pushes to as many clients as it
        # takes). The connection stays open and idle, so the client does not ask again and again;
        # a new connection (the worker restarted) asks again.
        self.refused: set[str] = set()
        self._reported: set[str] = set()  # addresses whose failure was logged at INFO already
        self.writers: dict[str, asyncio.StreamWriter] = {}  # subscribed connections
        self.outbox: dict[str, list[PushedRequest]] = {}  # requests to push at the end of this tick
        self.requests_pushed = 0
        self.requests_not_pushed = 0  # acknowledged with no subscribed owner, or its connection full
        self.requests_too_fast = 0  # acknowledged while the client sent PUSH_BELOW_RATE a second or more
        self.clock: Callable[[], float] = time.monotonic
        self.asked = 0  # times the addresses were asked for
        self._ask_now = asyncio.Event()  # ask_soon() was called since the last look
        # The rate of acknowledged requests: the window being counted, and whether to push during it.
        self._window_start = -float("inf")
        self._window_count = 0
        self._pushing = True
        self._group: asyncio.TaskGroup | None = None  # where the subscriptions run (run())

    @property
    def healthy(self) -> bool:
        """Subscribed on every worker known."""
        return bool(self.links) and len(self.subscribed) == len(self.links)

    def egress_wait_floor_ms(self) -> int:
        """The least fetch wait the egress reader needs now (:data:`PUSHED_FETCH_WAIT_MS` while
        :attr:`healthy`, else none)."""
        return PUSHED_FETCH_WAIT_MS if self.healthy else 0

    def ask_soon(self) -> None:
        """Ask the coordinator for the workers again without waiting for :data:`REFRESH_S`: at once, or
        :data:`RETRY_S` after the last time if that was sooner. For a reply that came through the log
        only while every connection was up (module docstring)."""
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
        asked = -REFRESH_S
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
                if down or not self.links or now - asked >= REFRESH_S or self._ask_now.is_set():
                    asked = now
                    self._ask_now.clear()
                    await self._ask_workers()
                # RETRY_S, cut short by ask_soon(), but never less than RETRY_S since the last ask.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_S):
                        await self._ask_now.wait()
                if self._ask_now.is_set():
                    await asyncio.sleep(max(0.0, asked + RETRY_S - clock()))
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
        (module docstring)."""
        now = self.clock()
        elapsed = now - self._window_start
        if elapsed >= RATE_WINDOW_S:
            # Stopped at PUSH_BELOW_RATE, going on again below PUSH_AGAIN_BELOW: a client sending at
            # about the threshold does not switch every window.
            limit = PUSH_BELOW_RATE if self._pushing else PUSH_AGAIN_BELOW
            self._pushing = self._window_count < limit * elapsed
            self._window_start, self._window_count = now, 0
        self._window_count += 1
        if not self._pushing:
            self.requests_too_fast += 1
            return
        address = self.owners.get(partition)
        if address is None or address not in self.subscribed:
            self.requests_not_pushed += 1
            return
        out = self.outbox.get(address)
        if out is None:
            if not self.outbox:
                asyncio.get_running_loop().call_soon(self._write_requests)
            out = self.outbox[address] = []
        out.append(PushedRequest(segment, partition, offset, ts_ms, key, value))

    def _write_requests(self) -> None:
        outbox, self.outbox = self.outbox, {}
        for address, requests in outbox.items():
            writer = self.writers.get(address)
            if (
                writer is None
                or writer.is_closing()
                or writer.transport.get_write_buffer_size() > MAX_PUSH_BUFFER
            ):
                self.requests_not_pushed += len(requests)
                continue
            writer.writelines(encode_frames(self.name, requests))
            self.requests_pushed += len(requests)

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
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_connection(host or "127.0.0.1", int(port))
                await dial_handshake(reader, writer, self.key, self.name, self.name)
            writer.write(encode_frame(Batch(self.name, [SubscribeReplies(self.marks is not None)])))
            self.subscribed.add(address)
            self.writers[address] = writer
            self.refused.discard(address)
            self._reported.discard(address)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_keepalive(writer, encode_frame(Batch(self.name, []))))
                tg.create_task(self._read(reader, address))
        except* (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError, ValueError) as group:
            exc = group.exceptions[0]
            level = logging.DEBUG if address in self._reported else logging.INFO
            self._reported.add(address)
            log.log(level, "%s: no replies pushed from %s (%r); egress has them", self.name, address, exc)
        finally:
            self.subscribed.discard(address)
            if writer is not None:
                if self.writers.get(address) is writer:
                    del self.writers[address]
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
                    self.subscribed.discard(address)
                    self.refused.add(address)
                    log.info(
                        "%s: %s pushes to %d clients already and refused this one; its replies come "
                        "from the egress topic",
                        self.name,
                        address,
                        msg.limit,
                    )


async def _keepalive(writer: asyncio.StreamWriter, frame: bytes) -> None:
    while True:
        await asyncio.sleep(KEEPALIVE_S)
        writer.write(frame)
        await writer.drain()
