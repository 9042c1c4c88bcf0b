"""The sources the worker's ingress reads, where it stands in each, and what it buffered (pure).

A source is one partition of one ingress segment (styx_py.core.segments): the worker reads its
partitions in the live segments, and *drains* older ones (reads them on until they are taken to their
end). Per source the ingress keeps the records buffered for the sequencer, the next offset the
sequencer takes and the next offset the fetch accepts. :class:`Sources` computes which sources to read
and from where; the Kafka consumer that reads them is :class:`~styx_worker.ingress.KafkaIngress`'s,
which is told what changed. Time is the caller's (the event loop's clock), passed in.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from styx_py.core.requests import read_request
from styx_py.core.segments import Cursor, live, pack, to_read, unpack
from styx_py.core.wire import IngressRecord

log = logging.getLogger("styx.ingress")

Source = tuple[int, int]  # (segment, partition)


@dataclass
class IngressCounts:
    """What the worker's ingress counted (its metrics: styx_worker.metrics)."""

    skipped: int = 0  # records with no request and no usable request id to answer
    pushed_taken: int = 0  # buffered from a push, before the fetch had them
    pushed_late: int = 0  # pushed after the fetch had them, or not wanted here
    push_mismatches: int = 0  # pushed records that differ from the topic's (never expected)
    paced: int = 0  # polls followed by a pause (styx_py.core.limits.INGRESS_PUSHED_POLL_S)


class Sources:
    """The (segment, partition) sources read, their positions and their buffers."""

    def __init__(self, max_pending: int, drain_s: float, counts: IngressCounts) -> None:
        self.max_pending = max_pending  # records buffered at most (then the fetch pauses)
        self.drain_s = drain_s  # a segment that left the live ones is read on at least this long
        self.counts = counts
        self.partitions: list[int] = []
        self.live_segments = [0]  # the segments read live (core.segments.live)
        # Sources of older segments still read until read to their end: since when (loop time).
        self.draining: dict[Source, float] = {}
        # Per source read: records buffered, the next offset the sequencer takes, the next offset the
        # fetch accepts.
        self.buffers: dict[Source, deque[IngressRecord]] = {}
        self.next_take: dict[Source, int] = {}
        self.expect: dict[Source, int] = {}
        self.count = 0  # records buffered, over every source

    def full(self) -> bool:
        return self.count >= self.max_pending

    def room(self) -> int:
        return self.max_pending - self.count

    def reading(self) -> dict[Source, int]:
        """What is read now, each from where the sequencer stands in it."""
        return {src: self.next_take.get(src, 0) for src in [*self._wanted(), *self.draining]}

    def assign(self, partitions: list[int]) -> dict[Source, int]:
        """Read exactly ``partitions``: the sources to read (:meth:`read`)."""
        self.partitions = list(partitions)
        self.draining = {src: t for src, t in self.draining.items() if src[1] in partitions}
        return self.reading()

    def live(self, segment: int, now: float) -> dict[Source, int] | None:
        """``segment`` is the newest: the sources to read (:meth:`read`), or None if nothing changes.
        The segments that leave the live ones are drained from ``now`` on."""
        wanted = live(segment)
        if wanted == self.live_segments or segment < self.live_segments[-1]:
            # Never back: a segment dropped and read again would be read from its start. (A coordinator
            # that resumed from state saved before its predecessor's last rotation names an older one
            # until it has rotated past it.)
            return None
        for s in range(self.live_segments[0], wanted[0]):  # left the live ones (read or skipped)
            for p in self.partitions:
                self.next_take.setdefault((s, p), 0)
                self.draining.setdefault((s, p), now)
        self.live_segments = wanted
        return self.reading()

    def drained(self, now: float, highwater: Callable[[Source], int | None]) -> dict[Source, int] | None:
        """The sources to read (:meth:`read`) without the draining ones taken up to their high
        watermark (``highwater``: as the consumer last heard it), or None if none is."""
        done = []
        for src, since in self.draining.items():
            hw = highwater(src)
            fetched = self.expect[src]  # past skipped records too
            if now - since >= self.drain_s and hw is not None and fetched >= hw and not self.buffers[src]:
                done.append(src)
        if not done:
            return None
        for src in done:
            del self.draining[src]
        return {src: off for src, off in self.next_take.items() if src not in done}

    def recover(self, positions: dict[int, Cursor], now: float) -> dict[Source, int]:
        """Each partition of ``positions`` read from its cursor on (core.segments.to_read): the sources
        to read (:meth:`read`; then :meth:`reset` those of ``positions``). Segments older than the live
        ones are drained from ``now`` on."""
        sources = {src: off for src, off in self.next_take.items() if src[1] not in positions}
        for p, cursor in positions.items():
            for s, offset in to_read(cursor, self.live_segments[-1]).items():
                sources[s, p] = offset
                if s not in self.live_segments:
                    self.draining.setdefault((s, p), now)
        return sources

    def replay(self, src: Source, offset: int, now: float) -> dict[Source, int]:
        """``src``, not read now, is named by the log from ``offset`` on (replay): the sources to read
        (:meth:`read`), ``src`` drained from ``now`` on."""
        self.draining.setdefault(src, now)
        return {**self.next_take, src: offset}

    def read(self, sources: dict[Source, int]) -> list[Source]:
        """Read exactly ``sources``, each from the offset given, or on from where the fetch stands in
        it if the sequencer stands at that offset: the buffers of the others are dropped. Returns the
        sources dropped or read from another offset now (what was pushed of them is moot)."""
        self.draining = {src: since for src, since in self.draining.items() if src in sources}
        moot = []
        for src in set(self.buffers) - set(sources):
            self.count -= len(self.buffers.pop(src))
            self.next_take.pop(src, None)
            self.expect.pop(src, None)
            moot.append(src)
        self.buffers = {src: self.buffers.get(src, deque()) for src in sources}
        for src, offset in sources.items():
            if self.next_take.get(src) != offset or src not in self.expect:
                self.reset(src, offset)
                moot.append(src)
            # else kept as it was: a new assignment forgets the fetch position, not the buffer
        return moot

    def reset(self, src: Source, offset: int) -> None:
        """Read ``src`` from ``offset`` on, dropping what was buffered of it."""
        self.count -= len(self.buffers[src])
        self.buffers[src].clear()
        self.next_take[src] = self.expect[src] = offset

    def wants(self, src: Source) -> bool:
        return src in self.buffers

    def accept(self, src: Source, offset: int, key: bytes | None, value: bytes, ts: int) -> None:
        """Buffer the record at ``offset``, the next one of ``src`` (fetched or pushed alike)."""
        self.expect[src] = offset + 1
        req = read_request(value, key)  # an empty value (a null record): no request
        if isinstance(req, str):
            # Nothing to answer (no usable request id); skipping is deterministic. A bad record that
            # names one is a BadRecord: answered with BadRequest.
            self.counts.skipped += 1
            log.error("skipping ingress record %s@%d: %s", src, offset, req)
            return
        self.buffers[src].append(IngressRecord(src[1], pack(src[0], offset), req, ts))
        self.count += 1

    def take(self, n: int) -> list[IngressRecord]:
        """Up to ``n`` buffered records, round robin over the sources in (segment, partition) order."""
        out: list[IngressRecord] = []
        queues = [q for _, q in sorted(self.buffers.items()) if q]
        while len(out) < n and queues:
            for q in queues:
                if q and len(out) < n:
                    out.append(q.popleft())
            queues = [q for q in queues if q]
        for rec in out:
            segment, offset = unpack(rec.offset)
            self.next_take[segment, rec.partition] = offset + 1
        self.count -= len(out)
        return out

    def take_next(self, src: Source) -> IngressRecord | None:
        """The next buffered record of ``src``, or None if none is buffered yet (or ``src`` is not read)."""
        buf = self.buffers.get(src)
        if not buf:
            return None
        rec = buf.popleft()
        self.next_take[src] = unpack(rec.offset)[1] + 1
        self.count -= 1
        return rec

    def positions(self) -> dict[int, Cursor]:
        out: dict[int, Cursor] = {p: {} for p in self.partitions}
        for (s, p), offset in sorted(self.next_take.items()):
            out.setdefault(p, {})[s] = offset
        return out

    def _wanted(self) -> list[Source]:
        return [(s, p) for s in self.live_segments for p in self.partitions]
