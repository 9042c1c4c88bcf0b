"""Taking snapshots, the coordinator's side: decide which epoch snapshots, collect every worker's
``SnapshotDone``, write the manifest (only then is the snapshot usable), compact and prune.

One snapshot at a time: the next is due only once the last one's manifest is written and its
compaction done. A recovery abandons the snapshot in progress (its deltas are rebuilt by the next
one). The manifest arithmetic and the blob work are the pure-ish functions of
:mod:`styx_coordinator.snapshots`.

S3 failing (an ``OSError``) fails the snapshot, whose deltas the next one carries, or the compaction,
which the next snapshot tries again (counted in ``styx status``: ``failed_snapshots``,
``failed_compactions``). So does a stored object that does not decode, or a compaction child that died
(``ChildProcessError``). Anything else raised here is a bug and ends the coordinator.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import msgspec

from styx_coordinator.cluster import Cluster
from styx_coordinator.metrics import CoordinatorMetrics
from styx_coordinator.snapshots import Merge, compact, extend, manifest_encoder, merge_here, retain
from styx_coordinator.tasks import Tasks
from styx_py.core.blobs import BlobStore, manifest_key
from styx_py.core.logmarks import highest
from styx_py.core.ports import Clock
from styx_py.core.wire import Manifest, SnapshotDone, SnapshotResult

__all__ = ["Snapshotter"]

log = logging.getLogger("styx.coordinator")


@dataclass
class _Pending:
    """A snapshot whose epoch started: its parts arrive as workers finish uploading."""

    lc: int  # the sequencer counter after its epoch
    parts: dict[str, SnapshotDone] = field(default_factory=dict)


class Snapshotter:
    def __init__(
        self,
        cluster: Cluster,
        clock: Clock,
        tasks: Tasks,
        blobs: BlobStore | None,
        metrics: CoordinatorMetrics,
        merge: Merge = merge_here,
    ) -> None:
        self.cluster = cluster
        self.clock = clock
        self.tasks = tasks
        self.blobs = blobs
        self.metrics = metrics
        self.merge = merge  # runs compaction's CPU-bound part (coordinator.main: in a child process)
        self.manifest: Manifest | None = None  # the last complete snapshot (or the empty one)
        self.pending: dict[int, _Pending] = {}
        self.last_at = 0.0  # when the last snapshot was decided (or the coordinator started)
        self.last: dict[str, Any] | None = None  # epoch, objects and bytes of the last complete one
        self.compactions = 0
        self.failed_compactions = 0
        self.failed = 0
        self.removed_objects = 0

    def _due(self, epoch: int) -> bool:
        if self.blobs is None or self.pending:
            return False
        every = self.cluster.config.snapshot_interval_epochs
        if every > 0:
            return epoch % every == every - 1
        return self.clock.now() - self.last_at >= self.cluster.config.snapshot_interval_s

    def begin(self, epoch: int) -> bool:
        """Whether ``epoch`` (about to start) takes a snapshot (and if so, wait for its parts)."""
        if not self._due(epoch):
            return False
        self.pending[epoch] = _Pending(-1)
        self.last_at = self.clock.now()
        return True

    def voted(self, epoch: int, lc: int) -> None:
        """Every worker voted on ``epoch``: its sequencer counter, which its manifest records (told as
        the last Vote arrives, before any worker can finish the epoch and send a part)."""
        pending = self.pending.get(epoch)
        if pending is not None:
            pending.lc = lc

    def abandon(self) -> None:
        """A new generation: the snapshots in progress are never completed."""
        self.pending.clear()

    def on_done(self, msg: SnapshotDone) -> None:
        pending = self.pending.get(msg.epoch)
        if pending is None or msg.gen != self.cluster.gen:
            return
        pending.parts[msg.node_id] = msg
        if len(pending.parts) == len(self.cluster.workers):
            self.tasks.spawn(self._complete(msg.epoch, self.cluster.gen))

    async def _complete(self, epoch: int, gen: int) -> None:
        """Write the manifest once every part is durable; only then is the snapshot usable."""
        pending = self.pending.get(epoch)
        if pending is None or gen != self.cluster.gen:
            return  # a recovery started since: the snapshot is abandoned (its deltas are rebuilt)
        parts = pending.parts
        ok = all(p.ok for p in parts.values())
        if ok and pending.lc < 0:
            # Workers decide from each other's reports: they finished the epoch although a Vote
            # never reached this coordinator (that stage stalls, and a recovery follows). Without the
            # epoch's sequencer counter the manifest cannot be written: the snapshot fails, and the
            # next one carries its deltas.
            ok = False
        if ok:
            assert self.blobs is not None and self.manifest is not None
            seqlog_offset = min(p.seqlog_offset for p in parts.values())
            marks = highest(m for p in parts.values() for m in p.marks)
            manifest = extend(self.manifest, epoch, pending.lc, seqlog_offset, marks)
            try:
                await self.blobs.put(manifest_key(epoch), manifest_encoder.encode(manifest))
            except OSError as exc:  # S3: the snapshot fails; the next one carries its deltas
                log.warning("manifest of snapshot %d not written: %s: %s", epoch, type(exc).__name__, exc)
                self.failed += 1
                ok = False
            else:
                if gen == self.cluster.gen:
                    self.manifest = manifest
                    self.last = {
                        "epoch": epoch,
                        "objects": sum(p.objects for p in parts.values()),
                        "bytes": sum(p.bytes for p in parts.values()),
                    }
                    # Usable now (a recovery that starts during the compaction makes it skip
                    # pruning and keep its manifest).
                    self.cluster.broadcast(SnapshotResult(epoch, True, gen))
                await self._compact(manifest, gen)
        else:
            self.failed += 1
            errors = "; ".join(f"{n}: {p.error}" for n, p in sorted(parts.items()) if not p.ok) or (
                "the coordinator did not hear every Vote of the epoch"
            )
            log.warning("snapshot %d failed: %s", epoch, errors)
        self.metrics.snapshot(ok, self.clock.now() - self.last_at)
        if gen == self.cluster.gen:
            if not ok:
                self.cluster.broadcast(SnapshotResult(epoch, ok, gen))
            self.pending.pop(epoch, None)

    async def _compact(self, manifest: Manifest, gen: int) -> None:
        """Merge long delta chains and drop what no manifest needs (the next snapshot waits for it)."""
        assert self.blobs is not None
        try:
            cfg = self.cluster.config
            compacted = await compact(
                self.blobs, manifest, cfg.snapshot_compact_after, cfg.dedup_replies_per_partition, self.merge
            )
            if compacted != manifest:
                await self.blobs.put(manifest_key(manifest.epoch), manifest_encoder.encode(compacted))
                if gen == self.cluster.gen and self.manifest is manifest:
                    self.manifest = compacted
                manifest = compacted
            # A recovery that started meanwhile may be loading the objects retention would remove.
            removed = await retain(self.blobs, manifest) if gen == self.cluster.gen else 0
        except (OSError, msgspec.DecodeError) as exc:  # the uncompacted chain stays valid
            self.failed_compactions += 1
            log.warning(
                "compaction after snapshot %d failed: %s: %s", manifest.epoch, type(exc).__name__, exc
            )
            return
        self.compactions += 1
        self.removed_objects += removed
