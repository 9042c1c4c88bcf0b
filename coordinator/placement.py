"""Partition placement: which worker owns which partition (pure)."""

from __future__ import annotations


def place(n_partitions: int, workers: list[str]) -> list[str]:
    """Round-robin over the sorted worker ids: balanced and identical on every node."""
    assert workers, "no workers to place partitions on"
    ordered = sorted(workers)
    return [ordered[p % len(ordered)] for p in range(n_partitions)]
