"""What a worker knows about one transaction and one epoch while they run (plain data, no I/O).

:class:`RootTxn` is a transaction whose root entity lives on this worker: the request, its tid and the
outcome collected from every invocation's ack. :class:`EpochState` is one epoch on this worker: its
:class:`EpochPhase`, its roots, and three tables — what the optimistic run learned
(:class:`Reservations`), every worker's reports (:class:`Reports`) and the fallback's locks and counters
(:class:`FallbackState`). The epoch machine (:mod:`styx_worker.epoch`) is the only writer.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

import msgspec

from styx_py.core.context import Number, added
from styx_py.core.effectids import OUTBOX
from styx_py.core.graph import Graph
from styx_py.core.partitioning import Key
from styx_py.core.scan import SCAN_OP, ScanRange
from styx_py.core.wire import (
    ExecDone,
    IngressRecord,
    Invoke,
    Phase,
    Reply,
    Revote,
    Status,
    Vote,
    decode_value,
    encode_value,
)
from styx_worker.ackshare import Share, ShareCollector
from styx_worker.conflicts import EntityKey
from styx_worker.digests import EpochWrites
from styx_worker.locks import LockTable
from styx_worker.state import StateStore, Writes

Path = tuple[int, ...]  # an invocation's position in its call tree (child indices from the root)
# A resent request answered from its earlier reply: (egress partition the resend names, the earlier
# reply to give again, the client it names to push to).
Resend = tuple[int, Reply, str]


class EpochPhase(IntEnum):
    """Where one epoch stands on this worker; it only moves forward."""

    OPEN = 0  # the next epoch here: its EpochStart has not come (peers' reports and calls may)
    EXECUTING = 1  # started: the batch runs optimistically against the state as of the epoch's start
    EXECUTED = 2  # every root of this worker finished: its ExecDone is out; waiting for every worker's
    VOTING = 3  # every ExecDone is in: this worker's Vote leaves once its batch is logged
    REVOTING = 4  # some Vote names serial tids: conflicts again without their writes (Revote)
    FALLBACK = 5  # decided: committed lock-free, replies out; conflicting tids re-run under locks
    SERIAL = 6  # the fallback is over here: serial tids run one at a time, in tid order
    FINISHED = 7


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
        "phase",
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

    def reset(self, phase: Phase = Phase.OPTIMISTIC) -> None:
        """Forget the outcome of a previous run (the fallback re-runs a transaction from scratch): the
        next run is in ``phase``; an ack of another phase (a late copy of an earlier run's) is not its."""
        self.phase = phase
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


def added_raw(raw: bytes | None, adds: Iterable[tuple[Number, str | None]]) -> bytes:
    """An encoded state (None: absent) with ``adds`` (``(amount, field)`` each) applied, encoded."""
    value = None if raw is None else decode_value(raw)
    for amount, field in adds:
        value = added(value, amount, field)
    return encode_value(value)


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

    __slots__ = ("aborted", "by_status", "committed", "epochs", "fallback", "refused", "rescheduled")

    def __init__(self) -> None:
        self.committed = self.aborted = self.rescheduled = 0
        self.by_status = [0] * 6  # aborted transactions by reply status (ST_*): the abort cause
        self.epochs = 0
        self.fallback = 0  # transactions re-run under locks (counted on every worker)
        self.refused = 0  # new requests not admitted (styx_worker.admission)

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
        self.refused += other.refused
        for status, n in enumerate(other.by_status):
            self.by_status[status] += n


class Reservations:
    """What the optimistic run of an epoch learned here, per tid: buffered writes, read and touched keys,
    scanned ranges, and the invocations to re-run from the call-graph cache."""

    __slots__ = ("adds", "cache", "ranges", "reads", "serial", "touched", "writes")

    def __init__(self) -> None:
        self.writes: dict[int, Writes] = {}
        self.reads: dict[int, set[EntityKey]] = {}
        # Blind adds (Context.add to an entity the tid neither read nor wrote otherwise): its
        # (amount, field) list per key; the key's buffered write is their sum on the epoch's state.
        self.adds: dict[int, dict[EntityKey, list[tuple[Number, str | None]]]] = {}
        self.ranges: dict[int, list[ScanRange]] = {}  # scans answered here (styx_worker.scan)
        self.touched: dict[int, set[EntityKey]] = {}
        self.serial: set[int] = set()  # tids that invoked one entity twice here (Phase.SERIAL)
        self.cache: dict[int, list[CachedInvocation]] = {}

    def cache_invocation(self, inv: Invoke, calls: list[CallRecord], own: Share) -> None:
        key = (inv.operator, inv.key)
        touched = self.touched.get(inv.tid)
        if touched is None:
            self.touched[inv.tid] = {key}
        elif key in touched:
            if key[0] != SCAN_OP:  # two scans of one partition only read it (styx_worker.scan)
                self.serial.add(inv.tid)  # one entity twice: its branches may race for it
        else:
            touched.add(key)
        self.cache.setdefault(inv.tid, []).append(CachedInvocation(inv, calls, own))


class Reports:
    """Every worker's reports of one epoch, by node, and what they add up to once complete."""

    __slots__ = ("aborted", "exec_done", "revotes", "serial", "vote", "votes")

    def __init__(self) -> None:
        self.exec_done: dict[str, ExecDone] = {}
        self.votes: dict[str, Vote] = {}
        self.revotes: dict[str, Revote] = {}
        self.aborted: frozenset[int] = frozenset()  # every worker's logic aborts (once all executed)
        self.serial: list[int] = []  # the epoch's serial tids (once every Vote is in)
        self.vote: Vote | None = None  # this worker's Vote, until its batch is logged


class FallbackState:
    """The fallback of one epoch here: its locks, the invocations waiting for one, the tids not final
    yet, and the serial tids' turns."""

    __slots__ = ("locks", "pending", "serial", "turn", "waiting", "writes")

    def __init__(self) -> None:
        self.locks = LockTable((), {})
        self.waiting: dict[tuple[EntityKey, int], list[tuple[Invoke, CachedInvocation | None]]] = {}
        self.writes: dict[int, Writes] = {}  # buffered writes of the fallback and serial runs
        self.pending: set[int] = set()  # fallback and serial tids not final yet
        self.serial: list[int] = []  # serial tids not final yet, in tid order (each runs in turn)
        self.turn = -1  # the serial tid whose turn it is here (its messages are let in)

    def done(self) -> bool:
        """Every Phase.FALLBACK transaction is final here (only serial ones may be left)."""
        return len(self.pending) == len(self.serial)


class EpochState:
    """One epoch on one worker, from its EpochStart to its EpochDone."""

    __slots__ = (
        "committed",
        "epoch",
        "fb",
        "gen",
        "graph",
        "invoked",
        "logged",
        "opt",
        "phase",
        "reports",
        "resends",
        "roots",
        "roots_open",
        "snapshot",
        "tally",
        "view",
    )

    def __init__(self, epoch: int, gen: int) -> None:
        self.epoch = epoch
        self.gen = gen  # the cluster generation running it: every message of the epoch carries it
        self.phase = EpochPhase.OPEN
        self.graph: Graph | None = None  # the graph version it runs, from its EpochStart
        self.view: TxnView | None = None  # what its invocations read and write through
        self.roots: dict[int, RootTxn] = {}
        self.roots_open = 0
        self.invoked: set[tuple[int, int, Path]] = set()  # (phase, tid, path): each runs once
        self.logged = True  # its batch's sequencer-log entry is durable (a replay logs none)
        self.snapshot = False
        self.resends: list[Resend] = []  # resent request ids answered from earlier replies
        self.tally = Tally()
        self.opt = Reservations()
        self.reports = Reports()
        self.fb = FallbackState()
        # The digests of what it committed here (and, replayed, of what its first run logged): its
        # EpochStart sets them up.
        self.committed = EpochWrites({}, None)


class TxnView:
    """The narrow view an invocation of one epoch runs against: committed state (as of the start of the
    epoch's phase), its transaction's buffered writes, its reads, the epoch's code, and what each
    partition had pending at the start of the epoch (styx_py.core.pendingcount)."""

    __slots__ = ("graph", "node_id", "opt", "pending", "store", "writes")

    def __init__(self, node_id: str, graph: Graph, store: StateStore, es: EpochState) -> None:
        self.node_id = node_id  # the worker it runs on: its synchronous calls' results come back here
        self.graph = graph
        self.store = store
        self.opt = es.opt
        self.writes = es.fb.writes
        outbox = graph.operators.get(OUTBOX)
        self.pending = {} if outbox is None else store.pending.at(outbox.partitions)

    def read(self, key: EntityKey) -> bytes | None:
        return self.store.data.get(key)

    def buffer(self, phase: Phase, tid: int) -> Writes:
        table = self.opt.writes if phase == Phase.OPTIMISTIC else self.writes
        buf = table.get(tid)
        if buf is None:
            buf = table[tid] = {}
        return buf

    def record_read(self, tid: int, key: EntityKey) -> None:
        reads = self.opt.reads.get(tid)
        if reads is None:
            self.opt.reads[tid] = {key}
        else:
            reads.add(key)

    def record_add(self, tid: int, key: EntityKey, amount: Number, field: str | None) -> None:
        adds = self.opt.adds.get(tid)
        if adds is None:
            adds = self.opt.adds[tid] = {}
        adds.setdefault(key, []).append((amount, field))

    def is_added(self, tid: int, key: EntityKey) -> bool:
        adds = self.opt.adds.get(tid)
        return adds is not None and key in adds

    def unadd(self, tid: int, key: EntityKey) -> bool:
        """Forget ``tid``'s blind adds to ``key`` (a read or a put of it follows); whether it had any."""
        adds = self.opt.adds.get(tid)
        return adds is not None and adds.pop(key, None) is not None

    def was_read(self, tid: int, key: EntityKey) -> bool:
        reads = self.opt.reads.get(tid)
        return reads is not None and key in reads

    def record_range(self, tid: int, rng: ScanRange) -> None:
        self.opt.ranges.setdefault(tid, []).append(rng)


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
        req.request_id,
    )
