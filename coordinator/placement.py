"""Partition placement: which worker owns which partition (pure)."""

from __future__ import annotations


def place(n_partitions: int, workers: list[str]) -> list[str]:
    """Round-robin over the sorted worker ids: balanced and identical on every node."""
    assert workers, "no workers to place partitions on"
    ordered = sorted(workers)
    return [ordered[p % len(ordered)] for p in range(n_partitions)]


def rebalance(placement: list[str], workers: list[str]) -> list[str]:
    """The placement on ``workers`` that moves the fewest partitions: every partition whose owner stays
    and is not above its share keeps it; the partitions of workers that left, and each worker's surplus
    (its highest-numbered ones), go to the workers below their share, lowest partition first. Shares
    differ by at most one; the workers holding most now get the larger ones."""
    assert workers, "no workers to place partitions on"
    ordered = sorted(set(workers))
    owned = {w: [p for p, owner in enumerate(placement) if owner == w] for w in ordered}
    base, extra = divmod(len(placement), len(ordered))
    by_load = sorted(ordered, key=lambda w: (-len(owned[w]), w))
    share = {w: base + (1 if i < extra else 0) for i, w in enumerate(by_load)}
    free = sorted(
        [p for p, owner in enumerate(placement) if owner not in share]
        + [p for w in ordered for p in owned[w][share[w] :]]
    )
    out = list(placement)
    for w in ordered:
        for _ in range(share[w] - min(len(owned[w]), share[w])):
            out[free.pop(0)] = w
    assert not free
    return out
