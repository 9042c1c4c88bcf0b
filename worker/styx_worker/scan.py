"""A scan's part on one worker: one partition's answer, and what the commit rules add for scans (pure).

``ctx.scan`` (:mod:`styx_py.core.scan`) calls every partition of the operator; each call is an
invocation of the system operator ``styx.scan`` whose key names the partition, routed to the worker
that owns it. That invocation (:func:`run_scan`) answers from the state its transaction sees here (the
committed state as of its phase, overlaid with its own buffered writes), walking the partition's keys
in key order from the range's low bound (:func:`partition_rows`), and, in the optimistic run, puts
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
from styx_py.core.scan import SCAN_OP, ScanRange, scan_key, scan_partition
from styx_py.core.wire import Invoke, Phase, Status, decode_value, encode_value
from styx_worker.ackshare import from_wire
from styx_worker.conflicts import EntityKey
from styx_worker.effects import Invoked
from styx_worker.keyindex import from_low, lower, past_end
from styx_worker.state import StateStore, Writes
from styx_worker.txn import CachedInvocation, TxnView

__all__ = ["guard_of", "partition_rows", "run_scan", "scan_races"]

Guard = Callable[[EntityKey], EntityKey | None]


def run_scan(view: TxnView, inv: Invoke, cached: CachedInvocation | None) -> Invoked:
    """One partition's answer to a scan: its live entries in the range, in key order, as
    ``[[key, value], …]``; in the optimistic run the range read goes into the read set."""
    op, low, low_open, high, high_open, prefix, rows = decode_value(inv.args)
    partition = scan_partition(inv.key)
    n = view.graph.operators[op].partitions
    rng = ScanRange(op, low, low_open, high, high_open, prefix, partition, n)
    live, read = partition_rows(view.store, view.buffer(inv.phase, inv.tid), rng, rows)
    if inv.phase == Phase.OPTIMISTIC:
        view.record_range(inv.tid, read)
    value = msgspec.Raw(encode_value([[k, msgspec.Raw(v)] for k, v in live]))
    own = cached.own_share if cached is not None else from_wire(inv.share_n, inv.share_d)
    return Invoked(inv, Status.OK, "", value, own, [], [])


def partition_rows(
    store: StateStore, buffer: Writes, rng: ScanRange, rows: int
) -> tuple[list[tuple[Key, bytes]], ScanRange]:
    """What :func:`styx_py.core.scan.select` answers for ``rng`` (one partition) over the committed
    ``store`` overlaid with the transaction's ``buffer`` (None: deleted), from the store's key index
    (:mod:`styx_worker.keyindex`): a bisection to the low bound and a walk over the keys up to one past
    the ``rows``-th live entry or the range's end, with the buffer's new keys merged in.

    Measured (``python -m styx_benchmarks.geo_cost``, benchmarks/results/deathstar-geo.md): a pass
    over every entity of the worker per partition scan cost 87-118 µs with ~450 entities."""
    op, partition, n, data = rng.operator, rng.partition, rng.partitions, store.data
    own = {k: v for (o, k), v in buffer.items() if o == op and partition_of(k, n) == partition}
    keys = store.index.keys(op, partition, n, data)
    lo, low_open = lower(rng)
    past = past_end(rng)
    live: list[tuple[Key, bytes]] = []
    for k in from_low(keys, [k for k in own if (op, k) not in data], lo, low_open):
        if past(k):
            break
        v = own[k] if k in own else data[(op, k)]
        if v is None:
            continue
        if len(live) == rows:  # cut short: the range read ends at the last row answered
            return live, msgspec.structs.replace(rng, high=live[-1][0], high_open=False)
        live.append((k, v))
    return live, rng


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
