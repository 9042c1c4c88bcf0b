"""Deploying the graph: once enough workers registered, create the topics, place the partitions, save
the cluster's durable state and send every worker the view that starts it. One graph per cluster."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from styx_py.coordinator.cluster import Cluster
from styx_py.coordinator.meta import MetaStore
from styx_py.coordinator.placement import place
from styx_py.coordinator.snapshots import empty_manifest
from styx_py.coordinator.snapshotter import Snapshotter
from styx_py.core.determinism import nondeterminism_warnings
from styx_py.core.errors import GraphError
from styx_py.core.graph import load_graph
from styx_py.core.ports import Clock

__all__ = ["Deployer", "TopicCreator"]

log = logging.getLogger("styx.coordinator")

TopicCreator = Callable[[dict[str, int]], Awaitable[None]]


class Deployer:
    def __init__(
        self,
        cluster: Cluster,
        clock: Clock,
        snapshots: Snapshotter,
        store: MetaStore,
        *,
        min_workers: int,
        create_topics: TopicCreator | None,
    ) -> None:
        self.cluster = cluster
        self.clock = clock
        self.snapshots = snapshots
        self.store = store
        self.min_workers = min_workers
        self.create_topics = create_topics
        self.enough_workers = asyncio.Event()

    def registered(self) -> None:
        """A worker registered before the deploy."""
        if len(self.cluster.membership.workers) >= self.min_workers:
            self.enough_workers.set()

    async def deploy(self, import_path: str, timeout_s: float) -> None:
        """Deploy ``import_path`` (validated first: raises GraphError); deploying it again does nothing."""
        graph = load_graph(import_path)
        warnings = nondeterminism_warnings(graph)
        c = self.cluster
        if c.graph_path is not None:
            if c.graph_path == import_path:
                return
            raise GraphError(f"graph {c.graph_path!r} is already deployed")
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
            await self.create_topics({cfg.ingress_topic: n, cfg.egress_topic: n, cfg.seqlog_topic: 1})
        c.graph_path = import_path
        c.operators = graph.specs()
        c.warnings = warnings
        for warning in warnings:
            log.warning("%s", warning)
        c.placement = place(n, c.workers)
        c.n_seq = len(c.workers)
        self.snapshots.manifest = empty_manifest(n)
        await self.store.save(c, self.snapshots.manifest)
        c.broadcast_view()
        c.state = "running"
        c.deployed.set()
        log.info("deployed %s: %d partitions on %d workers", import_path, n, len(c.membership.workers))
