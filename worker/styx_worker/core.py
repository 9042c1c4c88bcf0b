"""The worker's core: every message and event in, the effects it calls for out (pure, no I/O).

``WorkerCore.step(event)`` is the worker's logic as plain synchronous code. The events are the wire
messages of the coordinator and the peers, and what the shell reports back (an invocation that ended,
a synchronous call made, a log entry acknowledged, the ingress records asked for); the effects
(:mod:`styx_worker.effects`) are what the shell (:mod:`styx_worker.shell`) then carries out over the
ports, in order. The core holds the cluster view and routes on it, runs every epoch through the epoch
machine (:mod:`styx_worker.epoch`), emits replies (:mod:`styx_worker.replies`), hands partitions off at
a planned change (:mod:`styx_worker.handoff`) and stops for good when a replay diverges: a reply
unlike the egress log's, or writes unlike the digests the first run logged
(:mod:`styx_worker.digests`). Membership (:mod:`styx_worker.membership`), recovery
(:mod:`styx_worker.reconfig`) and code versions (:mod:`styx_worker.versions`) sit beside it in the
shell.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from styx_py.core.config import Config
from styx_py.core.graph import GraphVersion
from styx_py.core.partitioning import partition_of
from styx_py.core.segments import Cursor, cursor_of
from styx_py.core.wire import (
    COORDINATOR,
    BatchEntry,
    ClusterView,
    FindReplies,
    Halt,
    IngressRecord,
    LogLost,
    Message,
    ReadAt,
    ReadRows,
    Recover,
    ReplayDiverged,
    Reply,
    Retire,
    SnapshotResult,
)
from styx_worker import digests, effects, recovery, snapshot
from styx_worker.batch import BatchFormer
from styx_worker.dedup import ReplyTable
from styx_worker.digests import Divergence
from styx_worker.effects import Called, Effect, Event, Invoked, LogAcked, Outbox, PortView, Send, Taken
from styx_worker.epoch import EPOCH_MESSAGES, EpochMachine
from styx_worker.handoff import HandoffRefused, Moved, outgoing, refusal
from styx_worker.inbox import EpochMessage, Until
from styx_worker.lookup import find_replies
from styx_worker.replies import ReplyOut, shown
from styx_worker.routing import RoutingTable
from styx_worker.sequencer import Sequencer
from styx_worker.txn import EpochState
from styx_worker.versions import listed
from styx_worker.window import read_at

__all__ = ["CORE_MESSAGES", "WorkerCore"]

log = logging.getLogger("styx.worker")


class WorkerCore:
    def __init__(self, node_id: str, config: Config, ports: PortView) -> None:
        self.node_id = node_id
        self.ports = ports
        self.out = Outbox()
        self.table = RoutingTable(node_id)
        self.replies = ReplyOut(self.out, config.dedup_replies_per_partition, self._reply_diverged)
        self.batch = BatchFormer(node_id, config.epoch_size_max, self.replies, self._batch_diverged)
        self.epochs = EpochMachine(
            node_id, config, self.table, self.batch, self.replies, ports, self.out, self._writes_diverged
        )
        self.view: ClusterView | None = None
        self.versions: list[GraphVersion] = []  # every committed graph version (from the view)
        self.halted = ""  # why the cluster stopped for good (a replay diverged); "" while healthy
        self.leaving = False  # told to leave the cluster (Retire)
        self.consistent = True  # no restore left the state half-done (a shape change may keep it)
        self.recovering = False  # a recovery runs (styx_worker.reconfig): the reply tables are not whole

    @property
    def gen(self) -> int:
        return self.epochs.gen

    def step(self, event: Event) -> list[Effect]:
        """Handle one event; the effects it calls for, in the order they are to be carried out."""
        handler = _STEPS.get(type(event))
        if handler is None:
            raise AssertionError(f"worker {self.node_id}: unexpected {type(event).__name__}: {event!r}")
        handler(self, event)
        return self.out.take()

    def flush(self) -> list[Effect]:
        """The effects of a command (reset, apply_view) called outside :meth:`step`."""
        return self.out.take()

    # ---- epoch messages and the shell's events -------------------------------------------------------
    def _epoch_message(self, msg: EpochMessage) -> None:
        if self.halted:
            return  # the cluster stopped: nothing runs any more
        m = self.epochs
        if msg.gen == m.gen:
            m.on_message(msg)
        elif m.gen < 0:
            # No view yet, and a peer's report or call overtook it (peers send to each other directly):
            # it waits for the view.
            m.inbox.hold(-1, Until.VIEW, msg)
        else:
            # A message of a generation that recovery ended: its epoch numbers mean something else now.
            assert msg.gen < m.gen, f"{self.node_id}: from the future: {msg!r}"

    def _invoked(self, ev: Invoked) -> None:
        if not self.halted:
            self.epochs.on_invoked(ev)

    def _called(self, ev: Called) -> None:
        if not self.halted and ev.child.gen == self.epochs.gen:
            self.epochs.dispatch(ev.child)

    def _log_acked(self, ev: LogAcked) -> None:
        if not self.halted:
            self.epochs.on_log_acked(ev)

    def _taken(self, ev: Taken) -> None:
        if not self.halted:
            self.epochs.on_taken(ev)

    # ---- the cluster view --------------------------------------------------------------------------
    def _on_view(self, view: ClusterView) -> None:
        if self.view is not None and view.gen < self.view.gen:
            return  # an older view overtaken by a newer one
        if not any(w.node_id == self.node_id for w in view.workers):
            log.warning("%s: not in the view of generation %d (leaving the cluster)", self.node_id, view.gen)
            return
        m = self.epochs
        if view.handoff and 0 <= m.gen < view.gen:
            self._hand_off(view)  # before anything changes: the state is the barrier's
        self.view = view
        if m.gen < 0:
            # A (re)started worker joins the current generation; a running one changes generation
            # only through Recover, which also drops every epoch of the old one.
            m.gen = view.gen
        # Until then it decides no epoch of an older generation (recovery reads the log after this).
        m.fence = max(m.fence, view.gen)
        if view.gen == m.gen:
            self.apply_view()
        else:
            # The epochs of the running generation still finish on its placement (their snapshot);
            # the new view takes effect with its Recover, and their replies are held (replay sends them).
            self.replies.held = True
        self.out.effects.append(effects.ReportFenced(view.gen, False))
        for msg in m.inbox.release(-1, Until.VIEW):
            if msg.gen == m.gen:
                m.on_message(msg)

    def apply_view(self) -> None:
        """Route, sequence, read the ingress and run code as the view says (its newest graph version is
        loaded by the shell before: styx_worker.versions)."""
        view = self.view
        assert view is not None
        me = next(w for w in view.workers if w.node_id == self.node_id)
        self.table.update(view)
        self.replies.egress_partitions = len(view.placement)  # the egress topic has one per partition
        self.replies.lanes = self.table.owned()
        batch = self.batch
        batch.sequencer = Sequencer(me.sid, view.n_seq or len(view.workers), batch.sequencer.lc)
        batch.nodes = len(view.workers)
        self.versions = listed(view)
        if self.versions:
            # The running version (older ones are loaded by a recovery that replays their epochs).
            self.out.effects.append(effects.Load(self.versions[-1]))
        self.out.effects.append(effects.Assign(self.table.owned()))

    def _hand_off(self, view: ClusterView) -> None:
        """A planned change: send every partition this worker owns and ``view`` gives to another
        straight to that worker (styx_worker.handoff), or say it cannot (its state is not the barrier's)."""
        owner = view.placement
        gone = [p for p in self.table.owned() if owner[p] != self.node_id]
        if not gone:
            return
        m = self.epochs
        # The coordinator abandons a snapshot in progress: what it holds goes back into the delta, so
        # the next snapshot (this worker's or the new owner's) carries it.
        snapshot.put_back(m.unconfirmed, m.store, self.replies.answered)
        why = ""
        if not (self.consistent and not self.halted and not m.epochs):
            why = "its state is not at an epoch's end"
        elif self.recovering:
            why = "it is recovering"
        out: list[tuple[str, Message]] = []
        if not why:
            try:
                out = list(
                    outgoing(
                        view.gen,
                        m.completed_epoch,
                        {p: owner[p] for p in gone},
                        self.table.op_partitions,
                        m.store,
                        self.replies.answered,
                        self.ports.positions(),
                        self.batch.rescheduled,
                        [r for recs in self.replies.waiting.values() for r in recs],
                        self.ports.egress_offsets(),
                    )
                )
            except HandoffRefused as exc:
                why = str(exc)
        if why:  # the new owners' recovery fails at once, and a full one (from S3) follows
            log.warning("%s: not handing off %s: %s", self.node_id, gone, why)
            out = [(owner[p], refusal(view.gen, p)) for p in gone]
        else:
            log.warning("%s: handing off %s after epoch %d", self.node_id, gone, m.completed_epoch)
        self.out.effects.extend(Send(dest, piece) for dest, piece in out)

    # ---- leaving, halting, verdicts, lookups -------------------------------------------------------
    def _retire(self, msg: Retire) -> None:
        """Drained or replaced: decide nothing more of any generation before ``msg.gen``, say so (the
        coordinator reads the logs only after that), send no more replies, and leave."""
        if self.leaving:
            return
        self.leaving = True
        log.warning("%s: leaving the cluster: %s", self.node_id, msg.reason)
        m = self.epochs
        if msg.view is not None and msg.view.handoff and 0 <= m.gen < msg.view.gen:
            self._hand_off(msg.view)
        m.fence = max(m.fence, msg.gen)
        self._halt(f"retired: {msg.reason}", level=logging.WARNING)
        self.out.effects.append(effects.ReportFenced(msg.gen, True))

    def log_lost(self, what: str) -> None:
        """The broker lost part of the log, as this worker found: tell the coordinator, which stops the
        cluster (state ``log-lost``), and run nothing more."""
        if not self.halted:
            self.out.effects.append(Send(COORDINATOR, LogLost(self.node_id, what)))
            self._halt(f"log lost: {what}")

    def _on_halt(self, msg: Halt) -> None:
        self._halt(msg.reason)

    def _halt(self, reason: str, level: int = logging.CRITICAL) -> None:
        """Run nothing more and say why (``/readyz``); the coordinator keeps the cluster stopped."""
        if not self.halted:
            log.log(level, "%s: %s", self.node_id, reason)
        self.halted = reason
        self.replies.stopped = True
        self.out.effects.append(effects.Halt(reason))

    def _snapshot_result(self, msg: SnapshotResult) -> None:
        m = self.epochs
        if msg.gen == m.gen:  # else the verdict on a snapshot of a generation that recovery ended
            snapshot.on_result(m.unconfirmed, msg, m.store, self.replies.answered)

    def _find_replies(self, msg: FindReplies) -> None:
        """A gateway's reply lookup (see :mod:`.lookup`): whole tables only when not recovering, not
        replaying, and of the generation the coordinator asked in."""
        running = set(self.replies.waiting)
        running.update(r.request.request_id for r in self.batch.rescheduled)
        for es in self.epochs.epochs.values():
            running.update(root.request.request_id for root in es.roots.values())
        m = self.epochs
        whole = not self.recovering and not self.batch.replay and msg.gen == m.gen
        found = find_replies(msg, self.node_id, self.replies.answered, running, whole, m.traces)
        self.out.effects.append(Send(COORDINATOR, found))

    def _read_at(self, msg: ReadAt) -> None:
        """A consistent read as of an epoch (:mod:`.window`): refused while the state is not whole."""
        m = self.epochs
        if self.halted or self.recovering or not self.consistent or msg.gen != m.gen:
            found = ReadRows(msg.read, self.node_id, [], "unavailable", "recovering: retry", -1)
        else:
            owned = self.table.owned()
            found = read_at(msg, self.node_id, m.store, m.window, m.completed_epoch, owned.__contains__)
        self.out.effects.append(Send(COORDINATOR, found))

    # ---- reconfiguration: styx_worker.reconfig reads and waits, these install -----------------------
    def begin_recovery(self, msg: Recover) -> tuple[bool, set[int]]:
        """Generation ``msg.gen`` starts here: every epoch in flight is forgotten and the view applied
        (its effects: :meth:`flush`). Whether this worker keeps its state, and the partitions it owned:
        at a shape change at a barrier its state is that of the last epoch that ran (it finished it and
        no restore touched it since) and it keeps what it still owns; a worker that just joined holds
        nothing and takes all it owns from the old owners; otherwise it restores from S3."""
        m = self.epochs
        m.reset(msg.gen)
        fresh = m.completed_epoch < 0 and not len(m.store)
        keep = msg.keep and (fresh or (self.consistent and m.completed_epoch == msg.replay_until))
        self.consistent = False
        owned_before = set() if fresh else set(self.table.owned())
        self.apply_view()
        self.replies.held = False  # the replayed epochs send what is not on the log yet
        if keep:  # a snapshot the coordinator abandoned: the next one carries what it held
            snapshot.put_back(m.unconfirmed, m.store, self.replies.answered)
        else:
            m.unconfirmed.clear()
        return keep, owned_before

    def install_moved(self, msg: Recover, gone: set[int], moved: dict[int, Moved]) -> dict[int, Cursor]:
        """A planned change: drop the partitions ``gone``, take the ones handed over (``moved``); the
        ingress positions of those taken. Nothing is replayed: every worker is at the barrier's epoch."""
        m, batch = self.epochs, self.batch
        n = self.table.op_partitions
        m.store.drop(lambda key: partition_of(key[1], n[key[0]]) in gone)
        answered = ReplyTable(self.replies.answered.cap)
        waiting: dict[str, list[IngressRecord]] = {}
        rescheduled = [t for t in batch.rescheduled if t.partition not in gone]
        for p, piece in moved.items():
            m.store.load(((op, key), value) for op, key, value in piece.data)
            m.store.delta.update(((op, key), value) for op, key, value in piece.delta)
            for reply in piece.last.replies:
                answered.record(p, reply, as_delta=False)
            rescheduled += recovery.resumed(p, piece.last.rescheduled)
            recovery.add_waiting(waiting, p, piece.last.waiting)
        batch.rescheduled = sorted(rescheduled, key=lambda t: t.tid)
        batch.replay = {}
        batch.sequencer.lc = max(batch.sequencer.lc, msg.manifest.lc)
        self.replies.move(gone, answered, waiting)
        self.replies.answered.restore_delta({p: list(piece.last.reply_delta) for p, piece in moved.items()})
        m.completed_epoch = msg.replay_until
        m.window.restart(msg.replay_until)  # the moved partitions' versions stayed behind
        return {p: cursor_of(piece.last.position, piece.last.cursor) for p, piece in moved.items()}

    def install_restored(self, msg: Recover, r: recovery.Restored) -> None:
        """A full recovery: the state of the snapshot ``msg`` names, and the epochs to replay after it."""
        m, batch = self.epochs, self.batch
        m.install_store(r.store, msg.manifest.epoch)
        m.completed_epoch = msg.manifest.epoch
        batch.rescheduled = r.rescheduled
        batch.replay = r.replay
        batch.sequencer.lc = msg.manifest.lc
        self.replies.restore(r.answered, r.waiting, {})
        m.expected = r.digests
        # Digests of an epoch the restored state does not come from: no recovery replays it again
        # (every later one starts from this snapshot or a newer one), and the replay makes its own.
        m.written = (-1, [])

    # ---- a replay that diverges stops the cluster ----------------------------------------------------
    def _reply_diverged(self, epoch: int, logged: Reply, replayed: Reply) -> None:
        es = self.epochs.epochs.get(epoch)
        root = es.roots.get(logged.tid) if es is not None else None
        function = f"{root.request.operator}.{root.request.function}" if root is not None else ""
        self._diverged(epoch, logged.request_id, function, shown(logged), shown(replayed))

    def _batch_diverged(self, epoch: int, logged: BatchEntry, replayed: str) -> None:
        kind = type(logged).__name__.lower()
        self._diverged(epoch, logged.request_id, "", f"a batch entry {kind}", f"{replayed.lower()}")

    def _writes_diverged(self, es: EpochState, wrong: Divergence) -> None:
        """A replayed transaction's writes on a partition differ from its first run's: named by the
        functions it invoked here on that partition's entities (those that wrote, if any did)."""
        n = self.table.op_partitions
        here = [
            c.inv
            for c in es.opt.cache.get(wrong.tid, ())
            if partition_of(c.inv.key, n[c.inv.operator]) == wrong.partition
        ]
        wrote = es.opt.writes.get(wrong.tid, {})
        writers = [inv for inv in here if (inv.operator, inv.key) in wrote] or here
        function = ", ".join(sorted({f"{inv.operator}.{inv.function}" for inv in writers}))
        root = es.roots.get(wrong.tid)
        request_id = root.request.request_id if root is not None else ""
        logged, replayed = digests.shown(wrong.logged), digests.shown(wrong.replayed)
        self._diverged(es.epoch, request_id, function, logged, replayed, wrong.partition, wrong.tid)

    def _diverged(
        self,
        epoch: int,
        request_id: str,
        function: str,
        logged: str,
        replayed: str,
        partition: int = -1,
        tid: int = -1,
    ) -> None:
        if self.halted:
            return
        msg = ReplayDiverged(
            self.node_id, epoch, request_id, function, logged, replayed, self.gen, partition, tid
        )
        self.out.effects.append(Send(COORDINATOR, msg))
        self._halt(msg.describe())


_STEPS: dict[type, Callable[[WorkerCore, Any], None]] = {
    **{t: WorkerCore._epoch_message for t in EPOCH_MESSAGES},
    Invoked: WorkerCore._invoked,
    Called: WorkerCore._called,
    LogAcked: WorkerCore._log_acked,
    Taken: WorkerCore._taken,
    ClusterView: WorkerCore._on_view,
    Retire: WorkerCore._retire,
    Halt: WorkerCore._on_halt,
    SnapshotResult: WorkerCore._snapshot_result,
    FindReplies: WorkerCore._find_replies,
    ReadAt: WorkerCore._read_at,
}
CORE_MESSAGES = frozenset(t for t in _STEPS if t not in (Invoked, Called, LogAcked, Taken))
"""The wire messages the core handles (the shell handles the others)."""
