"""Consistent reads of committed state outside transactions: one epoch's cut, every partition asked.

A client's :class:`~styx_py.core.wire.ReadState` names an operator, a range (or one key) and an epoch
(-1: the newest one every worker finished, which every worker can read at once). The coordinator asks
the owner of each partition the read covers (:class:`~styx_py.core.wire.ReadAt`: every partition of the
operator for a range, the key's own for one key), merges their :class:`~styx_py.core.wire.ReadRows` in
key order and answers the client with one page (:mod:`styx_py.core.wire.reads`). Epochs keep running
meanwhile: each worker answers from its live state and the versions it keeps
(:mod:`styx_worker.window`).

Each partition of a range is asked for a little more than its even share of the page (:func:`share`).
A page ends at ``limit`` rows, or earlier where a partition's answer was cut short (its share or its
byte budget): every row up to the page's last key is in it, from every partition, and ``next`` says
where the next page starts. A worker that cannot answer (recovering, partitions moved, the epoch out of
its window) makes the read refused with that worker's code; one that does not answer within
``LOOKUP_TIMEOUT_S`` makes it ``unavailable``. At most ``MAX_OPEN_LOOKUPS`` reads are open at once.

Replies leave before their epoch is over (early commit replies), so a client that read a reply of epoch
``E`` can ask before every worker finished ``E``. Its read names ``min_epoch`` ``E``: the read waits,
for at most ``LOOKUP_TIMEOUT_S``, until the newest finished epoch is at least ``E`` (:meth:`StateReads.
finished`, called by the epoch loop), and then reads that one, so it sees the writes of the reply's
transaction (read-your-writes); past the wait it is ``unavailable`` (a recovery runs: the client retries).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from styx_coordinator.cluster import Cluster
from styx_coordinator.tasks import Tasks
from styx_py.core.limits import LOOKUP_TIMEOUT_S, MAX_OPEN_LOOKUPS, MAX_READ_PAGE
from styx_py.core.partitioning import Key, partition_of
from styx_py.core.ports import Clock
from styx_py.core.scan import ScanRange, order, scan_range
from styx_py.core.wire import AdminReply, PartRows, ReadAt, ReadRows, ReadState

__all__ = ["StateReads", "merge_page", "share"]


@dataclass(slots=True)
class _Read:
    src: str
    epoch: int
    limit: int
    waiting: set[str]  # workers that have not answered yet
    parts: dict[int, PartRows] = field(default_factory=dict)
    refused: ReadRows | None = None


class StateReads:
    def __init__(self, cluster: Cluster, clock: Clock, tasks: Tasks, latest: Callable[[], int]) -> None:
        self.cluster = cluster
        self.clock = clock
        self.tasks = tasks
        self.latest = latest  # the newest epoch every worker finished
        self.open: dict[int, _Read] = {}
        self.next_id = 0
        # Reads waiting for the newest finished epoch to reach their min_epoch, by their id.
        self.parked: dict[int, tuple[str, ReadState]] = {}
        # When each open or parked read times out, in the order they came (one timeout for all, so
        # also in time order), swept by one task while any is due: not a sleeping task per read.
        self.deadlines: deque[tuple[float, int]] = deque()
        self.sweeping = False

    def _refuse(self, src: str, code: str, error: str, **extra: Any) -> None:
        self.cluster.transport.send(src, AdminReply(False, error, {"code": code, **extra}))

    def start(self, src: str, msg: ReadState) -> None:
        c = self.cluster
        spec = next((o for o in c.operators if o.name == msg.operator), None)
        if spec is None:
            self._refuse(src, "unknown-operator", f"no operator {msg.operator!r} is deployed")
            return
        n = spec.partitions
        if not 1 <= msg.limit <= MAX_READ_PAGE:
            self._refuse(src, "bad-request", f"a read's limit must be in 1..{MAX_READ_PAGE}, got {msg.limit}")
            return
        try:
            if msg.key is not None:
                rng, rows = scan_range(msg.operator, start=msg.key, end=msg.key, limit=1)
                rng = ScanRange(msg.operator, msg.key, False, msg.key, False, None, -1, n)
                partitions = [partition_of(msg.key, n)]
            else:
                rng, _ = scan_range(msg.operator, msg.start, msg.end, msg.prefix, None, msg.after)
                rng = ScanRange(rng.operator, rng.low, rng.low_open, rng.high, True, rng.prefix, -1, n)
                rows, partitions = msg.limit, list(range(n))
        except TypeError as exc:
            self._refuse(src, "bad-request", str(exc))
            return
        latest = self.latest()
        epoch = latest if msg.epoch == -1 else msg.epoch
        if msg.epoch == -1 and msg.min_epoch > latest:
            self._park(src, msg)
            return
        if c.state != "running" or len(c.placement) < n:
            self._refuse(src, "unavailable", f"the cluster is {c.state}: retry", latest=latest)
            return
        if not -1 <= epoch <= latest:
            error = f"epoch {epoch} is not committed (the newest committed epoch is {latest})"
            self._refuse(src, "not-committed" if epoch > latest else "bad-request", error, latest=latest)
            return
        if self._full(src):
            return
        owners: dict[str, list[int]] = {}
        for p in partitions:
            owners.setdefault(c.placement[p], []).append(p)
        read_id, self.next_id = self.next_id, self.next_id + 1
        self.open[read_id] = _Read(src, epoch, rows, set(owners))
        quota = share(rows, len(partitions))
        for node_id, owned in sorted(owners.items()):
            c.transport.send(node_id, ReadAt(read_id, c.gen, epoch, rng, quota, owned))
        self._time_out(read_id)

    def _full(self, src: str) -> bool:
        """At most ``MAX_OPEN_LOOKUPS`` reads open or parked: refuse one more (True)."""
        n = len(self.open) + len(self.parked)
        if n >= MAX_OPEN_LOOKUPS:
            self._refuse(src, "unavailable", f"{n} reads in flight; retry")
        return n >= MAX_OPEN_LOOKUPS

    def _park(self, src: str, msg: ReadState) -> None:
        if self._full(src):
            return
        read_id, self.next_id = self.next_id, self.next_id + 1
        self.parked[read_id] = (src, msg)
        self._time_out(read_id)

    def _time_out(self, read_id: int) -> None:
        """Refuse read ``read_id`` in :data:`LOOKUP_TIMEOUT_S` if it is still open or parked then."""
        self.deadlines.append((self.clock.now() + LOOKUP_TIMEOUT_S, read_id))
        if not self.sweeping:
            self.sweeping = True
            self.tasks.spawn(self._sweep())

    async def _sweep(self) -> None:
        try:
            while self.deadlines:
                due, read_id = self.deadlines[0]
                if (wait := due - self.clock.now()) > 0:
                    await self.clock.sleep(wait)
                    continue
                self.deadlines.popleft()
                self._expire(read_id)
        finally:
            self.sweeping = False

    def finished(self, epoch: int) -> None:
        """Every worker finished ``epoch``: start the parked reads it satisfies."""
        if not self.parked:
            return
        ready = [i for i, (_, msg) in self.parked.items() if msg.min_epoch <= epoch]
        for read_id in ready:
            src, msg = self.parked.pop(read_id)
            self.start(src, msg)

    def on_rows(self, msg: ReadRows) -> None:
        read = self.open.get(msg.read)
        if read is None or msg.node_id not in read.waiting:
            return  # answered already (timed out, refused), or a duplicate
        read.waiting.discard(msg.node_id)
        if msg.code:
            self.open.pop(msg.read)
            self._refuse(read.src, msg.code, f"{msg.node_id}: {msg.error}", oldest=msg.oldest)
            return
        for part in msg.parts:
            read.parts[part.partition] = part
        if not read.waiting:
            self.open.pop(msg.read)
            keys, values, after = merge_page(list(read.parts.values()), read.limit)
            body = {"epoch": read.epoch, "keys": keys, "values": values, "next": after}
            self.cluster.transport.send(read.src, AdminReply(True, "", body))

    def _expire(self, read_id: int) -> None:
        """Read ``read_id``'s time is up: refuse it if it is still open (a worker did not answer) or
        parked (its min_epoch did not finish)."""
        read = self.open.pop(read_id, None)
        if read is not None:
            missing = ", ".join(sorted(read.waiting))
            self._refuse(read.src, "unavailable", f"no answer from {missing} within {LOOKUP_TIMEOUT_S:g} s")
        parked = self.parked.pop(read_id, None)
        if parked is not None:
            src, msg = parked
            latest = self.latest()
            error = f"epoch {msg.min_epoch} has not finished within {LOOKUP_TIMEOUT_S:g} s (newest: {latest})"
            self._refuse(src, "unavailable", error, latest=latest)


def share(limit: int, partitions: int) -> int:
    """The rows each of ``partitions`` is asked for, towards a page of ``limit``. Keys hash evenly over
    the partitions, so a page's keys fall ``m = limit / partitions`` to a partition on average, with a
    spread of about ``sqrt(m)``: asking each for ``m + 2 sqrt(m)`` fills most pages, where asking every
    partition for ``limit`` would read and merge ``partitions`` times the page. A partition with more
    than its share in the range cuts the page short at its last row (:func:`merge_page`): the page is
    smaller, never wrong."""
    if partitions <= 1:
        return limit
    m = limit / partitions
    return min(limit, math.ceil(m + 2 * math.sqrt(m)) + 1)


def merge_page(parts: list[PartRows], limit: int) -> tuple[list[Key], list[msgspec.Raw], Key | None]:
    """The partitions' answers as one page in key order, as its keys and their values (each a view of
    its stored msgpack), and the key the next page starts after (None: nothing follows). A partition
    cut short covers only up to its last row, so the page stops there: past it, that partition's rows
    are not known.

    Each answer is in key order, ints before strs: one whose first and last keys are of one type holds
    only that type, so where every answer's ends share one, keys compare as they are (no sort key
    computed per row). Each answer is cut at the page's end by bisection, and the page is put in key
    order by sorting row numbers by key: no object per row (on a small machine the garbage
    collector's passes over a tuple per row cost more than the sort)."""
    runs = [p for p in parts if p.keys]
    one_type = len({type(p.keys[0]) for p in runs} | {type(p.keys[-1]) for p in runs}) <= 1
    by: Callable[[Key], Any] | None = None if one_type else order
    cuts = [p.keys[-1] if one_type else order(p.keys[-1]) for p in runs if p.more]
    cut = min(cuts) if cuts else None
    keys: list[Key] = []
    values: list[msgspec.Raw] = []
    for p in runs:
        n = len(p.keys) if cut is None else bisect.bisect_right(p.keys, cut, key=by)
        keys += p.keys[:n]
        values += p.values_list()[:n]
    more = cut is not None or len(keys) > limit
    if len(runs) > 1:
        # Keys are distinct (each is in one partition): the order of the row numbers is the page's.
        rank = keys.__getitem__ if one_type else (lambda i: order(keys[i]))
        perm = sorted(range(len(keys)), key=rank)[:limit]
        keys, values = list(map(keys.__getitem__, perm)), list(map(values.__getitem__, perm))
    else:
        keys, values = keys[:limit], values[:limit]
    return keys, values, (keys[-1] if more and keys else None)
