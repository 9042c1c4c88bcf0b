"""The epoch driver: the one place with phase-level control flow on a worker.

One epoch, as seen by a worker (the coordinator's side is ``coordinator.barrier``)::

    EpochStart(e, lc) ─► sequence a batch (rescheduled first, keeping their tids), log it, run all
                         root invocations optimistically against the pre-epoch state
    all local roots acked ─► ExecDone(e, logic aborts, lc)
    AllExecDone(e, aborts) ─► find local conflicts ─► Vote(e, conflicts, uncacheable)
    Decision(e, fallback) ─► commit the rest (lock-free), send their replies (early commit)
                           ─► re-run the fallback tids under locks in tid order (cached or not)
    every fallback tid final ─► EpochDone(e, pending)

Messages for an epoch's fallback phase that arrive before its Decision are deferred until then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Coroutine
from fractions import Fraction
from typing import Any

import msgspec

from styx_py.core.blobs import BlobStore, epoch_of
from styx_py.core.config import Config
from styx_py.core.graph import Graph, load_graph
from styx_py.core.partitioning import key_bytes, partition_of
from styx_py.core.ports import Egress, Ingress, LogReader, SequencerLog, Transport
from styx_py.core.wire import (
    COORDINATOR,
    OUT_ABORT,
    OUT_COMMIT,
    OUT_RESCHEDULE,
    PHASE_FALLBACK,
    PHASE_OPTIMISTIC,
    ST_ABORT,
    ST_BAD,
    ST_CHANGED,
    ST_ERROR,
    ST_OK,
    Ack,
    AllExecDone,
    CallResult,
    ClusterView,
    Decision,
    EpochDone,
    EpochStart,
    ExecDone,
    Final,
    Heartbeat,
    IngressRecord,
    Invoke,
    Manifest,
    Message,
    Recover,
    RecoverDone,
    Register,
    Reply,
    SeqLogEntry,
    SnapshotDone,
    SnapshotResult,
    Vote,
    WorkAvailable,
)
from styx_py.worker import snapshot
from styx_py.worker.ackshare import ShareCollector, from_wire, to_wire
from styx_py.worker.commit import reply_for
from styx_py.worker.conflicts import EntityKey, find_conflicts
from styx_py.worker.dedup import ReplyTable
from styx_py.worker.executor import CachedInvocation, CallRecord, run_invocation
from styx_py.worker.locks import LockTable
from styx_py.worker.metrics import WorkerMetrics
from styx_py.worker.sequencer import Sequencer
from styx_py.worker.state import StateStore, Writes

log = logging.getLogger("styx.worker")

# How a request of a batch is handled (sequencer-log entries carry these in place of a tid).
FRESH, ANSWERED, WAITING = 1, -1, -2
# Messages that belong to one generation of the cluster (dropped once a recovery moved past it).
DATA_MESSAGES = (Invoke, Ack, CallResult, Final, EpochStart, AllExecDone, Decision)


# ---- per-transaction and per-epoch state ----------------------------------------------------------


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
        self.collector = ShareCollector()
        self.acked: set[tuple[int, ...]] = set()
        self.failed = False
        self.changed = False
        self.error = ""
        self.error_status = ST_OK
        self.err_path: list[int] | None = None
        self.result: msgspec.Raw | None = None

    def record(self, status: int, error: str, path: list[int]) -> None:
        if status == ST_OK:
            return
        if status == ST_CHANGED:
            self.changed = True
            return
        self.failed = True
        # The reported error is the one closest to the root (smallest path): deterministic.
        if status in (ST_ABORT, ST_ERROR, ST_BAD) and (self.err_path is None or path < self.err_path):
            self.err_path, self.error, self.error_status = path, error, status


class EpochState:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.started = False
        self.roots: dict[int, RootTxn] = {}
        self.roots_open = 0
        self.local_failed: list[int] = []
        self.opt_buffers: dict[int, Writes] = {}
        self.fb_buffers: dict[int, Writes] = {}
        self.reads: dict[int, set[EntityKey]] = {}
        self.touched: dict[int, set[EntityKey]] = {}
        self.uncacheable: set[int] = set()
        self.cache: dict[int, list[CachedInvocation]] = {}
        self.slots: dict[tuple[int, int, tuple[int, ...]], asyncio.Future[tuple[int, msgspec.Raw]]] = {}
        self.aborted: frozenset[int] = frozenset()
        self.locks = LockTable((), {})
        self.fallback_ready = False
        self.finals_pending: set[int] = set()
        self.deferred: list[Message] = []
        self.seqlog_written: Awaitable[None] | None = None
        self.finished = False
        self.snapshot = False
        self.decided = False
        self.invoked: set[tuple[int, int, tuple[int, ...]]] = set()
        self.resends: list[tuple[int, Reply]] = []  # resent request ids answered from earlier replies
        self.committed = self.aborted_count = self.rescheduled = 0

    def buffer(self, phase: int, tid: int) -> Writes:
        table = self.opt_buffers if phase == PHASE_OPTIMISTIC else self.fb_buffers
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

    def cache_invocation(self, inv: Invoke, calls: list[CallRecord], own: Fraction, key: EntityKey) -> None:
        touched = self.touched.get(inv.tid)
        if touched is None:
            self.touched[inv.tid] = {key}
        elif key in touched:
            self.uncacheable.add(inv.tid)  # one entity twice: order inside the txn matters
        else:
            touched.add(key)
        self.cache.setdefault(inv.tid, []).append(CachedInvocation(inv, calls, own))

    def result_slot(
        self, phase: int, tid: int, path: tuple[int, ...]
    ) -> asyncio.Future[tuple[int, msgspec.Raw]]:
        k = (phase, tid, path)
        fut = self.slots.get(k)
        if fut is None:
            fut = self.slots[k] = asyncio.get_running_loop().create_future()
        return fut


# ---- the worker -----------------------------------------------------------------------------------


class Worker:
    def __init__(
        self,
        node_id: str,
        config: Config,
        transport: Transport,
        ingress: Ingress,
        egress: Egress,
        seqlog: SequencerLog,
        *,
        blobs: BlobStore | None = None,
        logs: LogReader | None = None,
        host: str = "",
        port: int = 0,
        heartbeats: bool = True,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.transport = transport
        self.ingress = ingress
        self.egress = egress
        self.seqlog = seqlog
        self.blobs = blobs
        self.logs = logs
        self.generation = -1  # until the first cluster view: a restarted worker ignores stale traffic
        self.inflight: set[asyncio.Task[None]] = set()
        self.unconfirmed: snapshot.Unconfirmed = {}  # a snapshot's deltas, until the coordinator confirms it
        self.replay: dict[int, SeqLogEntry] = {}  # epoch -> logged composition of this worker's batch
        self.replied: dict[str, list[Reply]] = {}  # replies already on the egress log (recovery)
        self.answered = ReplyTable(config.dedup_replies_per_partition)
        self.waiting: dict[str, list[IngressRecord]] = {}  # resent ids whose first copy still runs
        self.recovering: asyncio.Task[None] | None = None
        self.coordinator_seen = time.monotonic()
        self.host, self.port = host, port
        self.heartbeats = heartbeats
        self.store = StateStore()
        self.graph: Graph | None = None
        self.graph_path: str | None = None
        self.view: ClusterView | None = None
        self.placement: list[str] = []
        self.op_partitions: dict[str, int] = {}
        self.peers: list[str] = []
        self.sequencer = Sequencer(1, 1)
        self.epochs: dict[int, EpochState] = {}
        self.completed_epoch = -1
        self.rescheduled: list[RootTxn] = []
        self.tasks: asyncio.TaskGroup | None = None
        self.stats = {"epochs": 0, "committed": 0, "aborted": 0, "rescheduled": 0, "fallback": 0}
        self.aborts_by_status = [0] * 6  # aborted transactions by reply status (ST_*): the abort cause
        self.metrics = WorkerMetrics(self)  # read at scrape time; nothing per transaction
        ingress.set_listener(self._on_ingress_available)

    # ---- lifecycle -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve until cancelled. Every invocation task is a child of this task group."""
        async with asyncio.TaskGroup() as tg:
            self.tasks = tg
            self.transport.send(COORDINATOR, Register(self.node_id, self.host, self.port))
            if self.heartbeats:
                tg.create_task(self._heartbeat_loop())
            await asyncio.Future()  # run until cancelled

    async def _heartbeat_loop(self) -> None:
        # Sent from the worker's own event loop: a hung loop stops heartbeats and counts as failed.
        interval = self.config.heartbeat_interval_ms / 1000
        while True:
            self.transport.send(COORDINATOR, Heartbeat(self.node_id, self.completed_epoch))
            await asyncio.sleep(interval)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a child of the worker's task group; recovery cancels what is in flight."""
        assert self.tasks is not None, "worker not running"
        task = self.tasks.create_task(coro)
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    def on_coordinator_lost(self) -> None:
        """The coordinator's connection broke: register again (delivered once it is back)."""
        self.transport.send(COORDINATOR, Register(self.node_id, self.host, self.port))

    def _on_ingress_available(self) -> None:
        if self.view is not None:
            self.transport.send(COORDINATOR, WorkAvailable(self.node_id))

    # ---- message dispatch --------------------------------------------------------------------------
    def on_message(self, src: str, msg: Message) -> None:
        if src == COORDINATOR:
            self.coordinator_seen = time.monotonic()
        if isinstance(msg, DATA_MESSAGES) and msg.gen != self.generation:
            # A message of a generation that recovery ended: its epoch numbers mean something else now.
            assert msg.gen < self.generation or self.generation < 0, (
                f"{self.node_id}: from the future: {msg!r}"
            )
            return
        match msg:
            case Invoke():
                self.handle_invoke(msg)
            case Ack():
                self.on_ack(msg, None)
            case CallResult():
                self.on_call_result(msg)
            case Final():
                self.on_final(msg)
            case EpochStart():
                self.on_epoch_start(msg)
            case AllExecDone():
                self.on_all_exec_done(msg)
            case Decision():
                self.on_decision(msg)
            case ClusterView():
                self.on_view(msg)
            case Heartbeat():
                pass  # the coordinator's echo: renews the lease (coordinator_seen, above)
            case SnapshotResult():
                snapshot.on_result(self.unconfirmed, msg, self.store, self.answered)
            case Recover():
                assert self.tasks is not None
                if self.recovering is not None:
                    self.recovering.cancel()
                self.recovering = self.tasks.create_task(self.recover(msg))
            case _:
                raise AssertionError(
                    f"worker {self.node_id}: unexpected message {type(msg).__name__} from {src}"
                )

    def epoch_state(self, epoch: int) -> EpochState | None:
        if epoch <= self.completed_epoch:
            return None  # a late message of a finished epoch (e.g. an unneeded cached call result)
        es = self.epochs.get(epoch)
        if es is None:
            es = self.epochs[epoch] = EpochState(epoch)
        return es

    def _defer(self, es: EpochState, msg: Message) -> bool:
        if es.fallback_ready:
            return False
        es.deferred.append(msg)
        return True

    # ---- cluster view ------------------------------------------------------------------------------
    def on_view(self, view: ClusterView) -> None:
        self.view = view
        if self.generation < 0:
            # A (re)started worker joins the current generation; a running one changes generation
            # only through Recover, which also drops every epoch of the old one.
            self.generation = view.gen
        self.placement = view.placement
        me = next(w for w in view.workers if w.node_id == self.node_id)
        self.sequencer = Sequencer(me.sid, len(view.workers), self.sequencer.lc)
        self.peers = sorted(w.node_id for w in view.workers)
        if view.graph_path is not None and view.graph_path != self.graph_path:
            self.graph = load_graph(view.graph_path)
            self.graph_path = view.graph_path
        self.op_partitions = {spec.name: spec.partitions for spec in view.operators}
        self.ingress.assign([p for p, owner in enumerate(view.placement) if owner == self.node_id])

    # ---- routing -----------------------------------------------------------------------------------
    def owner_of(self, operator: str, key: str | int) -> str:
        return self.placement[partition_of(key, self.op_partitions[operator])]

    def dispatch(self, inv: Invoke) -> None:
        owner = self.owner_of(inv.operator, inv.key)
        if owner == self.node_id:
            self.handle_invoke(inv)
        else:
            self.transport.send(owner, inv)

    def handle_invoke(self, inv: Invoke) -> None:
        es = self.epoch_state(inv.epoch)
        if es is None:
            return  # a repeat of an invocation of a finished epoch
        if inv.phase == PHASE_FALLBACK and self._defer(es, inv):
            return
        key = (inv.phase, inv.tid, tuple(inv.path))
        if key in es.invoked:
            return  # a repeat: run each invocation once
        es.invoked.add(key)
        self.spawn(run_invocation(self, es, inv, None))

    def send_result(self, inv: Invoke, status: int, value: msgspec.Raw) -> None:
        msg = CallResult(inv.epoch, inv.tid, inv.phase, inv.path, status, value, inv.gen)
        if inv.parent == self.node_id:
            self.on_call_result(msg)
        else:
            self.transport.send(inv.parent, msg)

    def on_call_result(self, msg: CallResult) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None or (msg.phase == PHASE_FALLBACK and self._defer(es, msg)):
            return
        slot = es.result_slot(msg.phase, msg.tid, tuple(msg.path))
        if not slot.done():
            slot.set_result((msg.status, msg.value))

    def send_ack(self, inv: Invoke, own: Fraction, status: int, error: str, value: msgspec.Raw) -> None:
        ack = Ack(inv.epoch, inv.tid, inv.phase, *to_wire(own), status, error, inv.path, inv.gen)
        if inv.root == self.node_id:
            self.on_ack(ack, value if not inv.path else None)
        else:
            self.transport.send(inv.root, ack)

    def on_ack(self, ack: Ack, root_value: msgspec.Raw | None) -> None:
        es = self.epoch_state(ack.epoch)
        if es is None:
            return  # a repeat of an ack of a finished epoch
        if ack.phase == PHASE_FALLBACK and self._defer(es, ack):
            return
        root = es.roots[ack.tid]
        path = tuple(ack.path)
        if path in root.acked:
            return  # a repeat: every invocation acks once
        root.acked.add(path)
        if not ack.path:
            root.result = root_value
        root.record(ack.status, ack.error, ack.path)
        if root.collector.add(from_wire(ack.share_n, ack.share_d)):
            if ack.phase == PHASE_OPTIMISTIC:
                self._root_done_optimistic(es, root)
            else:
                self._root_done_fallback(es, root)

    # ---- phase 1: sequencing and optimistic execution --------------------------------------------
    def on_epoch_start(self, msg: EpochStart) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None or es.started:
            return  # a repeat
        es.started = True
        self.sequencer.rebalance(msg.lc)
        if msg.replay:
            self.spawn(self._start_replayed(es))
            return
        if self.replied:
            # Replay is over: what is left of the replies found on the egress log belongs to epochs
            # up to the restored snapshot (acknowledged after it recorded its egress position), which
            # were not replayed. Every reply from now on is new, a resent request's answer included.
            self.replied = {}
        lc_start = self.sequencer.lc
        resched, self.rescheduled = take_rescheduled(self.rescheduled)
        room = max(0, self.config.epoch_size_max - len(resched))
        records = self.ingress.take(room) if room else []
        # In flight: this batch's rescheduled transactions, those still waiting, and resent copies.
        running = {r.request.request_id for r in resched} | set(self.waiting)
        running.update(r.request.request_id for r in self.rescheduled)
        fresh: list[IngressRecord] = []
        entries: list[tuple[int, int, int, str]] = []
        for rec in records:
            kind = self._classify(es, rec, running)
            if kind == FRESH:
                fresh.append(rec)
            else:
                entries.append((kind, rec.partition, rec.offset, rec.request.request_id))
        tids = self.sequencer.assign(len(fresh))
        roots = resched + [RootTxn(tid, rec) for tid, rec in zip(tids, fresh, strict=True)]
        # Logged even when empty: a complete set of entries (one per worker) marks an epoch that may
        # have been decided, which is how a restarted coordinator finds where replay must end.
        entries = [(r.tid, r.partition, r.offset, r.request.request_id) for r in roots] + entries
        entry = SeqLogEntry(msg.epoch, self.node_id, lc_start, entries, self.generation, self.sequencer.lc)
        es.seqlog_written = self.seqlog.append(entry)
        self._run_roots(es, roots)

    def _classify(self, es: EpochState, rec: IngressRecord, running: set[str]) -> int:
        """FRESH (a new transaction), ANSWERED (resent after its reply: send that reply again) or
        WAITING (resent while its first copy runs: answer with that copy's reply). Deterministic:
        it depends only on the reply table and the batch, both replayed identically."""
        rid = rec.request.request_id
        earlier = self.answered.get(rec.partition, rid)
        if earlier is not None:
            es.resends.append((rec.partition, earlier))
            return ANSWERED
        if rid in running:
            self.waiting.setdefault(rid, []).append(rec)
            return WAITING
        running.add(rid)
        return FRESH

    async def _start_replayed(self, es: EpochState) -> None:
        """Re-form this worker's batch of a logged epoch exactly: same requests, same tids."""
        entry = self.replay.pop(es.epoch, None)
        roots: list[RootTxn] = []
        if entry is not None:
            waiting = {r.tid: r for r in self.rescheduled}
            running = {r.request.request_id for r in self.rescheduled} | set(self.waiting)
            for tid, partition, offset, _rid in entry.entries:
                root = waiting.pop(tid, None) if tid > 0 else None
                if root is None:
                    rec = await self.ingress.take_exact(partition, offset)
                    if tid <= 0:
                        kind = self._classify(es, rec, running)
                        assert kind == tid, (
                            f"replay classified {rec.request.request_id} as {kind}, log says {tid}"
                        )
                        continue
                    running.add(rec.request.request_id)
                    root = RootTxn(tid, rec)
                roots.append(root)
            self.rescheduled = list(waiting.values())
            self.sequencer.rebalance(entry.lc_end)
        self._run_roots(es, roots)

    def _run_roots(self, es: EpochState, roots: list[RootTxn]) -> None:
        es.roots_open = len(roots)
        for root in roots:
            root.reset()
            es.roots[root.tid] = root
        if not roots:
            self._send_exec_done(es)
            return
        for root in roots:
            bad = self._route_error(root)
            if bad is not None:
                root.record(ST_BAD, bad, [])
                es.cache.setdefault(root.tid, [])
                self._root_done_optimistic(es, root)
                continue
            self.spawn(run_invocation(self, es, self._root_invoke(es.epoch, root, PHASE_OPTIMISTIC), None))

    def _route_error(self, root: RootTxn) -> str | None:
        req = root.request
        partitions = self.op_partitions.get(req.operator)
        if partitions is None:
            return f"unknown operator {req.operator!r}"
        try:
            key_bytes(req.key)
        except TypeError as exc:
            return str(exc)
        if partition_of(req.key, partitions) != root.partition:
            return f"request for key {req.key!r} arrived on ingress partition {root.partition}, not its own"
        return None

    def _root_invoke(self, epoch: int, root: RootTxn, phase: int) -> Invoke:
        req = root.request
        return Invoke(
            epoch,
            root.tid,
            phase,
            [],
            self.node_id,
            self.node_id,
            req.operator,
            req.function,
            req.key,
            req.args,
            1,
            1,
            False,
            root.ts_ms,
            self.generation,
        )

    def _root_done_optimistic(self, es: EpochState, root: RootTxn) -> None:
        if root.failed:
            es.local_failed.append(root.tid)
        es.roots_open -= 1
        if es.roots_open == 0:
            self._send_exec_done(es)

    def _send_exec_done(self, es: EpochState) -> None:
        """Report the epoch executed, once its sequencer-log entry is durable.

        The coordinator decides (and replies leave) only after every worker's entry is durable, so
        an epoch with any reply out can always be replayed with exactly the same composition.
        """
        written = es.seqlog_written
        if written is not None and not (isinstance(written, asyncio.Future) and written.done()):

            async def later() -> None:
                await written
                self._send_exec_done(es)

            es.seqlog_written = None
            self.spawn(later())
            return
        msg = ExecDone(es.epoch, self.node_id, sorted(es.local_failed), self.sequencer.lc, self.generation)
        self.transport.send(COORDINATOR, msg)

    # ---- phase 2: conflicts --------------------------------------------------------------------------
    def on_all_exec_done(self, msg: AllExecDone) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None:
            return  # a repeat
        es.aborted = frozenset(msg.aborted)
        conflicts = find_conflicts(es.reads, es.opt_buffers, es.aborted)
        vote = Vote(es.epoch, self.node_id, conflicts, sorted(es.uncacheable), self.generation)
        self.transport.send(COORDINATOR, vote)

    # ---- phase 3: lock-free commit and early replies ---------------------------------------------------
    def on_decision(self, msg: Decision) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None or es.decided:
            return  # a repeat
        es.decided = True
        es.snapshot = msg.snapshot
        fallback = frozenset(msg.fallback)
        for tid in sorted(es.opt_buffers):
            if tid not in fallback and tid not in es.aborted:
                self.store.apply(es.opt_buffers[tid])
        replies: list[tuple[int, Reply]] = []
        for tid in sorted(es.roots):
            if tid in fallback:
                continue
            root = es.roots[tid]
            replies.append((root.partition, reply_for(root, es.epoch, PHASE_OPTIMISTIC)))
            if root.failed:
                es.aborted_count += 1
                self.aborts_by_status[root.error_status] += 1
            else:
                es.committed += 1
        self._send_replies(es, replies)
        for partition, reply in es.resends:
            self._emit(es.epoch, partition, reply)

        self.stats["fallback"] += len(msg.fallback)
        es.locks = LockTable(msg.fallback, es.touched)
        es.finals_pending = set(msg.fallback)
        es.fallback_ready = True
        uncacheable = frozenset(msg.uncacheable)
        for tid in msg.fallback:
            fb_root = es.roots.get(tid)
            if fb_root is not None:
                fb_root.reset()
        deferred, es.deferred = es.deferred, []
        for m in deferred:
            self.on_message("", m)
        caching = self.config.call_graph_caching
        for tid in msg.fallback:
            if caching and tid not in uncacheable:
                for cinv in es.cache.get(tid, ()):
                    inv = msgspec.structs.replace(cinv.inv, phase=PHASE_FALLBACK)
                    self.spawn(run_invocation(self, es, inv, cinv))
            else:
                fb_root = es.roots.get(tid)
                if fb_root is not None:
                    inv = self._root_invoke(es.epoch, fb_root, PHASE_FALLBACK)
                    self.spawn(run_invocation(self, es, inv, None))
        if not msg.fallback:
            self._finish_epoch(es)

    def _check_lease(self) -> None:
        """Fencing: a worker that heard nothing from the coordinator for longer than the failure
        timeout may have been declared dead and replaced; it must not send another reply."""
        silent_ms = (time.monotonic() - self.coordinator_seen) * 1000
        if silent_ms > self.config.failure_timeout_ms:
            log.critical(
                "%s: no word from the coordinator for %.0f ms: fencing myself off", self.node_id, silent_ms
            )
            os._exit(70)

    def _send_replies(self, es: EpochState, replies: list[tuple[int, Reply]]) -> None:
        """Early commit replies: recorded (a resent id gets the same one), then sent, also to any
        copies of the request that arrived while it ran."""
        if self.heartbeats:
            self._check_lease()
        for partition, reply in replies:
            self.answered.record(partition, reply)
            self._emit(es.epoch, partition, reply)
            for rec in self.waiting.pop(reply.request_id, ()):
                self._emit(es.epoch, rec.partition, reply)

    def _emit(self, epoch: int, partition: int, reply: Reply) -> None:
        """After a recovery, a reply already on the egress log is not sent again; the replayed one
        must be identical (determinism), which is asserted."""
        if self.replied:
            earlier = self.replied.get(reply.request_id)
            if earlier:
                first = earlier.pop()
                if not earlier:
                    del self.replied[reply.request_id]
                assert first == reply, f"replay diverged for {reply.request_id}: {first} != {reply}"
                return
        self.egress.send(partition, reply, epoch)

    # ---- phase 4: fallback under locks ----------------------------------------------------------------
    def _root_done_fallback(self, es: EpochState, root: RootTxn) -> None:
        if root.changed:
            outcome = OUT_RESCHEDULE
        elif root.failed:
            outcome = OUT_ABORT
        else:
            outcome = OUT_COMMIT
        final = Final(es.epoch, root.tid, outcome, self.generation)
        for peer in self.peers:
            if peer != self.node_id:
                self.transport.send(peer, final)
        if outcome == OUT_RESCHEDULE:
            self.rescheduled.append(root)
            es.rescheduled += 1
        else:
            if outcome == OUT_COMMIT:
                es.committed += 1
            else:
                es.aborted_count += 1
                self.aborts_by_status[root.error_status] += 1
            self._send_replies(es, [(root.partition, reply_for(root, es.epoch, PHASE_FALLBACK))])
        self.on_final(final)

    def on_final(self, msg: Final) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None:
            return  # a repeat of a finished epoch's final
        if self._defer(es, msg):
            return
        writes = es.fb_buffers.pop(msg.tid, None)
        if msg.outcome == OUT_COMMIT and writes:
            self.store.apply(writes)
        es.locks.release(msg.tid)
        es.finals_pending.discard(msg.tid)
        if not es.finals_pending:
            self._finish_epoch(es)

    def _finish_epoch(self, es: EpochState) -> None:
        if es.finished:
            return
        es.finished = True
        es.locks.cancel_all()
        self.stats["epochs"] += 1
        self.stats["committed"] += es.committed
        self.stats["aborted"] += es.aborted_count
        self.stats["rescheduled"] += es.rescheduled
        del self.epochs[es.epoch]
        self.completed_epoch = es.epoch
        if es.snapshot:
            self._take_snapshot(es.epoch)
        pending = self.ingress.pending() + len(self.rescheduled)
        done = EpochDone(
            es.epoch, self.node_id, pending, es.committed, es.aborted_count, es.rescheduled, self.generation
        )
        self.transport.send(COORDINATOR, done)

    # ---- snapshots -------------------------------------------------------------------------------------
    def owned_partitions(self) -> list[int]:
        return [p for p, owner in enumerate(self.placement) if owner == self.node_id]

    def _take_snapshot(self, epoch: int) -> None:
        delta = self.store.take_delta()
        replies = self.answered.take_delta()
        self.unconfirmed[epoch] = (delta, replies)
        resched = [(r.partition, r.tid, r.offset, r.ts_ms, r.request) for r in self.rescheduled]
        waiting = [rec for recs in self.waiting.values() for rec in recs]
        parts = snapshot.capture(
            epoch,
            delta,
            self.op_partitions,
            self.owned_partitions(),
            self.ingress.positions(),
            resched,
            self.egress.offsets(),
            self.seqlog.acked(),
            replies,
            waiting,
        )
        # The snapshot's replies must be on the egress log before it can be confirmed: recovery from
        # it replays only later epochs, so a reply still queued in the producer when this process
        # dies would otherwise never be sent. The flush covers the replies queued until now.
        flushed = self.egress.flush()
        self.spawn(self._upload_snapshot(epoch, parts, flushed))

    async def _upload_snapshot(
        self, epoch: int, parts: list[snapshot.PartitionSnapshot], flushed: asyncio.Future[None]
    ) -> None:
        assert self.blobs is not None, "snapshots need a blob store"
        started = time.perf_counter()
        try:
            size, _ = await asyncio.gather(snapshot.upload(self.blobs, parts), flushed)
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator: the snapshot fails, nothing is lost
            log.warning("%s: snapshot %d upload failed: %s", self.node_id, epoch, exc)
            self.metrics.snapshot(False, time.perf_counter() - started, 0)
            done = SnapshotDone(
                epoch, self.node_id, False, f"{type(exc).__name__}: {exc}", 0, 0, self.generation
            )
        else:
            self.metrics.snapshot(True, time.perf_counter() - started, size)
            seqlog_offset = parts[0].seqlog_offset if parts else self.seqlog.acked()
            done = SnapshotDone(
                epoch, self.node_id, True, "", len(parts), size, self.generation, seqlog_offset
            )
        self.transport.send(COORDINATOR, done)

    # ---- recovery --------------------------------------------------------------------------------------
    async def recover(self, msg: Recover) -> None:
        """Roll back to the last complete snapshot and prepare to replay the logged epochs.

        Everything in flight is cancelled and forgotten; messages of older generations are dropped on
        arrival from now on. The coordinator then re-runs epochs ``manifest.epoch+1 .. replay_until``
        with their logged composition, and continues live.
        """
        for task in list(self.inflight):
            task.cancel()
        self.inflight.clear()
        self.epochs.clear()
        self.generation = msg.gen
        self.unconfirmed.clear()
        started = time.perf_counter()
        try:
            await self._load(msg)
        except Exception as exc:  # noqa: BLE001 - reported: the coordinator retries the recovery
            log.error("%s: recovery to generation %d failed: %s", self.node_id, msg.gen, exc)
            self.metrics.recovery(False, time.perf_counter() - started)
            self.transport.send(
                COORDINATOR, RecoverDone(msg.gen, self.node_id, False, f"{type(exc).__name__}: {exc}")
            )
            return
        self.metrics.recovery(True, time.perf_counter() - started)
        self.transport.send(COORDINATOR, RecoverDone(msg.gen, self.node_id, True, ""))

    async def _load(self, msg: Recover) -> None:
        assert self.logs is not None, "recovery needs a log reader"
        m = msg.manifest
        owned = self.owned_partitions()
        store = StateStore()
        positions = {p: 0 for p in owned}
        egress_offsets = {p: 0 for p in owned}
        seqlog_from = 0
        first = True
        rescheduled: list[RootTxn] = []
        answered = ReplyTable(self.config.dedup_replies_per_partition)
        waiting: dict[str, list[IngressRecord]] = {}
        for p in owned:
            last: snapshot.PartitionSnapshot | None = None
            for key in sorted(m.deltas.get(p, []), key=epoch_of):
                assert self.blobs is not None, "a manifest with snapshots needs a blob store"
                raw = await self.blobs.get(key)
                if raw is None:
                    raise FileNotFoundError(f"snapshot object {key} listed in manifest {m.epoch} is missing")
                last = snapshot.snapshot_decoder.decode(raw)
                store.load_writes(last.writes)
                for reply in last.replies:
                    answered.record(p, reply, as_delta=False)
            if last is not None:
                seqlog_from = last.seqlog_offset if first else min(seqlog_from, last.seqlog_offset)
                first = False
                positions[p] = last.position
                egress_offsets[p] = last.egress_offset
                for tid, offset, ts_ms, request in last.rescheduled:
                    rescheduled.append(RootTxn(tid, IngressRecord(p, offset, request, ts_ms)))
                for offset, ts_ms, request in last.waiting:
                    waiting.setdefault(request.request_id, []).append(
                        IngressRecord(p, offset, request, ts_ms)
                    )
        self.store = store
        self.rescheduled = rescheduled
        self.answered = answered
        self.waiting = waiting
        self.ingress.seek(positions)
        self.egress.reset_offsets(egress_offsets)
        self.sequencer.lc = m.lc
        self.completed_epoch = m.epoch
        entries = await self.logs.seqlog(max(seqlog_from, m.seqlog_offset) if m.epoch >= 0 else 0)
        self.replay = plan_replay(entries, m, msg.replay_until, set(owned), self.node_id)
        replied: dict[str, list[Reply]] = {}
        # Replies the previous generation queued may still be on their way to the log: wait for them,
        # or replay would not find them there and would send them a second time.
        await self.egress.flush()
        for r in await self.logs.replies_from(egress_offsets, m.epoch):
            replied.setdefault(r.request_id, []).append(r)
        self.replied = replied


def take_rescheduled(rescheduled: list[RootTxn]) -> tuple[list[RootTxn], list[RootTxn]]:
    """Split the rescheduled transactions into those that run in the next epoch and those that wait.

    At most one per root entity runs, the oldest (lowest tid); the others wait, keeping their tids.
    A transaction is rescheduled when its call graph changed in the fallback, which happens when an
    older transaction wrote what it read; two of them with the same root entity would, in all
    likelihood, collide again the same way (TPC-C: every NewOrder of a district reads and bumps
    ``D_NEXT_O_ID``, and its new order's key is the id it read). Running all of them again made each
    epoch re-execute the whole backlog twice (optimistic and fallback) to commit one transaction per
    hot entity: epochs grew with the backlog until throughput collapsed. Running one per entity
    commits the same one per epoch while the epochs stay small. The split needs no determinism of
    its own: a batch's composition is logged, and replay re-forms it from the log.
    """
    ordered = sorted(rescheduled, key=lambda r: r.tid)
    run: list[RootTxn] = []
    wait: list[RootTxn] = []
    roots: set[tuple[str, str | int]] = set()
    for root in ordered:
        entity = (root.request.operator, root.request.key)
        if entity in roots:
            wait.append(root)
        else:
            roots.add(entity)
            run.append(root)
    return run, wait


def plan_replay(
    entries: list[SeqLogEntry], m: Manifest, replay_until: int, owned: set[int], node_id: str
) -> dict[int, SeqLogEntry]:
    """This worker's batch of every epoch to replay, from the sequencer log (pure).

    Only entries of the generation that ran an epoch count: a generation that died mid-epoch may have
    logged part of an epoch that was never decided, and that epoch number was reused afterwards.
    """
    plan: dict[int, SeqLogEntry] = {}
    for entry in entries:
        e = entry.epoch
        if not m.epoch < e <= replay_until or entry.gen != m.generation_of(e):
            continue
        mine = [x for x in entry.entries if x[1] in owned]
        current = plan.get(e)
        if current is None:
            plan[e] = SeqLogEntry(e, node_id, entry.lc_start, mine, entry.gen, entry.lc_end)
        else:
            current.entries.extend(mine)
            current.lc_end = max(current.lc_end, entry.lc_end)
    return plan
