"""Mencius-style transaction ids: ``tid = sid + lc * n_seq``.

Each worker's sequencer owns the residue class ``sid`` modulo ``n_seq``, so sequencers never talk to
each other to stay unique. After every epoch the local counters are rebalanced to the global maximum
(sent by the coordinator), so a busy sequencer does not end up with systematically lower priority
than an idle one: all sequencers start the epoch at the same ``lc`` and their tids interleave.
"""

from __future__ import annotations


class Sequencer:
    def __init__(self, sid: int, n_seq: int, lc: int = 0) -> None:
        assert 1 <= sid <= n_seq, (sid, n_seq)
        self.sid = sid
        self.n_seq = n_seq
        self.lc = lc

    def next_tid(self) -> int:
        tid = self.sid + self.lc * self.n_seq
        self.lc += 1
        return tid

    def assign(self, count: int) -> list[int]:
        """Tids for ``count`` new transactions, in arrival order."""
        start = self.lc
        self.lc += count
        return [self.sid + lc * self.n_seq for lc in range(start, start + count)]

    def rebalance(self, global_lc: int) -> None:
        """Adopt the global maximum counter at an epoch boundary (never move backwards)."""
        self.lc = max(self.lc, global_lc)

    def owner_of(self, tid: int) -> int:
        """The sid that issued ``tid``."""
        r = tid % self.n_seq
        return r if r else self.n_seq
