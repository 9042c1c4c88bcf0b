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
:meth:`LockTable.release` hands over.

Scans add coarse locks: a scan's key names a partition of an operator (:mod:`styx_worker.scan`), and with
``guard`` every fallback tid touching an entity of a partition some fallback tid scans queues on that
partition's lock too, and needs it for that entity's invocations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping

from styx_py.core.scan import SCAN_OP
from styx_worker.conflicts import EntityKey

Guard = Callable[[EntityKey], EntityKey | None]  # an entity's scan lock (styx_worker.scan.guard_of)


class LockTable:
    __slots__ = ("guard", "held", "keysets", "queues", "shared")

    def __init__(
        self,
        fallback: Iterable[int],
        keys_of: Mapping[int, Iterable[EntityKey]],
        guard: Guard | None = None,
        writes_of: Mapping[int, Container[EntityKey]] | None = None,
    ) -> None:
        """``writes_of``: the keys each tid wrote in the optimistic run; the others of its keys it may
        share with other readers (scan locks are never shared). None: every lock is exclusive."""
        self.queues: dict[EntityKey, deque[int]] = {}
        self.held: dict[int, list[EntityKey]] = {}
        self.keysets: dict[int, frozenset[EntityKey]] = {}
        self.shared: dict[int, frozenset[EntityKey]] = {}
        fallback = sorted(fallback)
        self.guard: Guard | None = None
        scanned: set[EntityKey] = set()
        if guard is not None:
            scanned = {k for tid in fallback for k in keys_of.get(tid, ()) if k[0] == SCAN_OP}
            self.guard = guard if scanned else None  # no scan in this fallback: no partition locks
        for tid in fallback:
            own = set(keys_of.get(tid, ()))
            if scanned:
                assert guard is not None
                own |= {g for k in own if (g := guard(k)) is not None and g in scanned}
            keys = sorted(own, key=repr)
            self.held[tid] = keys
            self.keysets[tid] = frozenset(keys)
            if writes_of is not None:
                written = writes_of.get(tid, ())
                self.shared[tid] = frozenset(k for k in keys if k not in written and k[0] != SCAN_OP)
            for key in keys:
                self.queues.setdefault(key, deque()).append(tid)

    def owns_key(self, tid: int, key: EntityKey) -> bool:
        """Whether ``key`` is in ``tid``'s learned read/write set on this worker."""
        ks = self.keysets.get(tid)
        return ks is not None and key in ks

    def shares(self, tid: int, key: EntityKey) -> bool:
        """Whether ``tid`` holds ``key`` as a reader (it may not write it)."""
        ks = self.shared.get(tid)
        return ks is not None and key in ks

    def may_use(self, key: EntityKey, tid: int) -> bool:
        """Whether ``tid`` heads ``key``'s queue, or reads it behind readers only."""
        q = self.queues.get(key)
        return bool(q) and tid in self._front(key, q)  # type: ignore[arg-type]

    def _front(self, key: EntityKey, q: deque[int]) -> list[int]:
        """The tids that may use ``key`` now: its head, or the readers before its first writer."""
        front: list[int] = []
        for t in q:
            if not self.shares(t, key):
                return front or [t]
            front.append(t)
        return front

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
        self.keysets.pop(tid, None)
        granted: list[tuple[EntityKey, int]] = []
        for key in self.held.pop(tid, ()):
            q = self.queues[key]
            before = self._front(key, q)
            q.remove(tid)
            granted += [(key, t) for t in self._front(key, q) if t not in before]
        self.shared.pop(tid, None)
        return granted
