"""Records the clients pushed, taken as if fetched, and compared with the fetched copies (pure).

A client pushes a record (:class:`~styx_py.core.wire.PushedRequest`) once the broker acknowledged it:
a broker fetch sooner. A pushed record is buffered only as the next offset of its source, exactly like
a fetched one, or kept until the records before it are (:data:`~styx_py.core.limits.MAX_PUSHED_AHEAD`);
the fetch still reads it, skips it and compares the copies (``push_mismatches``), so the buffer, and
every epoch's batch, is the topic's records in offset order whichever copy came first. Every push and
every late one is told to the fetch's pace (:mod:`styx_worker.pace`).
"""

from __future__ import annotations

import logging
from collections import deque

from styx_py.core.limits import MAX_PUSHED_AHEAD, MAX_PUSHED_UNCONFIRMED
from styx_py.core.wire import PushedRequest
from styx_worker.pace import PushPace
from styx_worker.sources import IngressCounts, Source, Sources

log = logging.getLogger("styx.ingress")


class PushedRecords:
    """Pushed records ahead of their source's next offset, and taken ones not yet compared."""

    def __init__(self, sources: Sources, pace: PushPace, counts: IngressCounts) -> None:
        self.sources = sources
        self.pace = pace
        self.counts = counts
        # Per source: pushed records ahead of its next offset (offset -> record), and taken but not yet
        # compared with the fetched copy (in offset order).
        self.ahead: dict[Source, dict[int, PushedRequest]] = {}
        self.unconfirmed: dict[Source, deque[PushedRequest]] = {}

    def offer(self, pushed: PushedRequest, now: float) -> bool:
        """Buffer ``pushed`` if it is the next record of a source read here (and those pushed ahead of
        it that follow), keep it if it is ahead; drop it if the fetch had it, the source is not read
        here, or the buffer is full (the fetch brings it). Whether it was buffered."""
        src = (pushed.segment, pushed.partition)
        sources = self.sources  # plain attribute reads: this runs for every pushed record
        expect = sources.expect.get(src)
        self.pace.pushed(now)
        if (
            src not in sources.buffers
            or expect is None
            or pushed.offset < expect
            or sources.count >= sources.max_pending
        ):
            self.counts.pushed_late += 1
            self.pace.excused(src, pushed.offset)
            return False
        if pushed.offset > expect:
            ahead = self.ahead.setdefault(src, {})
            if len(ahead) < MAX_PUSHED_AHEAD:
                ahead[pushed.offset] = pushed
            return False
        self._take(src, pushed)
        if src in self.ahead:
            self.take_ahead(src)
        return True

    def take_ahead(self, src: Source) -> None:
        """Buffer the records pushed ahead of ``src`` that are next now; forget those the fetch brought."""
        ahead = self.ahead.get(src)
        if ahead is None:
            return
        while (pushed := ahead.pop(self.sources.expect[src], None)) is not None:
            self._take(src, pushed)
        expect = self.sources.expect[src]
        for offset in [o for o in ahead if o < expect]:
            del ahead[offset]
            self.counts.pushed_late += 1
            self.pace.excused(src, offset)  # fetched first, but pushed
        if not ahead:
            del self.ahead[src]

    def _take(self, src: Source, pushed: PushedRequest) -> None:
        self.counts.pushed_taken += 1
        unconfirmed = self.unconfirmed.get(src)
        if unconfirmed is None:
            unconfirmed = self.unconfirmed[src] = deque(maxlen=MAX_PUSHED_UNCONFIRMED)
        unconfirmed.append(pushed)
        self.sources.accept(src, pushed.offset, pushed.key, pushed.value, pushed.ts_ms)

    def confirm(self, src: Source, offset: int, key: bytes | None, value: bytes, ts: int) -> None:
        """The fetched copy of a record buffered before: the same as the pushed one, if it was pushed."""
        unconfirmed = self.unconfirmed.get(src)
        while unconfirmed and unconfirmed[0].offset < offset:
            unconfirmed.popleft()  # its fetched copy went by before a seek
        if not unconfirmed or unconfirmed[0].offset != offset:
            return
        pushed = unconfirmed.popleft()
        if (pushed.key, pushed.value, pushed.ts_ms) != (key, value, ts):
            self.counts.push_mismatches += 1
            log.critical(
                "ingress record %s@%d was pushed unlike the topic's copy (key %r / %r, timestamp %d / %d, "
                "%d / %d bytes): a client pushed what the broker did not store",
                src,
                offset,
                pushed.key,
                key,
                pushed.ts_ms,
                ts,
                len(pushed.value),
                len(value),
            )

    def forget(self, src: Source) -> None:
        """``src`` is read from another offset, or no more: what was pushed or fetched first is moot."""
        self.ahead.pop(src, None)
        self.unconfirmed.pop(src, None)
        self.pace.forget(src)
