"""The epoch barrier: collect one message per worker for a stage (pure).

Per epoch the coordinator collects every worker's Vote, [Revote] and EpochDone; what they add up to
is :mod:`styx_py.core.barrier`, which the workers compute too (from the peers' ExecDone as well).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from styx_py.core.wire import EpochDone, Revote, Vote

__all__ = ["Stage"]

M = TypeVar("M", Vote, Revote, EpochDone)


class Stage(Generic[M]):
    def __init__(self, epoch: int, workers: Iterable[str], kind: type[M] | None = None) -> None:
        self.epoch = epoch
        self.expected = frozenset(workers)
        self.kind: type[M] | None = kind
        self.got: dict[str, M] = {}

    def add(self, msg: M) -> bool:
        """Record a worker's message (a repeat or one of another stage changes nothing); True once
        every expected worker has reported."""
        if (
            msg.epoch == self.epoch
            and msg.node_id in self.expected
            and (self.kind is None or isinstance(msg, self.kind))
        ):
            self.got[msg.node_id] = msg
        return self.complete

    @property
    def complete(self) -> bool:
        return len(self.got) == len(self.expected)

    def messages(self) -> list[M]:
        return [self.got[n] for n in sorted(self.got)]
