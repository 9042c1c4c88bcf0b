"""A scan's part on one worker: one partition's answer, and what the commit rules add for scans (pure).

``ctx.scan`` (:mod:`styx_py.core.scan`) calls every partition of the operator; each call is an
invocation of the system operator ``styx.scan`` whose key names the partition, routed to the worker
that owns it. That invocation (:func:`run_scan`) answers from the state its transaction sees here (the
committed state as of its phase, overlaid with its own buffered writes) and, in the optimistic run, puts
the range it read into its transaction's read set (``Reservations.ranges``); the lock-free commit
(:func:`styx_worker.conflicts.find_conflicts`) then treats a lower tid's write of any key in the range,
an insert or a delete too, as a conflict.

In the fallback a scan's key is also a coarse lock on its partition of the operator: every fallback
transaction that touches an entity of a scanned partition queues on it too (:func:`guard_of`), in tid
order, so a scan re-runs after every lower tid that writes into that partition is final and before any
higher one. A transaction that scans a partition and also invokes an entity of it (:func:`scan_races`)
could see or miss its own write depending on message order, so it runs alone in Phase.SERIAL, as one
that invokes an entity twice does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import msgspec

from styx_py.core.partitioning import Key, partition_of
from styx_py.core.scan import SCAN_OP, ScanRange, scan_key, scan_partition, select
from styx_py.core.wire import Invoke, Phase, Status, decode_value, encode_value
from styx_worker.ackshare import from_wire
from styx_worker.conflicts import EntityKey
from styx_worker.effects import Invoked
from styx_worker.txn import CachedInvocation, TxnView

__all__ = ["guard_of", "run_scan", "scan_races"]

Guard = Callable[[EntityKey], EntityKey | None]


def run_scan(view: TxnView, inv: Invoke, cached: CachedInvocation | None) -> Invoked:
    """One partition's answer to a scan: its live entries in the range, in key order, as
    ``[[key, value], …]``; in the optimistic run the range read goes into the read set."""
    op, low, low_open, high, high_open, prefix, rows = decode_value(inv.args)
    partition = scan_partition(inv.key)
    n = view.graph.operators[op].partitions
    rng = ScanRange(op, low, low_open, high, high_open, prefix, partition, n)
    mine = _of_partition(op, partition, n)
    entries: dict[Key, bytes | None] = {k: v for (o, k), v in view.store.data.items() if mine(o, k)}
    entries.update((k, v) for (o, k), v in view.buffer(inv.phase, inv.tid).items() if mine(o, k))
    live, read = select(rng, rows, entries.items())
    if inv.phase == Phase.OPTIMISTIC:
        view.record_range(inv.tid, read)
    value = msgspec.Raw(encode_value([[k, msgspec.Raw(v)] for k, v in live]))
    own = cached.own_share if cached is not None else from_wire(inv.share_n, inv.share_d)
    return Invoked(inv, Status.OK, "", value, own, [], [])


def _of_partition(op: str, partition: int, n: int) -> Callable[[str, Key], bool]:
    def mine(o: str, k: Key) -> bool:
        return o == op and partition_of(k, n) == partition

    return mine


def guard_of(partitions: Mapping[str, int]) -> Guard:
    """The scan lock an entity's invocation needs besides its own (if its partition is scanned)."""

    def guard(key: EntityKey) -> EntityKey | None:
        op, k = key
        n = partitions.get(op)
        if op == SCAN_OP or n is None:
            return None
        return (SCAN_OP, scan_key(op, partition_of(k, n)))

    return guard


def scan_races(cache: Mapping[int, Iterable[CachedInvocation]], partitions: Mapping[str, int]) -> set[int]:
    """Tids that scanned a partition here and invoked an entity of it too: they run alone
    (Phase.SERIAL). The scanning entity itself counts: re-invoked from the call-graph cache, it and its
    scan run in parallel, so its writes could land before the scan or after it."""
    guard = guard_of(partitions)
    racing: set[int] = set()
    for tid, invocations in cache.items():
        invs = list(invocations)
        scanned = {(SCAN_OP, c.inv.key) for c in invs if c.inv.operator == SCAN_OP}
        if scanned and any(guard((c.inv.operator, c.inv.key)) in scanned for c in invs):
            racing.add(tid)
    return racing
