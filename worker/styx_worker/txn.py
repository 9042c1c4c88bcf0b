"""What a worker knows about one transaction and one epoch while they run (plain data).

:class:`RootTxn` is a transaction whose root entity lives on this worker: the request, its tid and
the outcome collected from every invocation's ack. :class:`EpochState` holds one epoch's per-tid
tables on this worker: buffered writes per phase, optimistic read sets, the call-graph cache, the
result slots of synchronous calls, the fallback locks and counters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import msgspec

from styx_py.core.graph import Graph
from styx_py.core.partitioning import Key
from styx_py.core.wire import (
    ExecDone,
    IngressRecord,
    Invoke,
    Message,
    Phase,
    Reply,
    Revote,
    Status,
    Vote,
)
from styx_worker.ackshare import Share, ShareCollector
from styx_worker.conflicts import EntityKey
from styx_worker.locks import LockTable
from styx_worker.state import Writes

Path = tuple[int, ...]  # an invocation's position in its call tree (child indices from the root)
# A resent request answered from its earlier reply: (egress partition the resend names, the earlier
# reply to give again, the client it names to push to).
Resend = tuple[int, Reply, str]


class RootTxn:
    """A transaction whose root entity lives on this worker."""

    __slots__ = (
        "acked",
        "changed",
        "collector",
        "err_path",
        "error",
        "error_status",
        "failed",
        "offset",
        "partition",
        "request",
        "result",
        "tid",
        "ts_ms",
    )

    def __init__(self, tid: int, record: IngressRecord) -> None:
        self.tid = tid
        self.request = record.request
        self.partition = record.partition
        self.offset = record.offset
        self.ts_ms = record.ts_ms
        self.reset()

    def reset(self) -> None:
        """Forget the outcome of a previous run (the fallback re-runs a transaction from scratch)."""
        self.collector = ShareCollector()
        self.acked: set[Path] = set()
        self.failed = False
        self.changed = False
        self.error = ""
        self.error_status: Status = Status.OK
        self.err_path: list[int] | None = None
        self.result: msgspec.Raw | None = None

    def record(self, status: Status, error: str, path: list[int]) -> None:
        if status == Status.OK:
            return
        if status == Status.CHANGED:
            self.changed = True
            return
        self.failed = True
        # The reported error is the one closest to the root (smallest path): deterministic.
        if status in (Status.ABORT, Status.ERROR, Status.BAD) and (
            self.err_path is None or path < self.err_path
        ):
            self.err_path, self.error, self.error_status = path, error, status


class CallRecord(msgspec.Struct, array_like=True, frozen=True):
    """One outgoing call of an invocation, as the optimistic run made it."""

    operator: str
    function: str
    key: Key
    args: bytes
    sync: bool


class CachedInvocation:
    """What the optimistic run of one invocation learned, for re-invocation in the fallback phase."""

    __slots__ = ("calls", "inv", "own_share")

    def __init__(self, inv: Invoke, calls: list[CallRecord], own_share: Share) -> None:
        self.inv = inv
        self.calls = calls
        self.own_share = own_share


class Tally:
    """Transactions rooted on this worker that finished: per epoch, and summed since the start."""

    __slots__ = ("aborted", "by_status", "committed", "epochs", "fallback", "rescheduled")

    def __init__(self) -> None:
        self.committed = self.aborted = self.rescheduled = 0
        self.by_status = [0] * 6  # aborted transactions by reply status (ST_*): the abort cause
        self.epochs = 0
        self.fallback = 0  # transactions re-run under locks (counted on every worker)

    def finished(self, root: RootTxn) -> None:
        if root.failed:
            self.aborted += 1
            self.by_status[root.error_status] += 1
        else:
            self.committed += 1

    def add(self, other: Tally) -> None:
        self.committed += other.committed
        self.aborted += other.aborted
        self.rescheduled += other.rescheduled
        self.epochs += other.epochs
        self.fallback += other.fallback
        for status, n in enumerate(other.by_status):
            self.by_status[status] += n


class EpochState:
    """One epoch on one worker, from its EpochStart to its EpochDone."""

    def __init__(self, epoch: int, gen: int) -> None:
        self.epoch = epoch
        self.gen = gen  # the cluster generation running it: every message of the epoch carries it
        self.started = False
        # The graph version this epoch runs, set by its EpochStart: invocations that arrive before it
        # wait in ``before_start`` (a code update may have begun with this very epoch).
        self._graph: Graph | None = None
        self.before_start: list[Message] = []
        self.roots: dict[int, RootTxn] = {}
        self.roots_open = 0
        self.local_failed: list[int] = []
        self.opt_buffers: dict[int, Writes] = {}
        self.fb_buffers: dict[int, Writes] = {}
        self.reads: dict[int, set[EntityKey]] = {}
        self.touched: dict[int, set[EntityKey]] = {}
        self.serial: set[int] = set()  # tids that invoked one entity twice here (Phase.SERIAL)
        self.cache: dict[int, list[CachedInvocation]] = {}
        self.slots: dict[tuple[Phase, int, Path], asyncio.Future[tuple[Status, msgspec.Raw]]] = {}
        self.aborted: frozenset[int] | None = None  # every worker's logic aborts, once all executed
        # Every worker's reports of this epoch, by node; the decision is computed from them.
        self.exec_done: dict[str, ExecDone] = {}
        self.votes: dict[str, Vote] = {}
        self.revotes: dict[str, Revote] = {}
        self.serial_tids: list[int] | None = None  # the epoch's serial tids, once every Vote is in
        self.locks = LockTable((), {})
        self.fallback_ready = False
        self.finals_pending: set[int] = set()  # fallback and serial tids not final yet
        self.serial_pending: list[int] = []  # serial tids not final yet, in tid order (run in turn)
        self.serial_released = -1  # the serial tid whose turn it is here (its messages are let in)
        self.serial_held: list[Message] = []  # Phase.SERIAL messages that arrived before their turn
        self.deferred: list[Message] = []  # fallback-phase messages that arrived before the decision
        self.seqlog_written: Awaitable[None] | None = None
        self.finished = False
        self.snapshot = False
        self.decided = False
        self.invoked: set[tuple[int, int, Path]] = set()
        self.resends: list[Resend] = []  # resent request ids answered from earlier replies
        self.tally = Tally()

    @property
    def graph(self) -> Graph:
        assert self._graph is not None, f"epoch {self.epoch} runs code before its EpochStart"
        return self._graph

    @graph.setter
    def graph(self, graph: Graph) -> None:
        self._graph = graph

    @property
    def has_graph(self) -> bool:
        return self._graph is not None

    def buffer(self, phase: Phase, tid: int) -> Writes:
        table = self.opt_buffers if phase == Phase.OPTIMISTIC else self.fb_buffers
        buf = table.get(tid)
        if buf is None:
            buf = table[tid] = {}
        return buf

    def record_read(self, tid: int, key: EntityKey) -> None:
        reads = self.reads.get(tid)
        if reads is None:
            self.reads[tid] = {key}
        else:
            reads.add(key)

    def cache_invocation(self, inv: Invoke, calls: list[CallRecord], own: Share, key: EntityKey) -> None:
        touched = self.touched.get(inv.tid)
        if touched is None:
            self.touched[inv.tid] = {key}
        elif key in touched:
            self.serial.add(inv.tid)  # one entity twice: its branches may race for it
        else:
            touched.add(key)
        self.cache.setdefault(inv.tid, []).append(CachedInvocation(inv, calls, own))

    def result_slot(self, phase: Phase, tid: int, path: Path) -> asyncio.Future[tuple[Status, msgspec.Raw]]:
        k = (phase, tid, path)
        fut = self.slots.get(k)
        if fut is None:
            fut = self.slots[k] = asyncio.get_running_loop().create_future()
        return fut

    def defer(self, msg: Message) -> bool:
        """Hold a fallback-phase message until the decision opened the fallback; True if held."""
        if self.fallback_ready:
            return False
        self.deferred.append(msg)
        return True

    def fallback_done(self) -> bool:
        """Every Phase.FALLBACK transaction is final here (only serial ones may be left)."""
        return len(self.finals_pending) == len(self.serial_pending)

    def serial_turn(self, tid: int) -> bool:
        """Whether ``tid`` (a serial transaction) may run here now: the fallback is over here and
        every serial transaction with a lower tid is final here."""
        return self.fallback_done() and bool(self.serial_pending) and self.serial_pending[0] == tid


def root_invoke(es: EpochState, root: RootTxn, phase: Phase, node_id: str) -> Invoke:
    """The invocation of a transaction's root function (share 1, path [], on this worker)."""
    req = root.request
    return Invoke(
        es.epoch,
        root.tid,
        phase,
        [],
        node_id,
        node_id,
        req.operator,
        req.function,
        req.key,
        req.args,
        1,
        1,
        False,
        root.ts_ms,
        es.gen,
    )
