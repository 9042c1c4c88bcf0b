"""The in-memory network with a latency model: hops that take virtual time, and a CPU per process.

:class:`MemoryNetwork` delivers on event-loop hops, in no virtual time. :class:`TimedNetwork` gives
every message a one-way delay drawn (seeded) from ``hop_us``, keeps each channel FIFO, and delays a
sequencer-log append by ``log_hops`` such hops (a produce and its acknowledgement). With the CPU part
of the :class:`LatencyModel` on, each process is one core that does one thing at a time: handling a
message costs it ``recv_cpu_us``, sending one ``send_cpu_us``, and each transaction of a batch it
logs ``txn_cpu_us`` (charged when the batch's log entry is written, before its roots run). A message
that reaches a busy process waits for it; what a busy process sends leaves once its CPU is free. The
code itself still runs in no virtual time: only these charges stand for its cost.

It counts what crosses it, per message type: messages and the bytes of the one-message frame each
would be on TCP, in all and per epoch (the messages that carry an epoch), when the first of each
(type, epoch) was sent and the last handled, and the CPU charged to each node. A run is a pure
function of its seed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter, defaultdict, deque
from collections.abc import Callable

from styx_py.core.wire import COORDINATOR, Message, Run, SeqLogEntry
from styx_py.testing.memory import MemoryLog, MemoryNetwork, MemorySeqLog
from styx_py.testing.topology import REPORTS, ReportRoutes

__all__ = ["LatencyModel", "TimedNetwork", "TimedSeqLog"]

US = 1e-6  # the virtual clock's resolution (looptime's default): every delay is whole microseconds


@dataclasses.dataclass(frozen=True)
class LatencyModel:
    """A datacenter network, and optionally what handling a message and a transaction costs."""

    hop_us: tuple[int, int] = (100, 500)  # one-way delay of a message, uniform in [lo, hi]
    log_hops: int = 2  # a sequencer-log append is durable this many hops later (produce + ack)
    recv_cpu_us: int = 0  # CPU per message handled
    send_cpu_us: int = 0  # CPU per message sent
    txn_cpu_us: int = 0  # CPU per transaction of a batch
    bundled_cpu_us: int = 0  # CPU per report a bundle carries beyond its first (topology)

    def __post_init__(self) -> None:
        lo, hi = self.hop_us
        assert 0 <= lo <= hi, f"hop_us must be 0 <= lo <= hi, not {self.hop_us}"
        costs = (self.recv_cpu_us, self.send_cpu_us, self.txn_cpu_us, self.bundled_cpu_us)
        assert min(self.log_hops, *costs) >= 0


@dataclasses.dataclass
class Packet:
    """What crosses one channel: one message, or a bundle of reports (topology); on arrival each of
    ``items`` (its sender, the message) goes to the receiver's handler, then ``then`` runs."""

    kind: str
    epoch: int | None
    items: list[tuple[str, Message]]
    then: Callable[[], None] | None = None
    carried: int = 1  # the reports it carries (a bundle's)


class TimedNetwork(MemoryNetwork):
    """``SimCluster(..., network=TimedNetwork(seed, model))``. Faults are not injected here.

    ``topology``: how the workers' reports travel (:mod:`styx_py.testing.topology`): ``all-to-all``
    as the workers send them, or ``relay`` / ``tree`` emulated under them.
    """

    def __init__(self, seed: int, model: LatencyModel, *, topology: str = "all-to-all") -> None:
        super().__init__(seed)
        self.model = model
        self.routes = None if topology == "all-to-all" else ReportRoutes(self, topology)
        self.delay_rng = random.Random(seed + 2)
        self.busy_until: defaultdict[str, float] = defaultdict(float)  # its CPU is taken until (virtual s)
        self.cpu_us: Counter[str] = Counter()  # the CPU each node was charged, in all
        self.epoch_cpu_us: dict[int, Counter[str]] = {}  # by node, for what carries an epoch
        self.arrives: dict[tuple[str, str], float] = {}  # the last arrival on each channel (FIFO)
        self.packets: dict[tuple[str, str], deque[Packet]] = {}
        self.ready: dict[str, deque[tuple[str, Packet]]] = {}  # arrived, waiting for the node's CPU
        self.running: set[str] = set()  # nodes whose ready queue is being worked off
        self.messages: Counter[str] = Counter()  # by message type
        self.bytes: Counter[str] = Counter()
        self.epoch_messages: dict[int, Counter[str]] = {}
        self.epoch_bytes: dict[int, Counter[str]] = {}
        self.first_sent: dict[tuple[str, int], float] = {}
        self.last_handled: dict[tuple[str, int], float] = {}

    def seqlog(self, log: MemoryLog, topic: str, ack_lag: int, node: str) -> MemorySeqLog:
        return TimedSeqLog(log, topic, self, node)

    def unregister(self, node_id: str, *, drained: bool = False) -> None:
        super().unregister(node_id, drained=drained)
        for (src, dest), q in self.packets.items():
            if dest == node_id or (src == node_id and not drained):
                q.clear()

    def hop_s(self) -> float:
        lo, hi = self.model.hop_us
        return self.delay_rng.randint(lo, hi) * US

    def charge(self, node: str, cpu_us: int, epoch: object = None) -> float:
        """Take ``cpu_us`` of ``node``'s CPU, after what it is busy with; when it is free again."""
        now = asyncio.get_running_loop().time()
        self.cpu_us[node] += cpu_us
        if isinstance(epoch, int):
            self.epoch_cpu_us.setdefault(epoch, Counter())[node] += cpu_us
        self.busy_until[node] = free = max(now, self.busy_until[node]) + cpu_us * US
        return free

    def send(self, src: str, dest: str, msg: Message) -> None:
        msg, size = self.through_wire(src, dest, msg)
        self.sent += 1
        epoch = getattr(msg, "epoch", None)
        epoch = epoch if isinstance(epoch, int) else None
        if self.routes is not None and isinstance(msg, REPORTS) and src != COORDINATOR:
            self.routes.send(src, dest, msg, size)
            return
        self.transmit(src, dest, type(msg).__name__, epoch, [(src, msg)], size)

    def transmit(
        self,
        src: str,
        dest: str,
        kind: str,
        epoch: int | None,
        items: list[tuple[str, Message]],
        size: int,
        then: Callable[[], None] | None = None,
        carried: int = 1,
    ) -> None:
        """Count a packet and put it on its way: it leaves once ``src``'s CPU sent it, a hop later it
        arrives (after what was sent on the channel before it)."""
        self.messages[kind] += 1
        self.bytes[kind] += size
        loop = asyncio.get_running_loop()
        if epoch is not None:
            self.epoch_messages.setdefault(epoch, Counter())[kind] += 1
            self.epoch_bytes.setdefault(epoch, Counter())[kind] += size
            self.first_sent.setdefault((kind, epoch), loop.time())
        leaves = self.charge(src, self.model.send_cpu_us, epoch)
        ch = (src, dest)
        arrives = max(leaves + self.hop_s(), self.arrives.get(ch, 0.0))
        self.arrives[ch] = arrives
        self.packets.setdefault(ch, deque()).append(Packet(kind, epoch, items, then, carried))
        loop.call_at(arrives, self._arrive, ch)

    def deliver(self, node: str, src: str, msg: Message) -> None:
        """Hand ``msg`` to ``node``'s handler (its CPU was charged for the packet that carried it)."""
        handler = self.handlers.get(node)
        if handler is None:
            return
        epoch = getattr(msg, "epoch", None)
        if isinstance(epoch, int):
            self.last_handled[type(msg).__name__, epoch] = self.busy_until[node]
        self.handle(handler, src, msg)

    def _arrive(self, ch: tuple[str, str]) -> None:
        q = self.packets.get(ch)
        if not q:
            return  # the receiver crashed (or the sender did) after the send: lost
        packet = q.popleft()
        self.delivered += 1
        node = ch[1]
        self.ready.setdefault(node, deque()).append((ch[0], packet))
        if node not in self.running:
            self.running.add(node)
            self._work(node)

    def _work(self, node: str) -> None:
        """Handle the next packet that waits for ``node``'s CPU, once it is free."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.busy_until[node] > now:
            loop.call_at(self.busy_until[node], self._work, node)
            return
        queue = self.ready[node]
        if not queue:
            self.running.discard(node)
            return
        _, packet = queue.popleft()
        cost = self.model.recv_cpu_us + self.model.bundled_cpu_us * (packet.carried - 1)
        done = self.charge(node, cost, packet.epoch)  # first: what it sends leaves after
        loop.call_at(done, self._work, node)
        for src, msg in packet.items:
            self.deliver(node, src, msg)
        if packet.then is not None and node in self.handlers:
            packet.then()


class TimedSeqLog(MemorySeqLog):
    """The sequencer log on a broker ``log_hops`` hops away; writing a batch's entry charges its
    transactions to the worker's CPU."""

    def __init__(self, log: MemoryLog, topic: str, network: TimedNetwork, node: str) -> None:
        super().__init__(log, topic)
        self.network = network
        self.node = node

    def append(self, entry: SeqLogEntry) -> asyncio.Future[None]:
        net = self.network
        txns = sum(isinstance(e, Run) for e in entry.entries)
        net.charge(self.node, txns * net.model.txn_cpu_us, entry.epoch)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        delay = sum(net.hop_s() for _ in range(net.model.log_hops))
        loop.call_later(delay, self._durable, entry, fut)
        return fut

    def _durable(self, entry: SeqLogEntry, fut: asyncio.Future[None]) -> None:
        if self.dead:
            return  # the process died before its produce was acknowledged: the entry is lost
        self.log.append(self.topic, 0, entry)
        if not fut.done():
            fut.set_result(None)
