"""The egress reader rests while every worker pushes: it skips the parts of the log it no longer needs.

With every worker pushing (:mod:`styx_client.sdk.push`), each reply reaches the client twice:
pushed, then read from the egress topic, where all but a few are copies of replies already taken.
Reading them is most of what the reply path costs the client at high rates (7-10 µs per request of
~50 at 8 000/s, benchmarks/results/resting-reader.md). So while every subscription is up, the reader
pauses its partitions and, instead of reading, moves its position forward over what it may skip.

What it may skip comes from the workers. Each sends the client :class:`~styx_py.core.wire.EgressAcked`
now and then: per egress partition, an offset ``E`` below which the broker acknowledged its replies.
Every record below ``E`` was appended before the message was sent, so the reply it holds answers a
request the client registered before the message arrived. The client notes ``n``, how many requests
it had registered then (:attr:`PendingTable.registered <styx_client.sdk.pending.PendingTable>`),
with ``E`` (a checkpoint). Once every request registered before ``n`` has left the pending table
(answered, failed, given up: :meth:`PendingTable.oldest <styx_client.sdk.pending.PendingTable.oldest>`
is at ``n`` or later), no record below ``E`` holds a reply anyone waits for, and the reader seeks to
``E``. Nothing a caller waits for is ever skipped, whatever the workers push or not.

A reply that was not pushed (a dropped frame, a worker that restarted and replays) keeps its request
in the table, and the checkpoints after it stay unused. The reader reads again, from where it stands,
as soon as:

- a request has been in flight :data:`~styx_py.core.limits.EGRESS_MISS_S` (then its reply may be in the
  log only);
- a subscription is down (:attr:`WorkerLinks.healthy <styx_client.sdk.push.WorkerLinks.healthy>`);
- or no mark came for :data:`~styx_py.core.limits.EGRESS_MARKS_STALE_S` while a request is in flight
  (workers that send none: an older version; an idle cluster sends none either, and a client with
  nothing in flight has nothing to read for, so it rests: its fetches cost the broker CPU by the round,
  4 % of a core on Tansu);
- or the client is moving to other egress segments (``settled`` is False): one it no longer needs is
  dropped only once read to its end, which takes a fetch. The marks have mostly moved the reader to
  that end already, so this costs a fetch or two per rotation, and without it a client that rested
  through a long run kept every segment it ever read assigned (4 partitions more every 2 s on the
  local stack, each one looked at by every rest).

It reads until none of these holds, then rests again. A reply it finds there, while every
subscription is up, also makes the client ask the coordinator for the workers at once
(:meth:`WorkerLinks.ask_soon <styx_client.sdk.push.WorkerLinks.ask_soon>`): a worker that joined
since the client last asked does not push to it yet, and its replies would otherwise each wait
``EGRESS_MISS_S`` until the next regular look.
"""

from __future__ import annotations

import collections

from styx_client.sdk.pending import PendingTable
from styx_py.core.limits import EGRESS_MARKS_STALE_S, EGRESS_MISS_S, MAX_EGRESS_CHECKPOINTS
from styx_py.core.segments import segment_topic, unpack

__all__ = ["EgressRest", "TopicPart"]

TopicPart = tuple[str, int]
"""An egress topic (segment) and partition; aiokafka's ``TopicPartition`` is one (a named tuple)."""


class EgressRest:
    """Whether the reply reader may rest, and where it may move to (module docstring). Plain data: the
    reader asks it, with the time, and moves its consumer itself."""

    def __init__(self, table: PendingTable, egress_topic: str) -> None:
        self.table = table
        self.egress_topic = egress_topic
        # Per partition, (E, n) in the order they came, E growing.
        self.checkpoints: dict[TopicPart, collections.deque[tuple[int, int]]] = {}
        self.last_mark = -float("inf")
        self.resting = False

    def mark(self, ends: list[tuple[int, int]], now: float) -> None:
        """A worker's :class:`~styx_py.core.wire.EgressAcked` at ``now`` (monotonic s): one checkpoint
        per partition that moved."""
        n = self.table.registered
        for partition, packed in ends:
            segment, offset = unpack(packed)
            tp = (segment_topic(self.egress_topic, segment), partition)
            queue = self.checkpoints.get(tp)
            if queue is None:
                queue = self.checkpoints[tp] = collections.deque(maxlen=MAX_EGRESS_CHECKPOINTS)
            if not queue or offset > queue[-1][0]:
                queue.append((offset, n))
        self.last_mark = now

    def may_rest(self, healthy: bool, settled: bool, now: float, wall_ms: int) -> bool:
        """Whether the reader may rest now: every subscription is up (``healthy``), it reads exactly the
        egress partitions it should (``settled``), and no reply may be in the log only (module
        docstring); ``now`` is the monotonic time in s, ``wall_ms`` the clock of ``Pending.stamp``."""
        if not healthy or not settled:
            return False
        if not len(self.table):
            return True  # nothing in flight: no reply to read for
        if now - self.last_mark >= EGRESS_MARKS_STALE_S:
            return False
        _, stamp = self.table.oldest()
        return stamp == 0 or wall_ms - stamp < EGRESS_MISS_S * 1000

    def skips(self, assigned: set[TopicPart]) -> dict[TopicPart, int]:
        """Where the resting reader may move each of its partitions ``assigned`` (those with a
        checkpoint every request before which has left the table); checkpoints of partitions no longer
        read are dropped."""
        oldest, _ = self.table.oldest()
        out: dict[TopicPart, int] = {}
        for tp in assigned:
            queue = self.checkpoints.get(tp)
            end = None
            while queue and queue[0][1] <= oldest:
                end = queue.popleft()[0]
            if end is not None:
                out[tp] = end
        for tp in [tp for tp in self.checkpoints if tp not in assigned]:
            del self.checkpoints[tp]  # a segment no longer read
        return out
