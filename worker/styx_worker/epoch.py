"""The epoch driver: the one place with phase-level control flow on a worker.

One epoch, as seen by a worker (the coordinator's side is :mod:`styx_coordinator.epochs`)::

    EpochStart(e, lc, snapshot?) ─► form the batch (batch.py), log it, run every root invocation
                         optimistically against the pre-epoch state (executor.py)
    all local roots acked ─► ExecDone(e, logic aborts) to every peer
    every worker's ExecDone ─► local conflicts (conflicts.py) ─► Vote(e, conflicts, serial, lc, pending)
                         to the coordinator and every peer, once the batch's log entry is durable
    [some Vote names serial tids ─► conflicts without their writes ─► Revote(e, conflicts) to all]
    every worker's Vote [Revote] ─► the decision (core/barrier.py, the same on every worker):
                           lock-free commit and early replies (commit.py, replies.py)
                           ─► re-run the fallback tids under locks in tid order (fallback.py)
                           ─► then each serial tid alone, in tid order (Phase.SERIAL)
    every fallback and serial tid final ─► snapshot if asked (snapshot.py) ─► EpochDone(e, pending)

Every worker decides from the same reports, so no coordinator round trip stands between the votes and
the replies. Messages for an epoch's fallback phase that arrive before its decision are deferred until
then; a serial transaction's messages wait for its turn on each worker; messages of the next epoch
wait until this worker has finished the current one.
The leaves compute and return values; this module decides what happens next.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from styx_py.core.barrier import combine_exec, combine_revotes, combine_votes
from styx_py.core.config import Config
from styx_py.core.graph import Graph
from styx_py.core.ports import SequencerLog, Transport
from styx_py.core.wire import (
    COORDINATOR,
    Ack,
    CallResult,
    EpochDone,
    EpochStart,
    ExecDone,
    Final,
    Invoke,
    Message,
    Outcome,
    Phase,
    Revote,
    Status,
    Vote,
)
from styx_worker import fallback, snapshot
from styx_worker.ackshare import Share, from_wire
from styx_worker.batch import BatchFormer
from styx_worker.commit import commit_lock_free, reply_for
from styx_worker.conflicts import EntityKey, find_conflicts
from styx_worker.executor import run_invocation
from styx_worker.replies import ReplyOut
from styx_worker.routing import Router, RoutingTable
from styx_worker.runner import InvocationRunner
from styx_worker.snapshot import Snapshotter
from styx_worker.state import StateStore
from styx_worker.txn import CachedInvocation, EpochState, RootTxn, Tally, root_invoke

Spawn = Callable[[Coroutine[Any, Any, None]], None]

log = logging.getLogger("styx.worker")

EPOCH_MESSAGES = (Invoke, Ack, CallResult, Final, EpochStart, ExecDone, Vote, Revote)
"""What :meth:`EpochDriver.on_message` takes: every message that belongs to an epoch."""
EpochMessage = Invoke | Ack | CallResult | Final | EpochStart | ExecDone | Vote | Revote


class EpochDriver:
    """Runs this worker's part of every epoch; also the executor's :class:`InvocationHost`."""

    def __init__(
        self,
        config: Config,
        transport: Transport,
        table: RoutingTable,
        batch: BatchFormer,
        replies: ReplyOut,
        seqlog: SequencerLog,
        snapshots: Snapshotter,
        spawn: Spawn,
    ) -> None:
        self.config = config
        self.transport = transport
        self.table = table
        self.node_id = table.node_id
        self.router = Router(table, transport, self)
        self.batch = batch
        self.replies = replies
        self.seqlog = seqlog
        self.snapshots = snapshots
        self.spawn = spawn
        # Invocations run without a task of their own unless they wait (runner.py).
        self.runs = InvocationRunner(functools.partial(run_invocation, self), spawn)
        self.store = StateStore()
        # Graph versions this worker loaded (prepared for a code update, or named by a view): a live
        # epoch runs the one its EpochStart names, a replayed one the one its log entry names, so the
        # transactions of an epoch never mix versions.
        self.graphs: dict[int, Graph] = {}
        self.gen = -1  # the cluster generation; until the first view a restarted worker ignores traffic
        self.fence = -1  # the newest generation in a view: no epoch of an older one is decided here
        self.epochs: dict[int, EpochState] = {}
        self.completed_epoch = -1
        self.early: list[Message] = []  # messages of the next epoch, held until this one is finished
        self.totals = Tally()  # since the start; read by the metrics

    # ---- InvocationHost (what the executor sees) -------------------------------------------------
    def read(self, key: EntityKey) -> bytes | None:
        return self.store.get(key)

    def dispatch(self, inv: Invoke) -> None:
        self.router.dispatch(inv)

    def send_result(self, inv: Invoke, status: Status, value: msgspec.Raw) -> None:
        self.router.send_result(inv, status, value)

    def send_ack(self, inv: Invoke, own: Share, status: Status, error: str, value: msgspec.Raw) -> None:
        self.router.send_ack(inv, own, status, error, value)

    # ---- messages ----------------------------------------------------------------------------------
    def on_message(self, msg: Message) -> None:
        """A message of the current generation that belongs to an epoch."""
        if not isinstance(msg, EPOCH_MESSAGES):
            raise AssertionError(f"{self.node_id}: not an epoch message: {msg!r}")
        if msg.epoch > self.completed_epoch + 1:
            # The next epoch began (the coordinator starts it once this one is decided, and peers
            # may be in it already) while this worker is still finishing the current one.
            self.early.append(msg)
            return
        match msg:
            case Invoke():
                self.on_invoke(msg)
            case Ack():
                self.on_ack(msg, None)
            case CallResult():
                self.on_call_result(msg)
            case Final():
                self.on_final(msg)
            case EpochStart():
                self.on_epoch_start(msg)
            case ExecDone() | Vote() | Revote():
                self.on_report(msg)
            case _:
                raise AssertionError(f"{self.node_id}: not an epoch message: {msg!r}")

    def reset(self, gen: int) -> None:
        """A recovery: every epoch in flight is forgotten; the new generation starts."""
        self.epochs.clear()
        self.early.clear()
        self.runs.clear()
        self.gen = gen

    def epoch_state(self, epoch: int) -> EpochState | None:
        if epoch <= self.completed_epoch:
            return None  # a late message of a finished epoch (e.g. an unneeded cached call result)
        es = self.epochs.get(epoch)
        if es is None:
            es = self.epochs[epoch] = EpochState(epoch, self.gen)
        return es

    def on_invoke(self, inv: Invoke) -> None:
        es = self.epoch_state(inv.epoch)
        if es is None:
            return  # a repeat of an invocation of a finished epoch
        if not es.has_graph:
            # A peer started the epoch first: which code runs is known at this worker's EpochStart.
            es.before_start.append(inv)
            return
        if self._held(es, inv):
            return
        key = (inv.phase, inv.tid, tuple(inv.path))
        if key in es.invoked:
            return  # a repeat: run each invocation once
        es.invoked.add(key)
        self._run(es, inv, None)

    def on_call_result(self, msg: CallResult) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None or self._held(es, msg):
            return
        slot = es.result_slot(msg.phase, msg.tid, tuple(msg.path))
        if not slot.done():
            slot.set_result((msg.status, msg.value))

    def on_ack(self, ack: Ack, root_value: msgspec.Raw | None) -> None:
        es = self.epoch_state(ack.epoch)
        if es is None:
            return  # a repeat of an ack of a finished epoch
        if self._held(es, ack):
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
            if ack.phase == Phase.OPTIMISTIC:
                self._root_done_optimistic(es, root)
            else:
                self._root_done_fallback(es, root, ack.phase)

    def _held(self, es: EpochState, msg: Invoke | CallResult | Ack) -> bool:
        """Hold a fallback message until the decision, a serial one until its transaction's turn."""
        if msg.phase == Phase.OPTIMISTIC:
            return False
        if es.defer(msg):
            return True
        if msg.phase == Phase.SERIAL and not es.serial_turn(msg.tid):
            es.serial_held.append(msg)
            return True
        return False

    def _run(self, es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        self.runs.start(es, inv, cached)

    # ---- phase 1: sequencing and optimistic execution --------------------------------------------
    def on_epoch_start(self, msg: EpochStart) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None or es.started:
            return  # a repeat
        es.started = True
        es.snapshot = msg.snapshot
        version = msg.version or 1  # 0: from a coordinator that predates code updates
        logged = self.batch.logged_version(msg.epoch) if msg.replay else None
        if logged is not None and logged != version:
            # The sequencer log records the code each epoch ran with: a replay follows it. (The
            # coordinator's list agrees unless saving it failed ambiguously during an update.)
            log.warning(
                "%s: epoch %d ran graph version %d (log), the coordinator says %d: replaying with %d",
                self.node_id,
                msg.epoch,
                logged,
                version,
                logged,
            )
            version = logged
        graph = self.graphs.get(version)
        assert graph is not None, (
            f"{self.node_id}: epoch {msg.epoch} runs graph version {version}, not loaded"
        )
        es.graph = graph
        self.table.know(graph)
        held, es.before_start = es.before_start, []
        for m in held:
            self.on_message(m)
        self.batch.sequencer.rebalance(msg.lc)
        if msg.replay:
            self.spawn(self._start_replayed(es))
            return
        self.replies.live()
        self.batch.ingress.live(msg.segment)
        self.replies.egress.live(msg.segment)
        roots, entry, es.resends = self.batch.form(msg.epoch, es.gen, version)
        es.seqlog_written = self.seqlog.append(entry)
        self._run_roots(es, roots)

    async def _start_replayed(self, es: EpochState) -> None:
        roots, es.resends = await self.batch.replayed(es.epoch)
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
            bad = self.table.misrouted(root.request, root.partition, es.graph)
            if bad is not None:
                root.record(Status.BAD, bad, [])
                es.cache.setdefault(root.tid, [])
                self._root_done_optimistic(es, root)
                continue
            self._run(es, root_invoke(es, root, Phase.OPTIMISTIC, self.node_id), None)

    def _root_done_optimistic(self, es: EpochState, root: RootTxn) -> None:
        if root.failed:
            es.local_failed.append(root.tid)
        es.roots_open -= 1
        if es.roots_open == 0:
            self._send_exec_done(es)

    def _send_exec_done(self, es: EpochState) -> None:
        """Report the epoch executed here, at once, to the peers only (the Vote is what waits for the
        log entry, and it tells the coordinator what it needs: one message fewer to it per epoch)."""
        self._report(ExecDone(es.epoch, self.node_id, sorted(es.local_failed), es.gen))

    def _report(self, msg: ExecDone | Vote | Revote) -> None:
        """A report of this worker's: to every peer and to itself; a Vote or Revote to the coordinator
        too."""
        if not isinstance(msg, ExecDone):
            self.transport.send(COORDINATOR, msg)
        self.router.to_peers(msg)
        self.on_report(msg)

    # ---- phase 2: conflicts, and the decision every worker reaches from the same reports -------------
    def on_report(self, msg: ExecDone | Vote | Revote) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None or es.decided:
            return  # a repeat, or a report of an epoch decided already
        if es.gen < self.fence:
            return  # a recovery to a newer generation began: this epoch is replayed or re-formed
        workers = len(self.table.peers)
        match msg:
            case ExecDone():
                es.exec_done[msg.node_id] = msg
                if len(es.exec_done) == workers and es.aborted is None:
                    es.aborted = frozenset(combine_exec(list(es.exec_done.values())))
                    self._vote(es)
            case Vote():
                es.votes[msg.node_id] = msg
                if len(es.votes) == workers and es.serial_tids is None:
                    fallback, es.serial_tids = combine_votes(list(es.votes.values()))
                    if not es.serial_tids:
                        self._decide(es, fallback, [])
                    else:
                        self._revote(es)
            case Revote():
                es.revotes[msg.node_id] = msg
        if len(es.revotes) == workers and es.serial_tids and not es.decided:
            serial = es.serial_tids
            self._decide(es, combine_revotes(list(es.revotes.values()), serial), serial)

    def _vote(self, es: EpochState) -> None:
        """Every worker executed: this worker's conflicts, sent once its log entry is durable.

        Peers decide (and reply) from the votes, so a worker votes only once every transaction it
        sequenced this epoch is in the sequencer log: an epoch with any reply out can always be
        replayed with exactly its composition.
        """
        assert es.aborted is not None
        conflicts = find_conflicts(es.reads, es.opt_buffers, es.aborted)
        # The sequencer counter after this epoch's batch: only the next EpochStart moves it.
        lc, pending = self.batch.sequencer.lc, self.batch.pending()
        vote = Vote(es.epoch, self.node_id, conflicts, sorted(es.serial), es.gen, lc, pending)
        self._when_logged(es, lambda: self._report(vote))

    def _when_logged(self, es: EpochState, then: Callable[[], None]) -> None:
        """Run ``then`` once the batch's sequencer-log entry is durable (at once if it is already)."""
        written = es.seqlog_written
        if written is None or (isinstance(written, asyncio.Future) and written.done()):
            then()
            return

        async def later() -> None:
            await written
            if es.gen == self.gen:
                then()

        self.spawn(later())

    def _revote(self, es: EpochState) -> None:
        """Conflicts again, without the writes of transactions whose branches may have raced."""
        assert es.aborted is not None and es.serial_tids is not None
        conflicts = find_conflicts(es.reads, es.opt_buffers, es.aborted | frozenset(es.serial_tids))
        self._report(Revote(es.epoch, self.node_id, conflicts, es.gen))

    # ---- phase 3: lock-free commit and early replies; phase 4: fallback under locks ------------------
    def _decide(self, es: EpochState, fallback_tids: list[int], serial: list[int]) -> None:
        es.decided = True
        replies = commit_lock_free(es, frozenset(fallback_tids) | frozenset(serial), self.store)
        self.replies.send(es.epoch, replies)
        for partition, reply, reply_to in es.resends:
            self.replies.emit(es.epoch, partition, reply, reply_to)

        es.tally.fallback = len(fallback_tids) + len(serial)
        fallback.open_fallback(es, fallback_tids, serial)
        deferred, es.deferred = es.deferred, []
        for m in deferred:
            self.on_message(m)
        caching = self.config.call_graph_caching
        for inv, cached in fallback.fallback_runs(es, fallback_tids, caching, self.node_id):
            self._run(es, inv, cached)
        if not es.finals_pending:
            self._finish_epoch(es)
        else:
            self._next_serial(es)

    def _next_serial(self, es: EpochState) -> None:
        """Once the fallback is over here, let the next serial transaction in (its root starts it)."""
        if not es.serial_pending or not es.fallback_done() or es.serial_released == es.serial_pending[0]:
            return
        tid = es.serial_released = es.serial_pending[0]
        root = es.roots.get(tid)
        if root is not None:
            self._run(es, root_invoke(es, root, Phase.SERIAL, self.node_id), None)
        held, es.serial_held = es.serial_held, []
        for m in held:
            self.on_message(m)  # this transaction's run now; the others are held again

    def _root_done_fallback(self, es: EpochState, root: RootTxn, phase: Phase) -> None:
        outcome = fallback.outcome_of(root)
        final = Final(es.epoch, root.tid, outcome, es.gen)
        self.router.to_peers(final)
        if outcome == Outcome.RESCHEDULE:
            self.batch.rescheduled.append(root)
            es.tally.rescheduled += 1
        else:
            es.tally.finished(root)
            self.replies.send(es.epoch, [(root, reply_for(root, es.epoch, phase))])
        self.on_final(final)

    def on_final(self, msg: Final) -> None:
        es = self.epoch_state(msg.epoch)
        if es is None:
            return  # a repeat of a finished epoch's final
        if es.defer(msg):
            return
        if msg.tid in es.serial_pending:
            es.serial_pending.remove(msg.tid)
        if fallback.apply_final(es, msg, self.store):
            self._finish_epoch(es)
        else:
            self._next_serial(es)

    # ---- the end of an epoch -------------------------------------------------------------------------
    def _finish_epoch(self, es: EpochState) -> None:
        if es.finished:
            return
        es.finished = True
        es.locks.cancel_all()
        es.tally.epochs = 1
        self.totals.add(es.tally)
        del self.epochs[es.epoch]
        self.completed_epoch = es.epoch
        if es.snapshot:
            self._snapshot(es)
        t = es.tally
        rejected = t.by_status[Status.BAD]  # a bad request is not an abort of the workload's logic
        done = EpochDone(
            es.epoch,
            self.node_id,
            self.batch.pending(),
            t.committed,
            t.aborted - rejected,
            t.rescheduled,
            es.gen,
            rejected,
        )
        self.transport.send(COORDINATOR, done)
        early, self.early = self.early, []
        for m in early:
            self.on_message(m)

    def _snapshot(self, es: EpochState) -> None:
        """Cut a snapshot at this epoch boundary (synchronous: nothing runs in between; the parts are made
        and encoded in steps afterwards, styx_worker.snapshot)."""
        delta = self.store.take_delta()
        replies = self.replies.answered.take_delta()
        resched = [(r.partition, r.tid, r.offset, r.ts_ms, r.request) for r in self.batch.rescheduled]
        waiting = [rec for recs in self.replies.waiting.values() for rec in recs]
        seqlog_acked = self.seqlog.acked()
        parts = snapshot.capture_steps(
            es.epoch,
            delta,
            self.table.op_partitions,
            self.table.owned(),
            self.batch.ingress.positions(),
            resched,
            self.replies.egress.offsets(),
            seqlog_acked,
            replies,
            waiting,
            self.snapshots.rows,
        )
        flushed = self.replies.egress.flush()
        self.snapshots.take(es.epoch, es.gen, parts, (delta, replies), flushed, seqlog_acked)
