"""The epoch machine: the one place with phase-level control flow on a worker (pure, no I/O).

One epoch, as seen by a worker (the coordinator's side is :mod:`styx_coordinator.epochs`), with the
:class:`~styx_worker.txn.EpochPhase` it is in::

    OPEN       EpochStart(e, lc, snapshot?) ─► take the batch (batch.py), log it, run every root
    EXECUTING    optimistically against the pre-epoch state (effects Take, Log, Run)
    EXECUTED   all local roots acked ─► ExecDone(e, logic aborts) to every peer
    VOTING     every worker's ExecDone ─► local conflicts (conflicts.py) ─► Vote(e, conflicts, serial,
                 lc, pending) to the coordinator and every peer, once the batch's log entry is durable
    REVOTING   [some Vote names serial tids ─► conflicts without their writes ─► Revote(e) to all]
    FALLBACK   every Vote [Revote] ─► the decision (core/barrier.py, the same on every worker):
                 lock-free commit and early replies (commit.py, replies.py), then the fallback tids
                 re-run under locks in tid order (fallback.py, locks.py)
    SERIAL     then each serial tid alone, in tid order
    FINISHED   every fallback and serial tid final ─► snapshot if asked ─► EpochDone(e, pending);
                 the digests of its writes go into the next batch's log entry (digests.py)

A replayed epoch compares its writes with the digests its first run logged at every commit, and a
difference halts the worker, as a replayed reply that differs from the egress log does.

Every worker decides from the same reports, so no coordinator round trip stands between the votes and
the replies. A message that comes before the epoch is where it can be handled waits in the
:class:`~styx_worker.inbox.Inbox`: the next epoch's until this one finished here, an invocation until
its EpochStart, a fallback message until the decision, a serial transaction's until its turn.
The leaves compute and return values; this module decides what happens next, and says it as effects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, get_args

from styx_py.core.barrier import combine_exec, combine_revotes, combine_votes
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
    Refused,
    Revote,
    Status,
    Vote,
)
from styx_worker import effects, fallback, snapshot
from styx_worker.commit import commit_lock_free, reply_for
from styx_worker.conflicts import find_conflicts
from styx_worker.digests import EpochWrites
from styx_worker.effects import PortView, Send, Take, Taken
from styx_worker.inbox import EpochMessage, Until
from styx_worker.invocations import InvocationFlow
from styx_worker.scan import scan_races
from styx_worker.txn import EpochPhase, EpochState, RootTxn, TxnView, root_invoke

__all__ = ["EPOCH_MESSAGES", "EpochMachine", "PortView"]

log = logging.getLogger("styx.worker")

EPOCH_MESSAGES: tuple[type, ...] = get_args(EpochMessage)
"""What :meth:`EpochMachine.on_message` takes: every message that belongs to an epoch."""


class EpochMachine(InvocationFlow):
    """This worker's part of every epoch of the running generation: the phases."""

    def on_message(self, msg: EpochMessage) -> None:
        """A message of the current generation that belongs to an epoch."""
        if msg.epoch > self.completed_epoch + 1:
            # The next epoch began (the coordinator starts it once this one is decided, and peers may be
            # in it already) while this worker is still finishing the current one.
            self.inbox.hold(msg.epoch, Until.OPEN, msg)
            return
        _HANDLERS[type(msg)](self, msg)

    # ---- phase 1: the batch and its optimistic run ---------------------------------------------------
    def on_epoch_start(self, msg: EpochStart) -> None:
        es = self._epoch(msg.epoch)
        if es is None or es.phase >= EpochPhase.EXECUTING:
            return  # a repeat
        es.phase = EpochPhase.EXECUTING
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
        es.view = TxnView(self.node_id, graph, self.store, es)
        self.table.know(graph)
        # A replayed epoch's writes are compared with the digests its first run logged, if any.
        es.committed = EpochWrites(
            self.table.op_partitions, self.expected.pop(es.epoch, None), self.changelog.enabled
        )
        self._replay(self.inbox.release(es.epoch, Until.STARTED))
        self.batch.sequencer.rebalance(msg.lc)
        out = self.out.effects
        if msg.replay:
            out.append(effects.Fetch(es.epoch, es.gen, self.batch.to_fetch(es.epoch)))
            return
        self.replies.live()
        out.append(effects.Live(msg.segment))
        room = self.batch.room()
        out.append(Take(es.epoch, es.gen, room, version, len(self.batch.next_run)))

    def on_taken(self, ev: Taken) -> None:
        """The records of the epoch's batch: form it (or re-form a replayed one) and run its roots."""
        es = self.epochs.get(ev.epoch)
        if es is None or es.gen != ev.gen:
            return  # of an epoch that recovery ended
        if isinstance(ev.request, Take):
            # The entry carries the digests of the epoch finished before (styx_worker.digests).
            (roots, es.resends, copies), entry = self.batch.form(
                es.epoch, es.gen, ev.request.version, ev.records, self.written, ev.admitted, ev.depth_max
            )
            es.tally.refused = sum(isinstance(e, Refused) for e in entry.entries)
            self.written = (-1, [])
            es.logged = False
            self.out.effects.append(effects.Log(es.epoch, es.gen, entry))
        else:
            roots, es.resends, copies = self.batch.replayed(es.epoch, ev.records)
        for rec in copies:
            self.replies.wait_for_first(rec)
        es.roots_open = len(roots)
        for root in roots:
            root.reset()
            es.roots[root.tid] = root
        if not roots:
            self._executed(es)
            return
        for root in roots:
            assert es.graph is not None
            bad = self.table.misrouted(root.request, root.partition, es.graph)
            if bad is not None:
                root.record(Status.BAD, bad, [])
                es.opt.cache.setdefault(root.tid, [])
                self._root_done_optimistic(es)
                continue
            self._start(es, root_invoke(es, root, Phase.OPTIMISTIC, self.node_id), None)

    def _root_done_optimistic(self, es: EpochState) -> None:
        es.roots_open -= 1
        if es.roots_open == 0:
            self._executed(es)

    def _executed(self, es: EpochState) -> None:
        """Every root of the epoch here finished: ExecDone, at once, to the peers only (the Vote is what
        waits for the log entry, and it tells the coordinator what it needs)."""
        es.phase = EpochPhase.EXECUTED
        failed = sorted(tid for tid, root in es.roots.items() if root.failed)
        self._report(ExecDone(es.epoch, self.node_id, failed, es.gen))

    def _report(self, msg: ExecDone | Vote | Revote) -> None:
        """A report of this worker's: to every peer and to itself; a Vote or Revote to the coordinator
        too."""
        if not isinstance(msg, ExecDone):
            self.out.effects.append(Send(COORDINATOR, msg))
        self._to_peers(msg)
        self.on_report(msg)

    def _to_peers(self, msg: Message) -> None:
        out = self.out.effects
        for peer in self.table.peers:
            if peer != self.node_id:
                out.append(Send(peer, msg))

    # ---- phase 2: conflicts, and the decision every worker reaches from the same reports -------------
    def on_report(self, msg: ExecDone | Vote | Revote) -> None:
        es = self._epoch(msg.epoch)
        if es is None or es.phase >= EpochPhase.FALLBACK:
            return  # a repeat, or a report of an epoch decided already
        if es.gen < self.fence:
            return  # a recovery to a newer generation began: this epoch is replayed or re-formed
        workers = len(self.table.peers)
        r = es.reports
        if isinstance(msg, ExecDone):
            r.exec_done[msg.node_id] = msg
            if len(r.exec_done) == workers and es.phase < EpochPhase.VOTING:
                r.aborted = frozenset(combine_exec(list(r.exec_done.values())))
                self._vote(es)
        elif isinstance(msg, Vote):
            r.votes[msg.node_id] = msg
            if len(r.votes) == workers and es.phase == EpochPhase.VOTING:
                fallback_tids, r.serial = combine_votes(list(r.votes.values()))
                if not r.serial:
                    self._decide(es, fallback_tids, [])
                    return
                es.phase = EpochPhase.REVOTING
                self._report(Revote(es.epoch, self.node_id, self._conflicts(es, r.serial), es.gen))
                return
        else:
            r.revotes[msg.node_id] = msg
        if len(r.revotes) == workers and es.phase == EpochPhase.REVOTING:
            self._decide(es, combine_revotes(list(r.revotes.values()), r.serial), r.serial)

    def _conflicts(self, es: EpochState, serial: Iterable[int] = ()) -> list[int]:
        """This worker's conflicts; a Revote's leave out the writes of the serial tids (their branches
        may have raced)."""
        return find_conflicts(
            es.opt.reads, es.opt.writes, es.reports.aborted | frozenset(serial), es.opt.ranges, es.opt.adds
        )

    def _vote(self, es: EpochState) -> None:
        """Every worker executed: this worker's conflicts, sent once its log entry is durable.

        Peers decide (and reply) from the votes, so a worker votes only once every transaction it
        sequenced this epoch is in the sequencer log: an epoch with any reply out can always be
        replayed with exactly its composition.
        """
        es.phase = EpochPhase.VOTING
        # The sequencer counter after this epoch's batch: only the next EpochStart moves it.
        lc = self.batch.sequencer.lc
        if es.opt.ranges:  # tids that scanned here (styx_worker.scan)
            opt = es.opt
            opt.serial |= scan_races({t: opt.cache[t] for t in opt.ranges}, self.table.op_partitions)
        vote = Vote(
            es.epoch, self.node_id, self._conflicts(es), sorted(es.opt.serial), es.gen, lc, self.pending()
        )
        if es.logged:
            self._report(vote)
        else:
            es.reports.vote = vote

    def on_log_acked(self, ev: effects.LogAcked) -> None:
        es = self.epochs.get(ev.epoch)
        if es is None or es.gen != ev.gen:
            return
        es.logged = True
        vote, es.reports.vote = es.reports.vote, None
        if vote is not None:
            self._report(vote)

    # ---- phase 3: lock-free commit and early replies; phase 4: fallback under locks ------------------
    def _decide(self, es: EpochState, fallback_tids: list[int], serial: list[int]) -> None:
        es.phase = EpochPhase.FALLBACK
        replies = commit_lock_free(es, frozenset(fallback_tids) | frozenset(serial), self.store)
        wrong = es.committed.diverged
        if wrong is not None:
            # A replay whose writes differ from the first run's: the replies of lower tids go first,
            # and that tid's own if the egress log has it, to compare (a reply that differs too is
            # named with both results); one the log lacks does not leave. Then the worker halts.
            first = [
                (root, r)
                for root, r in replies
                if root.tid < wrong.tid or (root.tid == wrong.tid and self.replies.on_the_log(r))
            ]
            self.replies.send(es.epoch, first)
            self.on_diverged(es, wrong)
            return
        self.replies.send(es.epoch, replies)
        for partition, reply, reply_to in es.resends:
            self.replies.emit(es.epoch, partition, reply, reply_to)
        es.tally.fallback = len(fallback_tids) + len(serial)
        fallback.open_fallback(es, fallback_tids, serial)
        self._replay(self.inbox.release(es.epoch, Until.DECIDED))
        if es.phase == EpochPhase.FINISHED:
            return  # the finals it held were all it waited for
        for inv, cached in fallback.fallback_runs(
            es, fallback_tids, self.config.call_graph_caching, self.node_id
        ):
            self._admit(es, inv, cached)
        if not es.fb.pending:
            self._finish(es)
        else:
            self._next_serial(es)

    def _next_serial(self, es: EpochState) -> None:
        """Once the fallback is over here, let the next serial transaction in (its root starts it)."""
        fb = es.fb
        if not fb.serial or not fb.done() or fb.turn == fb.serial[0]:
            return
        es.phase = EpochPhase.SERIAL
        tid = fb.turn = fb.serial[0]
        root = es.roots.get(tid)
        if root is not None:
            self._start(es, root_invoke(es, root, Phase.SERIAL, self.node_id), None)
        self._replay(self.inbox.release(es.epoch, Until.TURN, tid))  # this one's; the others wait on

    def _root_done_fallback(self, es: EpochState, root: RootTxn, phase: Phase) -> None:
        outcome = fallback.outcome_of(root)
        final = Final(es.epoch, root.tid, outcome, es.gen)
        self._to_peers(final)
        if outcome == Outcome.RESCHEDULE:
            self.batch.rescheduled.append(root)
            es.tally.rescheduled += 1
        else:
            es.tally.finished(root)
            self.replies.send(es.epoch, [(root, reply_for(root, es.epoch, phase))])
        self.on_final(final)

    def on_final(self, msg: Final) -> None:
        es = self._epoch(msg.epoch)
        if es is None:
            return  # a repeat of a finished epoch's final
        if es.phase < EpochPhase.FALLBACK:
            self.inbox.hold(es.epoch, Until.DECIDED, msg)
            return
        fb = es.fb
        phase = Phase.SERIAL if msg.tid in fb.serial else Phase.FALLBACK
        if phase == Phase.SERIAL:
            fb.serial.remove(msg.tid)
        released = fallback.apply_final(es, msg, self.store, phase)
        if es.committed.diverged is not None:
            self.on_diverged(es, es.committed.diverged)
            return
        for key, tid in released:
            for inv, cached in fb.waiting.pop((key, tid), ()):
                self._admit(es, inv, cached)  # it may need another lock too (a scan's)
        if not fb.pending:
            self._finish(es)
        else:
            self._next_serial(es)

    # ---- the end of an epoch -------------------------------------------------------------------------
    def _finish(self, es: EpochState) -> None:
        if es.phase == EpochPhase.FINISHED:
            return  # a held final finished it while its decision was still being carried out
        wrong = es.committed.finished()
        if wrong is not None:
            self.on_diverged(es, wrong)
            return
        es.phase = EpochPhase.FINISHED
        es.tally.epochs = 1
        self.totals.add(es.tally)
        del self.epochs[es.epoch]
        self.completed_epoch = es.epoch
        self.written = (es.epoch, es.committed.logged(self.table.owned()))
        self.inbox.drop_epoch(es.epoch)
        out = self.out.effects
        out.append(effects.Closed(es.epoch))
        # Before the snapshot's upload, which waits for everything queued to be on the log.
        self.changelog.finished(es.epoch, es.committed.commits, self.table.op_partitions, out)
        if es.snapshot:
            self._snapshot(es)
        t = es.tally
        rejected = t.by_status[Status.BAD]  # a bad request is not an abort of the workload's logic
        done = EpochDone(
            es.epoch,
            self.node_id,
            self.pending(),
            t.committed,
            t.aborted - rejected,
            t.rescheduled,
            es.gen,
            rejected,
            t.refused,
        )
        out.append(Send(COORDINATOR, done))
        self._replay(self.inbox.release(es.epoch + 1, Until.OPEN))

    def _snapshot(self, es: EpochState) -> None:
        """Cut a snapshot at this epoch boundary (nothing runs in between; the parts are made and encoded
        in steps afterwards, off the epoch path: styx_worker.snapshot)."""
        upload, kept = snapshot.cut(
            es.epoch,
            es.gen,
            self.store,
            self.replies,
            self.batch.rescheduled,
            self.table,
            self.ports,
            self.config,
        )
        self.unconfirmed[es.epoch] = kept
        self.out.effects.append(upload)


_HANDLERS: dict[type, Callable[[EpochMachine, Any], None]] = {
    Invoke: InvocationFlow.on_invoke,
    Ack: InvocationFlow.on_ack_message,
    CallResult: InvocationFlow.on_call_result,
    Final: EpochMachine.on_final,
    EpochStart: EpochMachine.on_epoch_start,
    ExecDone: EpochMachine.on_report,
    Vote: EpochMachine.on_report,
    Revote: EpochMachine.on_report,
}
