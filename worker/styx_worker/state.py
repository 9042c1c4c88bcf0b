"""In-memory entity state of one worker, stored as msgpack bytes.

Values are kept encoded: a read decodes a private copy (user code mutating what ``get`` returned can
never corrupt committed state or another transaction's snapshot), a write proves the value is
encodable at ``put`` time, and snapshots ship the bytes as they are. Committed writes also go to a
delta map, the unit of incremental snapshots.

The keys of the watched operators (the system operators of external calls and timers) that a commit,
a snapshot load or a hand-off wrote are collected in :attr:`StateStore.touched` for the worker's effect
runner (:mod:`styx_worker.outbox`), which reads their committed state; :attr:`StateStore.pending`
counts what each of their partitions holds (the per-partition bounds, styx_py.core.pendingcount).

A commit names its epoch: the value each written entity had before goes to the :attr:`StateStore.window`
first (:mod:`styx_worker.window`), for consistent reads as of recent epochs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from styx_py.core.effectids import SYSTEM_OPERATORS
from styx_py.core.pendingcount import PendingCounts
from styx_worker.conflicts import EntityKey
from styx_worker.keyindex import KeyIndex
from styx_worker.window import VersionWindow

Writes = dict[EntityKey, bytes | None]  # None = delete


class StateStore:
    def __init__(self, watched: frozenset[str] = frozenset(), window: VersionWindow | None = None) -> None:
        self.data: dict[EntityKey, bytes] = {}
        self.window = window  # the versions kept for reads as of recent epochs (None: none kept)
        self.index = KeyIndex()  # the keys in key order, for those reads (styx_worker.keyindex)
        self.delta: Writes = {}
        self.watched = watched
        self.touched: set[EntityKey] = set()
        self.on_touched: Callable[[], None] | None = None
        self.pending = PendingCounts()

    def _touch(self, keys: Iterable[EntityKey]) -> None:
        watched = self.watched
        hit = [k for k in keys if k[0] in watched]
        if hit:
            self.touched.update(hit)
            if self.on_touched is not None:
                self.on_touched()

    def get(self, key: EntityKey) -> bytes | None:
        return self.data.get(key)

    def apply(self, writes: Writes, epoch: int = -1) -> None:
        """Commit ``writes`` of ``epoch`` (-1: outside any epoch, kept by no window)."""
        data, delta, indexed = self.data, self.delta, self.index.by_op
        if self.window is not None and epoch >= 0:
            self.window.record(epoch, writes, data)
        changed: list[EntityKey] = []  # keys of indexed operators added or removed
        for key, value in writes.items():
            if value is None:
                if data.pop(key, None) is not None and key[0] in indexed:
                    changed.append(key)
            else:
                if key[0] in indexed and key not in data:
                    changed.append(key)
                data[key] = value
            delta[key] = value
            if key[0] in SYSTEM_OPERATORS:
                self.pending.write(key, value)
        if changed:
            self.index.update(changed, data)
        if self.watched:
            self._touch(writes)

    def load_writes(self, writes: Iterable[tuple[str, str | int, bytes | None]]) -> None:
        """Apply a snapshot delta during recovery (not recorded as a new delta)."""
        data = self.data
        self.index.clear()
        loaded = []
        for op, key, value in writes:
            if value is None:
                data.pop((op, key), None)
            else:
                data[(op, key)] = value
            loaded.append((op, key))
            if op in SYSTEM_OPERATORS:
                self.pending.write((op, key), value)
        if self.watched:
            self._touch(loaded)

    def drop(self, gone: Callable[[EntityKey], bool]) -> None:
        """Forget every key for which ``gone`` holds (its partition moved to another worker)."""
        self.index.clear()
        dropped = [k for k in self.data if gone(k)]
        for key in dropped:
            del self.data[key]
            if key[0] in SYSTEM_OPERATORS:
                self.pending.write(key, None)
        if self.watched:
            self._touch(dropped)
        for key in [k for k in self.delta if gone(k)]:  # deletes too (not in ``data``)
            del self.delta[key]

    def take_delta(self) -> Writes:
        delta, self.delta = self.delta, {}
        return delta

    def items(self) -> Iterator[tuple[EntityKey, bytes]]:
        return iter(self.data.items())

    def load(self, items: Iterable[tuple[EntityKey, bytes]]) -> None:
        items = list(items)
        self.index.clear()
        self.data.update(items)
        self.pending.write_all((k, v) for k, v in items if k[0] in SYSTEM_OPERATORS)
        if self.watched:
            self._touch(k for k, _ in items)

    def __len__(self) -> int:
        return len(self.data)
