"""Snapshot bookkeeping on the coordinator: when to take one, and the manifest of complete ones (pure)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from styx_py.core.blobs import BlobStore, base_key, delta_key, epoch_of
from styx_py.core.logmarks import LogMark
from styx_py.core.wire import ClusterMeta, Manifest, PartitionSnapshot, Reply, SeqLogEntry

snapshot_decoder = msgspec.msgpack.Decoder(PartitionSnapshot)

manifest_encoder = msgspec.msgpack.Encoder()
manifest_decoder = msgspec.msgpack.Decoder(Manifest)
meta_encoder = manifest_encoder
meta_decoder = msgspec.msgpack.Decoder(ClusterMeta)
META_KEY = "cluster/meta"


def empty_manifest(n_partitions: int) -> Manifest:
    """Recovery without any snapshot: empty state, replay the logs from the beginning."""
    return Manifest(-1, 0, n_partitions, {}, [(0, 0)])


def extend(
    prev: Manifest, epoch: int, lc: int, seqlog_offset: int, marks: list[LogMark] | None = None
) -> Manifest:
    """The manifest after the snapshot of ``epoch`` completed: every partition gains one delta.
    ``marks``: the offsets its workers recorded (core.logmarks)."""
    deltas = {p: [*prev.deltas.get(p, []), delta_key(p, epoch)] for p in range(prev.n_partitions)}
    generations = list(prev.epoch_generations)
    return Manifest(epoch, lc, prev.n_partitions, deltas, generations, seqlog_offset, marks or [])


def with_generation(m: Manifest, first_epoch: int, gen: int) -> Manifest:
    """Record that generation ``gen`` runs epochs from ``first_epoch`` on (after a recovery)."""
    return msgspec.structs.replace(m, epoch_generations=[*m.epoch_generations, (first_epoch, gen)])


Merge = Callable[[list[bytes], int], Awaitable[tuple[int, bytes]]]
"""Runs :func:`merge_chain` (the coordinator process: in a child process, off its event loop; a child
that died raises ``ChildProcessError``)."""


def merge_chain(chain: list[bytes], keep_replies: int) -> tuple[int, bytes]:
    """One partition's snapshot objects, oldest first (a compacted base, then deltas), merged into one
    base holding the partition's whole state and its ``keep_replies`` latest replies: its epoch and
    its encoding. Pure CPU (a second or more for a long chain with a full reply table)."""
    state: dict[tuple[str, str | int], bytes] = {}
    replies: dict[str, Reply] = {}
    last: PartitionSnapshot | None = None
    for raw in chain:
        last = snapshot_decoder.decode(raw)
        for op, k, v in last.writes:
            if v is None:
                state.pop((op, k), None)
            else:
                state[(op, k)] = v
        for reply in last.replies:
            replies.pop(reply.request_id, None)  # re-insert: the dict keeps commit order
            replies[reply.request_id] = reply
    assert last is not None, "an empty chain"
    kept = list(replies.values())[-keep_replies:] if keep_replies > 0 else []
    base = msgspec.structs.replace(last, writes=[(op, k, v) for (op, k), v in state.items()], replies=kept)
    return last.epoch, manifest_encoder.encode(base)


async def merge_here(chain: list[bytes], keep_replies: int) -> tuple[int, bytes]:
    """:func:`merge_chain` on the caller's event loop (the simulation, tests)."""
    return merge_chain(chain, keep_replies)


async def compact(
    blobs: BlobStore, manifest: Manifest, keep_deltas: int, keep_replies: int, merge: Merge = merge_here
) -> Manifest:
    """Merge each partition's chain of deltas into one base object once it is longer than ``keep_deltas``.

    Deltas are applied in numeric epoch order (never by name); deletes are dropped from the base,
    which holds the partition's whole state. Runs in the background: nothing waits on it.
    """
    deltas: dict[int, list[str]] = {}
    for p, keys in sorted(manifest.deltas.items()):
        if len(keys) <= keep_deltas:
            deltas[p] = keys
            continue
        chain: list[bytes] = []
        for key in sorted(keys, key=epoch_of):
            raw = await blobs.get(key)
            if raw is None:
                raise FileNotFoundError(f"{key} is listed in manifest {manifest.epoch} but missing")
            chain.append(raw)
        epoch, base = await merge(chain, keep_replies)
        key = base_key(p, epoch)
        await blobs.put(key, base)
        deltas[p] = [key]
    return msgspec.structs.replace(manifest, deltas=deltas)


async def retain(blobs: BlobStore, manifest: Manifest) -> int:
    """Delete snapshot objects no manifest needs any more and every manifest but the latest.

    Objects newer than the manifest may belong to a snapshot being taken: they stay.
    """
    needed = {k for keys in manifest.deltas.values() for k in keys}
    stale = [k for k in await blobs.list("snapshots/") if k not in needed and epoch_of(k) <= manifest.epoch]
    stale += [k for k in await blobs.list("manifests/") if epoch_of(k) < manifest.epoch]
    await blobs.delete(stale)
    return len(stale)


def last_complete_epoch(entries: list[SeqLogEntry], manifest: Manifest, n_workers: int) -> int:
    """The last epoch after the snapshot whose composition every worker logged (it may have been
    decided and replied to, so it must be replayed; one not complete was never decided)."""
    nodes: dict[int, set[str]] = {}
    needed: dict[int, int] = {}  # the workers of the generation that ran it (entries say; else n_workers)
    for entry in entries:
        if entry.epoch > manifest.epoch and entry.gen == manifest.generation_of(entry.epoch):
            nodes.setdefault(entry.epoch, set()).add(entry.node_id)
            needed[entry.epoch] = max(needed.get(entry.epoch, 0), entry.nodes or n_workers)
    last = manifest.epoch
    while last + 1 in nodes and len(nodes[last + 1]) >= needed[last + 1]:
        last += 1
    return last
