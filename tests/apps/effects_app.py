"""The reservation app (:mod:`styx_benchmarks.reservations`) on an in-memory payment service, for the
simulation.

:data:`PAYMENTS` is a ledger by idempotency key (a test installs a seeded one): slow, failing before it
takes effect, and losing its answer after it did.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

from styx_benchmarks.reservations import check, seat, user
from styx_py import Abort, Context, Graph, Operator

__all__ = ["PAYMENTS", "Payments", "app", "check"]


class Payments:
    """A payment service's ledger by idempotency key: the same key, the same effect and answer."""

    def __init__(self, seed: int = 0, fail: float = 0.0, lose: float = 0.0, delay_s: float = 0.01) -> None:
        self.rng = random.Random(seed)
        self.fail, self.lose, self.delay_s = fail, lose, delay_s
        self.ledger: dict[str, dict[str, Any]] = {}
        self.effects: Counter[str] = Counter()  # times a key took effect (must be 1)
        self.attempts: Counter[str] = Counter()

    async def __call__(self, function: str, args: list[Any], key: str) -> Any:
        self.attempts[key] += 1
        await asyncio.sleep(self.rng.uniform(0, self.delay_s))
        if self.rng.random() < self.fail:
            raise ConnectionError("payment service unavailable")
        if key not in self.ledger:
            self.effects[key] += 1
            if function == "charge":
                self.ledger[key] = {"kind": "charge", "user": args[0], "amount": args[1]}
            elif function == "refund":
                self.ledger[key] = {"kind": "refund", "charge": args[0]}
            else:
                raise ValueError(f"unknown payment function {function!r}")
        if self.rng.random() < self.lose:
            raise ConnectionResetError("answer lost after the effect")
        return {"ok": True, **self.ledger[key]}


PAYMENTS = Payments()


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
