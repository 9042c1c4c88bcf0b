"""Rows grouped into transactions: ``bulk_put`` to load them, ``get_many`` to read them back.

Rows are grouped by (operator, partition), and each transaction is rooted at a key of that same
partition, so each row's ``put`` or ``get`` is a local call: loading runs :data:`LOAD_CHUNK` rows per
transaction, reading :data:`READ_CHUNK` entities (each synchronous call halves the caller's ack share,
so one invocation must make far fewer than 64 of them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from styx_benchmarks.tpcc.schema import PARTITIONS
from styx_benchmarks.workload import Op
from styx_py.core.partitioning import partition_of

_encode = msgspec.msgpack.Encoder().encode

LOAD_CHUNK = 500  # rows per loading transaction (one put call each, all on one partition)
LOAD_BYTES = 256 * 1024  # and at most about this many bytes of rows (an order page is ~7 KB), well
# under MAX_REQUEST_BYTES
READ_CHUNK = 40  # entities per reading transaction (sync calls; see transactions.get_many)


def _root_keys(partitions: int) -> list[str]:
    """A key on each partition ``p``: a bulk transaction rooted there makes only local calls."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        keys.setdefault(partition_of(f"~bulk{i}", partitions), f"~bulk{i}")
        i += 1
    return [keys[p] for p in range(partitions)]


def bulk_batches(
    rows: Iterable[tuple[str, str, Any]], chunk: int = LOAD_CHUNK, max_bytes: int = LOAD_BYTES
) -> Iterator[Op]:
    """Group rows by (operator, partition) into ``bulk_put`` calls of up to ``chunk`` rows and about
    ``max_bytes`` of encoded values (a call holds one row at least, however big).

    Each call is rooted at a key of the rows' own partition, so its puts never leave the worker.
    """
    roots = {op: _root_keys(n) for op, n in PARTITIONS.items()}
    buffers: dict[tuple[str, int], list[list[Any]]] = defaultdict(list)
    sizes: defaultdict[tuple[str, int], int] = defaultdict(int)
    for op, key, value in rows:
        p = partition_of(key, PARTITIONS[op])
        buf = buffers[(op, p)]
        buf.append([key, value])
        sizes[(op, p)] += len(key) + len(_encode(value))
        if len(buf) >= chunk or sizes[(op, p)] >= max_bytes:
            yield Op("load", op, roots[op][p], "bulk_put", (buf,))
            buffers[(op, p)] = []
            sizes[(op, p)] = 0
    for (op, p), buf in sorted(buffers.items()):
        if buf:
            yield Op("load", op, roots[op][p], "bulk_put", (buf,))


def read_batches(keys: Iterable[tuple[str, str]], chunk: int = READ_CHUNK) -> Iterator[Op]:
    """``get_many`` calls reading ``(operator, key)`` pairs, grouped like :func:`bulk_batches`."""
    roots = {op: _root_keys(n) for op, n in PARTITIONS.items()}
    buffers: dict[tuple[str, int], list[str]] = defaultdict(list)
    for op, key in keys:
        p = partition_of(key, PARTITIONS[op])
        buf = buffers[(op, p)]
        buf.append(key)
        if len(buf) >= chunk:
            yield Op("read", op, roots[op][p], "get_many", (buf,))
            buffers[(op, p)] = []
    for (op, p), buf in sorted(buffers.items()):
        if buf:
            yield Op("read", op, roots[op][p], "get_many", (buf,))
