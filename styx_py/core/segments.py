"""Ingress log segments: the ingress topic as a sequence of topics, so no partition grows for ever.

A broker like Tansu (the local default) answers every fetch that returns data by listing every batch
stored in the partition, so a partition that is tailed while it grows costs more with every batch
(benchmarks/results/broker-cost.md). With ``log_segment_s`` set, the coordinator starts a new
*segment* of the ingress topic that often: segment 0 is the configured topic itself, segment ``k``
the topic ``<ingress_topic>.<k>`` with the same partitions; the egress topic is segmented the same
way, and workers write replies to the segment before the newest (:func:`replies_to`), which clients
read already when they learn of the newest. Clients write to the newest segment they
know of; workers read the newest :data:`LIVE` (a client that has not noticed the newest one yet still
writes to an older one, and a record written just before a client moved on may still be on its way).
A client writes again what it wrote to an older segment (:func:`unread`) and has no reply for. The
protocol is in docs/architecture.md ("Log segments").

A record is named by its partition and a *packed offset*: its segment in the high bits, its Kafka
offset in the low :data:`SHIFT` bits (an egress position too: below it, every reply of some earlier
segments and offsets). Packed offsets of one segment keep their order, segment 0's are
the plain Kafka offsets (logs and snapshots written before segments read the same), and everything that
names a record (the sequencer log, snapshots, handoffs) carries one int as before. Where a partition's
consumption stands is a :data:`Cursor`: segment -> next offset to take.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "FRESH_S",
    "LIVE",
    "MIN_PERIOD_S",
    "REPLY_SEGMENTS",
    "SHIFT",
    "Cursor",
    "cursor_of",
    "live",
    "pack",
    "replies_to",
    "reply_segments",
    "segment_topic",
    "segment_topics",
    "segments_in",
    "to_read",
    "unpack",
    "unread",
]

SHIFT = 40  # a segment holds up to 2**40 records per partition; segments up to 2**23
_MASK = (1 << SHIFT) - 1

Cursor = dict[int, int]  # segment -> next Kafka offset to take, for one partition

# A client's write acknowledged this soon after a listing of topics that showed its segment as the
# newest is read by the workers for sure (client PendingTable.on_time): the coordinator starts segments
# at least MIN_PERIOD_S apart (a longer log_segment_s is refused).
FRESH_S = 1.0
MIN_PERIOD_S = 1.5

# Ingress segments the workers read: the newest and the one before it. A write a client had
# acknowledged on time to segment s (less than FRESH_S after a listing showed s newest, so before s + 1
# existed) precedes s + 2 by more than a period; workers stop reading s only once the coordinator names
# s + 2, and then drain it first (KafkaIngress.live), so they take that write. Reading more segments
# only costs: every fetch names every partition read.
LIVE = 2
# Egress segments a client reads replies from: the newest it knows and the two before it. Workers
# write to the one before the newest (replies_to), so one a client has just learned of is read already;
# and they stop writing to segment s once s + 2 is named, a period before s + 3, when a client that
# follows stops reading s (once read to its end).
REPLY_SEGMENTS = 3


def live(newest: int) -> list[int]:
    """The segments workers read when ``newest`` is the newest."""
    return [s for s in range(newest - LIVE + 1, newest + 1) if s >= 0]


def to_read(cursor: Cursor, newest: int) -> Cursor:
    """Where a worker that resumes a partition at ``cursor`` (a snapshot's, a handoff's; empty: from the
    beginning) reads it when ``newest`` is the newest segment: the segments the cursor names, from its
    offsets, and every later one up to the newest, from the start. The cursor names every segment its
    worker still read; one older than the newest it names and not named was read to its end (a worker
    drains a segment before it stops reading it, and one may drain before an older one), and newer ones
    it had not read yet."""
    first_unread = max(cursor) + 1 if cursor else 0
    return {**cursor, **{s: 0 for s in range(first_unread, newest + 1)}}


def replies_to(newest: int) -> int:
    """The egress segment workers write replies to when ``newest`` is the newest: the one before it,
    which every client that follows (:func:`reply_segments` of the newest it knows) reads already."""
    return max(0, newest - 1)


def reply_segments(newest: int) -> list[int]:
    """The egress segments a client reads when ``newest`` is the newest it knows."""
    return [s for s in range(newest - REPLY_SEGMENTS + 1, newest + 1) if s >= 0]


def unread(segment: int, newest: int) -> bool:
    """Whether the workers may have stopped reading ``segment`` once ``newest`` is the newest: what a
    client wrote there late (not on time, see :data:`LIVE`) and has no reply for, it writes again to
    the newest."""
    return segment <= newest - LIVE


def pack(segment: int, offset: int) -> int:
    return (segment << SHIFT) | offset


def unpack(packed: int) -> tuple[int, int]:
    """(segment, Kafka offset) of a packed offset."""
    return packed >> SHIFT, packed & _MASK


def segment_topic(topic: str, segment: int) -> str:
    """The topic of ``segment`` of the ingress topic ``topic`` (segment 0: ``topic`` itself)."""
    return topic if segment == 0 else f"{topic}.{segment}"


def segments_in(topics: Iterable[str], topic: str) -> list[int]:
    """The segments of ``topic`` among ``topics``, in order."""
    pattern = re.compile(re.escape(topic) + r"(?:\.(\d+))?")
    out = {int(m.group(1) or 0) for t in topics if (m := pattern.fullmatch(t))}
    return sorted(out)


def segment_topics(topics: Iterable[str], topic: str) -> list[str]:
    """The topics of every segment of ``topic`` among ``topics``, in order: the whole log."""
    return [segment_topic(topic, s) for s in segments_in(topics, topic)]


def cursor_of(position: int, cursor: Cursor) -> Cursor:
    """A partition's cursor as a snapshot part or a handoff stores it: ``cursor`` when it has one, else
    the segment-0 ``position`` of parts written before segments."""
    return dict(cursor) if cursor else {0: position}
