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

import msgspec

from styx_py.core.blobs import BlobStore, delta_key
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import IngressRecord, PartitionSnapshot, Reply, Request, SnapshotResult
from styx_py.worker.dedup import ReplyTable

__all__ = ["PartitionSnapshot", "Unconfirmed", "capture", "on_result", "snapshot_decoder", "upload"]
from styx_py.worker.state import StateStore, Writes

_encoder = msgspec.msgpack.Encoder()
snapshot_decoder = msgspec.msgpack.Decoder(PartitionSnapshot)

Rescheduled = tuple[int, int, int, int, Request]  # (partition, tid, offset, ts_ms, request)


def capture(
    epoch: int,
    delta: Writes,
    partition: dict[str, int],
    owned: list[int],
    positions: dict[int, int],
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
    resched: dict[int, list[tuple[int, int, int, Request]]] = {p: [] for p in owned}
    for p, tid, offset, ts_ms, request in sorted(rescheduled, key=lambda r: r[1]):
        resched[p].append((tid, offset, ts_ms, request))
    held: dict[int, list[tuple[int, int, Request]]] = {p: [] for p in owned}
    for rec in waiting:
        held[rec.partition].append((rec.offset, rec.ts_ms, rec.request))
    return [
        PartitionSnapshot(
            epoch,
            p,
            writes[p],
            positions.get(p, 0),
            resched[p],
            egress_offsets.get(p, 0),
            seqlog_offset,
            replies.get(p, []),
            sorted(held[p], key=lambda w: w[0]),
        )
        for p in sorted(owned)
    ]


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
