"""Key choosers for the workloads: uniform and Zipfian (coefficient 0 to 0.999)."""

from __future__ import annotations

import bisect
import itertools
import random


class KeyChooser:
    """Draws key indices in ``[0, n)``; ``zipf=0`` is uniform, larger is more skewed (hot keys first)."""

    def __init__(self, n: int, zipf: float = 0.0, seed: int = 0) -> None:
        if not 0 <= zipf < 1:
            raise ValueError(f"zipf coefficient must be in [0, 1), got {zipf}")
        self.n = n
        self.zipf = zipf
        self.rng = random.Random(seed)
        self.cdf: list[float] | None = None
        if zipf > 0:
            self.cdf = list(itertools.accumulate(1.0 / (i**zipf) for i in range(1, n + 1)))

    def one(self, rng: random.Random | None = None) -> int:
        """One key index, drawn from ``rng`` (default: the chooser's own stream)."""
        r = rng or self.rng
        if self.cdf is None:
            return r.randrange(self.n)
        return min(self.n - 1, bisect.bisect_left(self.cdf, r.random() * self.cdf[-1]))

    def distinct(self, m: int, rng: random.Random | None = None) -> list[int]:
        out: list[int] = []
        while len(out) < m:
            k = self.one(rng)
            if k not in out:
                out.append(k)
        return out
