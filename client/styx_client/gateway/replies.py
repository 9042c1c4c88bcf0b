"""The idempotency table: final replies by request id, so a retry gets the identical body.

Bounded by entries and bytes, and every entry expires ``idempotency_ttl_s`` after it was stored.
Only final answers from the cluster (200/409/422) are stored: timeouts, 429 and 503 decided nothing,
so a retry runs.
"""

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from styx_client.gateway.outcomes import Outcome
from styx_py.core.limits import REPLY_CACHE_ENTRY_OVERHEAD_BYTES

__all__ = ["Cached", "ReplyCache"]


@dataclass(slots=True)
class Cached:
    fingerprint: bytes | None
    """Identity of the request's payload (None for gateway-chosen ids): a reused id must match it."""
    outcome: Outcome
    expires: float
    size: int


class ReplyCache:
    """Final replies by request id, for idempotent retries: LRU-by-completion, TTL, entry and byte caps."""

    def __init__(
        self, max_entries: int, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[str, Cached] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, rid: str) -> Cached | None:
        entry = self._entries.get(rid)
        if entry is not None and entry.expires <= self.clock():
            self._remove(rid)
            return None
        return entry

    def put(self, rid: str, fingerprint: bytes | None, outcome: Outcome) -> None:
        if rid in self._entries:
            self._remove(rid)
        size = len(outcome.body) + len(rid) + REPLY_CACHE_ENTRY_OVERHEAD_BYTES
        self._entries[rid] = Cached(fingerprint, outcome, self.clock() + self.ttl_s, size)
        self.bytes += size
        self._evict(self.clock())

    def _evict(self, now: float) -> None:
        """Drop the oldest entries while a cap is exceeded or the oldest has expired."""
        while self._entries and (
            len(self._entries) > self.max_entries
            or self.bytes > self.max_bytes
            or next(iter(self._entries.values())).expires <= now
        ):
            self._remove(next(iter(self._entries)))

    def _remove(self, rid: str) -> None:
        self.bytes -= self._entries.pop(rid).size
