"""The epoch barrier: collect one message per worker for a stage, then combine them (pure).

Per epoch the coordinator runs three stages: ExecDone (union of logic aborts, max sequencer
counter), Vote (union of conflicts => the fallback set) and EpochDone (pending work, counts).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from styx_py.core.wire import EpochDone, ExecDone, Revote, Vote

M = TypeVar("M", ExecDone, Vote, Revote, EpochDone)


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


def combine_exec(msgs: list[ExecDone]) -> tuple[list[int], int]:
    aborted = sorted({t for m in msgs for t in m.aborted})
    return aborted, max((m.lc for m in msgs), default=0)


def combine_votes(msgs: list[Vote]) -> tuple[list[int], list[int]]:
    """(the fallback: every conflict, the serial ones: every transaction that invoked one entity
    twice on some worker); the two are disjoint."""
    serial = {t for m in msgs for t in m.serial}
    fallback = sorted({t for m in msgs for t in m.conflicts} - serial)
    return fallback, sorted(serial)


def combine_revotes(msgs: list[Revote], serial: list[int]) -> list[int]:
    """The fallback after a recheck: every conflict left once the serial ones' writes are out."""
    return sorted({t for m in msgs for t in m.conflicts} - set(serial))
