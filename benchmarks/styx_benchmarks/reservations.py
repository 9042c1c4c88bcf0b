"""Seat reservations: hold a seat, charge through an external payment service, confirm — or release
the hold when its timer fires first (docs/effects.md).

``hold`` takes a free seat, asks the payment service to charge the user (``ctx.call_external``, with
the continuation ``paid``) and sets a timer (``ctx.call_later``, ``expire``) that releases the hold if
the payment's outcome has not come back by then. ``paid`` sells the seat and cancels the timer; when
the hold was released already, or the charge failed, it refunds the charge under its own idempotency
key (a failed charge may still have been taken: the service's answers may have been lost). Every seat
keeps its history, so :func:`check` can hold the payment ledger to what committed.

The app ``styx_benchmarks.reservations:app`` calls the HTTP payment service of
:mod:`styx_benchmarks.payments` at ``RESERVATIONS_PAYMENTS_URL``; the simulation's app
(``tests/apps/effects_app.py``) builds the same operators with an in-memory service.
"""

from __future__ import annotations

import os
from typing import Any

from styx_benchmarks.payments import Client
from styx_benchmarks.workload import State
from styx_py import Context, Graph, Operator

seat = Operator("seat", partitions=4)
user = Operator("user", partitions=3)


PAYMENTS_URL_ENV = "RESERVATIONS_PAYMENTS_URL"
_client: Client | None = None


async def http_payments(function: str, args: list[Any], key: str) -> Any:
    """The payment service over HTTP (:mod:`styx_benchmarks.payments`): ``POST /{function}`` with the
    idempotency key in the ``Idempotency-Key`` header; a status other than 200 raises."""
    global _client
    url = os.environ.get(PAYMENTS_URL_ENV)
    if not url:
        raise RuntimeError(f"{PAYMENTS_URL_ENV} is not set: no payment service to call")
    if _client is None:
        _client = Client(url)
    return await _client.post(function, {"args": args}, {"Idempotency-Key": key})


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
        refund_once(ctx, charge)
        s["history"].append([charge, "refunded"])
    await ctx.put(s)
    return answer


def refund_once(ctx: Context, charge: str) -> None:
    """Refund ``charge`` under its own key; a refund that failed for good is asked for again, under the
    same key (the service refunds once however often it is asked)."""
    then = (seat, "refund_done", ctx.key, [charge])
    ctx.call_external("payments", "refund", charge, idempotency_key=f"refund:{charge}", then=then)


@seat.function
async def refund_done(ctx: Context, outcome: dict[str, Any], charge: str) -> bool:
    if not outcome["ok"]:
        refund_once(ctx, charge)
    return bool(outcome["ok"])


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


@user.function(name="look", read_only=True)
async def look_user(ctx: Context) -> Any:
    return await ctx.get()


app = Graph("reservations", [seat, user], services={"payments": http_payments})


def check(state: State, ledger: dict[str, dict[str, Any]]) -> None:
    """No double charge, no seat both held and sold, every hold ended (sold, released or failed), and
    the ledger holds exactly the charges that committed (a refund for each that was not kept)."""
    charges = {k for k, v in ledger.items() if v["kind"] == "charge"}
    refunds = {v["charge"] for v in ledger.values() if v["kind"] == "refund"}
    committed: set[str] = set()
    sold: dict[Any, str] = {}
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
