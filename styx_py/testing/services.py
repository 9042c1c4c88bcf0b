"""In-memory doubles of the external services an app calls (``ctx.call_external``), for the simulation.

A :class:`ServiceDouble` keeps a ledger by idempotency key, as a real idempotent service does: the
first call of a key takes effect (runs the function) and records its answer; every later call with
that key gets the recorded answer and takes no effect. Its faults are seeded: an answer waits up to
``delay_s`` (virtual) seconds, a share ``fail`` of the calls fails before any effect, a share
``lose`` takes effect and then loses its answer (the caller sees a failure and tries again, under the
same key). The simulation kit installs doubles in place of the graph's services for each seed
(``simulate(..., services=...)``, ``styx simulate --services``) and hands them to the invariant, which
holds their ledgers to the final state (docs/simulate.md).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ServiceDouble"]


class ServiceDouble:
    """A service (:data:`styx_py.core.effects.Service`) in memory: ``functions`` by name, each called
    with the call's arguments once per idempotency key; its answer is the key's ledger entry."""

    def __init__(
        self,
        functions: Mapping[str, Callable[..., Any]],
        rng: random.Random | int = 0,
        *,
        fail: float = 0.0,
        lose: float = 0.0,
        delay_s: float = 0.01,
    ) -> None:
        self.functions = dict(functions)
        self.rng = rng if isinstance(rng, random.Random) else random.Random(rng)
        self.fail, self.lose, self.delay_s = fail, lose, delay_s
        self.ledger: dict[str, Any] = {}  # idempotency key -> the answer of the call that took effect
        self.attempts: Counter[str] = Counter()  # calls received per key (retries, replays)

    async def __call__(self, function: str, args: list[Any], key: str) -> Any:
        self.attempts[key] += 1
        await asyncio.sleep(self.rng.uniform(0, self.delay_s))
        if self.rng.random() < self.fail:
            raise ConnectionError("service unavailable")
        if key not in self.ledger:
            effect = self.functions.get(function)
            if effect is None:
                raise ValueError(f"unknown function {function!r}")
            self.ledger[key] = effect(*args)
        if self.rng.random() < self.lose:
            raise ConnectionResetError("answer lost after the effect")
        return self.ledger[key]
