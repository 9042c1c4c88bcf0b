"""Range reads inside transactions (``ctx.scan``): the pieces the engine and the serial model share.

A scan reads the keys of one operator in key order, bounded by ``start`` (inclusive) or ``after``
(exclusive), ``end`` (exclusive), ``prefix`` (str keys only) and ``limit`` rows. Keys are
hash-partitioned, so the engine visits every partition of the operator: one synchronous call per
partition, to the partition's worker, under the system operator :data:`SCAN_OP` with the key
:func:`scan_key` (the partition and the operator), and merges their answers. Each partition answers
from the state its transaction sees and puts the range into the transaction's read set there
(:class:`ScanRange`): a write by a lower tid into it (an update, an insert or a delete) is a conflict,
as a write to a key it read is.

Key order: int keys before str keys; ints by value, strs by code point. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from styx_py.core.errors import ScanLimitExceeded
from styx_py.core.limits import MAX_SCAN_LIMIT
from styx_py.core.partitioning import Key, key_bytes, partition_of

__all__ = [
    "SCAN_FUNCTION",
    "SCAN_OP",
    "OrderKey",
    "ScanRange",
    "merge",
    "operator_entries",
    "order",
    "scan_key",
    "scan_operator",
    "scan_partition",
    "scan_range",
    "select",
]

SCAN_OP = "styx.scan"  # the system operator a scan's per-partition calls name (never in a graph)
SCAN_FUNCTION = "range"

OrderKey = tuple[int, Any]


def order(key: Key) -> OrderKey:
    """The sort key of an entity key: ints before strs (never compared with each other)."""
    return (0, key) if isinstance(key, int) else (1, key)


def scan_key(operator: str, partition: int) -> str:
    """The key of the scan of ``operator``'s ``partition``: also the coarse lock the fallback takes on it."""
    return f"{partition}/{operator}"


def scan_partition(key: Key) -> int:
    """The partition a :func:`scan_key` names."""
    return int(str(key).split("/", 1)[0])


def scan_operator(key: Key) -> str:
    """The operator a :func:`scan_key` names."""
    return str(key).split("/", 1)[1]


class ScanRange(msgspec.Struct, array_like=True, frozen=True):
    """The key range one scan read on one partition (part of its transaction's read set).

    ``low``: the least key in it (None: unbounded), ``low_open``: excluding ``low`` itself; ``high``: the
    bound above (None: unbounded), ``high_open``: excluding ``high`` (an ``end``) or not (the last key a
    partition answered when ``limit`` cut it short: keys after it were not read). ``prefix``: only str keys
    with it. ``partition`` of ``partitions``: only that partition's keys (a range read by one partition's
    scan; -1: every partition). Each partition's range can be cut at another key, so a range must not
    hold another partition's keys: which partitions share a worker would then change the conflicts, and
    a replay after a shape change would decide otherwise than the first run."""

    operator: str
    low: Key | None
    low_open: bool
    high: Key | None
    high_open: bool
    prefix: str | None
    partition: int = -1
    partitions: int = 0

    def holds(self, key: Key) -> bool:
        if self.prefix is not None and not (isinstance(key, str) and key.startswith(self.prefix)):
            return False
        if self.partition >= 0 and partition_of(key, self.partitions) != self.partition:
            return False
        k = order(key)
        if self.low is not None:
            lo = order(self.low)
            if k < lo or (self.low_open and k == lo):
                return False
        if self.high is not None:
            hi = order(self.high)
            if k > hi or (self.high_open and k == hi):
                return False
        return True


def scan_range(
    operator: str,
    start: Key | None = None,
    end: Key | None = None,
    prefix: str | None = None,
    limit: int | None = None,
    after: Key | None = None,
) -> tuple[ScanRange, int]:
    """Check a scan's bounds; the range it reads and its row limit. Raises ``TypeError`` for a bound that
    is not a key and :class:`~styx_py.core.errors.ScanLimitExceeded` for a limit out of 1..MAX_SCAN_LIMIT
    (the same in the engine and the serial model: before any partition is asked)."""
    if start is not None and after is not None:
        raise TypeError("scan takes start or after, not both")
    for name, bound in (("start", start), ("end", end), ("after", after)):
        if bound is not None:
            try:
                key_bytes(bound)
            except TypeError:
                raise TypeError(f"scan {name} must be a str or int key, got {type(bound).__name__}") from None
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"scan prefix must be a str, got {type(prefix).__name__}")
    rows = MAX_SCAN_LIMIT if limit is None else limit
    if not isinstance(rows, int) or isinstance(rows, bool) or not 1 <= rows <= MAX_SCAN_LIMIT:
        raise ScanLimitExceeded(f"scan limit must be an int in 1..{MAX_SCAN_LIMIT}, got {limit!r}")
    low = after if after is not None else start
    return ScanRange(operator, low, after is not None, end, True, prefix), rows


def select(
    rng: ScanRange, rows: int, entries: Iterable[tuple[Key, bytes | None]]
) -> tuple[list[tuple[Key, bytes]], ScanRange]:
    """The first ``rows`` live entries in ``rng`` in key order (``None``: deleted), and the range read
    to find them: ``rng`` itself, or up to the last entry when ``rows`` cut it short."""
    live = sorted(((k, v) for k, v in entries if v is not None and rng.holds(k)), key=lambda kv: order(kv[0]))
    if len(live) <= rows:
        return live, rng
    live = live[:rows]
    return live, msgspec.structs.replace(rng, high=live[-1][0], high_open=False)


def merge(parts: Iterable[list[tuple[Key, Any]]], rows: int) -> list[tuple[Key, Any]]:
    """The partitions' answers as one list in key order, cut at ``rows``."""
    out = sorted((tuple(kv) for part in parts for kv in part), key=lambda kv: order(kv[0]))
    return [(k, v) for k, v in out[:rows]]


def operator_entries(
    items: Iterable[tuple[tuple[str, Key], bytes | None]], operator: str
) -> Iterator[tuple[Key, bytes | None]]:
    """The ``(key, value)`` of ``operator``'s entities among ``items``."""
    for (op, key), value in items:
        if op == operator:
            yield key, value
