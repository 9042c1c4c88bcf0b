"""An invocation's messages on one worker: where it runs, when a held one is let in, where its result
and its ack go (pure; the half of the epoch machine that deals in single transactions).

An :class:`~styx_py.core.wire.Invoke` runs on the worker that owns its entity: here it becomes a
:class:`~styx_worker.effects.Run` once the epoch is started (its code is known) and, in the fallback, once
its tid holds its entity's lock (:mod:`styx_worker.locks`). Its end (:class:`~styx_worker.effects.Invoked`)
dispatches its asynchronous calls, sends its result to its caller and its ack, with the share it kept, to
its root's worker, which sums the shares (:mod:`styx_worker.ackshare`) and tells the epoch machine when a
root's call graph is complete. A message that belongs to a later point of its epoch (a fallback message
before the decision, a serial one before its turn) waits in the inbox.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from styx_py.core.config import Config
from styx_py.core.graph import Graph
from styx_py.core.wire import Ack, CallResult, Invoke, Phase, Status, Written
from styx_worker import effects
from styx_worker.ackshare import Share, from_wire, to_wire
from styx_worker.batch import BatchFormer
from styx_worker.changelog import Changelog
from styx_worker.digests import Divergence, Logged
from styx_worker.effects import Deliver, Invoked, Outbox, PortView, Send
from styx_worker.executor import EMPTY_RAW
from styx_worker.inbox import EpochMessage, Inbox, Until
from styx_worker.replies import ReplyOut
from styx_worker.routing import RoutingTable
from styx_worker.snapshot import Unconfirmed
from styx_worker.state import StateStore
from styx_worker.traces import Traces
from styx_worker.txn import CachedInvocation, EpochPhase, EpochState, RootTxn, Tally
from styx_worker.window import VersionWindow

__all__ = ["InvocationFlow", "WritesDiverged"]

WritesDiverged = Callable[[EpochState, Divergence], None]  # a replayed epoch's writes differ


class InvocationFlow:
    """The per-transaction half of the epoch machine: where each invocation runs, when a held message
    is let in, and where each result and ack goes. The epoch machine (:class:`~styx_worker.epoch.
    EpochMachine`, a subclass) moves the phases and hears when a root finished."""

    def __init__(
        self,
        node_id: str,
        config: Config,
        table: RoutingTable,
        batch: BatchFormer,
        replies: ReplyOut,
        ports: PortView,
        out: Outbox,
        on_diverged: WritesDiverged,
    ) -> None:
        self.node_id = node_id
        self.on_diverged = on_diverged
        self.config = config
        self.table = table
        self.batch = batch
        self.replies = replies
        self.ports = ports
        self.out = out
        # The versions kept for reads as of recent epochs (styx_worker.window), across store swaps.
        self.window = VersionWindow(config.state_window_epochs)
        self.store = StateStore(window=self.window)
        # Graph versions loaded (styx_worker.versions): a live epoch runs the one its EpochStart names, a
        # replayed one the one its log entry names, so the transactions of an epoch never mix versions.
        self.graphs: dict[int, Graph] = {}
        self.gen = -1  # the cluster generation; until the first view a restarted worker ignores traffic
        self.fence = -1  # the newest generation in a view: no epoch of an older one is decided here
        self.epochs: dict[int, EpochState] = {}
        self.completed_epoch = -1
        self.inbox = Inbox()
        self.totals = Tally()  # since the start; read by the metrics
        self.unconfirmed: Unconfirmed = {}  # snapshots' deltas until the coordinator's verdict
        # The digests of the last epoch finished here, until the next batch's log entry carries them
        # (styx_worker.digests); and those of the epochs a recovery replays, as first logged.
        self.written: tuple[int, list[Written]] = (-1, [])
        self.expected: dict[int, Logged] = {}
        self.changelog = Changelog(bool(config.changelog_topic))  # what the epochs commit, to the topic
        self.traces = Traces()  # the invocations of recent transactions, for the invocation view

    def reset(self, gen: int) -> None:
        """A recovery: every epoch in flight is forgotten; the new generation starts."""
        self.epochs.clear()
        self.inbox.clear()
        self.gen = gen
        self.expected = {}

    def install_store(self, store: StateStore, epoch: int) -> None:
        """A restore: ``store`` holds the state as of ``epoch``; the window restarts there."""
        store.window = self.window
        self.window.restart(epoch)
        self.store = store

    def pending(self) -> int:
        """Transactions waiting to run: rescheduled ones and requests buffered from the ingress."""
        return len(self.batch.rescheduled) + self.ports.pending()

    # ---- messages ------------------------------------------------------------------------------------
    def on_message(self, msg: EpochMessage) -> None:
        raise NotImplementedError  # EpochMachine

    def _root_done_optimistic(self, es: EpochState) -> None:
        raise NotImplementedError  # EpochMachine

    def _root_done_fallback(self, es: EpochState, root: RootTxn, phase: Phase) -> None:
        raise NotImplementedError  # EpochMachine

    def _replay(self, msgs: list[EpochMessage]) -> None:
        for m in msgs:
            self.on_message(m)

    def _epoch(self, epoch: int) -> EpochState | None:
        if epoch <= self.completed_epoch:
            return None  # a late message of a finished epoch (e.g. an unneeded cached call result)
        es = self.epochs.get(epoch)
        if es is None:
            es = self.epochs[epoch] = EpochState(epoch, self.gen)
        return es

    def _held(self, es: EpochState, msg: Invoke | CallResult | Ack) -> bool:
        """Hold a fallback message until the decision, a serial one until its transaction's turn."""
        if es.phase < EpochPhase.FALLBACK:
            self.inbox.hold(es.epoch, Until.DECIDED, msg)
            return True
        if msg.phase == Phase.SERIAL and not (es.phase == EpochPhase.SERIAL and es.fb.turn == msg.tid):
            self.inbox.hold(es.epoch, Until.TURN, msg, msg.tid)
            return True
        return False

    def on_invoke(self, inv: Invoke) -> None:
        es = self._epoch(inv.epoch)
        if es is None:
            return  # a repeat of an invocation of a finished epoch
        if es.phase < EpochPhase.EXECUTING:
            # A peer started the epoch first: which code runs is known at this worker's EpochStart.
            self.inbox.hold(inv.epoch, Until.STARTED, inv)
            return
        if inv.phase != Phase.OPTIMISTIC and self._held(es, inv):
            return
        key = (inv.phase, inv.tid, tuple(inv.path))
        if key in es.invoked:
            return  # a repeat: run each invocation once
        es.invoked.add(key)
        if inv.phase == Phase.FALLBACK:
            self._admit(es, inv, None)
        else:
            self._start(es, inv, None)

    def _start(self, es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        assert es.view is not None
        self.out.effects.append(effects.Run(inv, cached, es.view))

    def _admit(self, es: EpochState, inv: Invoke, cached: CachedInvocation | None) -> None:
        """A fallback invocation starts once its tid holds its entity's lock (and its partition's scan
        lock, if it queued on one); one whose entity is not in its learned read/write set changed its call
        graph (its transaction is rescheduled)."""
        key, locks = (inv.operator, inv.key), es.fb.locks
        if not locks.owns_key(inv.tid, key):
            own = cached.own_share if cached is not None else from_wire(inv.share_n, inv.share_d)
            self.on_invoked(Invoked(inv, Status.CHANGED, "", EMPTY_RAW, own, [], []))
            return
        blocked = locks.blocked(key, inv.tid)
        if blocked is None:
            self._start(es, inv, cached)
        else:
            es.fb.waiting.setdefault((blocked, inv.tid), []).append((inv, cached))

    def on_invoked(self, ev: Invoked) -> None:
        """An invocation ended: dispatch its asynchronous calls, then its result and its ack."""
        inv = ev.inv
        es = self.epochs.get(inv.epoch)
        if es is None or es.gen != inv.gen:
            return  # of an epoch that recovery ended
        for child in ev.children:
            self.dispatch(child)
        writes = (es.opt.writes if inv.phase == Phase.OPTIMISTIC else es.fb.writes).get(inv.tid, {})
        if inv.phase == Phase.FALLBACK and ev.status == Status.OK:
            key = (inv.operator, inv.key)
            if key in writes and es.fb.locks.shares(inv.tid, key):
                # It only read this entity in the optimistic run, so it holds it as a reader beside
                # others: a write now changed its read/write set (rescheduled, the write dropped).
                ev.status = Status.CHANGED
        self.traces.record(inv, ev.status, (inv.operator, inv.key) in writes)
        if inv.phase == Phase.OPTIMISTIC:
            es.opt.cache_invocation(inv, ev.calls, ev.own)
        if inv.want_result:
            msg = CallResult(inv.epoch, inv.tid, inv.phase, inv.path, ev.status, ev.value, inv.gen)
            if inv.parent == self.node_id:
                self.on_call_result(msg)
            else:
                self.out.effects.append(Send(inv.parent, msg))
        self._ack(inv, ev.own, ev.status, ev.error, ev)

    def _ack(self, inv: Invoke, own: Share, status: Status, error: str, ev: Invoked) -> None:
        ack = Ack(inv.epoch, inv.tid, inv.phase, *to_wire(own), status, error, inv.path, inv.gen)
        if inv.root == self.node_id:
            # The root invocation's own result travels with its ack (no CallResult for the root).
            self._on_ack(ack, ev.value if not inv.path else None)
        else:
            self.out.effects.append(Send(inv.root, ack))

    def dispatch(self, inv: Invoke) -> None:
        """Run ``inv`` on the worker that owns its entity (this one, or a peer)."""
        owner = self.table.owner_of(inv.operator, inv.key)
        if owner == self.node_id:
            self.on_invoke(inv)
        else:
            self.out.effects.append(Send(owner, inv))

    def on_call_result(self, msg: CallResult) -> None:
        es = self._epoch(msg.epoch)
        if es is None or (msg.phase != Phase.OPTIMISTIC and self._held(es, msg)):
            return
        self.out.effects.append(
            Deliver(msg.epoch, (msg.phase, msg.tid, tuple(msg.path)), msg.status, msg.value)
        )

    def on_ack_message(self, ack: Ack) -> None:
        self._on_ack(ack, None)

    def _on_ack(self, ack: Ack, root_value: Any) -> None:
        es = self._epoch(ack.epoch)
        if es is None or (ack.phase != Phase.OPTIMISTIC and self._held(es, ack)):
            return  # a repeat of an ack of a finished epoch, or held
        root = es.roots[ack.tid]
        path = tuple(ack.path)
        if path in root.acked or ack.phase != root.phase:
            return  # a repeat (every invocation acks once), or of a run before this one
        root.acked.add(path)
        if not ack.path:
            root.result = root_value
        root.record(ack.status, ack.error, ack.path)
        if root.collector.add(from_wire(ack.share_n, ack.share_d)):
            if ack.phase == Phase.OPTIMISTIC:
                self._root_done_optimistic(es)
            else:
                self._root_done_fallback(es, root, ack.phase)
