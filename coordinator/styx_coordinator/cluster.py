"""The cluster as the coordinator knows it: its workers, the deployed graph, the generation, and the
:class:`~styx_py.core.wire.ClusterView` built from them that every worker is sent.

Two counters, not to be confused: ``gen`` is the cluster generation (every recovery opens a new one;
messages of an older generation are ignored everywhere) and ``view_version`` numbers the views (every
broadcast of a view, for a registration as well as for a recovery, bumps it).
"""

from __future__ import annotations

import asyncio
from typing import Literal

from styx_coordinator.load import PartitionLoad
from styx_coordinator.membership import Membership
from styx_py.core.config import Config
from styx_py.core.graph import GraphVersion, OperatorSpec, version_at
from styx_py.core.ports import Transport
from styx_py.core.wire import ClusterView, Message

__all__ = ["Cluster", "State"]

State = Literal["starting", "running", "recovering", "degraded", "log-lost"]


class Cluster:
    def __init__(self, config: Config, transport: Transport, kafka_bootstrap: str | None) -> None:
        self.config = config
        self.transport = transport
        self.kafka_bootstrap = kafka_bootstrap
        self.membership = Membership(config.failure_timeout_ms)
        self.load = PartitionLoad()  # measured transactions per second per partition (heartbeats)
        # Per worker, from its last heartbeat: [external calls pending, running, timers pending].
        self.effects: dict[str, list[int]] = {}
        self.pending_owners: dict[str, list[str]] = {}  # what each worker's heartbeat named (status)
        self.graph_path: str | None = None  # the running version's import path
        self.versions: list[GraphVersion] = []  # every committed version, in deploy order
        self.operators: list[OperatorSpec] = []
        self.placement: list[str] = []  # partition index -> owning worker
        # Sequencer-id space (tid = sid + lc * n_seq): the most workers the cluster ever had, so that
        # tids issued after workers leave stay above every earlier one.
        self.n_seq = 0
        self.gen = 0
        self.segment = 0  # the newest ingress segment (styx_py.core.segments; styx_coordinator.segments)
        self.view_version = 0
        self.state: State = "starting"
        self.degraded = (
            ""  # why the cluster stopped (a replay diverged, a recovery gave up); "" while healthy
        )
        self.cluster_id = ""  # its incarnation marker on the broker (styx_py.core.logmarks); "": none
        self.halted = False  # stopped for good (a replay diverged): the workers halt, S3 records it
        self.warnings: list[str] = []  # about the deployed code (calls a replay does not reproduce)
        self.deployed = asyncio.Event()  # a graph runs (deployed here, or resumed from S3)

    @property
    def workers(self) -> list[str]:
        return sorted(self.membership.workers)

    def broadcast(self, msg: Message) -> None:
        for node_id in self.workers:
            self.transport.send(node_id, msg)

    def view(self, *, handoff: bool = False) -> ClusterView:
        cfg = self.config
        return ClusterView(
            self.view_version,
            self.membership.infos(),
            self.placement,
            self.graph_path,
            self.operators,
            self.kafka_bootstrap,
            cfg.ingress_topic,
            cfg.egress_topic,
            cfg.seqlog_topic,
            self.gen,
            max(self.n_seq, len(self.membership.workers)),
            list(self.versions),
            handoff,
        )

    def version_of(self, epoch: int) -> int:
        """The graph version that runs ``epoch`` (what its EpochStart says)."""
        return version_at(self.versions, epoch).number

    def broadcast_view(self, *, handoff: bool = False) -> None:
        """``handoff``: a planned change at a barrier (workers hand moved partitions to each other)."""
        self.view_version += 1
        self.broadcast(self.view(handoff=handoff))
