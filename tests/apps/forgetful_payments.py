"""A payment service's double that does not honour idempotency keys: a retried call takes effect again
(recorded under the key and the attempt), as a service that forgot its keys would. The kit's reservation
invariant finds the double charge (tests/test_simulate.py)."""

from __future__ import annotations

import itertools
import random
from typing import Any

from styx_benchmarks.reservations_sim import payments
from styx_py.testing.services import ServiceDouble


class Forgetful(ServiceDouble):
    n = itertools.count()

    async def __call__(self, function: str, args: list[Any], key: str) -> Any:
        return await super().__call__(function, args, f"{key}#{next(self.n)}")


def services(rng: random.Random) -> dict[str, ServiceDouble]:
    honest = payments(rng)
    return {"payments": Forgetful(honest.functions, rng, lose=0.5, delay_s=0.01)}
