"""Incremental snapshots: per-partition deltas of committed writes, cut at an epoch boundary.

At the end of an epoch flagged by the coordinator, a worker takes its delta map (every committed
write since the previous snapshot, deletes included) and, per owned partition, records where its
ingress consumption stands, its rescheduled transactions (with their tids) and its egress position.
The cut is synchronous (a consistent cut between two epochs) and takes the delta and the replies whole,
without copying them; splitting them by partition and encoding the parts run afterwards, between
epochs, ``snapshot_step_rows`` rows at a time (why: styx_py.core.config), and the upload runs off the
epoch loop. The delta is kept until the coordinator confirms the snapshot complete; if any part
failed, the delta is merged back so the next snapshot carries it (a half-failed snapshot is never
used: the coordinator writes no manifest for it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any, TypeVar

import msgspec

from styx_py.core.blobs import BlobStore, delta_key
from styx_py.core.config import Config
from styx_py.core.logmarks import recorded_by_snapshot
from styx_py.core.partitioning import partition_of
from styx_py.core.segments import Cursor
from styx_py.core.wire import (
    IngressRecord,
    PartitionSnapshot,
    Reply,
    Request,
    SnapshotDone,
    SnapshotResult,
)
from styx_worker.dedup import ReplyTable
from styx_worker.effects import PortView, Upload
from styx_worker.replies import ReplyOut
from styx_worker.routing import RoutingTable
from styx_worker.state import StateStore, Writes
from styx_worker.txn import RootTxn

__all__ = [
    "PartitionSnapshot",
    "Unconfirmed",
    "capture_steps",
    "encode_steps",
    "on_result",
    "put_back",
    "rows_by_partition",
    "run_steps",
    "run_upload",
    "snapshot_decoder",
    "upload_snapshot",
]

log = logging.getLogger("styx.worker")

_encoder = msgspec.msgpack.Encoder()
snapshot_decoder = msgspec.msgpack.Decoder(PartitionSnapshot)

Rescheduled = tuple[int, int, int, int, Request]  # (partition, tid, offset, ts_ms, request)

T = TypeVar("T")
Steps = Generator[None, None, T]
"""Work done in steps: it yields where other work may run, and returns its result."""


def run_steps(steps: Steps[T]) -> T:
    """Every step of ``steps`` at once."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


async def run_steps_async(steps: Steps[T], pause_s: float = 0.0) -> T:
    """``steps``, letting the event loop run between two of them: whatever is ready, and for ``pause_s``."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        await asyncio.sleep(pause_s)


def capture_steps(
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
    rows: int,
) -> Steps[list[PartitionSnapshot]]:
    """Split a delta map by partition into the parts of one snapshot, ``rows`` writes per step
    (pure: :func:`run_steps` takes every step at once). Everything but ``delta`` and ``replies`` is read
    now; those two are read in the steps, so nothing may change them meanwhile (the worker takes them
    whole: :meth:`StateStore.take_delta <styx_worker.state.StateStore.take_delta>`)."""
    partition, owned = dict(partition), sorted(owned)
    resched, held = rows_by_partition(owned, rescheduled, waiting)
    parts = [
        PartitionSnapshot(
            epoch,
            p,
            [],
            positions.get(p, {}).get(0, 0),
            resched[p],
            egress_offsets.get(p, 0),
            seqlog_offset,
            replies.get(p, []),
            held[p],
            dict(sorted(egress_offsets.items())),
            dict(sorted(positions.get(p, {}).items())),
        )
        for p in owned
    ]
    return _split(delta, partition, {part.partition: part.writes for part in parts}, parts, rows)


def _split(
    delta: Writes,
    partition: dict[str, int],
    writes: dict[int, list[tuple[str, str | int, bytes | None]]],
    parts: list[PartitionSnapshot],
    rows: int,
) -> Steps[list[PartitionSnapshot]]:
    for n, ((op, key), value) in enumerate(delta.items(), 1):
        writes[partition_of(key, partition[op])].append((op, key, value))
        if n % rows == 0:
            yield
    return parts


def encode_steps(part: PartitionSnapshot, rows: int) -> Steps[bytes]:
    """``part`` encoded (the same bytes as at once), its writes and replies ``rows`` at a time."""
    writes = yield from _array_steps(part.writes, rows)
    replies = yield from _array_steps(part.replies, rows)
    return _encoder.encode(msgspec.structs.replace(part, writes=writes, replies=replies))


def _array_steps(items: list[Any], rows: int) -> Steps[msgspec.Raw]:
    """``items`` as one MessagePack array, encoded ``rows`` items at a time and spliced: each slice's
    own array header (``0x90 | n`` below 16 items, else ``0xdc`` and two bytes) gives way to one for
    all of them (``0xdc`` and two bytes, or ``0xdd`` and four from 2**16 items)."""
    if len(items) <= rows:
        return msgspec.Raw(_encoder.encode(items))
    n = len(items)
    body = [b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")]
    for start in range(0, n, rows):
        data = _encoder.encode(items[start : start + rows])
        body.append(data[1:] if data[0] < 0xDC else data[3:])
        yield
    return msgspec.Raw(b"".join(body))


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


async def run_upload(
    blobs: BlobStore, parts: Steps[list[PartitionSnapshot]], rows: int, pause_s: float = 0.0
) -> tuple[int, int]:
    """Split, encode (``rows`` at a time) and write every part, in steps ``pause_s`` apart; returns the
    parts and the bytes written. Any failure propagates (the snapshot fails)."""
    done = await run_steps_async(parts, pause_s)
    size = 0
    for part in done:
        data = await run_steps_async(encode_steps(part, rows), pause_s)
        size += len(data)
        await blobs.put(delta_key(part.partition, part.epoch), data)
    return len(done), size


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


def cut(
    epoch: int,
    gen: int,
    store: StateStore,
    replies: ReplyOut,
    rescheduled: list[RootTxn],
    table: RoutingTable,
    ports: PortView,
    config: Config,
) -> tuple[Upload, tuple[Writes, dict[int, list[Reply]]]]:
    """The snapshot of this worker at the end of ``epoch``: its parts to upload (made in steps later)
    and what they hold, kept until the coordinator's verdict. The delta and the replies are taken whole
    (nothing may change them while the steps read them)."""
    delta = store.take_delta()
    answered = replies.answered.take_delta()
    resched = [(r.partition, r.tid, r.offset, r.ts_ms, r.request) for r in rescheduled]
    waiting = [rec for recs in replies.waiting.values() for rec in recs]
    acked = ports.seqlog_acked()
    positions, egress = ports.positions(), ports.egress_offsets()
    parts = capture_steps(
        epoch,
        delta,
        table.op_partitions,
        table.owned(),
        positions,
        resched,
        egress,
        acked,
        answered,
        waiting,
        config.snapshot_step_rows,
    )
    marks = recorded_by_snapshot(config.ingress_topic, config.egress_topic, positions, egress)
    return Upload(epoch, gen, parts, acked, marks), (delta, answered)


def put_back(unconfirmed: Unconfirmed, store: StateStore, answered: ReplyTable) -> None:
    """Every snapshot not confirmed yet counts as failed (the coordinator abandoned it at a shape
    change): its deltas go back, newest first so that older ones end up underneath."""
    for epoch in sorted(unconfirmed, reverse=True):
        on_result(unconfirmed, SnapshotResult(epoch, False, -1), store, answered)


UploadObserver = Callable[[bool, float, int], None]  # (ok, seconds, bytes): the worker's metrics
UPLOAD_ERRORS = (OSError, TimeoutError)
"""What a snapshot upload may fail with and still be only a failed snapshot (the blob store's port
raises OSError for every failure of the store); anything else is a bug and ends the worker."""


async def upload_snapshot(
    node_id: str,
    blobs: BlobStore | None,
    upload: Upload,
    flushed: Awaitable[None],
    pace: tuple[int, float],
    observe: UploadObserver,
) -> SnapshotDone:
    """Upload a captured snapshot (``upload.parts``, :func:`capture_steps`) in steps (``pace``: rows per
    step, seconds between steps) and say how it went, for the coordinator.

    The snapshot's replies must be on the egress log before it can be confirmed: recovery from it
    replays only later epochs, so a reply still queued in the producer when this process dies would
    otherwise never be sent. ``flushed`` covers the replies queued until the capture."""
    assert blobs is not None, "snapshots need a blob store"
    epoch, gen, acked = upload.epoch, upload.gen, upload.seqlog_acked
    started = time.perf_counter()
    try:
        (count, size), _ = await asyncio.gather(run_upload(blobs, upload.parts, *pace), flushed)
    except UPLOAD_ERRORS as exc:
        log.warning("%s: snapshot %d upload failed: %s", node_id, epoch, exc)
        observe(False, time.perf_counter() - started, 0)
        return SnapshotDone(epoch, node_id, False, f"{type(exc).__name__}: {exc}", 0, 0, acked, gen)
    observe(True, time.perf_counter() - started, size)
    return SnapshotDone(epoch, node_id, True, "", count, size, acked, gen, upload.marks)
