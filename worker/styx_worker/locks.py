"""Deterministic locks for the fallback phase (pure: no waiting here).

Every conflicting transaction re-runs holding locks on the keys it touched in the optimistic run,
granted strictly in tid order: the queue of a key lists the fallback tids that touched it, sorted, and a
tid may use the key when it is at the head, or when it only read the key in the optimistic run and so
did every tid ahead of it (a shared lock: readers of a key nobody ahead writes do not wait for each
other, as in Calvin; TPC-C's NewOrders all read W_TAX). A reader that writes the key after all changed
its read/write set (the epoch machine reschedules it). A transaction waits only for lower tids, so
there is no deadlock; it releases all its locks when its outcome is final (commit, abort or reschedule), after
its writes are applied. The epoch machine starts a fallback invocation once its tid heads the queue of
every key it needs (:meth:`LockTable.blocked`), and looks again at the ones waiting for a key
:meth:`LockTable.release` hands over. Each key keeps its writers apart from its queue, so asking costs
constant time and a release a bisection per key plus what it grants: a fallback of hundreds of readers of
one key (TPC-C's warehouse part) never walks that key's queue.

Scans add coarse locks: a scan's key names a partition of an operator (:mod:`styx_worker.scan`), and with
``guard`` every fallback tid touching an entity of a partition some fallback tid scans queues on that
partition's lock too, and needs it for that entity's invocations.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Mapping

from styx_py.core.scan import SCAN_OP
from styx_worker.conflicts import EntityKey

Guard = Callable[[EntityKey], EntityKey | None]  # an entity's scan lock (styx_worker.scan.guard_of)


class LockTable:
    __slots__ = ("guard", "held", "keysets", "queues", "shared", "writers")

    def __init__(
        self,
        fallback: Iterable[int],
        keys_of: Mapping[int, Iterable[EntityKey]],
        guard: Guard | None = None,
        writes_of: Mapping[int, Container[EntityKey]] | None = None,
    ) -> None:
        """``writes_of``: the keys each tid wrote in the optimistic run; the others of its keys it may
        share with other readers (scan locks are never shared). None: every lock is exclusive."""
        self.queues: dict[EntityKey, list[int]] = {}  # a key's queued tids, ascending
        self.writers: dict[EntityKey, list[int]] = {}  # those of them that hold it alone, ascending
        self.held: dict[int, list[EntityKey]] = {}
        self.keysets: dict[int, frozenset[EntityKey]] = {}
        self.shared: dict[int, frozenset[EntityKey]] = {}
        fallback = sorted(fallback)
        self.guard: Guard | None = None
        scanned: set[EntityKey] = set()
        if guard is not None:
            scanned = {k for tid in fallback for k in keys_of.get(tid, ()) if k[0] == SCAN_OP}
            self.guard = guard if scanned else None  # no scan in this fallback: no partition locks
        no_share: frozenset[EntityKey] = frozenset()
        for tid in fallback:
            own = set(keys_of.get(tid, ()))
            if scanned:
                assert guard is not None
                own |= {g for k in own if (g := guard(k)) is not None and g in scanned}
            keys = sorted(own, key=repr)
            self.held[tid] = keys
            self.keysets[tid] = frozenset(keys)
            shared = no_share
            if writes_of is not None:
                written = writes_of.get(tid, ())
                shared = frozenset(k for k in keys if k not in written and k[0] != SCAN_OP)
                self.shared[tid] = shared
            for key in keys:
                self.queues.setdefault(key, []).append(tid)
                if key not in shared:
                    self.writers.setdefault(key, []).append(tid)

    def owns_key(self, tid: int, key: EntityKey) -> bool:
        """Whether ``key`` is in ``tid``'s learned read/write set on this worker (it is queued on it)."""
        ks = self.keysets.get(tid)
        return ks is not None and key in ks

    def shares(self, tid: int, key: EntityKey) -> bool:
        """Whether ``tid`` holds ``key`` as a reader (it may not write it)."""
        ks = self.shared.get(tid)
        return ks is not None and key in ks

    def may_use(self, key: EntityKey, tid: int) -> bool:
        """Whether ``tid`` heads ``key``'s queue, or reads it behind readers only (below its first
        writer). Constant time: no walk of the queue."""
        q = self.queues.get(key)
        if not q or not self.owns_key(tid, key):
            return False
        if q[0] == tid:
            return True
        w = self.writers.get(key)
        return self.shares(tid, key) and (not w or tid < w[0])

    def blocked(self, key: EntityKey, tid: int) -> EntityKey | None:
        """The first lock an invocation of ``key`` by ``tid`` needs and another tid heads, or None (it may
        start): ``key``'s own, then its partition's scan lock if ``tid`` queued on it."""
        if not self.may_use(key, tid):
            return key
        g = self.guard(key) if self.guard is not None else None
        if g is not None and self.owns_key(tid, g) and not self.may_use(g, tid):
            return g
        return None

    def release(self, tid: int) -> list[tuple[EntityKey, int]]:
        """Release every lock of ``tid``; the keys it held, each with every tid that may use it now and
        could not before."""
        granted: list[tuple[EntityKey, int]] = []
        for key in self.held.pop(tid, ()):
            q = self.queues[key]
            w = self.writers.get(key)
            first = w[0] if w else None  # the first writer, before the release
            wrote = not self.shares(tid, key)
            q.pop(bisect_left(q, tid))
            if wrote:
                assert w is not None
                w.pop(bisect_left(w, tid))
            if not q:
                continue
            nxt = w[0] if w else None
            if tid == first:
                # A writer left: if it headed the queue, the new front is all new (its head, or the
                # readers below the next writer); if readers were ahead of it, those between it and
                # the next writer join them.
                start = 0 if q[0] > tid else bisect_left(q, tid)
                if start == 0 and q[0] == nxt:
                    granted.append((key, q[0]))
                else:
                    end = len(q) if nxt is None else bisect_left(q, nxt)
                    granted += [(key, t) for t in q[start:end]]
            elif not wrote and first is not None and tid < first and q[0] == first:
                granted.append((key, first))  # the last reader ahead of the first writer left
        self.keysets.pop(tid, None)
        self.shared.pop(tid, None)
        return granted
