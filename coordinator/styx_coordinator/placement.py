"""Partition placement: which worker owns which partition (pure).

Placement balances by count first (shares differ by at most one, so every worker has work and no
worker holds twice another's partitions) and, when the partitions' measured load is known, by load
within that: which partitions leave a worker and where the free ones go are chosen to even the load
out, and then pairs are swapped between the most and the least loaded workers while that lowers the
heaviest one's load by more than :data:`PLACEMENT_SWAP_GAIN` of the mean. Every move costs a restore at the
barrier (docs/operations.md), so swaps are made only at a shape change, never on their own, and at
most :data:`MAX_PLACEMENT_SWAPS` of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from styx_py.core.limits import MAX_PLACEMENT_SWAPS, PLACEMENT_SWAP_GAIN

__all__ = ["MAX_PLACEMENT_SWAPS", "PLACEMENT_SWAP_GAIN", "loads_of", "place", "rebalance"]


def place(n_partitions: int, workers: list[str]) -> list[str]:
    """Round-robin over the sorted worker ids: balanced and identical on every node."""
    assert workers, "no workers to place partitions on"
    ordered = sorted(workers)
    return [ordered[p % len(ordered)] for p in range(n_partitions)]


def loads_of(placement: Sequence[str], load: Sequence[float], workers: Sequence[str]) -> dict[str, float]:
    """Each worker's load: the sum of its partitions' loads."""
    out = dict.fromkeys(workers, 0.0)
    for p, owner in enumerate(placement):
        if owner in out:
            out[owner] += load[p]
    return out


def rebalance(placement: list[str], workers: list[str], load: Sequence[float] | None = None) -> list[str]:
    """The placement on ``workers`` that moves the fewest partitions: every partition whose owner stays
    and is not above its share keeps it; the partitions of workers that left, and each worker's surplus,
    go to the workers below their share. Shares differ by at most one; the workers holding most now get
    the larger ones.

    Without ``load`` (one number per partition, e.g. transactions per second) a worker's surplus is its
    highest-numbered partitions and free partitions go out lowest first. With it, a worker keeps its
    heaviest partitions up to its share, the free ones go heaviest first to the least loaded worker
    below its share, and then swaps even the load out (see the module docstring)."""
    assert workers, "no workers to place partitions on"
    assert load is None or len(load) == len(placement), "one load per partition"
    ordered = sorted(set(workers))
    owned = {w: [p for p, owner in enumerate(placement) if owner == w] for w in ordered}
    base, extra = divmod(len(placement), len(ordered))
    by_count = sorted(ordered, key=lambda w: (-len(owned[w]), w))
    share = {w: base + (1 if i < extra else 0) for i, w in enumerate(by_count)}
    fewest_moves = _fill(placement, owned, share, None)
    if load is None or not any(x > 0 for x in load):
        return fewest_moves
    # Swaps on the count-only order and on the greedy one; the lighter heaviest worker wins, the fewer
    # moves on a tie (greedy choices can lose to the count-only order on odd loads: this keeps
    # load-aware never worse).
    candidates = [
        _swap(fewest_moves, load, ordered),
        _swap(_fill(placement, owned, share, load), load, ordered),
    ]

    def score(c: list[str]) -> tuple[float, int]:
        heaviest = max(loads_of(c, load, ordered).values())
        return heaviest, sum(a != b for a, b in zip(placement, c, strict=True))

    return min(candidates, key=score)


def _fill(
    placement: list[str], owned: dict[str, list[int]], share: dict[str, int], weight: Sequence[float] | None
) -> list[str]:
    """Each worker keeps its partitions up to its share; the rest (and those of workers that left) go
    to the workers below their share. Without ``weight``: a worker keeps its lowest-numbered ones and
    free partitions go lowest first to the first worker (by id) with room. With it: a worker keeps its
    heaviest (ties: the lowest) and free ones go heaviest first to the least loaded worker with room."""

    def order(p: int) -> tuple[float, int]:
        return (0.0 if weight is None else -weight[p], p)

    free = [p for p, owner in enumerate(placement) if owner not in share]
    free += [p for w, ps in owned.items() for p in sorted(ps, key=order)[share[w] :]]
    room = {w: share[w] - min(len(owned[w]), share[w]) for w in share}
    leaving = set(free)
    total = {
        w: 0.0 if weight is None else sum(weight[p] for p in owned[w] if p not in leaving) for w in share
    }
    out = list(placement)
    for p in sorted(free, key=order):
        with_room = [w for w in sorted(share) if room[w] > 0]
        w = with_room[0] if weight is None else min(with_room, key=lambda w: (total[w], w))
        out[p] = w
        room[w] -= 1
        total[w] += 0.0 if weight is None else weight[p]
    return out


def _swap(placement: list[str], weight: Sequence[float], workers: list[str]) -> list[str]:
    """Swap a partition of the most loaded worker with one of the least loaded, while that lowers the
    heaviest load by more than PLACEMENT_SWAP_GAIN of the mean (counts stay as they are)."""
    out = list(placement)
    total = loads_of(out, weight, workers)
    mean = sum(total.values()) / len(workers)
    for _ in range(MAX_PLACEMENT_SWAPS):
        hi = max(workers, key=lambda w: (total[w], w))
        lo = min(workers, key=lambda w: (total[w], w))
        best: tuple[float, int, int] | None = None
        for a in (p for p, o in enumerate(out) if o == hi):
            for b in (p for p, o in enumerate(out) if o == lo):
                d = weight[a] - weight[b]
                if d <= 0:
                    continue
                peak = max(total[hi] - d, total[lo] + d)  # the larger of the two after the swap
                if best is None or (peak, a, b) < best:
                    best = (peak, a, b)
        if best is None or total[hi] - best[0] <= PLACEMENT_SWAP_GAIN * mean:
            break
        _, a, b = best
        out[a], out[b] = lo, hi
        d = weight[a] - weight[b]
        total[hi] -= d
        total[lo] += d
    return out
