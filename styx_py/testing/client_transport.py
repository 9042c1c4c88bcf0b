"""The in-memory client transport: the real :class:`~styx_client.sdk.StyxClient` on the simulation's log
and network (:mod:`styx_py.testing.memory`).

Records are appended to the in-memory ingress log and acknowledged a seeded number of event-loop hops
later, as a broker would; replies are read from the in-memory egress log through the same bytes a Kafka
consumer hands over; the newest segment is the newest topic in the log. With pushes, the client is a
node of the :class:`~styx_py.testing.memory.MemoryNetwork` (inbox ``admin``) that subscribes on every
worker, as on the workers' ports, and pushes each acknowledged request to the worker that reads its
partition, only while it sends few requests a second (:class:`~styx_client.sdk.outbox.PushRate`). A
worker that restarts (a new registration under its id) is a dropped connection: the client
subscribes again at its next look. A client that lets its egress reader rest (``rest_egress``) asks the
workers for their egress marks, and while :class:`~styx_client.sdk.resting.EgressRest` allows it, its
reader reads nothing and moves its positions over what the marks let it skip, as the Kafka reader
pauses and seeks its partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping

import msgspec

from styx_client.sdk.config import ClientConfig
from styx_client.sdk.entry import Pending
from styx_client.sdk.kafka import reply_partition_of
from styx_client.sdk.outbox import PushRate
from styx_client.sdk.resting import EgressRest
from styx_client.sdk.transport import Batching, Opened, TransportEvents
from styx_py.core.limits import EGRESS_REST_S, WORKER_LINK_RETRY_S
from styx_py.core.segments import reply_segments, segment_topic, segments_in
from styx_py.core.wire import (
    EgressAcked,
    Message,
    PushedReply,
    PushedRequest,
    SubscribeRefused,
    SubscribeReplies,
)
from styx_py.testing.memory import MemoryLog, MemoryNetwork

__all__ = ["MemoryTransport"]

MAX_HOPS = 3  # event-loop hops before a record is appended, and again before it is acknowledged


class MemoryTransport:
    """A :class:`~styx_client.sdk.transport.ClientTransport` over the in-memory log and network."""

    def __init__(
        self,
        log: MemoryLog,
        network: MemoryNetwork,
        seed: int,
        workers: Callable[[], Mapping[str, list[int]]],
        on_write: Callable[[str, int], None] | None = None,
    ) -> None:
        self.log = log
        self.network = network
        self.rng = random.Random(seed)
        self.workers = workers  # node id -> the ingress partitions it reads (the coordinator's placement)
        self.on_write = on_write  # (request id, segment) of every record appended, for the simulation
        self.config: ClientConfig | None = None
        self.events: TransportEvents | None = None
        self.read: list[int] = []  # the egress partitions read, in every segment read
        self.positions: dict[tuple[str, int], int] = {}  # egress topic and partition -> next offset
        self.draining: set[tuple[str, int]] = set()  # read to their end, then dropped
        self.woken = asyncio.Event()
        self.rest: EgressRest | None = None  # the client's, when its reader may rest
        self.links = _Links(network)
        self.acked = 0

    async def open(
        self,
        config: ClientConfig,
        operators: Mapping[str, int],
        events: TransportEvents,
        rest: EgressRest | None,
        reply_to: str,
    ) -> Opened:
        self.config, self.events, self.rest = config, events, rest
        egress = config.egress_topic
        chosen = reply_partition_of(config.client_id, config.reply_partition, len(self.log.topics[egress]))
        self.read = list(range(len(self.log.topics[egress]))) if chosen == -1 else [chosen]
        newest = max(segments_in(self.log.topics, config.ingress_topic), default=0)
        for tp in self._reply_partitions(newest):
            self._assign(tp, len(self.log.topics[tp[0]][tp[1]]))  # at the end: only newer replies
        if config.push.on:
            self.links.open(reply_to, events, marks=rest is not None)
        return Opened(chosen, newest)

    def start(self, group: asyncio.TaskGroup) -> None:
        assert self.config is not None
        group.create_task(self._read(), name=f"{self.config.client_id}-reader")
        if self.config.push.on:
            group.create_task(self.links.run(self.workers), name=f"{self.config.client_id}-pushed")

    # ---- the ingress log -------------------------------------------------------------------------------

    def produce(self, segment: int, partition: int, key: bytes, value: bytes, entry: Pending) -> int:
        assert self.config is not None
        topic = segment_topic(self.config.ingress_topic, segment)
        loop = asyncio.get_running_loop()
        loop.call_soon(
            self._append, self.rng.randint(0, MAX_HOPS), topic, partition, key, value, entry, segment
        )
        return self.wall_ms()

    def _append(
        self, hops: int, topic: str, partition: int, key: bytes, value: bytes, entry: Pending, segment: int
    ) -> None:
        loop = asyncio.get_running_loop()
        if hops > 0:
            loop.call_soon(self._append, hops - 1, topic, partition, key, value, entry, segment)
            return
        offset = self.log.append(topic, partition, (key, value))
        if self.on_write is not None:
            self.on_write(key.decode(), segment)
        loop.call_soon(self._ack, self.rng.randint(0, MAX_HOPS), entry, segment, offset)

    def _ack(self, hops: int, entry: Pending, segment: int, offset: int) -> None:
        if hops > 0:
            asyncio.get_running_loop().call_soon(self._ack, hops - 1, entry, segment, offset)
            return
        assert self.events is not None
        self.acked += 1
        self.events.acknowledged(entry, segment, offset)

    def push_request(self, entry: Pending, segment: int, offset: int) -> None:
        self.links.push(entry, segment, offset)

    @property
    def pushes_healthy(self) -> bool:
        return self.links.healthy

    def ask_workers_soon(self) -> None:
        self.links.ask.set()

    async def newest_segment(self, known: int) -> int | None:
        assert self.config is not None
        await asyncio.sleep(0)  # a request to the broker
        return max(known, *segments_in(self.log.topics, self.config.ingress_topic))

    def retire(self, keep: set[int]) -> None:
        pass  # nothing is kept per segment

    def wall_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000)  # virtual time: the same every run

    # ---- the egress log --------------------------------------------------------------------------------

    def _reply_partitions(self, newest: int) -> list[tuple[str, int]]:
        assert self.config is not None
        names = [segment_topic(self.config.egress_topic, s) for s in reply_segments(newest)]
        return [(t, p) for t in names if t in self.log.topics for p in self.read]

    def _assign(self, tp: tuple[str, int], at: int) -> None:
        self.positions[tp] = at
        self.log.listeners.setdefault(tp, []).append(self.woken.set)

    async def follow_egress(self, newest: int) -> bool:
        wanted = self._reply_partitions(newest)
        for tp in wanted:
            if tp not in self.positions:
                self._assign(tp, 0)
        self.draining = set(self.positions) - set(wanted)
        self.woken.set()
        return True

    async def _read(self) -> None:
        events = self.events
        assert events is not None
        encode = msgspec.msgpack.encode
        while True:
            self.woken.clear()
            if self.rest is not None and self._rest(self.rest):
                await asyncio.sleep(EGRESS_REST_S)
                continue
            for tp, at in list(self.positions.items()):
                part = self.log.topics[tp[0]][tp[1]]
                self.positions[tp] = len(part)
                for reply in part[at:]:
                    events.from_log(reply.request_id.encode(), encode(reply))
            for tp in self.draining:
                del self.positions[tp]
                self.log.listeners[tp].remove(self.woken.set)
            self.draining = set()
            await self.woken.wait()

    def _rest(self, rest: EgressRest) -> bool:
        """Rest (positions moved past what may be skipped) and say so, or read (False)."""
        now = asyncio.get_running_loop().time()
        rest.resting = rest.may_rest(self.links.healthy, not self.draining, now, self.wall_ms())
        if rest.resting:
            for tp, end in rest.skips(set(self.positions)).items():
                if end > self.positions[tp]:
                    rest.table.stats.egress_skipped += end - self.positions[tp]
                    self.positions[tp] = end
        return rest.resting

    @property
    def batching(self) -> Batching:
        return Batching(self.acked, self.acked, 0)

    @property
    def requests_pushed(self) -> int:
        return self.links.requests_pushed

    async def close(self) -> None:
        for tp in self.positions:
            with contextlib.suppress(ValueError):
                self.log.listeners[tp].remove(self.woken.set)
        self.positions.clear()
        self.links.close()


class _Links:
    """The client's node on the network: subscriptions to the workers' pushed replies, pushed requests."""

    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network
        self.name = ""
        self.events: TransportEvents | None = None
        self.marks = False
        self.subscribed: dict[str, int] = {}  # worker -> the incarnation subscribed to
        self.refused: set[str] = set()
        self.owners: dict[int, str] = {}  # ingress partition -> its worker
        self.ask = asyncio.Event()
        self.rate = PushRate()  # pushed only while the client sends few a second, as on the workers' ports
        self.requests_pushed = 0

    def open(self, name: str, events: TransportEvents, marks: bool) -> None:
        self.name, self.events, self.marks = name, events, marks
        self.network.register(name, self._on_message, inbox="admin")

    def close(self) -> None:
        if self.name:
            self.network.unregister(self.name)

    @property
    def healthy(self) -> bool:
        incarnations = self.network.incarnations
        return (
            bool(self.subscribed)
            and all(
                incarnations[w] == n and w in self.network.handlers and w not in self.refused
                for w, n in self.subscribed.items()
            )
            and set(self.owners.values()) <= set(self.subscribed)
        )

    async def run(self, workers: Callable[[], Mapping[str, list[int]]]) -> None:
        """Subscribe on every worker, again on one that restarted; look every WORKER_LINK_RETRY_S, or when
        asked."""
        while True:
            placement = workers()
            self.owners = {p: w for w, partitions in placement.items() for p in partitions}
            incarnations = self.network.incarnations
            for worker in sorted(placement):
                if self.subscribed.get(worker) != incarnations[worker] and worker in self.network.handlers:
                    self.subscribed[worker] = incarnations[worker]
                    self.refused.discard(worker)
                    self.network.send(self.name, worker, SubscribeReplies(self.marks))
            for gone in [w for w in self.subscribed if w not in placement]:
                del self.subscribed[gone]
            self.ask.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WORKER_LINK_RETRY_S):
                    await self.ask.wait()

    def push(self, entry: Pending, segment: int, offset: int) -> None:
        if not self.rate.push(asyncio.get_running_loop().time()):
            return
        worker = self.owners.get(entry.partition)
        if worker is None or worker not in self.subscribed or worker in self.refused:
            return
        pushed = PushedRequest(
            segment, entry.partition, offset, entry.stamp, entry.rid.encode(), entry.fingerprint
        )
        self.network.send(self.name, worker, pushed)
        self.requests_pushed += 1

    def _on_message(self, src: str, msg: Message) -> None:
        events = self.events
        assert events is not None
        if isinstance(msg, PushedReply):
            events.pushed(msg.reply)
        elif isinstance(msg, EgressAcked):
            events.marks(msg.ends)
        elif isinstance(msg, SubscribeRefused):
            self.refused.add(src)
