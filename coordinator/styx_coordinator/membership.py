"""Worker membership and failure detection by missed heartbeats (pure; the clock is passed in)."""

from __future__ import annotations

import msgspec

from styx_py.core.wire import WorkerInfo


class Membership:
    def __init__(self, failure_timeout_ms: int) -> None:
        self.failure_timeout_s = failure_timeout_ms / 1000
        self.workers: dict[str, WorkerInfo] = {}
        self.last_seen: dict[str, float] = {}

    def register(self, node_id: str, host: str, port: int, now: float) -> None:
        sid = self.workers[node_id].sid if node_id in self.workers else 0
        self.workers[node_id] = WorkerInfo(node_id, sid, host, port)
        self.last_seen[node_id] = now
        self._assign_sids()

    def _assign_sids(self) -> None:
        # New values, never changed in place: a view built before (a message the transport encodes
        # only when it flushes) keeps the sids it was built with, consistent with its n_seq.
        for sid, node_id in enumerate(sorted(self.workers), start=1):
            if self.workers[node_id].sid != sid:
                self.workers[node_id] = msgspec.structs.replace(self.workers[node_id], sid=sid)

    def remove(self, node_id: str) -> None:
        """No longer a member (drained, or lost for good): the others' sequencer ids are renumbered."""
        self.workers.pop(node_id, None)
        self.last_seen.pop(node_id, None)
        self._assign_sids()

    def silent_for(self, node_id: str, now: float) -> float:
        """Seconds since ``node_id``'s last heartbeat (or registration)."""
        return now - self.last_seen.get(node_id, now)

    def heartbeat(self, node_id: str, now: float) -> None:
        if node_id in self.workers:
            self.last_seen[node_id] = now

    def failed(self, now: float) -> list[str]:
        return sorted(n for n, seen in self.last_seen.items() if now - seen > self.failure_timeout_s)

    def infos(self) -> list[WorkerInfo]:
        return [self.workers[n] for n in sorted(self.workers)]
