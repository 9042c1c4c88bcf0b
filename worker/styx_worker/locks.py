"""Deterministic locks for the fallback phase.

Every conflicting transaction re-runs holding locks on the keys it touched in the optimistic run,
granted strictly in tid order: the queue of a key lists the fallback tids that touched it, sorted,
and a tid may use the key only when it is at the head. A transaction waits only for lower tids, so
there is no deadlock; it releases all its locks when its outcome is final (commit, abort or
reschedule), after its writes are applied.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Mapping

from styx_worker.conflicts import EntityKey


class LockTable:
    def __init__(self, fallback: Iterable[int], keys_of: Mapping[int, Iterable[EntityKey]]) -> None:
        self.queues: dict[EntityKey, deque[int]] = {}
        self.held: dict[int, list[EntityKey]] = {}
        self.keysets: dict[int, frozenset[EntityKey]] = {}
        self.waiters: dict[tuple[EntityKey, int], asyncio.Future[None]] = {}
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

    async def acquire(self, key: EntityKey, tid: int) -> None:
        if self.is_head(key, tid):
            return
        fut = self.waiters.get((key, tid))
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self.waiters[(key, tid)] = fut
        await fut

    def release(self, tid: int) -> None:
        self.keysets.pop(tid, None)
        for key in self.held.pop(tid, ()):
            q = self.queues[key]
            q.remove(tid)
            if q:
                fut = self.waiters.pop((key, q[0]), None)
                if fut is not None and not fut.done():
                    fut.set_result(None)

    def cancel_all(self) -> None:
        for fut in self.waiters.values():
            if not fut.done():
                fut.cancel()
        self.waiters.clear()
