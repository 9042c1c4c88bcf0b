"""The coordinator service: its lifecycle, message dispatch, worker registration and status.

The coordinator is the control plane; it never touches transaction data. Its parts, each in its own
module:

| part | module |
|---|---|
| workers, deployed graph, generation, the view | :mod:`~styx_coordinator.cluster` |
| deploy | :mod:`~styx_coordinator.deploy` |
| the epoch loop (barrier driver) | :mod:`~styx_coordinator.epochs` |
| snapshots: decide, collect, manifest, compaction | :mod:`~styx_coordinator.snapshotter` |
| recovery, and resuming from S3 after a restart | :mod:`~styx_coordinator.recovery` |
| has the broker lost the log? (incarnation marker, recorded offsets) | :mod:`~styx_coordinator.logcheck` |
| failure detection by heartbeats | :mod:`~styx_coordinator.monitor` |
| shape changes: join, drain, scale, takeover of lost workers | :mod:`~styx_coordinator.reshape` |
| ``styx status`` | :mod:`~styx_coordinator.status` |
| reply lookups for the gateway (any replica) | :mod:`~styx_coordinator.lookups` |
| consistent reads of committed state as of an epoch | :mod:`~styx_coordinator.reads` |

Every timer reads the injected :class:`~styx_py.core.ports.Clock` (the event loop's by default), so
the simulation runs the coordinator on virtual time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from styx_coordinator.cluster import Cluster, State
from styx_coordinator.deploy import Deployer, TopicCreator
from styx_coordinator.epochs import EpochLoop
from styx_coordinator.logcheck import LogCheck
from styx_coordinator.lookups import ReplyLookups
from styx_coordinator.meta import MetaStore
from styx_coordinator.metrics import CoordinatorMetrics
from styx_coordinator.monitor import FailureMonitor
from styx_coordinator.reads import StateReads
from styx_coordinator.recovery import Recovery
from styx_coordinator.reshape import Reshaper
from styx_coordinator.segments import SegmentRotator
from styx_coordinator.snapshots import Merge, merge_here
from styx_coordinator.snapshotter import Snapshotter
from styx_coordinator.status import operator_rows, version_rows, worker_rows
from styx_coordinator.tasks import Tasks
from styx_py.core.blobs import BlobStore
from styx_py.core.config import Config
from styx_py.core.errors import StyxError
from styx_py.core.logmarks import describe
from styx_py.core.ports import Clock, LogGuard, LogReader, LoopClock, Transport
from styx_py.core.wire import (
    COORDINATOR,
    AdminReply,
    DeployRequest,
    DrainRequest,
    EpochDone,
    Fenced,
    FoundReplies,
    GraphPrepared,
    Halt,
    Heartbeat,
    LogLost,
    Manifest,
    Message,
    ReadRows,
    ReadState,
    RecoverDone,
    Register,
    ReplayDiverged,
    ReplyLookup,
    Retire,
    Revote,
    ScaleRequest,
    SnapshotDone,
    StatusRequest,
    Vote,
    WorkAvailable,
)

__all__ = ["Coordinator"]

log = logging.getLogger("styx.coordinator")


class Coordinator:
    def __init__(
        self,
        config: Config,
        transport: Transport,
        *,
        min_workers: int = 1,
        kafka_bootstrap: str | None = None,
        create_topics: TopicCreator | None = None,
        clock: Clock | None = None,
        detect_failures: bool = True,
        blobs: BlobStore | None = None,
        logs: LogReader | None = None,
        merge: Merge = merge_here,
        guard: LogGuard | None = None,
    ) -> None:
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.detect_failures = detect_failures
        self.cluster = cluster = Cluster(config, transport, kafka_bootstrap)
        self.tasks = Tasks()
        self.metrics = CoordinatorMetrics(self)  # read at scrape time; per epoch: a few observations
        self.monitor = FailureMonitor(cluster.membership, config, self.clock, on_checked=self._on_checked)
        self.snapshots = Snapshotter(cluster, self.clock, self.tasks, blobs, self.metrics, merge)
        self.epochs = EpochLoop(
            cluster, self.clock, self.tasks, self.snapshots, self.metrics, on_stall=self.start_recovery
        )
        self.meta = store = MetaStore(blobs)
        self.logcheck = LogCheck(cluster, guard)
        self.recovery = Recovery(
            cluster, self.clock, self.tasks, self.epochs, self.snapshots, store, logs, self.give_up
        )
        self.recovery.logcheck, self.recovery.lose_log = self.logcheck, self.lose_log
        self.reshaper = Reshaper(cluster, self.recovery, self.epochs, self.tasks, self.clock)
        self.lookups = ReplyLookups(cluster, self.clock, self.tasks)
        self.reads = StateReads(cluster, self.clock, self.tasks, lambda: self.epochs.epoch - 1)
        self.epochs.on_finished = self.reads.finished
        self.deployer = Deployer(
            cluster,
            self.clock,
            self.snapshots,
            store,
            self.epochs,
            min_workers=min_workers,
            create_topics=create_topics,
            logcheck=self.logcheck,
        )
        self.rotator: SegmentRotator | None = None
        if config.log_segment_s > 0 and create_topics is not None:
            self.rotator = SegmentRotator(
                cluster,
                self.clock,
                create_topics,
                # Epochs that ran live: a replay's do not count (its workers take no new requests).
                lambda: self.epochs.epoch if self.epochs.epoch > self.epochs.replay_until else -1,
                lambda: self.meta.save(cluster, self.snapshots.manifest),
                self.epochs.work.set,
            )

    # ---- lifecycle --------------------------------------------------------------------------------
    async def run(self) -> None:
        now = self.clock.now()  # not in __init__: the simulation's clock turns virtual after that
        self.epochs.throughput.started_at = now
        self.snapshots.last_at = now
        async with asyncio.TaskGroup() as tg:
            self.tasks.group = tg
            if not self.recovery.resuming:
                self.epochs.start()
            if self.detect_failures:
                tg.create_task(self.monitor.run())
            if self.rotator is not None:
                tg.create_task(self.rotator.run())
            await asyncio.Future()  # serve until cancelled; a failing child task ends the group

    async def resume(self) -> bool:
        """Take over from a coordinator that died, from its state in S3 (see :meth:`Recovery.resume`);
        False for a fresh cluster. A cluster that stopped degraded stays stopped."""
        resumed = await self.recovery.resume()
        saved = self.meta.loaded
        if resumed and saved is not None:
            self.cluster.cluster_id = saved.cluster_id
            await self.deployer.ensure_changelog()
            if saved.degraded:
                self.degrade(saved.degraded, save=False, log_lost=saved.log_lost)
            elif lost := await self.logcheck.lost(self.snapshots.manifest):
                self.degrade(describe(lost), save=False, log_lost=True)
                await self._save_halted()
        return resumed

    def lose_log(self, lost: list[str]) -> None:
        """The broker lost part of the cluster's log (styx_py.core.logmarks): stop for good, as
        :meth:`degrade`, in state ``log-lost``, naming what was lost."""
        self.degrade(describe(lost), log_lost=True)

    def degrade(self, reason: str, *, save: bool = True, log_lost: bool = False) -> None:
        """Stop the cluster for good: a replay diverged, or the broker lost the log (``log_lost``), so
        no recovery can reproduce what clients were told. No more epochs, no recovery (a restart of any
        process included); every worker is told to halt and ``styx status`` / ``/readyz`` say why.
        Recorded in S3 so a restarted coordinator stays stopped too."""
        c = self.cluster
        if c.halted:
            return
        self._stop_degraded(reason)
        if log_lost:
            c.state = "log-lost"
        c.halted = True
        if self.recovery.task is not None:
            self.recovery.task.cancel()
        c.broadcast(Halt(reason))
        if save:
            self.tasks.spawn(self._save_halted())

    def give_up(self, reason: str) -> None:
        """A recovery failed past its bound (``recovery_max_attempts``, ``recovery_max_s``): stop the
        cluster, degraded, and say why (``styx status``, ``/readyz``). Unlike :meth:`degrade`, not for
        good: what failed (S3, the broker, a worker) can be mended, so the workers are not halted and
        nothing is recorded in S3; a restart of the coordinator resumes the cluster and recovers it."""
        if not self.cluster.degraded:
            self._stop_degraded(reason)

    def _stop_degraded(self, reason: str) -> None:
        c = self.cluster
        log.critical("cluster degraded: %s", reason)
        c.degraded, c.state = reason, "degraded"
        self.epochs.stop()
        self.recovery.resuming = False

    async def _save_halted(self) -> None:
        try:
            await self.meta.save(self.cluster, self.snapshots.manifest)
        except OSError as exc:  # S3: the cluster stays stopped while this coordinator runs
            log.error(
                "the halted state is not recorded in S3 (%s: %s): a restarted coordinator recovers, "
                "replays and finds the divergence again",
                type(exc).__name__,
                exc,
            )

    def start_recovery(self) -> None:
        self.recovery.start()

    def _on_checked(self) -> None:
        self.reshaper.check()

    def _admin(self, src: str, change: Callable[[], dict[str, Any]]) -> None:
        """An admin request that changes the cluster: its body, or its error as the reply."""
        try:
            body = change()
        except StyxError as exc:
            self.transport.send(src, AdminReply(False, str(exc), {}))
        else:
            self.transport.send(src, AdminReply(True, "", {**body, **self.status()}))

    def scale(self, workers: int) -> dict[str, Any]:
        self._can_reshape()
        return self.reshaper.scale(workers)

    def drain(self, node_id: str) -> dict[str, Any]:
        self._can_reshape()
        self.reshaper.drain([node_id], "drained")
        return {"draining": [node_id]}

    def _can_reshape(self) -> None:
        c = self.cluster
        if c.degraded:
            raise StyxError(f"the cluster is degraded: {c.degraded}")
        if c.graph_path is None:
            raise StyxError("nothing is deployed yet: start the workers you want, then deploy")
        if self.recovery.resuming:
            raise StyxError("the coordinator is resuming the cluster: try again once it runs")

    async def deploy(self, import_path: str, timeout_s: float = 30.0) -> dict[str, Any]:
        await self.deployer.deploy(import_path, timeout_s)
        return self.status()

    async def _deploy_and_reply(self, src: str, import_path: str) -> None:
        try:
            body = await self.deploy(import_path)
        except StyxError as exc:
            self.transport.send(src, AdminReply(False, str(exc), {}))
        else:
            self.transport.send(src, AdminReply(True, "", body))

    # ---- messages ---------------------------------------------------------------------------------
    def on_message(self, src: str, msg: Message) -> None:
        match msg:
            case Vote() | Revote() | EpochDone():
                self.epochs.on_report(msg)
            case WorkAvailable():
                self.epochs.work.set()
            case Heartbeat():
                self.cluster.membership.heartbeat(msg.node_id, self.clock.now())
                if msg.node_id in self.cluster.membership.workers:
                    c = self.cluster
                    c.load.report(msg.node_id, msg.load, self.clock.now(), c.placement)
                    c.effects[msg.node_id] = msg.effects
                    c.pending_owners[msg.node_id] = msg.pending_owners
                    # The echo renews the worker's lease (see the worker's lease check).
                    self.transport.send(msg.node_id, Heartbeat(COORDINATOR, self.epoch))
            case Register():
                self._on_register(msg)
            case DeployRequest():
                self.tasks.spawn(self._deploy_and_reply(src, msg.import_path))
            case StatusRequest():
                self.transport.send(src, AdminReply(True, "", self.status()))
            case ScaleRequest():
                self._admin(src, lambda: self.scale(msg.workers))
            case DrainRequest():
                self._admin(src, lambda: self.drain(msg.node_id))
            case ReplyLookup():
                self.lookups.start(src, msg)
            case FoundReplies():
                self.lookups.on_found(msg)
            case ReadState():
                self.reads.start(src, msg)
            case ReadRows():
                self.reads.on_rows(msg)
            case SnapshotDone():
                self.snapshots.on_done(msg)
            case RecoverDone():
                self.recovery.on_done(msg)
            case GraphPrepared():
                self.deployer.on_prepared(msg)
            case Fenced():
                self.recovery.on_fenced(msg)
            case ReplayDiverged():
                self.degrade(msg.describe())
            case LogLost():
                log.critical("worker %s: the broker lost the log: %s", msg.node_id, msg.what)
                self.lose_log([msg.what])
            case _:
                raise AssertionError(f"coordinator: unexpected {type(msg).__name__} from {src}")

    def _on_register(self, msg: Register) -> None:
        c, now = self.cluster, self.clock.now()
        known = msg.node_id in c.membership.workers
        if c.degraded:
            log.error("worker %s registered; the cluster is degraded: %s", msg.node_id, c.degraded)
            c.membership.register(msg.node_id, msg.host, msg.port, now)
            if c.halted:
                self.transport.send(msg.node_id, Halt(c.degraded))
            return
        if self.recovery.resuming:
            # Taking over from a coordinator that died: wait for the workers it had, then recover.
            if msg.node_id not in self.recovery.expected:
                log.warning("worker %s is not part of the resumed cluster; ignored", msg.node_id)
                return
            c.membership.register(msg.node_id, msg.host, msg.port, now)
            self.recovery.rejoined()
            return
        if c.graph_path is not None and known:
            # A worker came back (restarted after a crash): its state is gone, so the cluster rolls
            # back to the last complete snapshot and replays the logged epochs.
            self.recovery.detected_after_s = now - c.membership.last_seen.get(msg.node_id, now)
            c.membership.register(msg.node_id, msg.host, msg.port, now)
            log.warning("worker %s re-registered: recovering", msg.node_id)
            self.recovery.start()
            return
        if c.graph_path is not None:
            desired = self.reshaper.desired
            if desired is not None and len(c.workers) >= desired:
                # Scaled in on purpose (`styx scale`): a drained worker's supervisor may restart it.
                why = f"the cluster runs {desired} workers (styx scale --workers {desired})"
                log.warning("worker %s registered; not joining: %s", msg.node_id, why)
                self.transport.send(msg.node_id, Retire(why, c.gen))
                return
            log.warning("worker %s joined the running cluster: moving partitions to it", msg.node_id)
            self.reshaper.join(msg.node_id, msg.host, msg.port)
            return
        c.membership.register(msg.node_id, msg.host, msg.port, now)
        log.info("worker %s registered (%d workers)", msg.node_id, len(c.membership.workers))
        self.deployer.registered()

    # ---- status -----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = self.clock.now()
        c = self.cluster
        return {
            "graph": c.graph_path,
            "version": self.graph_version or None,
            "versions": version_rows(c),  # every committed version: number, graph, first epoch
            "refused_updates": self.deployer.refused,
            "epoch": self.epoch,
            "workers": worker_rows(c, now),
            "operators": operator_rows(c),
            **self.epochs.throughput.summary(now),  # epochs_per_s, txn_per_s, abort_rate, totals
            # Epochs timed since the start and their summed duration: a reader's two samples give the
            # mean epoch latency between them (the gateway's console charts it).
            "epoch_seconds": {
                "count": sum(self.metrics.epoch_duration.counts),
                "sum": round(self.metrics.epoch_duration.total, 6),
            },
            "failed_workers": list(self.failed),
            "state": c.state,
            "degraded": c.degraded or None,
            "warnings": list(c.warnings),
            "generation": c.gen,
            "recoveries": self.recoveries,
            # Of the recovery under way (0: none): its attempts so far, within recovery_max_attempts.
            "recovery_attempts": self.recovery.attempts,
            "stalled_epochs": self.stalls,
            "last_recovery": self.last_recovery,
            "last_move": self.last_move,  # the last planned shape change's partition move
            "last_snapshot": self.last_snapshot,
            "compactions": self.compactions,
            "failed_compactions": self.snapshots.failed_compactions,
            "kafka_bootstrap": c.kafka_bootstrap,
            "ingress_topic": c.config.ingress_topic,
            # The newest ingress segment (its topic: core.segments.segment_topic) and the period.
            "ingress_segment": c.segment,
            "log_segment_s": c.config.log_segment_s,
            "egress_topic": c.config.egress_topic,
            "changelog_topic": c.config.changelog_topic,  # "": none
            "reply_routing": c.config.reply_routing,
            # What the cluster's consumers wait per fetch; SDK clients that connect here do the same.
            "kafka_fetch_wait_ms": c.config.kafka_fetch_wait_ms,
            "desired_workers": self.reshaper.desired,
            "shape_changes": list(self.reshaper.events),
        }

    # ---- read by tests, metrics and the simulation ------------------------------------------------
    @property
    def config(self) -> Config:
        return self.cluster.config

    @property
    def transport(self) -> Transport:
        return self.cluster.transport

    @property
    def state(self) -> State:
        return self.cluster.state

    @property
    def degraded(self) -> str:
        """Why the cluster stopped: a replay diverged (for good) or a recovery gave up ("" while healthy)."""
        return self.cluster.degraded

    @property
    def gen(self) -> int:
        """The cluster generation (every recovery opens a new one)."""
        return self.cluster.gen

    @property
    def graph_path(self) -> str | None:
        return self.cluster.graph_path

    @property
    def graph_version(self) -> int:
        """The running version of the graph (0 before the first deploy)."""
        return self.cluster.versions[-1].number if self.cluster.versions else 0

    @property
    def workers(self) -> list[str]:
        return self.cluster.workers

    @property
    def epoch(self) -> int:
        return self.epochs.epoch

    @property
    def idle(self) -> asyncio.Event:
        return self.epochs.idle

    @property
    def totals(self) -> dict[str, int]:
        return self.epochs.throughput.totals

    @property
    def overloaded(self) -> bool:
        return self.epochs.throughput.overloaded(self.clock.now())

    @property
    def stalls(self) -> int:
        return self.epochs.stalls

    @property
    def failed(self) -> list[str]:
        return self.monitor.failed

    @property
    def recoveries(self) -> int:
        return self.recovery.count

    @property
    def last_recovery(self) -> Mapping[str, Any] | None:
        return self.recovery.last

    @property
    def last_move(self) -> Mapping[str, Any] | None:
        return self.recovery.last_move

    @property
    def manifest(self) -> Manifest | None:
        return self.snapshots.manifest

    @property
    def last_snapshot(self) -> Mapping[str, Any] | None:
        return self.snapshots.last

    @property
    def compactions(self) -> int:
        return self.snapshots.compactions

    @property
    def failed_snapshots(self) -> int:
        return self.snapshots.failed
