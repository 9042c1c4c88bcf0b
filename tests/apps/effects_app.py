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
from styx_py import Abort, Context, Graph, Operator

__all__ = ["PAYMENTS", "app", "check"]

PAYMENTS = payment_service(random.Random(0))


async def payments(function: str, args: list[Any], key: str) -> Any:
    return await PAYMENTS(function, args, key)


app = Graph("reservations_sim", [seat, user], services={"payments": payments})

# The same app with a per-partition bound small enough for a test to reach (docs/effects.md, limits).
BOUND = 3
bounded = Graph(
    "reservations_sim", [seat, user], services={"payments": payments}, max_pending_per_partition=BOUND
)


# A continuation that always fails: the outcome must be recorded all the same, the intent cleared.
flaky = Operator("flaky", partitions=2)


@flaky.function
async def go(ctx: Context, how: str) -> str:
    await ctx.put("asked")
    return ctx.call_external("payments", "charge", ctx.key, 1, then=(flaky, how, ctx.key))


@flaky.function
async def boom(ctx: Context, outcome: dict[str, Any]) -> None:
    raise ValueError(f"continuation of {outcome['call']} fails")


@flaky.function
async def refuse(ctx: Context, outcome: dict[str, Any]) -> None:
    raise Abort("the continuation aborts")


failing = Graph("failing_sim", [flaky], services={"payments": payments})
