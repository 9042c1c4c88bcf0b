"""Measured load per partition, for placement (pure): transactions per second, from the workers'
heartbeats.

Every heartbeat carries, per partition the worker sequenced transactions of, how many it sequenced
since its process started; only its current partitions count. The rate is an exponentially weighted
average with a time constant of ``window_s``: a partition's recent load counts most, a burst seconds
ago little. A worker that restarts counts from zero again (a count below the last one starts over),
and a partition that moved is measured at its new owner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from styx_py.core.limits import LOAD_WINDOW_S

__all__ = ["LOAD_WINDOW_S", "PartitionLoad"]


class PartitionLoad:
    def __init__(self, window_s: float = LOAD_WINDOW_S) -> None:
        assert window_s > 0
        self.window_s = window_s
        self.rate: dict[int, float] = {}  # partition -> transactions per second
        self.last: dict[tuple[str, int], tuple[float, int]] = {}  # (worker, partition) -> (time, count)

    def report(self, node_id: str, counts: Mapping[int, int], now: float, placement: Sequence[str]) -> None:
        """A heartbeat: ``counts`` are transactions sequenced per partition since the worker started.
        Only the partitions ``placement`` gives the worker count: the counter of one it gave away
        stands still, and averaging that in would halve the partition's measured load."""
        for p, n in counts.items():
            if not 0 <= p < len(placement) or placement[p] != node_id:
                continue
            prev = self.last.get((node_id, p))
            self.last[(node_id, p)] = (now, n)
            if prev is None or now <= prev[0]:
                continue
            t0, n0 = prev
            dt = now - t0
            added = n - n0 if n >= n0 else n  # below the last count: the worker restarted
            weight = 1.0 - math.exp(-dt / self.window_s)
            old = self.rate.get(p, 0.0)
            self.rate[p] = old + weight * (added / dt - old)

    def forget(self, node_id: str) -> None:
        """A worker left: its counters go (its partitions are measured again at their new owners)."""
        self.last = {k: v for k, v in self.last.items() if k[0] != node_id}

    def rates(self, n_partitions: int) -> list[float]:
        """Transactions per second of partitions ``0 .. n_partitions - 1`` (0 where none were seen)."""
        return [self.rate.get(p, 0.0) for p in range(n_partitions)]
