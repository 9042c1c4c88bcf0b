"""The reservation app (:mod:`styx_benchmarks.reservations`) on an in-memory payment service, for the
simulation.

:data:`PAYMENTS` is the payment service's double (:func:`styx_benchmarks.reservations_sim.payments`, a
ledger by idempotency key); a test installs a seeded one.
"""

from __future__ import annotations

import random
from typing import Any

from styx_benchmarks.reservations import check, seat, user
from styx_benchmarks.reservations_sim import payments as payment_service
from styx_py import Graph

__all__ = ["PAYMENTS", "app", "check"]

PAYMENTS = payment_service(random.Random(0))


async def payments(function: str, args: list[Any], key: str) -> Any:
    return await PAYMENTS(function, args, key)


app = Graph("reservations_sim", [seat, user], services={"payments": payments})
