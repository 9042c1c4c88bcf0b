"""The coordinator's log-loss check (:mod:`styx_py.core.logmarks`): at deploy it writes the cluster's
incarnation marker; at start (resuming) and at every recovery, before anything is read from the logs or
restored, it asks the broker whether it still holds the marker and every offset the coordinator
recorded: the sequencer-log offset of the last complete snapshot and what its workers said the broker
held (ingress positions, egress offsets). The workers check what they see while running themselves
(``styx_worker.logwatch``)."""

from __future__ import annotations

from styx_coordinator.cluster import Cluster
from styx_py.core.logmarks import LogMark
from styx_py.core.ports import LogGuard
from styx_py.core.wire import Manifest

__all__ = ["LogCheck"]


class LogCheck:
    def __init__(self, cluster: Cluster, guard: LogGuard | None) -> None:
        self.cluster = cluster
        self.guard = guard  # None: the logs cannot be lost (the simulation's in-memory log)

    async def stamp(self) -> None:
        """A fresh cluster: a new id, its marker on the broker (raises OSError if the broker fails)."""
        if self.guard is not None:
            self.cluster.cluster_id = await self.guard.stamp()

    def recorded(self, manifest: Manifest | None) -> list[LogMark]:
        if manifest is None or manifest.epoch < 0:
            return []
        seqlog = LogMark("sequencer log", self.cluster.config.seqlog_topic, 0, manifest.seqlog_offset)
        return [seqlog, *manifest.marks]

    async def lost(self, manifest: Manifest | None) -> list[str]:
        """What the broker lost, one line each (empty: nothing); raises OSError if it cannot be asked."""
        if self.guard is None or not self.cluster.cluster_id:
            return []
        return await self.guard.lost(self.cluster.cluster_id, self.recorded(manifest))
