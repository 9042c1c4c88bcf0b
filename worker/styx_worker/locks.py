"""Deterministic locks for the fallback phase (pure: no waiting here).

Every conflicting transaction re-runs holding locks on the keys it touched in the optimistic run,
granted strictly in tid order: the queue of a key lists the fallback tids that touched it, sorted, and a
tid may use the key only when it is at the head. A transaction waits only for lower tids, so there is
no deadlock; it releases all its locks when its outcome is final (commit, abort or reschedule), after
its writes are applied. The epoch machine starts a fallback invocation once its tid heads the queue of
every key it needs (:meth:`LockTable.blocked`), and looks again at the ones waiting for a key
:meth:`LockTable.release` hands over.

Scans add coarse locks: a scan's key names a partition of an operator (:mod:`styx_worker.scan`), and with
``guard`` every fallback tid touching an entity of a partition some fallback tid scans queues on that
partition's lock too, and needs it for that entity's invocations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping

from styx_py.core.scan import SCAN_OP
from styx_worker.conflicts import EntityKey

Guard = Callable[[EntityKey], EntityKey | None]  # an entity's scan lock (styx_worker.scan.guard_of)


class LockTable:
    __slots__ = ("guard", "held", "keysets", "queues")

    def __init__(
        self,
        fallback: Iterable[int],
        keys_of: Mapping[int, Iterable[EntityKey]],
        guard: Guard | None = None,
    ) -> None:
        self.queues: dict[EntityKey, deque[int]] = {}
        self.held: dict[int, list[EntityKey]] = {}
        self.keysets: dict[int, frozenset[EntityKey]] = {}
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
            for key in keys:
                self.queues.setdefault(key, deque()).append(tid)

    def owns_key(self, tid: int, key: EntityKey) -> bool:
        """Whether ``key`` is in ``tid``'s learned read/write set on this worker."""
        ks = self.keysets.get(tid)
        return ks is not None and key in ks

    def is_head(self, key: EntityKey, tid: int) -> bool:
        q = self.queues.get(key)
        return bool(q) and q[0] == tid  # type: ignore[index]

    def blocked(self, key: EntityKey, tid: int) -> EntityKey | None:
        """The first lock an invocation of ``key`` by ``tid`` needs and another tid heads, or None (it may
        start): ``key``'s own, then its partition's scan lock if ``tid`` queued on it."""
        if not self.is_head(key, tid):
            return key
        g = self.guard(key) if self.guard is not None else None
        if g is not None and self.owns_key(tid, g) and not self.is_head(g, tid):
            return g
        return None

    def release(self, tid: int) -> list[tuple[EntityKey, int]]:
        """Release every lock of ``tid``; the keys it held with the tid that heads each now."""
        self.keysets.pop(tid, None)
        granted: list[tuple[EntityKey, int]] = []
        for key in self.held.pop(tid, ()):
            q = self.queues[key]
            head = q[0] if q else None
            q.remove(tid)
            if q and q[0] != head:
                granted.append((key, q[0]))
        return granted
