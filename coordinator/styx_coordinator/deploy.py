"""Deploying the graph: once enough workers registered, create the topics, place the partitions, save
the cluster's durable state and send every worker the view that starts it.

Deploying another import path to a running cluster is a code update, serializable like everything
else: it takes effect at an epoch boundary on every worker at once. Transactions of epochs before the
barrier epoch ran the old version, those of the barrier epoch and after run the new one.

1. Validate: the coordinator loads the new graph and checks it can replace the running one
   (:func:`~styx_py.core.graph.check_update`: same partition counts, no operator removed).
2. Prepare: every worker loads it too (its Python path may differ) and says what it declares
   (:class:`~styx_py.core.wire.PrepareGraph` / :class:`~styx_py.core.wire.GraphPrepared`). One
   failure, a difference from the coordinator's load, a silent worker or a recovery in between
   refuses the update: nothing changed, the old version keeps running.
3. Commit: the epoch loop pauses before its next epoch ``E`` (every earlier epoch is over), the new
   version joins the versions list with first epoch ``E``, the cluster's durable state is saved, the
   view (with the versions) goes out, and ``EpochStart(E)`` names the new version. The version of
   every epoch is thus durable before the epoch runs, and every worker's sequencer-log entry records
   it too: a replay runs each epoch with the code its log entries say it ran with.

S3 or the broker failing a deploy or an update (an ``OSError``) refuses it with a
:class:`~styx_py.core.errors.GraphError` that says so, having changed nothing: deploy again. Anything
else raised here is a bug and ends the coordinator.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from styx_coordinator.cluster import Cluster
from styx_coordinator.epochs import EpochLoop
from styx_coordinator.logcheck import LogCheck
from styx_coordinator.meta import MetaStore
from styx_coordinator.placement import place
from styx_coordinator.snapshots import empty_manifest
from styx_coordinator.snapshotter import Snapshotter
from styx_py.core.determinism import nondeterminism_warnings
from styx_py.core.errors import GraphError
from styx_py.core.graph import Graph, GraphVersion, check_update, load_graph
from styx_py.core.logmarks import marker_topic
from styx_py.core.ports import Clock
from styx_py.core.wire import GraphPrepared, PrepareGraph

__all__ = ["Deployer", "TopicCreator"]

log = logging.getLogger("styx.coordinator")

TopicCreator = Callable[[dict[str, int]], Awaitable[None]]


@dataclass
class Update:
    """A code update in progress."""

    number: int
    import_path: str
    graph: Graph
    gen: int  # the generation that prepared it: a recovery in between (restarted workers) refuses it
    answers: dict[str, GraphPrepared] = field(default_factory=dict)
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    committed: asyncio.Future[GraphVersion] = field(default_factory=asyncio.Future)


class Deployer:
    def __init__(
        self,
        cluster: Cluster,
        clock: Clock,
        snapshots: Snapshotter,
        store: MetaStore,
        epochs: EpochLoop,
        *,
        min_workers: int,
        create_topics: TopicCreator | None,
        logcheck: LogCheck,
    ) -> None:
        self.cluster = cluster
        self.clock = clock
        self.snapshots = snapshots
        self.store = store
        self.min_workers = min_workers
        self.create_topics = create_topics
        self.logcheck = logcheck
        self.epochs = epochs
        self.enough_workers = asyncio.Event()
        self.update: Update | None = None  # the code update in progress (one at a time)
        self.refused = 0  # code updates refused since start

    def registered(self) -> None:
        """A worker registered before the deploy."""
        if len(self.cluster.membership.workers) >= self.min_workers:
            self.enough_workers.set()

    async def ensure_changelog(self) -> None:
        """Create the changelog topic of a resumed cluster if it has none yet (one deployed before it
        had a changelog, or under another name): its workers write to it, a restore reads its end."""
        cfg, n = self.cluster.config, len(self.cluster.placement)
        if self.create_topics is not None and cfg.changelog_topic and n:
            await self.create_topics({cfg.changelog_topic: n})  # an existing topic is left as it is

    async def deploy(self, import_path: str, timeout_s: float) -> None:
        """Deploy ``import_path`` (validated first: raises GraphError); deploying the running graph again
        does nothing, another one is a code update (:meth:`upgrade`)."""
        c = self.cluster
        if c.graph_path is not None:
            if c.graph_path != import_path:
                await self.upgrade(import_path, timeout_s)
            return
        graph = load_graph(import_path)
        warnings = nondeterminism_warnings(graph)
        try:
            async with self.clock.timeout(timeout_s):
                await self.enough_workers.wait()
        except TimeoutError as exc:
            raise GraphError(
                f"only {len(c.membership.workers)} of {self.min_workers} workers registered "
                f"after {timeout_s}s"
            ) from exc
        n = graph.n_partitions
        if self.create_topics is not None:
            cfg = c.config
            topics = {cfg.ingress_topic: n, cfg.egress_topic: n, cfg.seqlog_topic: 1}
            topics[marker_topic(cfg.seqlog_topic)] = 1
            if cfg.changelog_topic:
                topics[cfg.changelog_topic] = n
            try:
                await self.create_topics(topics)
                await self.logcheck.stamp()  # the cluster's incarnation marker, before any epoch
            except OSError as exc:  # the broker
                raise GraphError(
                    f"creating the topics failed ({type(exc).__name__}: {exc}); deploy again"
                ) from exc
        c.graph_path = import_path
        c.versions = [GraphVersion(1, import_path, 0)]
        c.operators = graph.specs()
        c.warnings = warnings
        c.placement = place(n, c.workers)
        c.n_seq = len(c.workers)
        self.snapshots.manifest = empty_manifest(n)
        try:
            await self.store.save(c, self.snapshots.manifest)
        except OSError as exc:  # S3: no worker heard of it; deploying again writes the state again
            c.graph_path, c.versions, c.operators, c.warnings, c.placement = None, [], [], [], []
            self.snapshots.manifest = None
            why = f"{type(exc).__name__}: {exc}"
            raise GraphError(
                f"saving the cluster state failed ({why}); nothing deployed, deploy again"
            ) from exc
        for warning in warnings:
            log.warning("%s", warning)
        c.broadcast_view()
        c.state = "running"
        c.deployed.set()
        log.info("deployed %s: %d partitions on %d workers", import_path, n, len(c.membership.workers))

    # ---- code updates ------------------------------------------------------------------------------
    async def upgrade(self, import_path: str, timeout_s: float) -> GraphVersion:
        """Replace the running graph by the one at ``import_path`` at an epoch barrier (module
        docstring); raises GraphError, having changed nothing, when it is refused."""
        try:
            return await self._upgrade(import_path, load_graph(import_path), timeout_s)
        except GraphError as exc:
            self.refused += 1
            log.error("code update to %s refused: %s", import_path, exc)
            raise

    async def _upgrade(self, import_path: str, graph: Graph, timeout_s: float) -> GraphVersion:
        c = self.cluster
        if self.update is not None:
            raise GraphError(
                f"an update to {self.update.import_path!r} is in progress; deploy again after it"
            )
        if c.degraded:
            raise GraphError(f"the cluster is degraded: {c.degraded}")
        check_update(c.operators, graph, len(c.placement))
        if c.state != "running":
            raise GraphError(f"the cluster is {c.state}; deploy again once it runs")
        u = self.update = Update(c.versions[-1].number + 1, import_path, graph, c.gen)
        try:
            try:
                async with self.clock.timeout(timeout_s):
                    await self._prepare(u)
            except TimeoutError:
                missing = sorted(set(c.workers) - set(u.answers))
                raise GraphError(
                    f"workers {missing} did not prepare {import_path!r} within {timeout_s}s"
                ) from None
            # Every worker holds the new version: commit it at the next epoch boundary.
            self.epochs.before_start = functools.partial(self._commit, u)
            self.epochs.work.set()  # an idle cluster runs an (empty) epoch to take the barrier
            try:
                async with self.clock.timeout(timeout_s):
                    await asyncio.shield(u.committed)
            except TimeoutError:
                if self.epochs.before_start is not None:  # still waiting for its barrier: withdraw it
                    self.epochs.before_start = None
                    raise GraphError(
                        f"no epoch boundary within {timeout_s}s (is the cluster recovering?); nothing changed"
                    ) from None
            return await u.committed  # (being committed when the time ran out: saving the state)
        finally:
            if self.update is u and self.epochs.before_start is None:
                self.update = None

    async def _prepare(self, u: Update) -> None:
        """Every worker loads the new version; all must succeed and agree with the coordinator."""
        c = self.cluster
        c.broadcast(PrepareGraph(u.number, u.import_path))
        while set(c.workers) - set(u.answers):
            u.answered.clear()
            await u.answered.wait()
        specs = u.graph.specs()
        for node_id, answer in sorted(u.answers.items()):
            if not answer.ok:
                raise GraphError(f"worker {node_id} cannot load {u.import_path!r}: {answer.error}")
            if answer.operators != specs:
                raise GraphError(
                    f"worker {node_id} loaded a different graph from {u.import_path!r} than the "
                    "coordinator did (operators, partitions or functions differ): do they run the same code?"
                )
        if u.gen != c.gen:
            raise GraphError("a recovery began while the workers prepared the update; deploy again")

    async def _restore_saved_state(self) -> None:
        """After a failed save of a committed version: save the state without it, in case the failed
        write landed anyway (best effort: a replay follows the sequencer log's versions regardless)."""
        try:
            await self.store.save(self.cluster, self.snapshots.manifest)
        except OSError as exc:  # S3: the next save (a recovery, an update) writes it again
            log.warning(
                "could not save the cluster state back without the refused version: %s: %s",
                type(exc).__name__,
                exc,
            )

    def on_prepared(self, msg: GraphPrepared) -> None:
        u = self.update
        if u is not None and msg.version == u.number:
            u.answers[msg.node_id] = msg
            u.answered.set()

    async def _commit(self, u: Update, epoch: int) -> None:
        """Called by the epoch loop before it starts ``epoch``, every earlier epoch over."""
        c = self.cluster
        self.update = None
        if u.gen != c.gen:
            u.committed.set_exception(
                GraphError("a recovery began before the update's barrier; nothing changed, deploy again")
            )
            return
        before = (c.graph_path, list(c.versions), c.operators, c.warnings)
        version = GraphVersion(u.number, u.import_path, epoch)
        c.graph_path, c.operators = u.import_path, u.graph.specs()
        c.versions = [*c.versions, version]
        c.warnings = nondeterminism_warnings(u.graph)
        try:
            # Durable before the epoch starts: a replay after any crash must run it with this version.
            await self.store.save(c, self.snapshots.manifest)
        except OSError as exc:  # S3: the update is refused; the old version runs on
            c.graph_path, c.versions, c.operators, c.warnings = before
            await self._restore_saved_state()
            u.committed.set_exception(
                GraphError(f"saving the cluster state failed ({type(exc).__name__}: {exc}); nothing changed")
            )
            return
        c.broadcast_view()  # before EpochStart(epoch) on every coordinator -> worker channel
        for warning in c.warnings:
            log.warning("%s", warning)
        log.info("graph version %d (%s) runs from epoch %d", u.number, u.import_path, epoch)
        if not u.committed.done():
            u.committed.set_result(version)
