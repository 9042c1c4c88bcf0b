"""Aria-style conflict detection over the reservations of one epoch on one worker.

A transaction ``T`` conflicts when a key it read or wrote carries a write reservation from a lower
tid (write-after-write or read-after-write against a lower tid; a blind add, ``Context.add``, only
against a lower tid's put or delete: adds commute), or when a key range it scanned
(:class:`~styx_py.core.scan.ScanRange`) holds a key with a write reservation from a lower tid: an
insert, an update or a delete (phantoms are conflicts). Transactions whose logic aborted are
left out of the write reservations (they will write nothing), but are still checked themselves: an
abort decided against stale data must be re-run in the fallback phase.

Pure: no I/O, no event loop.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Set

from styx_py.core.scan import ScanRange

EntityKey = tuple[str, str | int]


def write_minima(writes: Mapping[int, Iterable[EntityKey]], excluded: Set[int]) -> dict[EntityKey, int]:
    """For each key, the lowest tid holding a write reservation on it."""
    minima: dict[EntityKey, int] = {}
    for tid, keys in writes.items():
        if tid in excluded:
            continue
        for key in keys:
            current = minima.get(key)
            if current is None or tid < current:
                minima[key] = tid
    return minima


def find_conflicts(
    reads: Mapping[int, Iterable[EntityKey]],
    writes: Mapping[int, Iterable[EntityKey]],
    excluded: Set[int] = frozenset(),
    ranges: Mapping[int, Iterable[ScanRange]] | None = None,
    adds: Mapping[int, Container[EntityKey]] | None = None,
) -> list[int]:
    """Sorted tids that conflict with a lower tid on some key or scanned range of this worker.

    ``adds``: the keys among each tid's writes that it only added to, blind (``Context.add``). Adds
    commute, so a blind add conflicts only with a lower tid's other write (a put or a delete: the
    order decides the value); a read, a scan or another write conflicts with a lower tid's add as
    with any write."""
    minima = write_minima(writes, excluded)
    overwrites = minima
    if adds:
        overwrites = write_minima(
            {t: [k for k in keys if k not in adds.get(t, ())] for t, keys in writes.items()}, excluded
        )
    conflicted: set[int] = set()
    for table in (reads, writes):
        for tid, keys in table.items():
            if tid in conflicted:
                continue
            added = adds.get(tid, ()) if adds and table is writes else ()
            for key in keys:
                holder = (overwrites if key in added else minima).get(key)
                if holder is not None and holder < tid:
                    conflicted.add(tid)
                    break
    if ranges:
        written: dict[str, list[tuple[str | int, int]]] = {}
        for (op, k), holder in minima.items():
            written.setdefault(op, []).append((k, holder))
        for tid, scanned in ranges.items():
            if tid not in conflicted and any(
                holder < tid and r.holds(k) for r in scanned for k, holder in written.get(r.operator, ())
            ):
                conflicted.add(tid)
    return sorted(conflicted)
