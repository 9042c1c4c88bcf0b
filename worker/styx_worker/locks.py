"""Deterministic locks for the fallback phase (pure: no waiting here).

Every conflicting transaction re-runs holding locks on the keys it touched in the optimistic run,
granted strictly in tid order: the queue of a key lists the fallback tids that touched it, sorted, and a
tid may use the key only when it is at the head. A transaction waits only for lower tids, so there is
no deadlock; it releases all its locks when its outcome is final (commit, abort or reschedule), after
its writes are applied. The epoch machine starts a fallback invocation once its tid heads its key's
queue (:meth:`LockTable.is_head`), and starts the ones :meth:`LockTable.release` hands the keys to.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from styx_worker.conflicts import EntityKey


class LockTable:
    __slots__ = ("held", "keysets", "queues")

    def __init__(self, fallback: Iterable[int], keys_of: Mapping[int, Iterable[EntityKey]]) -> None:
        self.queues: dict[EntityKey, deque[int]] = {}
        self.held: dict[int, list[EntityKey]] = {}
        self.keysets: dict[int, frozenset[EntityKey]] = {}
        for tid in sorted(fallback):
            keys = sorted(keys_of.get(tid, ()), key=repr)
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
