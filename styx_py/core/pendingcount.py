"""How many intents and timers each partition has pending: the count the per-partition bounds
(``Graph(max_pending_per_partition=…)``, docs/effects.md) are checked against.

An entity of a system operator (``styx.outbox``, ``styx.timers``) holds a map of what it has pending,
so its count is the length of that map, read from the msgpack header without decoding the rest.
:class:`PendingCounts` keeps the totals per (system operator, partition) as state is written; the worker
takes a copy at the start of each epoch and the serial model computes the same from its state, so the
bound depends on committed state only (as of the start of the transaction's epoch), never on timing.
"""

from __future__ import annotations

from collections.abc import Iterable

from styx_py.core.effectids import SYSTEM_OPERATORS
from styx_py.core.partitioning import Key, partition_of

__all__ = ["PendingCounts", "pending_size"]

EntityKey = tuple[str, Key]
Totals = dict[tuple[str, int], int]  # (system operator, partition) -> entries pending


def pending_size(raw: bytes | None) -> int:
    """The number of entries of an encoded map (0 for no value or another type)."""
    if not raw:
        return 0
    head = raw[0]
    if 0x80 <= head <= 0x8F:
        return head & 0x0F
    if head == 0xDE:
        return int.from_bytes(raw[1:3], "big")
    if head == 0xDF:
        return int.from_bytes(raw[1:5], "big")
    return 0


class PendingCounts:
    """Per (system operator, partition), the entries pending, kept up to date by :meth:`write`."""

    __slots__ = ("partitions", "sizes", "totals")

    def __init__(self) -> None:
        self.sizes: dict[EntityKey, int] = {}
        self.partitions = 0  # the system operators' partition count the totals are for (0: none yet)
        self.totals: Totals = {}

    def write(self, key: EntityKey, raw: bytes | None) -> None:
        if key[0] not in SYSTEM_OPERATORS:
            return
        size = pending_size(raw)
        before = self.sizes.pop(key, 0)
        if size:
            self.sizes[key] = size
        if self.partitions and size != before:
            slot = (key[0], partition_of(key[1], self.partitions))
            self.totals[slot] = self.totals.get(slot, 0) + size - before

    def write_all(self, items: Iterable[tuple[EntityKey, bytes | None]]) -> None:
        for key, raw in items:
            self.write(key, raw)

    def at(self, partitions: int) -> Totals:
        """A copy of the totals, for system operators over ``partitions`` partitions."""
        if partitions != self.partitions:
            self.partitions = partitions
            self.totals = {}
            for (op, key), size in self.sizes.items():
                slot = (op, partition_of(key, partitions))
                self.totals[slot] = self.totals.get(slot, 0) + size
        return {k: v for k, v in self.totals.items() if v}
