"""What a worker puts on the changelog topic once an epoch finished here (pure).

Every epoch's commits on this worker (:attr:`~styx_worker.digests.EpochWrites.commits`) become the
records of each partition it owns, in commit order (:func:`styx_py.core.changelog.records_of`), handed
to the egress as one :class:`~styx_worker.effects.Changes` effect, which goes out beside the epoch's
replies and is flushed with them (a snapshot is complete, and a worker reports itself fenced, only once
they are on the log).

Exactly once across recoveries: a restore reads, after its own queued records are on the log, the last
record of each partition it owns (:meth:`~styx_py.core.ports.LogReader.changelog_tail`) into
:attr:`Changelog.tail`; the replayed epochs' records at or below it are the ones the changelog holds
already and are skipped. Every epoch after the restored snapshot is replayed, and the snapshot is
complete only with its epochs' records on the log, so nothing is missing either. A partition moved at a
planned change needs no tail: its old owner's records are on the log before the new owner runs an epoch.
"""

from __future__ import annotations

from collections.abc import Mapping

from styx_py.core.changelog import Commit, Position, records_of
from styx_worker.effects import Changes, Effect

__all__ = ["Changelog"]


class Changelog:
    """This worker's writer of the changelog: on or off, and what a restore found on it already."""

    __slots__ = ("enabled", "skipped", "tail")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tail: dict[int, Position] = {}  # partition -> the last record's position on the topic
        self.skipped = 0  # records a replay found on the changelog already (since the start)

    def restored(self, tail: Mapping[int, Position]) -> None:
        """A restore: the changelog ends at ``tail`` in the partitions it names (the others are empty)."""
        self.tail = dict(tail)

    def finished(
        self, epoch: int, commits: list[Commit] | None, partitions: Mapping[str, int], out: list[Effect]
    ) -> None:
        """``epoch`` finished here with ``commits``: its records (those past the tail) go out."""
        if not self.enabled or not commits:
            return
        records = records_of(epoch, commits, partitions, self.tail)
        if any(at[0] >= epoch for at in self.tail.values()):  # a replay of what the topic may hold
            self.skipped += sum(map(len, records_of(epoch, commits, partitions).values()))
            self.skipped -= sum(map(len, records.values()))
        if records:
            out.append(Changes(epoch, records))
