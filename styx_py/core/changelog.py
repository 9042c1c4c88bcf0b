"""The changelog topic's records: every committed write, in commit order, exactly once (pure).

One changelog partition per state partition, written by the worker that owns the partition once an
epoch finished there. The Kafka key of a record is its entity (:func:`entity_key`), so the latest
record per key is the table; the value is a :class:`ChangeRecord` in msgpack: the operator and key,
the value (the state's msgpack as it is, embedded; nil for a delete, with ``deleted`` set, so a put of
``None`` and a delete differ), and the write's place in the commit order: ``epoch``, ``phase``,
``tid``, and ``index``, its place among the records the epoch wrote to the partition.

The order within a partition is the serial order ``(epoch, phase, tid)``
(:mod:`styx_py.core.serial`); one transaction's writes to one partition are sorted by the msgpack
of ``(operator, key)``. ``(epoch, index)`` is a record's *position*: strictly increasing along a
partition, and the same on every run of the epoch (a replay commits the same writes). A worker that
resumes a partition reads its last record's position (:meth:`ChangeRecord.position`) and skips every
record of a replay at or below it, so a replay never appends twice and, since every epoch a restored
snapshot does not hold is replayed, a recovery leaves no gap. A deleted entity keeps its delete
record (not a Kafka tombstone: every record carries its position).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from styx_py.core.partitioning import Key, partition_of
from styx_py.core.wire import NIL, Phase, decode_value

__all__ = [
    "ChangeRecord",
    "Commit",
    "Position",
    "change_decoder",
    "encode_change",
    "entity_key",
    "records_of",
    "table_of",
]

Position = tuple[int, int]  # (epoch, index): a record's place along its partition
Commit = tuple[int, int, Mapping[tuple[str, Key], bytes | None]]  # phase, tid, its writes (None: delete)


class ChangeRecord(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """One committed write to one entity."""

    operator: str
    key: Key
    value: msgspec.Raw  # the state's msgpack (nil for a delete)
    deleted: bool
    epoch: int
    phase: Phase
    tid: int
    index: int  # its place among the records ``epoch`` wrote to this partition

    @property
    def position(self) -> Position:
        return (self.epoch, self.index)

    def decoded(self) -> Any:
        """The value written (``None`` for a delete)."""
        return None if self.deleted else decode_value(self.value)


_encoder = msgspec.msgpack.Encoder()
change_decoder = msgspec.msgpack.Decoder(ChangeRecord)


def encode_change(record: ChangeRecord) -> bytes:
    return _encoder.encode(record)


def entity_key(operator: str, key: Key) -> bytes:
    """The Kafka key of a record: the msgpack of ``[operator, key]``."""
    return _encoder.encode((operator, key))


def records_of(
    epoch: int,
    commits: Iterable[Commit],
    partitions: Mapping[str, int],
    after: Mapping[int, Position] | None = None,
) -> dict[int, list[ChangeRecord]]:
    """The records ``epoch``'s ``commits`` put on each partition, in commit order; with ``after``,
    only those past each partition's position there (what the changelog holds already)."""
    out: dict[int, list[ChangeRecord]] = {}
    for phase, tid, writes in sorted(commits, key=lambda c: (c[0], c[1])):
        items = list(writes.items())
        if len(items) > 1:
            items.sort(key=lambda kv: entity_key(*kv[0]))
        for (op, key), value in items:
            p = partition_of(key, partitions[op])
            part = out.setdefault(p, [])
            raw = NIL if value is None else msgspec.Raw(value)
            part.append(ChangeRecord(op, key, raw, value is None, epoch, Phase(phase), tid, len(part)))
    if after:
        for p, tail in after.items():
            if p in out:
                out[p] = [r for r in out[p] if r.position > tail]
    return {p: records for p, records in out.items() if records}


def table_of(records: Iterable[ChangeRecord]) -> dict[tuple[str, Key], Any]:
    """The state the records leave, read in order: the latest record per entity, deletes dropped."""
    table: dict[tuple[str, Key], Any] = {}
    for r in records:
        if r.deleted:
            table.pop((r.operator, r.key), None)
        else:
            table[(r.operator, r.key)] = r.decoded()
    return table
