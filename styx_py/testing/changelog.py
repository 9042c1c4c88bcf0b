"""The simulation's check of the changelog topic against the serial execution.

Every partition of the changelog must hold exactly the records the serial execution's writes give, in
commit order (:func:`styx_py.core.changelog.records_of` of each epoch's committed transactions), each
once, and read from the start it must rebuild the cluster's final state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from styx_py.core.changelog import ChangeRecord, Commit, records_of, table_of
from styx_py.core.graph import Graph
from styx_py.core.partitioning import Key
from styx_py.core.serial import Writes
from styx_py.core.wire import Reply

__all__ = ["check_changelog", "expected_changelog"]


def expected_changelog(
    commits: list[tuple[Reply, Writes]], graph_at: Callable[[int], Graph]
) -> dict[int, list[ChangeRecord]]:
    """Per partition, the records the serial execution's ``commits`` put on the changelog."""
    by_epoch: dict[int, list[Commit]] = {}
    for reply, writes in commits:
        if writes:
            by_epoch.setdefault(reply.epoch, []).append((reply.phase, reply.tid, writes))
    out: dict[int, list[ChangeRecord]] = {}
    for epoch in sorted(by_epoch):
        partitions = {name: op.partitions for name, op in graph_at(epoch).operators.items()}
        for p, records in records_of(epoch, by_epoch[epoch], partitions).items():
            out.setdefault(p, []).extend(records)
    return out


def check_changelog(
    seed: int,
    topic: list[list[Any]],
    commits: list[tuple[Reply, Writes]],
    graph_at: Callable[[int], Graph],
    state: Mapping[tuple[str, Key], Any],
) -> None:
    """``topic`` (the changelog's partitions) against the serial execution and the final ``state``."""
    expected = expected_changelog(commits, graph_at)
    for p, part in enumerate(topic):
        want = expected.get(p, [])
        if part == want:
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(part, want, strict=False)) if a != b), min(len(part), len(want))
        )
        got_r = part[at] if at < len(part) else "nothing"
        want_r = want[at] if at < len(want) else "nothing"
        raise AssertionError(
            f"seed {seed}: changelog partition {p} differs from the serial execution's writes at record "
            f"{at} ({len(part)} records, serially {len(want)}): {got_r!r}, serially {want_r!r}"
        )
    missing = sorted(p for p in expected if p >= len(topic))
    assert not missing, f"seed {seed}: changelog partitions {missing} missing"
    rebuilt = table_of(r for part in topic for r in part)
    if rebuilt != dict(state):
        differ = sorted(
            (k for k in rebuilt.keys() | state.keys() if rebuilt.get(k) != state.get(k)), key=repr
        )
        raise AssertionError(f"seed {seed}: the changelog rebuilds a state that differs at {differ[:5]}")
