"""Seat reservations with an external payment service and hold timers, for the simulation.

``hold`` takes a free seat, asks the payment service to charge the user (an external call, its
continuation ``paid``) and sets a timer (``expire``) that releases the hold if the payment has not come
back by then. ``paid`` sells the seat and cancels the timer, or, when the hold was released already (the
timer fired first) or the charge failed, refunds a charge that went through. Every seat keeps its
history, so a check can hold the payment ledger against what committed.

The service is :data:`PAYMENTS`, an in-memory ledger by idempotency key (a test installs a seeded one):
slow, failing before it takes effect, and losing its answer after it did.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

from styx_py import Context, Graph, Operator

seat = Operator("seat", partitions=4)
user = Operator("user", partitions=3)


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


@seat.function
async def hold(ctx: Context, who: str, amount: int, ttl_s: float) -> str:
    s = await ctx.get({"state": "free", "history": []})
    if s["state"] != "free":
        return "taken"
    charge = ctx.call_external("payments", "charge", who, amount, then=(seat, "paid", ctx.key))
    timer = ctx.call_later(ttl_s, seat, "expire", ctx.key, charge)
    s.update(state="held", who=who, charge=charge, timer=timer)
    s["history"].append([charge, "held"])
    await ctx.put(s)
    return charge


@seat.function
async def paid(ctx: Context, outcome: dict[str, Any]) -> str:
    """The charge's outcome. A charge that failed is voided all the same (a refund under its own key):
    the service may have taken it before its answers were lost."""
    s = await ctx.get()
    charge = outcome["call"]
    s["history"].append([charge, "paid" if outcome["ok"] else "failed"])
    answer = "late"
    if s["state"] == "held" and s["charge"] == charge:
        ctx.cancel_timer(s["timer"])
        s["state"] = "sold" if outcome["ok"] else "free"
        answer = s["state"]
    if s["state"] == "sold" and s["charge"] == charge:
        ctx.call_async(user, "bought", s["who"], ctx.key)
    else:  # released first (the timer fired), or the charge failed: give the money back
        ctx.call_external("payments", "refund", charge, idempotency_key=f"refund:{charge}")
        s["history"].append([charge, "refunded"])
    await ctx.put(s)
    return answer


@seat.function
async def expire(ctx: Context, charge: str) -> str:
    s = await ctx.get()
    s["history"].append([charge, "expired"])
    if s["state"] == "held" and s["charge"] == charge:
        s["state"] = "free"
        await ctx.put(s)
        return "released"
    await ctx.put(s)
    return "stale"


@seat.function(read_only=True)
async def look(ctx: Context) -> Any:
    return await ctx.get()


@user.function
async def bought(ctx: Context, seat_key: str) -> int:
    seats = await ctx.get([])
    seats.append(seat_key)
    await ctx.put(seats)
    return len(seats)


app = Graph("reservations_sim", [seat, user], services={"payments": payments})


def check(state: dict[tuple[str, Any], Any], ledger: dict[str, dict[str, Any]]) -> None:
    """No double charge, no seat both held and sold, every hold ended (sold, released or failed), and
    the ledger holds exactly the charges that committed (a refund for each that was not kept)."""
    charges = {k for k, v in ledger.items() if v["kind"] == "charge"}
    refunds = {v["charge"] for v in ledger.values() if v["kind"] == "refund"}
    committed: set[str] = set()
    sold: dict[str, str] = {}
    for (op, key), s in state.items():
        if op != "seat":
            continue
        assert s["state"] in ("free", "sold"), f"seat {key} still {s['state']}"
        events: dict[str, list[str]] = {}
        for charge, what in s["history"]:
            events.setdefault(charge, []).append(what)
        for charge, seen in events.items():
            committed.add(charge)
            assert seen[0] == "held", (key, charge, seen)
            assert seen.count("paid") + seen.count("failed") == 1, (key, charge, seen)
            assert seen.count("expired") <= 1, f"timer of {charge} fired twice: {seen}"
            if "paid" in seen:
                assert charge in charges, f"{charge} paid but not in the ledger"
        if s["state"] == "sold":
            sold[key] = s["charge"]
            assert "refunded" not in events[s["charge"]], (key, events[s["charge"]])
    assert charges <= committed, f"charged under keys no transaction committed: {sorted(charges - committed)}"
    for charge in charges:
        kept = charge in sold.values()
        assert kept != (charge in refunds), f"{charge}: kept {kept}, refunded {charge in refunds}"
    bought = [k for (op, _), seats in state.items() if op == "user" for k in seats]
    assert sorted(bought) == sorted(sold), "a seat sold twice, or a sale not recorded"
