"""Reads of committed state as of a recent epoch, served from memory without pausing epochs (pure).

Every commit on this worker goes through :meth:`StateStore.apply <styx_worker.state.StateStore.apply>`,
which hands :meth:`VersionWindow.record` the value each written entity had before its first write in
that epoch (copy-on-write: a reference to the old bytes, no copy; None when it did not exist). The
state as of epoch ``E`` is the live state with, for every entity written in an epoch after ``E``, the
value kept from the first such epoch: so the epoch in progress (part of its writes applied) never shows.

Bounded: the values of the last :attr:`~styx_py.core.config.Config.state_window_epochs` epochs are kept,
older ones dropped as epochs go by. A restore or a hand-off restarts the window at the epoch the state
then stands at (:meth:`VersionWindow.restart`): its older versions are not here, and a read of an older
epoch is refused (``out-of-window``) rather than answered with a newer state. Nothing here is
snapshotted.

:func:`read_at` answers a :class:`~styx_py.core.wire.ReadAt`: each partition asked for that this worker
owns, its live entries in the range as of the epoch, in key order, up to the row limit and the byte
budget (:data:`~styx_py.core.limits.MAX_READ_BYTES`). Cost: each partition's answer bisects the
operator's keys in key order (:mod:`styx_worker.keyindex`) and walks the rows it returns, plus the
versions kept since the epoch.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import accumulate, repeat
from typing import Protocol

from styx_py.core.limits import MAX_READ_BYTES
from styx_py.core.partitioning import Key, partition_of
from styx_py.core.scan import order
from styx_py.core.wire import PartRows, ReadAt, ReadRows
from styx_worker.conflicts import EntityKey
from styx_worker.keyindex import KeyIndex, from_low, lower, past_end

__all__ = ["VersionWindow", "read_at"]

Values = dict[EntityKey, bytes | None]


class Stored(Protocol):
    """What a read needs of the :class:`~styx_worker.state.StateStore`."""

    @property
    def data(self) -> dict[EntityKey, bytes]: ...
    @property
    def index(self) -> KeyIndex: ...


class VersionWindow:
    """The value before each epoch's writes, for the last ``epochs`` epochs."""

    __slots__ = ("before", "epochs", "floor")

    def __init__(self, epochs: int, floor: int = -1) -> None:
        assert epochs >= 1
        self.epochs = epochs
        self.floor = floor  # no read of an epoch before this one (the window's last restart)
        self.before: dict[int, Values] = {}  # epoch -> entity -> its value before that epoch's writes

    def record(self, epoch: int, keys: Values, data: dict[EntityKey, bytes]) -> None:
        """``keys`` are about to be written in ``epoch``: keep what ``data`` holds for each one not kept
        yet in that epoch."""
        kept = self.before.get(epoch)
        if kept is None:
            kept = self.before[epoch] = {}
            self._forget(epoch - self.epochs)
        for key in keys:
            if key not in kept:
                kept[key] = data.get(key)

    def _forget(self, upto: int) -> None:
        """Drop the versions of the epochs up to ``upto``: no read as of an epoch before it needs them.
        Epochs commit in order, so the oldest kept are first in ``before``."""
        before = self.before
        while before and (oldest := next(iter(before))) <= upto:
            del before[oldest]
        if upto > self.floor:
            self.floor = upto

    def restart(self, epoch: int) -> None:
        """The state was restored or reshaped as of ``epoch``: only reads of it and later ones."""
        self.before.clear()
        self.floor = epoch

    def oldest(self, completed: int) -> int:
        """The oldest epoch readable here once ``completed`` is the last epoch finished."""
        return max(self.floor, completed - self.epochs + 1)

    def changed_since(self, epoch: int) -> Values:
        """Every entity written after ``epoch``, with its value as of ``epoch``."""
        out: Values = {}
        for e in sorted((e for e in self.before if e > epoch), reverse=True):
            out.update(self.before[e])  # the earliest epoch's value is the one left
        return out

    def __len__(self) -> int:
        return sum(map(len, self.before.values()))


def read_at(
    msg: ReadAt,
    node_id: str,
    store: Stored,
    window: VersionWindow,
    completed: int,
    owned: Callable[[int], bool],
) -> ReadRows:
    """This worker's answer to ``msg``, from the live ``store`` and the ``window`` of versions, once
    ``completed`` is the last epoch finished here (the caller refuses while recovering)."""
    e = msg.epoch
    if e > completed:
        return ReadRows(msg.read, node_id, [], "unavailable", f"epoch {e} not finished here yet", -1)
    oldest = window.oldest(completed)
    if e < oldest:
        error = f"epoch {e} is older than the oldest epoch kept in memory here ({oldest})"
        return ReadRows(msg.read, node_id, [], "out-of-window", error, oldest)
    if not all(owned(p) for p in msg.partitions):
        return ReadRows(msg.read, node_id, [], "unavailable", "partitions moved: retry", oldest)
    rng, n = msg.range, msg.range.partitions
    op = rng.operator
    then: dict[int, dict[Key, bytes | None]] = {p: {} for p in msg.partitions}  # changed since e
    for (o, k), v in window.changed_since(e).items():
        if o == op:  # the range is checked where the rows are walked
            part = then.get(partition_of(k, n))
            if part is not None:
                part[k] = v
    budget = [MAX_READ_BYTES]
    parts = [
        _partition_rows(msg, p, store.index.keys(op, p, n, store.data), store.data, then[p], budget)
        for p in msg.partitions
    ]
    return ReadRows(msg.read, node_id, parts, "", "", oldest)


def _partition_rows(
    msg: ReadAt,
    partition: int,
    keys: list[Key],
    data: dict[EntityKey, bytes],
    then: dict[Key, bytes | None],
    budget: list[int],
) -> PartRows:
    """One partition's live entries in the range as of the epoch: its keys now from the first one in
    range on, with the values ``then`` holds for those changed since (and the keys deleted since).

    Built from slices, bisections and maps rather than a Python step per key (``python -m
    styx_benchmarks.scan_cpu --pure --profile``: 95 µs for an answer of 283 rows where a loop over
    them took 1.26 ms, both under cProfile): the keys from the low bound on, as many as ``rows`` + 1 rows
    can take (each key inserted since the epoch is no row then), the keys deleted since merged in, cut
    where the range ends (a walk in key order leaves the range once, so the first key past it is found
    by bisection), their values, then ``rows`` of them or fewer where the byte budget ends."""
    rng, op, limit = msg.range, msg.range.operator, msg.rows
    lo, low_open = lower(rng)
    at = 0 if lo is None else (bisect_right if low_open else bisect_left)(keys, lo, key=order)
    window = limit + 1 + (sum(v is None for v in then.values()) if then else 0)
    cand = keys[at : at + window]
    gone = [k for k in then if (op, k) not in data] if then else []
    if gone:  # present at the epoch, not in ``keys`` now: merged in up to the last key taken
        extra = from_low([], gone, lo, low_open)
        if at + window < len(keys):
            last = order(cand[-1])
            extra = (k for k in extra if order(k) < last)
        cand = list(heapq.merge(cand, extra, key=order))
    past = past_end(rng)
    if cand and past(cand[-1]):
        cand = cand[: bisect_left(cand, True, key=past)]
    vals: list[bytes]
    if then:
        was = [then[k] if k in then else data[(op, k)] for k in cand]
        if None in was:  # absent at the epoch (inserted since, or inserted and deleted since)
            cand = [k for k, v in zip(cand, was, strict=True) if v is not None]
        vals = [v for v in was if v is not None]
    else:
        vals = list(map(data.__getitem__, zip(repeat(op), cand)))
    more = len(cand) > limit
    if more:
        cand, vals = cand[:limit], vals[:limit]
    sizes = list(accumulate(map(len, vals)))
    if sizes and sizes[-1] > budget[0]:  # the first row always, the rest while they fit
        n = max(1, bisect_right(sizes, budget[0]))
        more = more or n < len(vals)
        cand, vals, sizes = cand[:n], vals[:n], sizes[:n]
    if sizes:
        budget[0] -= sizes[-1]
    return PartRows.of(partition, cand, vals, more)
