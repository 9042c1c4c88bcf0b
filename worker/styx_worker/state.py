"""In-memory entity state of one worker, stored as msgpack bytes.

Values are kept encoded: a read decodes a private copy (user code mutating what ``get`` returned can
never corrupt committed state or another transaction's snapshot), a write proves the value is
encodable at ``put`` time, and snapshots ship the bytes as they are. Committed writes also go to a
delta map, the unit of incremental snapshots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from styx_worker.conflicts import EntityKey

Writes = dict[EntityKey, bytes | None]  # None = delete


class StateStore:
    def __init__(self) -> None:
        self.data: dict[EntityKey, bytes] = {}
        self.delta: Writes = {}

    def get(self, key: EntityKey) -> bytes | None:
        return self.data.get(key)

    def apply(self, writes: Writes) -> None:
        data, delta = self.data, self.delta
        for key, value in writes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
            delta[key] = value

    def load_writes(self, writes: Iterable[tuple[str, str | int, bytes | None]]) -> None:
        """Apply a snapshot delta during recovery (not recorded as a new delta)."""
        data = self.data
        for op, key, value in writes:
            if value is None:
                data.pop((op, key), None)
            else:
                data[(op, key)] = value

    def drop(self, gone: Callable[[EntityKey], bool]) -> None:
        """Forget every key for which ``gone`` holds (its partition moved to another worker)."""
        for key in [k for k in self.data if gone(k)]:
            del self.data[key]
        for key in [k for k in self.delta if gone(k)]:  # deletes too (not in ``data``)
            del self.delta[key]

    def take_delta(self) -> Writes:
        delta, self.delta = self.delta, {}
        return delta

    def items(self) -> Iterator[tuple[EntityKey, bytes]]:
        return iter(self.data.items())

    def load(self, items: Iterable[tuple[EntityKey, bytes]]) -> None:
        self.data.update(items)

    def __len__(self) -> int:
        return len(self.data)
