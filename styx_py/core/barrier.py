"""What an epoch's reports add up to (pure): every worker computes it, and so does the coordinator.

Workers send their ``ExecDone`` to every peer, their ``Vote`` and ``Revote`` to the coordinator and to
every peer; each worker combines the same set of reports with these functions, so all of them reach
the same decision without waiting for the coordinator to announce it (docs/architecture.md, the epoch
protocol).
"""

from __future__ import annotations

from styx_py.core.wire import ExecDone, Revote, Vote

__all__ = ["combine_exec", "combine_revotes", "combine_votes", "highest_lc"]


def combine_exec(msgs: list[ExecDone]) -> list[int]:
    """Every tid whose root saw a logic abort or an error."""
    return sorted({t for m in msgs for t in m.aborted})


def highest_lc(msgs: list[Vote]) -> int:
    """The highest sequencer counter after the epoch's batches (the next epoch starts every sequencer
    from it)."""
    return max((m.lc for m in msgs), default=0)


def combine_votes(msgs: list[Vote]) -> tuple[list[int], list[int]]:
    """(the fallback: every conflict, the serial ones: every transaction that invoked one entity
    twice on some worker); the two are disjoint."""
    serial = {t for m in msgs for t in m.serial}
    fallback = sorted({t for m in msgs for t in m.conflicts} - serial)
    return fallback, sorted(serial)


def combine_revotes(msgs: list[Revote], serial: list[int]) -> list[int]:
    """The fallback after a recheck: every conflict left once the serial ones' writes are out."""
    return sorted({t for m in msgs for t in m.conflicts} - set(serial))
