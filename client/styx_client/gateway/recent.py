"""The recent invocations of this gateway: a bounded window, listed by ``GET /v1/invocations``.

Every invocation this process sends to the cluster (``POST /v1/invocations``; not the ``/v1/state``
reads) gets an entry when its job starts and its outcome when the job ends: the call (operator, key,
function, arguments), when it was submitted, and the cluster's reply (status, tid, epoch, phase, result
or error) or why there is none (timeout, cluster unavailable). Entries are numbered in the order their
jobs started; the number is the listing's cursor (``after``), so paging is stable while new entries
arrive.

Bounded by entries (``max_recent_invocations``) and bytes (``max_recent_bytes``: arguments as JSON,
results as the cluster encoded them): the oldest go first. The window is this replica's own: another
replica's invocations are not listed here, but each one is still found by id
(``GET /v1/invocations/{id}``, from the cluster's reply tables).

Cost, measured on the 2-core machine: an entry and its outcome take ~11 µs per invocation (the
arguments encoded once as JSON); a filtered listing scans the whole window, ~0.6 ms for 1 000 entries.
"""

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from styx_client.gateway.outcomes import Outcome, json_bytes
from styx_py.core.wire import UNDECODABLE, Key, Reply, decode_value

__all__ = ["ENTRY_OVERHEAD_BYTES", "STATUSES", "Recent", "RecentInvocations", "Status"]

Status = Literal["pending", "committed", "aborted", "failed", "error"]
"""``error``: no reply from the cluster (timeout, unavailable, refused by the client); see ``code``."""
STATUSES: tuple[Status, ...] = ("pending", "committed", "aborted", "failed", "error")
ENTRY_OVERHEAD_BYTES = 256  # ids, names, numbers and the entry itself, counted with the JSON bytes


@dataclass(slots=True)
class Recent:
    """One invocation of the window."""

    seq: int
    request_id: str
    operator: str
    key: Key
    function: str
    args: msgspec.Raw
    submitted_at: float
    """Unix time (seconds) the job started: for people, never for ordering (``seq`` orders)."""
    size: int
    reply: Reply | None = None
    http_status: int | None = None
    code: str | None = None
    latency_ms: float | None = None

    @property
    def status(self) -> Status:
        if self.reply is not None:
            return self.reply.status  # type: ignore[return-value]  # committed | aborted | failed
        return "pending" if self.http_status is None else "error"

    def view(self) -> dict[str, Any]:
        """The entry as the API shows it (``InvocationView``)."""
        reply = self.reply
        return {
            "request_id": self.request_id,
            "cursor": str(self.seq),
            "status": self.status,
            "operator": self.operator,
            "key": self.key,
            "function": self.function,
            "args": msgspec.json.decode(self.args),
            "submitted_at": round(self.submitted_at, 3),
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 3),
            "http_status": self.http_status,
            "code": self.code,
            "source": "gateway",
            **reply_fields(reply),
        }


def reply_fields(reply: Reply | None) -> dict[str, Any]:
    """The reply's part of an ``InvocationView`` (all None without a reply)."""
    if reply is None:
        return {"tid": None, "epoch": None, "phase": None, "result": None, "error": None, "error_type": None}
    try:
        result = decode_value(reply.result)
    except UNDECODABLE:
        result = None
    return {
        "tid": reply.tid,
        "epoch": reply.epoch,
        "phase": int(reply.phase),
        "result": result,
        "error": reply.error,
        "error_type": reply.error_type,
    }


class RecentInvocations:
    """The window: entries by number (oldest first) and the newest entry of each request id."""

    def __init__(self, max_entries: int, max_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock
        self.bytes = 0
        self._next = 1
        self._entries: OrderedDict[int, Recent] = OrderedDict()
        self._by_id: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def started(self, rid: str, operator: str, key: Key, function: str, args: list[Any]) -> Recent:
        """A job started: its entry, in the window from now on (the oldest may go)."""
        raw = msgspec.Raw(json_bytes(args))
        size = len(raw) + len(rid) + ENTRY_OVERHEAD_BYTES
        entry = Recent(self._next, rid, operator, key, function, raw, self.clock(), size)
        self._next += 1
        self._entries[entry.seq] = entry
        self._by_id[rid] = entry.seq
        self.bytes += size
        self._evict()
        return entry

    def finished(self, entry: Recent, outcome: Outcome, reply: Reply | None, latency_ms: float) -> None:
        """The job ended with ``outcome`` (and the cluster's ``reply``, when there is one)."""
        entry.reply = reply
        entry.http_status = outcome.status
        entry.code = outcome.code
        entry.latency_ms = latency_ms
        if entry.seq in self._entries and reply is not None:
            grown = len(reply.result) + len(reply.error or "")
            entry.size += grown
            self.bytes += grown
            self._evict()

    def get(self, rid: str) -> Recent | None:
        """The newest entry of ``rid``, if the window still holds it."""
        seq = self._by_id.get(rid)
        return None if seq is None else self._entries.get(seq)

    def page(
        self, *, status: str | None, operator: str | None, limit: int, after: int | None
    ) -> tuple[list[Recent], int | None]:
        """Up to ``limit`` entries, newest first, older than cursor ``after`` (None: from the newest),
        matching the filters; and the cursor of the next page (None: no more)."""
        found: list[Recent] = []
        for entry in self._newest_first(after):
            if (status is None or entry.status == status) and (
                operator is None or entry.operator == operator
            ):
                if len(found) == limit:
                    return found, found[-1].seq
                found.append(entry)
        return found, None

    def _newest_first(self, after: int | None) -> Iterator[Recent]:
        for seq in reversed(self._entries):
            if after is None or seq < after:
                yield self._entries[seq]

    def _evict(self) -> None:
        while self._entries and (len(self._entries) > self.max_entries or self.bytes > self.max_bytes):
            seq, entry = self._entries.popitem(last=False)
            self.bytes -= entry.size
            if self._by_id.get(entry.request_id) == seq:
                del self._by_id[entry.request_id]
