"""Snapshot bookkeeping on the coordinator: when to take one, and the manifest of complete ones (pure)."""

from __future__ import annotations

import msgspec

from styx_py.wire import Manifest

manifest_encoder = msgspec.msgpack.Encoder()
manifest_decoder = msgspec.msgpack.Decoder(Manifest)


def empty_manifest(n_partitions: int) -> Manifest:
    """Recovery without any snapshot: empty state, replay the logs from the beginning."""
    return Manifest(-1, 0, n_partitions, {}, [(0, 0)])


def extend(prev: Manifest, epoch: int, lc: int) -> Manifest:
    """The manifest after the snapshot of ``epoch`` completed: every partition gains one delta."""
    deltas = {p: [*prev.deltas.get(p, []), epoch] for p in range(prev.n_partitions)}
    return Manifest(epoch, lc, prev.n_partitions, deltas, list(prev.epoch_generations))


def with_generation(m: Manifest, first_epoch: int, gen: int) -> Manifest:
    """Record that generation ``gen`` runs epochs from ``first_epoch`` on (after a recovery)."""
    return msgspec.structs.replace(m, epoch_generations=[*m.epoch_generations, (first_epoch, gen)])
