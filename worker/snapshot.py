"""Incremental snapshots: per-partition deltas of committed writes, cut at an epoch boundary.

At the end of an epoch flagged by the coordinator, a worker takes its delta map (every committed
write since the previous snapshot, deletes included) and, per owned partition, records where its
ingress consumption stands, its rescheduled transactions (with their tids) and its egress position.
The capture is synchronous (a consistent cut between two epochs); the upload runs off the epoch loop.
The delta is kept until the coordinator confirms the snapshot complete; if any part failed, the delta
is merged back so the next snapshot carries it (a half-failed snapshot is never used: the
coordinator writes no manifest for it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import msgspec

from styx_py.core.blobs import BlobStore, delta_key
from styx_py.core.partitioning import partition_of
from styx_py.core.ports import Transport
from styx_py.core.segments import Cursor
from styx_py.core.wire import (
    COORDINATOR,
    IngressRecord,
    PartitionSnapshot,
    Reply,
    Request,
    SnapshotDone,
    SnapshotResult,
)
from styx_py.worker.dedup import ReplyTable
from styx_py.worker.state import StateStore, Writes

__all__ = [
    "PartitionSnapshot",
    "Snapshotter",
    "Unconfirmed",
    "capture",
    "on_result",
    "rows_by_partition",
    "snapshot_decoder",
    "upload",
]

log = logging.getLogger("styx.worker")

_encoder = msgspec.msgpack.Encoder()
snapshot_decoder = msgspec.msgpack.Decoder(PartitionSnapshot)

Rescheduled = tuple[int, int, int, int, Request]  # (partition, tid, offset, ts_ms, request)


def capture(
    epoch: int,
    delta: Writes,
    partition: dict[str, int],
    owned: list[int],
    positions: dict[int, Cursor],
    rescheduled: list[Rescheduled],
    egress_offsets: dict[int, int],
    seqlog_offset: int,
    replies: dict[int, list[Reply]],
    waiting: list[IngressRecord],
) -> list[PartitionSnapshot]:
    """Split a delta map by partition into the parts of one snapshot (pure)."""
    writes: dict[int, list[tuple[str, str | int, bytes | None]]] = {p: [] for p in owned}
    for (op, key), value in delta.items():
        writes[partition_of(key, partition[op])].append((op, key, value))
    resched, held = rows_by_partition(owned, rescheduled, waiting)
    return [
        PartitionSnapshot(
            epoch,
            p,
            writes[p],
            positions.get(p, {}).get(0, 0),
            resched[p],
            egress_offsets.get(p, 0),
            seqlog_offset,
            replies.get(p, []),
            held[p],
            dict(sorted(egress_offsets.items())),
            dict(sorted(positions.get(p, {}).items())),
        )
        for p in sorted(owned)
    ]


ResumeRow = tuple[int, int, int, Request]  # (tid, offset, ts_ms, request): a rescheduled transaction
HeldRow = tuple[int, int, Request]  # (offset, ts_ms, request): a resent request waiting for its reply


def rows_by_partition(
    partitions: Iterable[int], rescheduled: list[Rescheduled], waiting: list[IngressRecord]
) -> tuple[dict[int, list[ResumeRow]], dict[int, list[HeldRow]]]:
    """The rescheduled (in tid order) and waiting (in offset order) requests of ``partitions``, as a
    snapshot part or a handoff carries them; those of other partitions are left out (pure)."""
    resched: dict[int, list[ResumeRow]] = {p: [] for p in partitions}
    for p, tid, offset, ts_ms, request in sorted(rescheduled, key=lambda r: r[1]):
        if p in resched:
            resched[p].append((tid, offset, ts_ms, request))
    held: dict[int, list[HeldRow]] = {p: [] for p in resched}
    for rec in sorted(waiting, key=lambda r: r.offset):
        if rec.partition in held:
            held[rec.partition].append((rec.offset, rec.ts_ms, rec.request))
    return resched, held


async def upload(blobs: BlobStore, parts: list[PartitionSnapshot]) -> int:
    """Write every part; returns the bytes written. Any failure propagates (the snapshot fails)."""
    size = 0
    for part in parts:
        data = _encoder.encode(part)
        size += len(data)
        await blobs.put(delta_key(part.partition, part.epoch), data)
    return size


Unconfirmed = dict[int, tuple[Writes, dict[int, list[Reply]]]]  # epoch -> (state delta, replies)


def on_result(unconfirmed: Unconfirmed, msg: SnapshotResult, store: StateStore, answered: ReplyTable) -> None:
    """The coordinator's verdict: forget a durable snapshot's deltas, or put a failed one's back."""
    taken = unconfirmed.pop(msg.epoch, None)
    if msg.ok or taken is None:
        return
    delta, replies = taken
    # Newer writes win over the failed snapshot's; the next snapshot carries both.
    merged = dict(delta)
    merged.update(store.delta)
    store.delta = merged
    answered.restore_delta(replies)


UploadObserver = Callable[[bool, float, int], None]  # (ok, seconds, bytes): the worker's metrics


class Snapshotter:
    """Uploads a captured snapshot off the epoch loop and reports it to the coordinator."""

    def __init__(
        self,
        node_id: str,
        blobs: BlobStore | None,
        transport: Transport,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        observe: UploadObserver,
    ) -> None:
        self.node_id = node_id
        self.blobs = blobs
        self.transport = transport
        self.spawn = spawn
        self.observe = observe
        self.unconfirmed: Unconfirmed = {}  # a snapshot's deltas, until the coordinator confirms it

    def take(
        self,
        epoch: int,
        gen: int,
        parts: list[PartitionSnapshot],
        kept: tuple[Writes, dict[int, list[Reply]]],
        flushed: asyncio.Future[None],
        seqlog_acked: int,
    ) -> None:
        """Upload ``parts``; ``kept`` (the delta and replies they hold) waits for the verdict.

        The snapshot's replies must be on the egress log before it can be confirmed: recovery from it
        replays only later epochs, so a reply still queued in the producer when this process dies
        would otherwise never be sent. ``flushed`` covers the replies queued until the capture."""
        self.unconfirmed[epoch] = kept
        self.spawn(self._upload(epoch, gen, parts, flushed, seqlog_acked))

    async def _upload(
        self,
        epoch: int,
        gen: int,
        parts: list[PartitionSnapshot],
        flushed: asyncio.Future[None],
        seqlog_acked: int,
    ) -> None:
        assert self.blobs is not None, "snapshots need a blob store"
        started = time.perf_counter()
        try:
            size, _ = await asyncio.gather(upload(self.blobs, parts), flushed)
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator: the snapshot fails, nothing is lost
            log.warning("%s: snapshot %d upload failed: %s", self.node_id, epoch, exc)
            self.observe(False, time.perf_counter() - started, 0)
            done = SnapshotDone(
                epoch, self.node_id, False, f"{type(exc).__name__}: {exc}", 0, 0, seqlog_acked, gen
            )
        else:
            self.observe(True, time.perf_counter() - started, size)
            seqlog_offset = parts[0].seqlog_offset if parts else seqlog_acked
            done = SnapshotDone(epoch, self.node_id, True, "", len(parts), size, seqlog_offset, gen)
        self.transport.send(COORDINATOR, done)

    def on_result(self, msg: SnapshotResult, store: StateStore, answered: ReplyTable) -> None:
        on_result(self.unconfirmed, msg, store, answered)

    def put_back(self, store: StateStore, answered: ReplyTable) -> None:
        """Every snapshot not confirmed yet counts as failed (the coordinator abandoned it at a shape
        change): its deltas go back, newest first so that older ones end up underneath."""
        for epoch in sorted(self.unconfirmed, reverse=True):
            on_result(self.unconfirmed, SnapshotResult(epoch, False, -1), store, answered)
