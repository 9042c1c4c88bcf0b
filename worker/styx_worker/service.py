"""A worker: its lifecycle, the messages it receives, the cluster view it runs in, and recovery.

The :class:`Worker` wires the pieces of the data path together (``build`` below) and routes every
message: epoch messages of the current generation to the epoch driver (:mod:`.epoch`), cluster
views, snapshot verdicts and recovery orders to their handlers here. It also keeps the worker alive
in the cluster: registration, heartbeats from its own event loop, and fencing — a worker that heard
nothing from the coordinator for longer than the failure timeout may have been replaced, so it stops
before sending another reply.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

from styx_py.core.blobs import BlobStore
from styx_py.core.config import Config
from styx_py.core.errors import GraphError
from styx_py.core.graph import GraphVersion, load_graph
from styx_py.core.partitioning import partition_of
from styx_py.core.ports import Clock, Egress, Ingress, LogReader, LoopClock, SequencerLog, Transport
from styx_py.core.segments import cursor_of
from styx_py.core.wire import (
    COORDINATOR,
    UNDECODABLE,
    BatchEntry,
    ClusterView,
    Fenced,
    FindReplies,
    FoundReplies,
    GraphPrepared,
    Halt,
    Handoff,
    Heartbeat,
    IngressRecord,
    Message,
    PrepareGraph,
    PushedRequest,
    Recover,
    RecoverDone,
    Register,
    ReplayDiverged,
    Reply,
    ReplyStatus,
    Retire,
    SeqLogEntry,
    SnapshotResult,
    SubscribeReplies,
    WorkAvailable,
    decode_value,
)
from styx_worker import recovery
from styx_worker.batch import BatchFormer
from styx_worker.dedup import ReplyTable
from styx_worker.epoch import EPOCH_MESSAGES, EpochDriver, EpochMessage
from styx_worker.feed import ReplyFeed
from styx_worker.handoff import HandoffRefused, Inbox, outgoing, refusal
from styx_worker.lookup import find_replies
from styx_worker.metrics import WorkerGauges, WorkerMetrics
from styx_worker.replies import ReplyOut
from styx_worker.routing import RoutingTable
from styx_worker.sequencer import Sequencer
from styx_worker.snapshot import Snapshotter
from styx_worker.state import StateStore
from styx_worker.txn import Tally

log = logging.getLogger("styx.worker")

MAX_BEFORE_VIEW = 10_000  # peers' messages a worker without a view keeps for it

# Messages that belong to one generation of the cluster (dropped once a recovery moved past it).


def shown(reply: Reply) -> str:
    """A reply as a person reads it: its outcome and its result or error (clipped)."""
    if reply.status == ReplyStatus.COMMITTED:
        try:
            value = repr(decode_value(reply.result))
        except UNDECODABLE:
            value = "<undecodable>"
    else:
        value = repr(reply.error)
    return f"{reply.status!s} {value[:200]} (tid {reply.tid})"


class _Left(Exception):
    """The worker was told to leave the cluster (Retire): its tasks stop."""


def fence_off() -> None:
    """Leave at once, without flushing anything: this process may already have been replaced."""
    os._exit(70)


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
        clock: Clock | None = None,
        host: str = "",
        port: int = 0,
        heartbeats: bool = True,
        on_fenced: Callable[[], None] = fence_off,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.transport = transport
        self.ingress = ingress
        self.egress = egress
        self.blobs = blobs
        self.logs = logs
        self.clock = clock or LoopClock()
        self.host, self.port = host, port
        self.heartbeats = heartbeats
        self.on_fenced = on_fenced
        self.fenced = False
        self.inflight: set[asyncio.Task[None]] = set()
        self.tasks: asyncio.TaskGroup | None = None
        self.recovering: asyncio.Task[None] | None = None
        self.view: ClusterView | None = None
        self.before_view: list[EpochMessage] = []  # peers' epoch messages that arrived before the first view
        self.versions: list[GraphVersion] = []  # every committed graph version (from the view)
        self.graph_paths: dict[int, str] = {}  # version -> import path, of those loaded in driver.graphs
        self.coordinator_seen = -1.0  # clock time of the last word from the coordinator (set in run)
        self.registered_at = -1.0  # clock time of the last Register sent
        self.metrics = WorkerMetrics(self)  # read at scrape time; nothing per transaction
        self.table = RoutingTable(node_id)
        self.halted = ""  # why the cluster stopped for good (a replay diverged); "" while healthy
        self.retired = asyncio.Event()  # no longer part of the cluster (Retire): run() returns
        self.consistent = True  # no restore left the state half-done (a shape change may keep it)
        self.handoffs = Inbox()  # partitions handed to this worker at a planned change (styx_worker.handoff)
        self.feed = ReplyFeed(transport.send, egress.offsets)
        self.replies = ReplyOut(
            egress, config.dedup_replies_per_partition, self._check_lease, self._reply_diverged, self.feed
        )
        self.batch = BatchFormer(node_id, config.epoch_size_max, ingress, self.replies, self._batch_diverged)
        self.snapshots = Snapshotter(
            node_id,
            blobs,
            transport,
            self.spawn,
            self.metrics.snapshot,
            config.snapshot_step_rows,
            config.snapshot_step_pause_ms / 1000,
        )
        self.driver = EpochDriver(
            config, transport, self.table, self.batch, self.replies, seqlog, self.snapshots, self.spawn
        )
        ingress.set_listener(self._on_ingress_available)

    @property
    def generation(self) -> int:
        return self.driver.gen

    @property
    def totals(self) -> Tally:
        return self.driver.totals

    @property
    def store(self) -> StateStore:
        return self.driver.store

    # ---- lifecycle -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve until cancelled, or until told to leave the cluster (then it returns). Every
        invocation task is a child of this task group."""
        try:
            async with asyncio.TaskGroup() as tg:
                self.tasks = tg
                try:
                    self.coordinator_seen = self.clock.now()
                    self._register()
                    if self.heartbeats:
                        tg.create_task(self._heartbeat_loop())
                    await self.retired.wait()
                    raise _Left  # cancels every task of the group
                finally:
                    self.driver.runs.close()  # queued invocations are cancelled with the tasks
        except* _Left:
            log.warning("%s: left the cluster", self.node_id)

    async def _heartbeat_loop(self) -> None:
        # Sent from the worker's own event loop: a hung loop stops heartbeats and counts as failed.
        interval = self.config.heartbeat_interval_ms / 1000
        timeout_s = self.config.failure_timeout_ms / 1000
        while True:
            load = dict(self.batch.sequenced)
            self.transport.send(COORDINATOR, Heartbeat(self.node_id, self.driver.completed_epoch, load))
            now = self.clock.now()
            if now - self.coordinator_seen > timeout_s and now - self.registered_at > timeout_s:
                # No echo for a failure timeout: the coordinator does not count this worker as a
                # member (its Register was lost while the coordinator restarted), so say it again.
                log.warning(
                    "%s: no word from the coordinator for %.1f s: registering again",
                    self.node_id,
                    now - self.coordinator_seen,
                )
                self._register()
            await self.clock.sleep(interval)

    def _register(self) -> None:
        self.registered_at = self.clock.now()
        self.transport.send(COORDINATOR, Register(self.node_id, self.host, self.port))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a child of the worker's task group; recovery cancels what is in flight."""
        assert self.tasks is not None, "worker not running"
        task = self.tasks.create_task(coro)
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    def on_disconnect(self, peer: str) -> None:
        """A connection broke. The coordinator's: register again (delivered once it is back). A
        client's: push it nothing more."""
        if peer == COORDINATOR:
            self._register()
        else:
            self.feed.drop(peer)

    def _on_ingress_available(self) -> None:
        if self.view is not None:
            self.transport.send(COORDINATOR, WorkAvailable(self.node_id))

    def _check_lease(self) -> None:
        """Fencing: a worker that heard nothing from the coordinator for longer than the failure
        timeout may have been declared dead and replaced; it must not send another reply."""
        if not self.heartbeats or self.fenced:
            return
        silent_ms = (self.clock.now() - self.coordinator_seen) * 1000
        if silent_ms > self.config.failure_timeout_ms:
            self.fenced = True
            log.critical(
                "%s: no word from the coordinator for %.0f ms: fencing myself off", self.node_id, silent_ms
            )
            self.on_fenced()

    # ---- messages ----------------------------------------------------------------------------------
    def on_message(self, src: str, msg: Message) -> None:
        if src == COORDINATOR:
            self.coordinator_seen = self.clock.now()
        if isinstance(msg, EPOCH_MESSAGES):
            if self.halted:
                return  # the cluster stopped: nothing runs any more
            if msg.gen == self.driver.gen:
                self.driver.on_message(msg)
                return
            if self.driver.gen < 0:
                # No view yet, and a peer's report or call overtook it (peers send to each other
                # directly): it waits for the view (bounded: only what was sent before the view came).
                if len(self.before_view) < MAX_BEFORE_VIEW:
                    self.before_view.append(msg)
                return
            # A message of a generation that recovery ended: its epoch numbers mean something else now.
            assert msg.gen < self.driver.gen, f"{self.node_id}: from the future: {msg!r}"
            return
        match msg:
            case ClusterView():
                self.on_view(msg)
            case Heartbeat():
                pass  # the coordinator's echo: renews the lease (coordinator_seen, above)
            case Halt():
                self._halt(msg.reason)
            case Retire():
                self._retire(msg)
            case Handoff() if not self.halted:
                self.handoffs.add(msg, self.driver.gen)
            case Handoff():
                pass
            case SnapshotResult() if msg.gen != self.driver.gen:
                pass  # the verdict on a snapshot of a generation that recovery ended
            case SnapshotResult():
                self.snapshots.on_result(msg, self.driver.store, self.replies.answered)
            case FindReplies():
                self.transport.send(COORDINATOR, self._find_replies(msg))
            case PrepareGraph():
                self.transport.send(COORDINATOR, self._prepare(msg))
            case SubscribeReplies():
                self.feed.subscribe(src, msg.marks)
            case PushedRequest() if not self.halted:
                self.ingress.offer(msg)
            case PushedRequest():
                pass
            case Recover() if self.halted:
                log.error("%s: the cluster is degraded; no recovery (%s)", self.node_id, self.halted)
            case Recover() if self.view is None or self.view.gen != msg.gen:
                # The view of this generation went to this worker's previous process (it restarted
                # in between): without it this worker knows neither placement nor graph. Its own
                # registration makes the coordinator start a newer generation.
                log.warning("%s: ignoring recovery to generation %d: no view of it", self.node_id, msg.gen)
            case Recover():
                assert self.tasks is not None
                if self.recovering is not None:
                    self.recovering.cancel()
                self.recovering = self.tasks.create_task(self.recover(msg))
            case _:
                raise AssertionError(
                    f"worker {self.node_id}: unexpected message {type(msg).__name__} from {src}"
                )

    def on_view(self, view: ClusterView) -> None:
        if self.view is not None and view.gen < self.view.gen:
            return  # an older view overtaken by a newer one
        if not any(w.node_id == self.node_id for w in view.workers):
            log.warning("%s: not in the view of generation %d (leaving the cluster)", self.node_id, view.gen)
            return
        if view.handoff and 0 <= self.driver.gen < view.gen:
            self._hand_off(view)  # before anything changes: the state is the barrier's
        self.view = view
        if self.driver.gen < 0:
            # A (re)started worker joins the current generation; a running one changes generation
            # only through Recover, which also drops every epoch of the old one.
            self.driver.gen = view.gen
        # Until then it decides no epoch of an older generation (recovery reads the log after this).
        self.driver.fence = max(self.driver.fence, view.gen)
        if view.gen == self.driver.gen:
            self._apply(view)
        else:
            # The epochs of the running generation still finish on its placement (their snapshot);
            # the new view takes effect with its Recover, and their replies are held (replay sends them).
            self.replies.held = True
        self._report_fenced(view.gen)
        held, self.before_view = self.before_view, []
        for m in held:
            if m.gen == self.driver.gen:
                self.driver.on_message(m)

    def _apply(self, view: ClusterView) -> None:
        """Route, sequence, read the ingress and run code as ``view`` says."""
        me = next(w for w in view.workers if w.node_id == self.node_id)
        self.table.update(view)
        self.replies.egress_partitions = len(view.placement)  # the egress topic has one per partition
        self.replies.lanes = self.table.owned()
        self.batch.sequencer = Sequencer(me.sid, view.n_seq or len(view.workers), self.batch.sequencer.lc)
        self.batch.nodes = len(view.workers)
        self.versions = view.versions or (
            [GraphVersion(1, view.graph_path, 0)] if view.graph_path is not None else []
        )
        if self.versions:
            # The running version (older ones are loaded by a recovery that replays their epochs).
            self._load(self.versions[-1].number, self.versions[-1].import_path)
        self.ingress.assign(self.table.owned())

    # ---- code updates ------------------------------------------------------------------------------
    def _load(self, version: int, import_path: str) -> None:
        """Load graph ``version`` unless it is loaded already (raises GraphError)."""
        if self.graph_paths.get(version) == import_path:
            return
        self.driver.graphs[version] = load_graph(import_path)
        self.graph_paths[version] = import_path

    def _prepare(self, msg: PrepareGraph) -> GraphPrepared:
        """A code update's first phase: load the new version here (this worker's Python path may differ
        from the coordinator's) and say what it declares; it runs only once committed."""
        try:
            self._load(msg.version, msg.import_path)
        except GraphError as exc:
            log.error("%s: cannot prepare graph version %d: %s", self.node_id, msg.version, exc)
            return GraphPrepared(self.node_id, msg.version, False, str(exc), [])
        return GraphPrepared(self.node_id, msg.version, True, "", self.driver.graphs[msg.version].specs())

    def _load_for_replay(self, replay: dict[int, SeqLogEntry]) -> None:
        """Every graph version the epochs to replay ran with, as their log entries say (each epoch
        replays with its own code); the import paths come from the view's list of versions."""
        paths = {v.number: v.import_path for v in self.versions}
        for epoch, version in sorted({(e.epoch, e.version or 1) for e in replay.values()}):
            path = paths.get(version)
            if path is None:
                raise GraphError(
                    f"epoch {epoch} ran graph version {version}, which the cluster does not list"
                )
            try:
                self._load(version, path)
            except GraphError as exc:
                raise GraphError(
                    f"replaying epoch {epoch} needs graph version {version} ({path}): {exc}"
                ) from exc

    def _find_replies(self, msg: FindReplies) -> FoundReplies:
        """A gateway's reply lookup (see :mod:`.lookup`): whole tables only when not recovering, not
        replaying, and of the generation the coordinator asked in."""
        running = set(self.replies.waiting)
        running.update(r.request.request_id for r in self.batch.rescheduled)
        for es in self.driver.epochs.values():
            running.update(root.request.request_id for root in es.roots.values())
        recovering = self.recovering is not None and not self.recovering.done()
        whole = not recovering and not self.batch.replay and msg.gen == self.driver.gen
        return find_replies(msg, self.node_id, self.replies.answered, running, complete=whole)

    # ---- a replay that diverges stops the cluster --------------------------------------------------------
    def _reply_diverged(self, epoch: int, logged: Reply, replayed: Reply) -> None:
        es = self.driver.epochs.get(epoch)
        root = es.roots.get(logged.tid) if es is not None else None
        function = f"{root.request.operator}.{root.request.function}" if root is not None else ""
        self._diverged(epoch, logged.request_id, function, shown(logged), shown(replayed))

    def _batch_diverged(self, epoch: int, logged: BatchEntry, replayed: str) -> None:
        kind = type(logged).__name__.lower()
        self._diverged(epoch, logged.request_id, "", f"a batch entry {kind}", f"{replayed.lower()}")

    def _diverged(self, epoch: int, request_id: str, function: str, logged: str, replayed: str) -> None:
        if self.halted:
            return
        msg = ReplayDiverged(self.node_id, epoch, request_id, function, logged, replayed, self.driver.gen)
        self.transport.send(COORDINATOR, msg)
        self._halt(msg.describe())

    def _retire(self, msg: Retire) -> None:
        """Drained or replaced: decide nothing more of any generation before ``msg.gen``, say so (the
        coordinator reads the logs only after that), send no more replies, and stop."""
        if self.retired.is_set():
            return
        log.warning("%s: leaving the cluster: %s", self.node_id, msg.reason)
        if msg.view is not None and msg.view.handoff and 0 <= self.driver.gen < msg.view.gen:
            self._hand_off(msg.view)
        self.driver.fence = max(self.driver.fence, msg.gen)
        self._halt(f"retired: {msg.reason}", level=logging.WARNING)
        self._report_fenced(msg.gen, then=self.retired.set)

    def _hand_off(self, view: ClusterView) -> None:
        """A planned change: send every partition this worker owns and ``view`` gives to another
        straight to that worker (styx_worker.handoff), or say it cannot (its state is not the barrier's)."""
        owner = view.placement
        gone = [p for p in self.table.owned() if owner[p] != self.node_id]
        if not gone:
            return
        # The coordinator abandons a snapshot in progress: what it holds goes back into the delta, so
        # the next snapshot (this worker's or the new owner's) carries it.
        self.snapshots.put_back(self.driver.store, self.replies.answered)
        why = ""
        if not (self.consistent and not self.halted and not self.driver.epochs):
            why = "its state is not at an epoch's end"
        elif self.recovering is not None and not self.recovering.done():
            why = "it is recovering"
        out: list[tuple[str, Handoff]] = []
        if not why:
            try:
                out = outgoing(
                    view.gen,
                    self.driver.completed_epoch,
                    {p: owner[p] for p in gone},
                    self.table.op_partitions,
                    self.driver.store,
                    self.replies.answered,
                    self.ingress.positions(),
                    self.batch.rescheduled,
                    [r for recs in self.replies.waiting.values() for r in recs],
                    self.replies.egress.offsets(),
                )
            except HandoffRefused as exc:
                why = str(exc)
        if why:  # the new owners' recovery fails at once, and a full one (from S3) follows
            log.warning("%s: not handing off %s: %s", self.node_id, gone, why)
            out = [(owner[p], refusal(view.gen, p)) for p in gone]
        else:
            log.warning("%s: handing off %s after epoch %d", self.node_id, gone, self.driver.completed_epoch)
        for dest, piece in out:
            self.transport.send(dest, piece)

    def _report_fenced(self, gen: int, then: Callable[[], None] = lambda: None) -> None:
        """Tell the coordinator this worker decides nothing of a generation before ``gen`` any more —
        once every reply it queued is on the log: the recovery that follows reads the log back (a
        partition's new owner among others) and must find them there."""

        async def flushed() -> None:
            await self.egress.flush()
            self.transport.send(COORDINATOR, Fenced(self.node_id, gen))
            then()

        if self.tasks is None:
            self.transport.send(COORDINATOR, Fenced(self.node_id, gen))
            then()
            return
        coro = flushed()
        try:
            self.tasks.create_task(coro)
        except RuntimeError:  # the worker is shutting down (its process ends): nothing to report
            coro.close()

    def _halt(self, reason: str, level: int = logging.CRITICAL) -> None:
        """Run nothing more and say why (``/readyz``); the coordinator keeps the cluster stopped."""
        if not self.halted:
            log.log(level, "%s: %s", self.node_id, reason)
        self.halted = reason
        self.replies.stopped = True
        self.driver.runs.clear()
        for task in list(self.inflight):  # epoch messages are dropped from now on (on_message)
            task.cancel()

    # ---- recovery --------------------------------------------------------------------------------------
    async def recover(self, msg: Recover) -> None:
        """Roll back to the last complete snapshot and prepare to replay the logged epochs.

        Everything in flight is cancelled and forgotten; messages of older generations are dropped on
        arrival from now on. The coordinator then re-runs epochs ``manifest.epoch+1 .. replay_until``
        with their logged composition, and continues live.
        """
        if self.view is None or self.view.gen != msg.gen:
            return  # a newer generation's view came since the Recover: its own Recover follows
        for task in list(self.inflight):
            task.cancel()
        self.inflight.clear()
        self.driver.reset(msg.gen)
        # A shape change at a barrier: this worker's state is that of the last epoch that ran (it
        # finished it and no restore touched it since): it keeps what it still owns. A worker that just
        # joined holds nothing: it takes all it owns from the old owners.
        fresh = self.driver.completed_epoch < 0 and not len(self.driver.store)
        keep = msg.keep and (fresh or (self.consistent and self.driver.completed_epoch == msg.replay_until))
        self.consistent = False
        owned_before = set() if fresh else set(self.table.owned())
        self.ingress.live(msg.segment)  # a fresh process would start at segment 0
        self.egress.live(msg.segment)
        self._apply(self.view)
        self.replies.held = False  # the replayed epochs send what is not on the log yet
        if keep:  # a snapshot the coordinator abandoned: the next one carries what it held
            self.snapshots.put_back(self.driver.store, self.replies.answered)
        else:
            self.snapshots.unconfirmed.clear()
        started = time.perf_counter()
        try:
            if keep:
                await self._move_partitions(msg, owned_before)
            elif msg.keep:
                raise HandoffRefused(
                    f"cannot keep: this worker's state is of epoch {self.driver.completed_epoch}, "
                    f"not {msg.replay_until}"
                )
            else:
                await self._restore(msg)
        except Exception as exc:  # noqa: BLE001 - reported: the coordinator retries the recovery
            log.error("%s: recovery to generation %d failed: %s", self.node_id, msg.gen, exc)
            self.metrics.recovery(False, time.perf_counter() - started)
            self.transport.send(
                COORDINATOR, RecoverDone(self.node_id, False, f"{type(exc).__name__}: {exc}", msg.gen)
            )
            return
        self.consistent = True
        self.metrics.recovery(True, time.perf_counter() - started)
        self.transport.send(COORDINATOR, RecoverDone(self.node_id, True, "", msg.gen))

    async def _move_partitions(self, msg: Recover, owned_before: set[int]) -> None:
        """Keep the partitions still owned as they are; drop the ones moved away; take the ones gained
        from their old owners' handoffs (nothing is replayed: every worker is at the last epoch)."""
        owned = set(self.table.owned())
        gone, gained = owned_before - owned, sorted(owned - owned_before)
        # Each old owner sent its pieces when it saw the view, before it answered Fenced: they are
        # here or on their way. One that never comes (its sender died, or the link broke) fails this
        # recovery after a failure timeout, and a full one follows.
        wait_s = self.config.failure_timeout_ms / 1000
        try:
            async with self.clock.timeout(wait_s):
                moved = await self.handoffs.take(msg.gen, gained, msg.replay_until)
        except TimeoutError:
            raise HandoffRefused(f"partitions {gained} not all handed over within {wait_s:.1f}s") from None
        self.handoffs.forget_before(msg.gen + 1)
        store = self.driver.store
        n = self.table.op_partitions
        store.drop(lambda key: partition_of(key[1], n[key[0]]) in gone)
        answered = ReplyTable(self.config.dedup_replies_per_partition)
        waiting: dict[str, list[IngressRecord]] = {}
        rescheduled = [t for t in self.batch.rescheduled if t.partition not in gone]
        for p, m in moved.items():
            store.load(((op, key), value) for op, key, value in m.data)
            store.delta.update(((op, key), value) for op, key, value in m.delta)
            for reply in m.last.replies:
                answered.record(p, reply, as_delta=False)
            rescheduled += recovery.resumed(p, m.last.rescheduled)
            recovery.add_waiting(waiting, p, m.last.waiting)
            self.egress.reset_offsets(m.last.egress_offsets)
        self.batch.rescheduled = sorted(rescheduled, key=lambda t: t.tid)
        self.batch.replay = {}
        self.batch.sequencer.lc = max(self.batch.sequencer.lc, msg.manifest.lc)
        self.replies.move(gone, answered, waiting)
        self.replies.answered.restore_delta({p: list(m.last.reply_delta) for p, m in moved.items()})
        self.ingress.seek({p: cursor_of(m.last.position, m.last.cursor) for p, m in moved.items()})
        self.driver.completed_epoch = msg.replay_until
        log.warning(
            "%s: partitions moved: kept %s, gave %s, took %s",
            self.node_id,
            sorted(owned & owned_before),
            sorted(gone),
            gained,
        )

    async def _restore(self, msg: Recover) -> None:
        assert self.logs is not None, "recovery needs a log reader"
        r = await recovery.restore(
            msg,
            self.table.owned(),
            self.node_id,
            self.blobs,
            self.logs,
            self.config.dedup_replies_per_partition,
        )
        self.handoffs.forget_before(msg.gen + 1)
        self._load_for_replay(r.replay)
        self.driver.store = r.store
        self.driver.completed_epoch = msg.manifest.epoch
        self.batch.rescheduled = r.rescheduled
        self.batch.replay = r.replay
        self.batch.sequencer.lc = msg.manifest.lc
        self.replies.restore(r.answered, r.waiting, {})
        self.ingress.seek(r.positions)
        self.egress.reset_offsets(r.egress_offsets)
        # Replies the previous generation queued may still be on their way to the log: wait for them,
        # or replay would not find them there and would send them a second time.
        await self.egress.flush()
        if msg.replay_until > msg.manifest.epoch:  # replies of epochs to replay may be on the log
            self.replies.on_log = await recovery.replies_on_log(
                self.logs, r.egress_offsets, msg.manifest.epoch
            )

    # ---- what the metrics read ------------------------------------------------------------------------
    def gauges(self) -> WorkerGauges:
        return WorkerGauges(
            rescheduled_waiting=len(self.batch.rescheduled),
            ingress_buffered=self.ingress.pending(),
            inflight_tasks=len(self.inflight),
            open_epochs=len(self.driver.epochs),
            waiting_resends=sum(len(v) for v in self.replies.waiting.values()),
            partitions=len(self.table.owned()),
            generation=self.driver.gen,
            completed_epoch=self.driver.completed_epoch,
            push_clients=len(self.feed.clients),
            replies_pushed=self.feed.pushed,
        )

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: part of a deployed cluster, not recovering, not degraded."""
        if self.halted:
            return False, f"degraded: {self.halted}"
        if self.view is None:
            return False, "not part of a deployed cluster yet"
        if self.recovering is not None and not self.recovering.done():
            return False, f"recovering (generation {self.driver.gen})"
        return True, f"generation {self.driver.gen}, partitions {self.table.owned()}"
