"""Recovery: rebuild this worker's part of the cluster from the last complete snapshot and the logs.

:func:`restore` reads the manifest's snapshot objects for the partitions this worker owns (a
compacted base first, then deltas, in epoch order) and the sequencer log from the snapshot's
position; it returns everything as a :class:`Restored` value, which the worker installs only once
the whole restore succeeded. :func:`plan_replay` (pure) picks this worker's logged batch of every
epoch to replay, :func:`~styx_worker.digests.logged_digests` the digests its writes are compared
with. :func:`replies_on_log` reads back the replies that replayed epochs already sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from styx_py.core.blobs import BlobStore, epoch_of
from styx_py.core.ports import LogReader
from styx_py.core.segments import Cursor, cursor_of
from styx_py.core.wire import IngressRecord, Manifest, Recover, Reply, SeqLogEntry
from styx_worker.dedup import ReplyTable
from styx_worker.digests import Logged, logged_digests
from styx_worker.snapshot import HeldRow, PartitionSnapshot, ResumeRow, snapshot_decoder
from styx_worker.state import StateStore
from styx_worker.txn import RootTxn


@dataclass
class Restored:
    store: StateStore
    rescheduled: list[RootTxn]
    answered: ReplyTable
    waiting: dict[str, list[IngressRecord]]
    positions: dict[int, Cursor]  # ingress partition -> next offset to take per segment
    # Egress partition -> where to read back replies from: below it, none of a replayed epoch's.
    egress_offsets: dict[int, int]
    replay: dict[int, SeqLogEntry]  # epoch -> this worker's logged batch
    # epoch -> partition -> tid -> digest of its writes, as first logged (styx_worker.digests)
    digests: dict[int, Logged]


async def restore(
    msg: Recover,
    owned: list[int],
    node_id: str,
    blobs: BlobStore | None,
    logs: LogReader,
    replies_per_partition: int,
) -> Restored:
    """Everything this worker needs to resume at ``msg.manifest``'s snapshot and replay from it."""
    m = msg.manifest
    store = StateStore()
    positions: dict[int, Cursor] = {p: {} for p in owned}
    # A replayed epoch's replies may be on any egress partition (each goes where its client reads):
    # read every partition, from the lowest bound any owned partition's snapshot gives (0 without one).
    egress_offsets = {q: 0 for q in range(m.n_partitions)} if owned else {}
    bounds: list[dict[int, int]] = []
    seqlog_from = 0
    first = True
    rescheduled: list[RootTxn] = []
    answered = ReplyTable(replies_per_partition)
    waiting: dict[str, list[IngressRecord]] = {}
    for p in owned:
        last: PartitionSnapshot | None = None
        for key in sorted(m.deltas.get(p, []), key=epoch_of):
            assert blobs is not None, "a manifest with snapshots needs a blob store"
            raw = await blobs.get(key)
            if raw is None:
                raise FileNotFoundError(f"snapshot object {key} listed in manifest {m.epoch} is missing")
            last = snapshot_decoder.decode(raw)
            store.load_writes(last.writes)
            for reply in last.replies:
                answered.record(p, reply, as_delta=False)
        if last is not None:
            seqlog_from = last.seqlog_offset if first else min(seqlog_from, last.seqlog_offset)
            first = False
            positions[p] = cursor_of(last.position, last.cursor)
            bounds.append(last.egress_offsets or {p: last.egress_offset})
            rescheduled += resumed(p, last.rescheduled)
            add_waiting(waiting, p, last.waiting)
        else:
            bounds.append({})
    for q in egress_offsets:
        egress_offsets[q] = min(b.get(q, 0) for b in bounds)
    replay: dict[int, SeqLogEntry] = {}
    written: dict[int, Logged] = {}
    if msg.replay_until > m.epoch:  # else nothing to replay: no need to read the log
        entries = await logs.seqlog(max(seqlog_from, m.seqlog_offset) if m.epoch >= 0 else 0)
        replay = plan_replay(entries, m, msg.replay_until, set(owned), node_id)
        written = logged_digests(entries, m, msg.replay_until, set(owned))
    return Restored(store, rescheduled, answered, waiting, positions, egress_offsets, replay, written)


def resumed(partition: int, rows: list[ResumeRow]) -> list[RootTxn]:
    """A snapshot part's or a handoff's rescheduled transactions of ``partition``, to run again."""
    return [RootTxn(tid, IngressRecord(partition, offset, request, ts)) for tid, offset, ts, request in rows]


def add_waiting(waiting: dict[str, list[IngressRecord]], partition: int, rows: list[HeldRow]) -> None:
    """Add a snapshot part's or a handoff's waiting requests of ``partition`` to ``waiting`` (by id)."""
    for offset, ts_ms, request in rows:
        waiting.setdefault(request.request_id, []).append(IngressRecord(partition, offset, request, ts_ms))


async def replies_on_log(
    logs: LogReader, egress_offsets: dict[int, int], after_epoch: int
) -> dict[str, list[Reply]]:
    """Replies the replayed epochs (those after ``after_epoch``) already put on the egress log."""
    on_log: dict[str, list[Reply]] = {}
    for r in await logs.replies_from(egress_offsets, after_epoch):
        on_log.setdefault(r.request_id, []).append(r)
    return on_log


def plan_replay(
    entries: list[SeqLogEntry], m: Manifest, replay_until: int, owned: set[int], node_id: str
) -> dict[int, SeqLogEntry]:
    """This worker's batch of every epoch to replay, from the sequencer log (pure).

    Only entries of the generation that ran an epoch count: a generation that died mid-epoch may have
    logged part of an epoch that was never decided, and that epoch number was reused afterwards.
    """
    plan: dict[int, SeqLogEntry] = {}
    for entry in entries:
        e = entry.epoch
        if not m.epoch < e <= replay_until or entry.gen != m.generation_of(e):
            continue
        mine = [x for x in entry.entries if x.partition in owned]
        current = plan.get(e)
        if current is None:
            plan[e] = msgspec.structs.replace(entry, node_id=node_id, entries=mine)
        else:
            current.entries.extend(mine)
            current.lc_end = max(current.lc_end, entry.lc_end)
    return plan
