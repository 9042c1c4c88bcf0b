"""The audit's changelog checks (pure): each committed write on the changelog once, in commit order, and
the changelog up to a snapshot's epoch rebuilding that snapshot (:mod:`styx_py.core.changelog`).

- ``changelog.order`` — along each partition (in offset order) the records' ``(epoch, phase, tid)`` never
  goes back and their positions ``(epoch, index)`` strictly increase (:func:`partition_findings`).
- ``changelog.once`` — no position twice and no index skipped within an epoch (the same scan); no record
  of a transaction that no committed reply names at that epoch and phase (a join in the job); and, with
  the serial replay, each partition holds exactly the records the replay's writes give
  (:class:`ChangelogExpectation`: their number and the sum of their digests, up to the epoch bound).
- ``changelog.snapshot`` — the latest record per entity up to the snapshot's epoch is the snapshot's state
  (:func:`snapshot_findings`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from styx_py.audit.rows import change_digest
from styx_py.audit.rules import CHECKS, ERROR, SKIPPED, Finding
from styx_py.core.changelog import Commit, encode_change, records_of
from styx_py.core.graph import Graph

__all__ = [
    "CHANGELOG_CHECKS",
    "ChangelogExpectation",
    "changelog_skipped",
    "digest_sums",
    "partition_findings",
    "snapshot_findings",
]

CHANGELOG_CHECKS = tuple(c for c in CHECKS if c.startswith("changelog."))

MAX_PER_PARTITION = 20  # findings of one kind spelled out per partition
_MASK = (1 << 64) - 1


def _signed(n: int) -> int:
    n &= _MASK
    return n - (1 << 64) if n >= 1 << 63 else n


def changelog_skipped(reason: str, checks: Iterable[str] = CHANGELOG_CHECKS) -> list[Finding]:
    return [Finding(c, "changelog", reason, SKIPPED) for c in checks]


def partition_findings(partition: int, rows: Iterable[tuple[int, int, int, int, int]]) -> list[Finding]:
    """``changelog.order`` and ``changelog.once`` findings of one partition's records, given in offset order
    as ``(offset, epoch, phase, tid, index)``."""
    out: list[Finding] = []
    counts = {"changelog.once": 0, "changelog.order": 0}

    def finding(check: str, subject: str, message: str) -> None:
        counts[check] += 1
        if counts[check] <= MAX_PER_PARTITION:
            out.append(Finding(check, subject, message, ERROR))

    prev: tuple[int, int, int, int, int] | None = None
    for offset, epoch, phase, tid, index in rows:
        where = f"changelog p{partition}@{offset}"
        if prev is None:
            if index != 0:
                finding(
                    "changelog.once", where, f"{where}: the first record is index {index} of epoch {epoch}"
                )
        else:
            p_off, p_epoch, p_phase, p_tid, p_index = prev
            if (epoch, index) == (p_epoch, p_index):
                finding(
                    "changelog.once",
                    where,
                    f"{where}: epoch {epoch} record {index} (tid {tid}) written twice (also at {p_off})",
                )
            elif (epoch, index) < (p_epoch, p_index) or (epoch, phase, tid) < (p_epoch, p_phase, p_tid):
                finding(
                    "changelog.order",
                    where,
                    f"{where}: epoch {epoch} phase {phase} tid {tid} (record {index}) after epoch {p_epoch} "
                    f"phase {p_phase} tid {p_tid} (record {p_index}, offset {p_off})",
                )
            elif epoch == p_epoch and index != p_index + 1:
                finding(
                    "changelog.once",
                    where,
                    f"{where}: epoch {epoch} records {p_index + 1}..{index - 1} missing (between offsets "
                    f"{p_off} and {offset})",
                )
            elif epoch != p_epoch and index != 0:
                finding(
                    "changelog.once",
                    where,
                    f"{where}: epoch {epoch} records 0..{index - 1} missing (before it)",
                )
        prev = (offset, epoch, phase, tid, index)
    for check, n in counts.items():
        if n > MAX_PER_PARTITION:
            more = n - MAX_PER_PARTITION
            out.append(
                Finding(check, f"changelog p{partition}", f"{n} such findings in all ({more} not listed)")
            )
    return out


def digest_sums(rows: Iterable[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Per partition, the number of records and the (wrapping, signed 64-bit) sum of their digests, from
    ``(partition, digest)`` pairs."""
    out: dict[int, tuple[int, int]] = {}
    for p, digest in rows:
        n, total = out.get(p, (0, 0))
        out[p] = (n + 1, _signed(total + digest))
    return out


class ChangelogExpectation:
    """The changelog records the serial replay's writes give, up to epoch ``bound``, summed per partition
    like :func:`digest_sums`; fed each committed transaction in commit order."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.epoch = -1
        self.commits: list[Commit] = []
        self.partitions: Mapping[str, int] = {}
        self.sums: dict[int, tuple[int, int]] = {}

    def feed(
        self, graph: Graph, epoch: int, phase: int, tid: int, writes: Mapping[Any, bytes | None]
    ) -> None:
        if epoch > self.bound or not writes:
            return
        if epoch != self.epoch:
            self._flush()
            self.epoch = epoch
            self.partitions = {name: op.partitions for name, op in graph.operators.items()}
        self.commits.append((phase, tid, writes))

    def _flush(self) -> None:
        if not self.commits:
            return
        for p, records in records_of(self.epoch, self.commits, self.partitions).items():
            n, total = self.sums.get(p, (0, 0))
            for r in records:
                n, total = n + 1, _signed(total + change_digest(encode_change(r)))
            self.sums[p] = (n, total)
        self.commits = []

    def findings(self, actual: Mapping[int, tuple[int, int]]) -> list[Finding]:
        """``changelog.once`` for each partition whose records (up to the bound) are not the expected ones."""
        self._flush()
        out: list[Finding] = []
        for p in sorted(self.sums.keys() | actual.keys()):
            want, got = self.sums.get(p, (0, 0)), actual.get(p, (0, 0))
            if want != got:
                how = (
                    "other records"
                    if want[0] == got[0]
                    else f"{got[0]} records, the serial replay writes {want[0]}"
                )
                out.append(
                    Finding(
                        "changelog.once",
                        f"changelog p{p}",
                        f"changelog p{p} up to epoch {self.bound}: {how} (not the serial replay's writes)",
                    )
                )
        return out


def snapshot_findings(
    epoch: int,
    rebuilt: Mapping[tuple[str, Any], Any],
    snapshot: Mapping[tuple[str, Any], Any],
    limit: int = 20,
) -> list[Finding]:
    """``changelog.snapshot``: the state the records up to ``epoch`` leave, against the snapshot's."""
    differ = sorted(
        (k for k in rebuilt.keys() | snapshot.keys() if rebuilt.get(k) != snapshot.get(k)), key=str
    )
    out = [
        Finding(
            "changelog.snapshot",
            f"{op}/{key}",
            f"{op} {key!r}: snapshot {epoch} holds {snapshot.get((op, key))!r}, the changelog up to epoch "
            f"{epoch} gives {rebuilt.get((op, key))!r}",
        )
        for op, key in differ[:limit]
    ]
    if len(differ) > limit:
        out.append(
            Finding("changelog.snapshot", f"snapshot {epoch}", f"{len(differ)} entities differ in all")
        )
    return out
