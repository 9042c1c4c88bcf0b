"""Replies leaving a worker: recorded, sent once, and given again to resent request ids (pure).

Every reply a transaction rooted here produces goes through :meth:`ReplyOut.send`: it is recorded in
the reply table (a resent request id is answered from it, see :mod:`styx_worker.dedup`), emitted to the
egress log (an :class:`~styx_worker.effects.Emit`, which the shell also pushes to a subscribed client),
and emitted for every copy of the request that arrived while it ran (``waiting``).

Where a reply goes: the egress partition its request names (``Request.reply_partition``, set by the
SDK so that a client reads only its own partition), else this epoch's *lane*: one of the partitions
this worker owns, taken in turn epoch by epoch (:meth:`ReplyOut.route`). So a worker writes all the
unrouted replies of an epoch as one batch, not one per partition they came from, and every egress
partition still has one producer, its owner (Tansu was seen to expose one producer's later batch
before another's earlier one). The broker's cost grows with the batches it stores per partition, not
with records (one record per batch costs Tansu ~4 times the CPU of five, and 3 times the latency:
benchmarks/results/broker-cost.md). A
resent request is answered on the partition *it* names, if any; the reply table stays keyed by
ingress partition.

After a recovery, replayed epochs produce their replies a second time. Those already on the egress
log (read back by recovery into ``on_log``) are not sent again; determinism makes the replayed reply
identical to the logged one. When it is not (a nondeterministic function), the replayed one is not
sent and ``on_diverged`` is told: the worker stops the cluster (:mod:`styx_worker.core`). Every worker
reads back every egress partition (any worker may have sent to any of them) and pairs logged and
replayed replies by request id and tid, whatever partition they are on: a reply with a given tid is
only ever sent by its transaction's root worker (this one, or the one whose partitions it took over);
a replay may send it to another partition than the first run did (the lane of the worker that replays
it), which the pairing does not mind.
"""

from __future__ import annotations

from collections.abc import Callable

from styx_py.core.limits import MAX_LOGGED_VALUE_CHARS
from styx_py.core.wire import UNDECODABLE, IngressRecord, Reply, ReplyStatus, Request, decode_value
from styx_worker.dedup import ReplyTable
from styx_worker.effects import Emit, Outbox
from styx_worker.txn import RootTxn

Diverged = Callable[[int, Reply, Reply], None]  # (epoch, the reply on the log, the replayed one)


def shown(reply: Reply) -> str:
    """A reply as a person reads it: its outcome and its result or error (clipped)."""
    if reply.status == ReplyStatus.COMMITTED:
        try:
            value = repr(decode_value(reply.result))
        except UNDECODABLE:
            value = "<undecodable>"
    else:
        value = repr(reply.error)
    return f"{reply.status!s} {value[:MAX_LOGGED_VALUE_CHARS]} (tid {reply.tid})"


class ReplyOut:
    __slots__ = (
        "answered",
        "egress_partitions",
        "held",
        "lanes",
        "on_diverged",
        "on_log",
        "out",
        "stopped",
        "waiting",
    )

    def __init__(self, out: Outbox, replies_per_partition: int, on_diverged: Diverged) -> None:
        self.out = out
        self.on_diverged = on_diverged
        self.stopped = False  # a replay diverged, or the cluster halted: nothing more leaves this worker
        # A newer generation was announced: replies of the old one are held back (its replay sends
        # them again), so that once this worker's egress is flushed nothing more of it can reach the
        # log while another worker — a partition's new owner — reads the log back.
        self.held = False
        self.answered = ReplyTable(replies_per_partition)
        self.waiting: dict[str, list[IngressRecord]] = {}  # resent ids whose first copy still runs
        self.on_log: dict[str, list[Reply]] = {}  # replies already on the egress log (recovery)
        self.egress_partitions = 0  # of the egress topic: one per entity partition (the cluster view)
        self.lanes: list[int] = []  # the partitions this worker owns: its epochs' reply lanes, in turn

    def route(self, partition: int, request: Request, epoch: int) -> int:
        """The egress partition of the reply to ``request`` (taken from ingress ``partition``) sent by
        ``epoch``: the one it names if the topic has it, else the epoch's lane (``partition`` itself
        while this worker owns none, as before its first view)."""
        wanted = request.reply_partition
        if 0 <= wanted < self.egress_partitions:
            return wanted
        lanes = self.lanes
        return lanes[epoch % len(lanes)] if lanes else partition

    def wait_for_first(self, record: IngressRecord) -> None:
        """``record`` resends a request id whose first copy still runs: it gets that copy's reply."""
        self.waiting.setdefault(record.request.request_id, []).append(record)

    def send(self, epoch: int, replies: list[tuple[RootTxn, Reply]]) -> None:
        """Replies of ``epoch``: recorded (a resent id gets the same one), then emitted, also to any
        copies of the request that arrived while it ran."""
        for root, reply in replies:
            self.answered.record(root.partition, reply)
            request = root.request
            self.emit(epoch, self.route(root.partition, request, epoch), reply, request.reply_to)
            for rec in self.waiting.pop(reply.request_id, ()):
                self.emit(epoch, self.route(rec.partition, rec.request, epoch), reply, rec.request.reply_to)

    def emit(self, epoch: int, partition: int, reply: Reply, reply_to: str = "") -> None:
        """Emit ``reply`` unless a replayed epoch finds it already on the egress log."""
        if self.stopped or self.held:
            return
        if self.on_log:
            # Paired by tid: a request id reused for another request (another partition, another
            # transaction) has replies of its own, and replay assigns every transaction its tid again.
            earlier = self.on_log.get(reply.request_id)
            i = next((i for i, r in enumerate(earlier or ()) if r.tid == reply.tid), None)
            if earlier is not None and i is not None:
                logged = earlier.pop(i)
                if not earlier:
                    del self.on_log[reply.request_id]
                if logged != reply:
                    self.stopped = True
                    self.on_diverged(epoch, logged, reply)
                return
        self.out.effects.append(Emit(partition, reply, epoch, reply_to))

    def on_the_log(self, reply: Reply) -> bool:
        """Whether a replayed epoch finds a reply of ``reply``'s request id and tid on the egress log."""
        return any(r.tid == reply.tid for r in self.on_log.get(reply.request_id, ()))

    def live(self) -> None:
        """Replay is over: what is left of the replies found on the egress log belongs to epochs up to
        the restored snapshot (acknowledged after it recorded its egress position), which were not
        replayed. Every reply from now on is new, a resent request's answer included."""
        self.on_log = {}

    def move(self, gone: set[int], answered: ReplyTable, waiting: dict[str, list[IngressRecord]]) -> None:
        """Partitions moved (a shape change): forget the replies and waiting resends of ``gone``, take
        over ``answered`` and ``waiting`` of the partitions gained."""
        self.answered.move(gone, answered)
        kept = {rid: [r for r in recs if r.partition not in gone] for rid, recs in self.waiting.items()}
        self.waiting = {rid: recs for rid, recs in kept.items() if recs}
        for rid, recs in waiting.items():
            self.waiting.setdefault(rid, []).extend(recs)
        self.on_log = {}

    def restore(
        self, answered: ReplyTable, waiting: dict[str, list[IngressRecord]], on_log: dict[str, list[Reply]]
    ) -> None:
        self.answered = answered
        self.waiting = waiting
        self.on_log = on_log
