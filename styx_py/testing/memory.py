"""In-memory network and Kafka-like logs, good enough to run the whole cluster in one process.

Delivery is driven only by ``loop.call_soon`` (no timers), with a seeded random number of extra
hops per delivery: a run is a pure function of its seed, and different seeds interleave the
channels differently. Each channel (src → dest) stays FIFO, like a TCP connection. Messages go
through the real frame encoder and decoder, so everything sent must be valid on the wire.
"""

from __future__ import annotations

import asyncio
import builtins
import random
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

from styx_py.core.changelog import ChangeRecord, Position
from styx_py.core.requests import read_request
from styx_py.core.segments import Cursor, live, pack, replies_to, segment_topic, segments_in, to_read, unpack
from styx_py.core.wire import (
    COORDINATOR,
    Batch,
    Inbox,
    IngressRecord,
    Message,
    PushedRequest,
    Reply,
    Request,
    SeqLogEntry,
    decode_batch,
    encode_frame,
    request_encoder,
)

Handler = Callable[[str, Message], None]


class NetworkFaults:
    """What the network does wrong, as a test seeds it: actions at delivery numbers (a crash, a lost
    upload), lost and duplicated deliveries, isolated nodes; and how often each happened."""

    def __init__(self) -> None:
        self.points: list[tuple[int, Callable[[], None]]] = []  # (after n deliveries, action), sorted
        self.drops: set[int] = set()  # delivery numbers whose message is lost
        self.drop_types: set[type] = set()  # the next message of each of these types is lost
        self.duplicates: set[int] = set()  # delivery numbers whose message arrives twice
        self.isolated: set[str] = set()  # nodes cut off: whatever they send or are sent is lost
        self.duplicated = 0
        self.dropped = 0
        self.cut = 0  # messages lost to isolation

    def at(self, delivered: int, action: Callable[[], None]) -> None:
        """Run ``action`` right after the ``delivered``-th message delivery (seeded fault points)."""
        self.points.append((delivered, action))
        self.points.sort(key=lambda f: f[0])

    def duplicate(self, n: int) -> bool:
        """Whether the ``n``-th delivery arrives twice."""
        if n in self.duplicates:
            self.duplicated += 1
            return True
        return False

    def lost(self, n: int, ch: tuple[str, str], msg: Message) -> bool:
        """Whether the ``n``-th delivery, ``msg`` on channel ``ch``, is lost."""
        if ch[0] in self.isolated or ch[1] in self.isolated:
            self.cut += 1
            return True  # a network partition: the process runs on, nobody hears it
        if n in self.drops or type(msg) in self.drop_types:
            self.drop_types.discard(type(msg))
            self.dropped += 1
            return True  # lost: only the epoch watchdog can notice
        return False

    def fire(self, delivered: int) -> None:
        """Run the next fault point if ``delivered`` deliveries reached it."""
        if self.points and delivered >= self.points[0][0]:
            _, fault = self.points.pop(0)
            fault()


class MemoryNetwork:
    def __init__(self, seed: int = 0, max_hops: int = 3, serialize: bool = True) -> None:
        self.rng = random.Random(seed)
        # Channels to or from a client (inbox "admin") draw from their own generator, so clients that
        # come and go do not change how the cluster's own messages interleave.
        self.client_rng = random.Random(seed + 1)
        self.max_hops = max_hops
        self.serialize = serialize
        self.handlers: dict[str, Handler] = {}
        self.inboxes: dict[str, Inbox] = {}  # the channel each node receives (decoded as such)
        self.channels: dict[tuple[str, str], deque[Message]] = {}
        self.scheduled: set[tuple[str, str]] = set()
        self.sent = 0
        self.delivered = 0
        self.errors: list[BaseException] = []
        self.on_error: Callable[[], None] | None = None
        self.faults = NetworkFaults()
        # Registrations per node: a new process under the same id (a restart) is a new connection to
        # whoever talks to it, as a TCP peer's restart is (client push links resubscribe).
        self.incarnations: Counter[str] = Counter()

    def endpoint(self, node_id: str) -> MemoryTransport:
        return MemoryTransport(self, node_id)

    def register(self, node_id: str, handler: Handler, inbox: Inbox | None = None) -> None:
        self.handlers[node_id] = handler
        self.incarnations[node_id] += 1
        self.inboxes[node_id] = inbox or ("coordinator" if node_id == COORDINATOR else "worker")

    def unregister(self, node_id: str, *, drained: bool = False) -> None:
        """A crash: the node hears nothing more and what it had sent but not delivered is lost.
        ``drained``: a clean exit, which sends what it had sent first (the process drains its transport)."""
        self.handlers.pop(node_id, None)
        for (src, dest), q in self.channels.items():
            if dest == node_id or (src == node_id and not drained):
                q.clear()

    def send(self, src: str, dest: str, msg: Message) -> None:
        if self.serialize:
            msg, _ = self.through_wire(src, dest, msg)
        self.sent += 1
        ch = (src, dest)
        q = self.channels.get(ch)
        if q is None:
            q = self.channels[ch] = deque()
        q.append(msg)
        if ch not in self.scheduled:
            self.scheduled.add(ch)
            self._schedule(ch)

    def through_wire(self, src: str, dest: str, msg: Message) -> tuple[Message, int]:
        """``msg`` as the receiver's channel decodes it from a frame of its own, and that frame's size."""
        frame = encode_frame(Batch(src, [msg]))
        inbox = self.inboxes.get(dest) or ("coordinator" if dest == COORDINATOR else "worker")
        return decode_batch(frame[4:], inbox).msgs[0], len(frame)

    def handle(self, handler: Handler, src: str, msg: Message) -> None:
        """Hand ``msg`` to its receiver's handler; a failure there is a bug, never background noise."""
        try:
            handler(src, msg)
        except BaseException as exc:
            # Surfaced by SimCluster.wait.
            self.errors.append(exc)
            if self.on_error is not None:
                self.on_error()
            raise

    def seqlog(self, log: MemoryLog, topic: str, ack_lag: int, node: str) -> MemorySeqLog:
        """The sequencer log as ``node``'s producer sees it (a network with a latency model times it)."""
        return MemorySeqLog(log, topic, ack_lag)

    def _rng(self, ch: tuple[str, str]) -> random.Random:
        inboxes = self.inboxes
        return self.client_rng if "admin" in (inboxes.get(ch[0]), inboxes.get(ch[1])) else self.rng

    def _schedule(self, ch: tuple[str, str]) -> None:
        asyncio.get_running_loop().call_soon(self._hop, ch, self._rng(ch).randint(0, self.max_hops))

    def _hop(self, ch: tuple[str, str], hops: int) -> None:
        if hops > 0:
            asyncio.get_running_loop().call_soon(self._hop, ch, hops - 1)
            return
        q = self.channels[ch]
        handler = self.handlers.get(ch[1])
        faults = self.faults
        for _ in range(self._rng(ch).randint(1, len(q)) if q else 0):
            if not q:
                break  # a fault injected by the previous delivery cleared the channel
            msg = q.popleft()
            self.delivered += 1
            if faults.duplicate(self.delivered):
                q.append(msg)  # delivered again later (after whatever is queued behind it)
            if faults.lost(self.delivered, ch, msg):
                continue
            if handler is not None:
                self.handle(handler, ch[0], msg)
            faults.fire(self.delivered)
        if q:
            self._schedule(ch)
        else:
            self.scheduled.discard(ch)


class MemoryTransport:
    def __init__(self, network: MemoryNetwork, node_id: str) -> None:
        self.network = network
        self.node_id = node_id
        self.dead = False  # set when its process "crashed": a killed process sends nothing more

    def send(self, dest: str, msg: Message) -> None:
        if not self.dead:
            self.network.send(self.node_id, dest, msg)


class MemoryLog:
    """Topics of partitions of records; listeners hear appends (like a consumer's fetch)."""

    def __init__(self) -> None:
        self.topics: dict[str, list[list[Any]]] = {}
        self.listeners: dict[tuple[str, int], list[Callable[[], None]]] = {}
        self.sent_epochs: dict[tuple[str, int], list[int]] = {}  # egress: the epoch header per record

    def create(self, topic: str, partitions: int) -> None:
        parts = self.topics.setdefault(topic, [])
        while len(parts) < partitions:
            parts.append([])

    def append(self, topic: str, partition: int, value: Any) -> int:
        part = self.topics[topic][partition]
        part.append(value)
        for listener in self.listeners.get((topic, partition), ()):
            listener()
        return len(part) - 1

    def records(self, topic: str) -> list[Any]:
        return [r for part in self.topics.get(topic, []) for r in part]


class MemoryIngress:
    """A worker's ingress partitions in the in-memory log, in every segment it reads (core.segments)."""

    def __init__(self, log: MemoryLog, topic: str) -> None:
        self.log = log
        self.topic = topic
        self.partitions: list[int] = []
        self.live_segments = [0]
        self._pos: dict[tuple[int, int], int] = {}  # (segment, partition) -> next offset
        self.listener: Callable[[], None] | None = None
        self.skipped = 0  # records without a usable request id

    def set_listener(self, on_available: Callable[[], None]) -> None:
        self.listener = on_available

    def _notify(self) -> None:
        if self.listener is not None:
            self.listener()

    def _read(self, sources: dict[tuple[int, int], int]) -> None:
        for s, p in set(self._pos) - set(sources):
            del self._pos[s, p]
            self.log.listeners[(segment_topic(self.topic, s), p)].remove(self._notify)
        for (s, p), offset in sources.items():
            if (s, p) not in self._pos:
                self.log.listeners.setdefault((segment_topic(self.topic, s), p), []).append(self._notify)
            self._pos[s, p] = offset

    def assign(self, partitions: list[int]) -> None:
        """Read exactly ``partitions`` (a partition that moved away is dropped, as on Kafka)."""
        self.partitions = list(partitions)
        sources = {(s, p): self._pos.get((s, p), 0) for s in self.live_segments for p in partitions}
        draining = {src: pos for src, pos in self._draining(self._pos).items() if src[1] in partitions}
        self._read({**sources, **draining})

    def live(self, segment: int) -> None:
        """As ``KafkaIngress.live``: a segment that leaves the live ones is read until taken to its end."""
        wanted = live(segment)
        if wanted != self.live_segments and segment >= self.live_segments[-1]:
            # Those that leave the live ones, read or skipped.
            left = {(s, p): 0 for s in range(self.live_segments[0], wanted[0]) for p in self.partitions}
            self.live_segments = wanted
            sources = {(s, p): self._pos.get((s, p), 0) for s in wanted for p in self.partitions}
            self._read({**sources, **self._draining({**left, **self._pos})})

    def _draining(self, sources: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
        """Of ``sources``, those of segments no longer live with records not taken yet."""
        return {
            (s, p): pos
            for (s, p), pos in sources.items()
            if s not in self.live_segments and pos < len(self._part(s, p))
        }

    def _part(self, segment: int, p: int) -> list[Any]:
        parts = self.log.topics.get(segment_topic(self.topic, segment), [])
        return parts[p] if p < len(parts) else []

    def take(self, n: int) -> list[IngressRecord]:
        out: list[IngressRecord] = []
        progress = True
        while len(out) < n and progress:
            progress = False
            for s, p in sorted(self._pos):
                pos = self._pos[s, p]
                if pos < len(self._part(s, p)) and len(out) < n:
                    rec = self._record(s, p, pos)
                    if rec is not None:
                        out.append(rec)
                    self._pos[s, p] = pos + 1
                    progress = True
        if any(s not in self.live_segments for s, _ in self._pos):
            live_sources = {src: pos for src, pos in self._pos.items() if src[0] in self.live_segments}
            self._read({**live_sources, **self._draining(self._pos)})
        return out

    def _record(self, segment: int, p: int, offset: int) -> IngressRecord | None:
        """The record as the worker's reader makes it (None: skipped, no request id to answer).

        A value on the ingress topic is a :class:`Request`, raw record bytes, or a ``(Kafka key,
        bytes)`` pair; all of them go through the bytes, as on Kafka."""
        value = self._part(segment, p)[offset]
        if isinstance(value, Request):
            value = (value.request_id.encode(), request_encoder.encode(value))
        key, data = (None, value) if isinstance(value, bytes) else value
        req = read_request(data, key)
        if isinstance(req, str):
            self.skipped += 1
            return None
        return IngressRecord(p, pack(segment, offset), req, req.ts_ms)

    def offer(self, pushed: PushedRequest) -> None:
        """A record a client pushed: the in-memory log has it already."""

    async def take_exact(self, partition: int, offset: int) -> IngressRecord:
        segment, at = unpack(offset)
        if (segment, partition) not in self._pos:  # a segment no longer read live (replay)
            self._read({**self._pos, (segment, partition): at})
        assert self._pos[segment, partition] == at, (partition, offset, self._pos[segment, partition])
        self._pos[segment, partition] = at + 1
        rec = self._record(segment, partition, at)
        assert rec is not None, f"replay of a skipped ingress record {partition}@{offset}"
        return rec

    def pending(self) -> int:
        return sum(len(self._part(s, p)) - pos for (s, p), pos in self._pos.items())

    def buffered(self) -> Iterator[IngressRecord]:
        for (s, p), pos in self._pos.items():
            for offset in range(pos, len(self._part(s, p))):
                rec = self._record(s, p, offset)
                if rec is not None:
                    yield rec

    def positions(self) -> dict[int, Cursor]:
        out: dict[int, Cursor] = {p: {} for p in self.partitions}
        for (s, p), pos in sorted(self._pos.items()):
            out.setdefault(p, {})[s] = pos
        return out

    def seek(self, positions: dict[int, Cursor]) -> None:
        sources = {src: pos for src, pos in self._pos.items() if src[1] not in positions}
        for p, cursor in positions.items():
            for s, offset in to_read(cursor, self.live_segments[-1]).items():
                sources[s, p] = offset
        self._read(sources)


class MemoryEgress:
    """Replies appended to the in-memory log, like a real producer's: with ``ack_lag`` > 0 a reply
    reaches the log (and the client) only ``ack_lag`` event-loop hops after ``send``, and those still
    in flight when the worker crashes (``lose_unacked``) are lost. A snapshot then records an egress
    position below replies of its own epochs, and a crash can lose replies the worker already sent."""

    def __init__(
        self,
        log: MemoryLog,
        topic: str,
        on_reply: Callable[[Reply], None] | None = None,
        ack_lag: int = 0,
        changelog: str = "",
    ) -> None:
        self.log = log
        self.topic = topic
        self.on_reply = on_reply
        self.ack_lag = ack_lag
        self.changelog = changelog  # the changelog topic ("": none)
        self.in_flight: Counter[int] = Counter()  # replies sent, not yet on the log, by sending epoch
        self.dead = False
        self.segment = 0  # the egress segment replies go to (core.segments.replies_to)
        self._flushes: list[asyncio.Future[None]] = []  # done when nothing is in flight

    def send(self, partition: int, reply: Reply, epoch: int, pushed: bool = False) -> None:
        if self.dead:
            return  # the process died: nothing it sends reaches the log
        if self.ack_lag == 0:
            self._append(partition, reply, epoch)
            return
        self.in_flight[epoch] += 1
        # Hops of call_soon keep the order of sends (the loop's ready queue is FIFO).
        topic = segment_topic(self.topic, self.segment)
        asyncio.get_running_loop().call_soon(self._hop, topic, partition, reply, epoch, self.ack_lag - 1)

    def changes(self, partition: int, records: list[ChangeRecord]) -> None:
        """Changelog records, in order, with the replies' lag (and lost with them on a crash)."""
        if self.dead or not self.changelog:
            return  # a worker given no changelog topic here writes none
        for r in records:
            if self.ack_lag == 0:
                self.log.append(self.changelog, partition, r)
                continue
            self.in_flight[-1] += 1  # counted apart from replies (by sending epoch) under epoch -1
            asyncio.get_running_loop().call_soon(self._change_hop, partition, r, self.ack_lag - 1)

    def _change_hop(self, partition: int, record: ChangeRecord, left: int) -> None:
        if self.dead:
            return
        if left > 0:
            asyncio.get_running_loop().call_soon(self._change_hop, partition, record, left - 1)
            return
        self.log.append(self.changelog, partition, record)
        self._landed(-1)

    def live(self, newest: int) -> None:
        self.segment = max(self.segment, replies_to(newest))
        self.log.create(segment_topic(self.topic, self.segment), len(self.log.topics[self.topic]))

    def _hop(self, topic: str, partition: int, reply: Reply, epoch: int, left: int) -> None:
        if self.dead:
            return
        if left > 0:
            asyncio.get_running_loop().call_soon(self._hop, topic, partition, reply, epoch, left - 1)
            return
        self._append(partition, reply, epoch, topic)
        self._landed(epoch)

    def _landed(self, epoch: int) -> None:
        self.in_flight[epoch] -= 1
        if not self.in_flight[epoch]:
            del self.in_flight[epoch]
        if not self.in_flight:
            for done in self._flushes:
                if not done.done():
                    done.set_result(None)
            self._flushes.clear()

    def _append(self, partition: int, reply: Reply, epoch: int, topic: str | None = None) -> None:
        topic = topic or segment_topic(self.topic, self.segment)
        self.log.sent_epochs.setdefault((topic, partition), []).append(epoch)
        self.log.append(topic, partition, reply)
        if self.on_reply is not None:
            self.on_reply(reply)

    def lose_unacked(self) -> None:
        """The process died: replies not yet acknowledged never reach the log."""
        self.dead = True

    def offsets(self) -> dict[int, int]:
        parts = self.log.topics[segment_topic(self.topic, self.segment)]
        return {p: pack(self.segment, len(part)) for p, part in enumerate(parts)}

    def reset_offsets(self, offsets: dict[int, int]) -> None:
        pass  # offsets are read off the log itself

    def flush(self) -> asyncio.Future[None]:
        """Done when nothing sent so far is in flight (never, once the process died)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.in_flight:
            self._flushes.append(done)
        else:
            done.set_result(None)
        return done


class MemoryLogReader:
    """Recovery's view of the logs: replies already sent and the sequencer log."""

    def __init__(
        self, log: MemoryLog, egress_topic: str, seqlog_topic: str, changelog_topic: str = ""
    ) -> None:
        self.log = log
        self.egress_topic = egress_topic
        self.seqlog_topic = seqlog_topic
        self.changelog_topic = changelog_topic

    async def replies_from(self, offsets: dict[int, int], after_epoch: int) -> list[Reply]:
        out: list[Reply] = []
        segments = segments_in(self.log.topics, self.egress_topic)
        for p, bound in sorted(offsets.items()):
            first, start = unpack(bound)
            for s in (s for s in segments if s >= first):
                topic = segment_topic(self.egress_topic, s)
                at = start if s == first else 0
                sent = self.log.sent_epochs.get((topic, p), [])
                part = self.log.topics[topic][p]
                out += [r for r, e in zip(part[at:], sent[at:], strict=True) if e > after_epoch]
        return out

    async def seqlog(self, from_offset: int) -> list[SeqLogEntry]:
        return list(self.log.topics[self.seqlog_topic][0][from_offset:])

    async def changelog_tail(self, partitions: list[int]) -> dict[int, Position]:
        parts = self.log.topics.get(self.changelog_topic, [])
        return {p: parts[p][-1].position for p in partitions if p < len(parts) and parts[p]}


class MemorySeqLog:
    """The sequencer log as a producer sees it: with ``ack_lag`` > 0 an entry reaches the log (and is
    acknowledged) only ``ack_lag`` event-loop hops after ``append``, and entries still in flight when
    the worker crashes (``lose_unacked``) never reach it. A worker that let the coordinator decide an
    epoch before its entry was durable would then leave a decided epoch that cannot be replayed."""

    def __init__(self, log: MemoryLog, topic: str, ack_lag: int = 0) -> None:
        self.log = log
        self.topic = topic
        self.ack_lag = ack_lag
        self.dead = False

    def acked(self) -> int:
        return len(self.log.topics[self.topic][0])

    def append(self, entry: SeqLogEntry) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.ack_lag == 0:
            self.log.append(self.topic, 0, entry)
            fut.set_result(None)
        else:
            asyncio.get_running_loop().call_soon(self._hop, entry, fut, self.ack_lag - 1)
        return fut

    def _hop(self, entry: SeqLogEntry, fut: asyncio.Future[None], left: int) -> None:
        if self.dead:
            return  # the process died before its produce was acknowledged: the entry is lost
        if left > 0:
            asyncio.get_running_loop().call_soon(self._hop, entry, fut, left - 1)
            return
        self.log.append(self.topic, 0, entry)
        if not fut.done():
            fut.set_result(None)

    def lose_unacked(self) -> None:
        self.dead = True


class MemoryBlobStore:
    """In-process store; ``fail(n, prefix)`` makes the next n uploads of keys starting with ``prefix``
    fail (torn snapshots, lost manifests, cluster state that cannot be saved)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail_next = 0
        self.fail_prefix = ""
        self.puts = 0

    def fail(self, n: int, prefix: str = "") -> None:
        self.fail_next, self.fail_prefix = n, prefix

    async def put(self, key: str, data: bytes) -> None:
        if self.fail_next > 0 and key.startswith(self.fail_prefix):
            self.fail_next -= 1
            raise OSError(f"injected upload failure for {key}")
        self.puts += 1
        self.objects[key] = bytes(data)

    async def get(self, key: str) -> bytes | None:
        return self.objects.get(key)

    async def list(self, prefix: str) -> builtins.list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    async def delete(self, keys: builtins.list[str]) -> None:
        for k in keys:
            self.objects.pop(k, None)
