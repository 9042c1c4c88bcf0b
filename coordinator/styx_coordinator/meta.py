"""The coordinator's durable state in the blob store: what a restarted coordinator needs to take over
(graph, placement, workers, generation; written at deploy and at every recovery), and the latest
snapshot manifest to read back with it."""

from __future__ import annotations

import asyncio

from styx_coordinator.cluster import Cluster
from styx_coordinator.snapshots import META_KEY, manifest_decoder, meta_decoder, meta_encoder
from styx_py.core.blobs import BlobStore, epoch_of
from styx_py.core.wire import ClusterMeta, Manifest

__all__ = ["MetaStore"]


class MetaStore:
    def __init__(self, blobs: BlobStore | None) -> None:
        self.blobs = blobs  # None: nothing is durable (no snapshots, no resuming)
        self.loaded: ClusterMeta | None = None  # what the last load read
        # One save at a time, each writing the state as of its turn: saves from different tasks (a
        # recovery, a segment rotation) land in order, so the newest state is the one that stays.
        self._saving = asyncio.Lock()

    async def save(self, cluster: Cluster, manifest: Manifest | None) -> None:
        async with self._saving:
            await self._save(cluster, manifest)

    async def _save(self, cluster: Cluster, manifest: Manifest | None) -> None:
        if self.blobs is None or cluster.graph_path is None or manifest is None:
            return
        meta = ClusterMeta(
            cluster.graph_path,
            cluster.placement,
            cluster.workers,
            cluster.gen,
            list(manifest.epoch_generations),
            cluster.degraded,
            cluster.n_seq,
            list(cluster.versions),
            cluster.segment,
            cluster.cluster_id,
            cluster.state == "log-lost",
        )
        await self.blobs.put(META_KEY, meta_encoder.encode(meta))

    async def load(self) -> tuple[ClusterMeta, Manifest | None] | None:
        """The saved state and the latest manifest written (None: no snapshot completed yet);
        None when no coordinator ran this cluster before."""
        if self.blobs is None:
            return None
        raw = await self.blobs.get(META_KEY)
        if raw is None:
            return None
        meta = self.loaded = meta_decoder.decode(raw)
        manifests = await self.blobs.list("manifests/")
        if not manifests:
            return meta, None
        latest = max(manifests, key=epoch_of)
        data = await self.blobs.get(latest)
        assert data is not None, f"{latest} vanished while listed"
        return meta, manifest_decoder.decode(data)
