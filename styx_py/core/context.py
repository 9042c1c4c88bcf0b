"""The user-facing context of a function invocation.

This is the abstract API user code sees; the runtime implementation lives in ``worker.executor``
(kept apart so user code cannot reach runtime internals, as in Restate's sdk-python).
"""

from __future__ import annotations

import random as _random
import uuid as _uuid
from abc import ABC, abstractmethod
from typing import Any
from zlib import crc32

from styx_py.core.operator import Operator
from styx_py.core.partitioning import Key


def invocation_rng(tid: int, path: list[int]) -> _random.Random:
    """The random stream of one invocation: a function of its tid and call-tree position only, so a
    re-run, a fallback re-execution and a replay draw the same numbers (and so does the serial model)."""
    return _random.Random((tid << 32) | crc32(",".join(map(str, path)).encode()))


class Context(ABC):
    """What a function can do: touch its own entity's state and call other entities.

    Every effect is part of the surrounding transaction: it commits or aborts as a whole.
    """

    key: Key
    operator: str

    @abstractmethod
    async def get(self, default: Any = None) -> Any:
        """This entity's state, or ``default`` when it has none."""

    @abstractmethod
    async def put(self, value: Any) -> None:
        """Replace this entity's state (any msgspec-encodable value)."""

    @abstractmethod
    async def delete(self) -> None:
        """Remove this entity's state."""

    @abstractmethod
    def call_async(self, operator: Operator | str, function: str, key: Key, *args: Any) -> None:
        """Call a function of another entity in the same transaction, without waiting for it."""

    @abstractmethod
    async def call(self, operator: Operator | str, function: str, key: Key, *args: Any) -> Any:
        """Call a function of another entity in the same transaction and return its result."""

    @abstractmethod
    def random(self) -> float:
        """A deterministic pseudo-random float in [0, 1): identical when the transaction is replayed."""

    @abstractmethod
    def now(self) -> float:
        """The transaction's sequenced timestamp (seconds since the epoch), identical on replay."""

    def uuid(self) -> _uuid.UUID:
        """A deterministic UUID (version 4 layout) drawn from :meth:`random`'s stream."""
        bits = 0
        for _ in range(4):
            bits = (bits << 32) | int(self.random() * 2**32)
        return _uuid.UUID(int=bits, version=4)
