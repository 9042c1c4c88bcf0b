"""Has the broker lost the cluster's log? What the cluster recorded against what the broker has (pure).

A cluster's state is only as good as its logs: a snapshot says "ingress read up to offset 1830", the
sequencer log holds the composition of every epoch after it, and recovery replays from there. A broker
that lost its log (Tansu in memory after a restart, a Kafka topic deleted and created again, storage
rolled back) answers as if nothing were wrong: its topics come back empty or are created anew on the
first request, and a cluster that went on would give a second, different answer to requests it
already answered. So the cluster checks, and stops (state ``log-lost``) instead of serving on:

- every offset it recorded (a :class:`LogMark`: the sequencer-log offset of the last snapshot, a
  worker's acknowledged appends, its ingress positions) must still lie within the broker's log: the
  broker's end (next offset) is at least the recorded offset;
- the cluster's incarnation marker, a record holding its cluster id that the coordinator writes to its
  own topic at deploy (:func:`marker_topic`), must be there: a broker that gives no topic identities
  (Tansu) cannot tell a topic from a new one of the same name, and offsets alone miss a loss early in a
  cluster's life, when little was recorded.

:func:`losses` is the verdict; the coordinator (``styx_coordinator.logcheck``) and the workers ask it
with what they read from the broker.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from styx_py.core.limits import MAX_LOSSES_SHOWN
from styx_py.core.segments import Cursor, segment_topic, unpack

__all__ = [
    "LogMark",
    "describe",
    "highest",
    "losses",
    "marker_loss",
    "marker_topic",
    "recorded_by_snapshot",
    "regressed",
]


class LogMark(NamedTuple):
    """An offset the cluster recorded: every offset of ``topic``'s ``partition`` below ``offset`` held
    a record. ``label`` names the log for a person ("sequencer log", "ingress", "egress")."""

    label: str
    topic: str
    partition: int
    offset: int


def marker_topic(seqlog_topic: str) -> str:
    """The topic of the cluster's incarnation marker (one partition), named after its sequencer log."""
    return f"{seqlog_topic}-cluster"


def recorded_by_snapshot(
    ingress_topic: str, egress_topic: str, positions: Mapping[int, Cursor], egress: Mapping[int, int]
) -> list[LogMark]:
    """What a worker's snapshot says the broker held: per partition, the ingress position in every
    segment it reads (``positions``) and the egress offset below which every reply was acknowledged
    (``egress``: packed, core.segments)."""
    out = [
        LogMark("ingress", segment_topic(ingress_topic, s), p, offset)
        for p, cursor in positions.items()
        for s, offset in cursor.items()
    ]
    for p, packed in egress.items():
        s, offset = unpack(packed)
        out.append(LogMark("egress", segment_topic(egress_topic, s), p, offset))
    return [m for m in out if m.offset > 0]


def highest(marks: Iterable[LogMark]) -> list[LogMark]:
    """The highest recorded offset of each partition among ``marks`` (each worker reports its own)."""
    best: dict[tuple[str, str, int], LogMark] = {}
    for m in marks:
        key = (m.label, m.topic, m.partition)
        if key not in best or m.offset > best[key].offset:
            best[key] = m
    return sorted(best.values())


def regressed(mark: LogMark, end: int) -> str | None:
    """The loss, said in a line, if the broker's ``end`` (next offset) lies below ``mark``."""
    if end >= mark.offset:
        return None
    where = f"{mark.label} {mark.topic} partition {mark.partition}"
    return f"{where}: recorded offset {mark.offset}, broker ends at {end}"


def losses(
    recorded: Sequence[LogMark], topics: Collection[str], ends: Mapping[tuple[str, int], int]
) -> list[str]:
    """What the broker lost of ``recorded``, one line each (empty: nothing). ``topics``: the broker's
    topics, listed before anything else was asked of it (Tansu creates a topic a request names);
    ``ends``: the next offset of each partition the broker has, from a fetch's high watermark (one it
    lacks is gone; Tansu creates a topic again with a partition count of its own). A recorded offset
    of 0 says nothing was there: it never counts as lost."""
    out: list[str] = []
    for mark in sorted(recorded):
        if mark.offset <= 0:
            continue
        if mark.topic not in topics:
            out.append(f"{mark.label} {mark.topic}: the topic is gone (recorded offset {mark.offset})")
            continue
        end = ends.get((mark.topic, mark.partition))
        if end is None:
            where = f"{mark.label} {mark.topic} partition {mark.partition}"
            out.append(f"{where}: the partition is gone (recorded offset {mark.offset})")
        elif (lost := regressed(mark, end)) is not None:
            out.append(lost)
    return out


def marker_loss(topic: str, cluster_id: str, found: Sequence[bytes] | None) -> str | None:
    """The loss of the incarnation marker, if ``found`` (the records of ``topic``, None: no such topic)
    does not hold ``cluster_id``. A marker of another cluster there means the broker's topics are
    another cluster's."""
    if not cluster_id:
        return None  # recorded before markers existed: nothing to compare with
    if found is None:
        return f"cluster marker {topic}: the topic is gone (cluster {cluster_id})"
    ids = {value.decode(errors="replace") for value in found}
    if cluster_id in ids:
        return None
    if not ids:
        return f"cluster marker {topic}: empty, the record of cluster {cluster_id} is gone"
    return f"cluster marker {topic}: holds cluster {', '.join(sorted(ids))}, not {cluster_id}"


def describe(lost: Sequence[str]) -> str:
    """The reason the cluster stops with, in one line (the first :data:`MAX_LOSSES_SHOWN` losses named)."""
    shown = "; ".join(lost[:MAX_LOSSES_SHOWN])
    if len(lost) > MAX_LOSSES_SHOWN:
        shown += f"; and {len(lost) - MAX_LOSSES_SHOWN} more"
    return (
        f"the Kafka broker lost the cluster's log ({shown}): the cluster stopped rather than "
        "serve from state its log no longer holds. Restore the broker's data, or start a fresh cluster "
        "(docs/operations.md#log-lost)"
    )
